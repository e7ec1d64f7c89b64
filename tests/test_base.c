/* parallel/comm/base.h, the helpers every library calls: the error line, the clock, sorting
 * doubles, reading a whole file, making folders. Files go under $TMPDIR (else /tmp). */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "parallel/comm/base.h"
#include "check.h"

/* A helper that puts a prefix first, as parallel/layout.c's and dsl/cluster_yaml.c's do. */
TR_PRINTF(3, 4) static int prefixed(char *err, size_t errlen, const char *fmt, ...) {
    int n = snprintf(err, errlen, "recipe.lua:7: ");
    va_list ap;
    va_start(ap, fmt);
    int rc = tr_verrf(err + n, errlen - (size_t)n, fmt, ap);
    va_end(ap);
    return rc;
}

static void test_errf(void) {
    char err[16];
    int rc = tr_errf(err, sizeof err, "%s: %d", "heads", 12);
    check(rc == -1 && !strcmp(err, "heads: 12"), "tr_errf: -1 and the line (%s)", err);
    tr_errf(err, sizeof err, "%s", "a line longer than sixteen bytes");
    check(!strcmp(err, "a line longer t"), "tr_errf: truncated to the buffer (%s)", err);
    check(tr_errf(NULL, 0, "no room %d", 1) == -1, "tr_errf: NULL buffer, nothing written");
    memcpy(err, "untouched", 10);
    tr_errf(err, 0, "no room %d", 1);
    check(!strcmp(err, "untouched"), "tr_errf: errlen 0 writes nothing");
    char line[64];
    rc = prefixed(line, sizeof line, "heads %d must divide dim %d", 3, 64);
    check(rc == -1 && !strcmp(line, "recipe.lua:7: heads 3 must divide dim 64"),
          "tr_verrf: after a prefix (%s)", line);
}

/* Monotonic: never goes back (no duration is checked: no timing in a pass/fail test). */
static void test_now(void) {
    double t0 = tr_now(), t = t0;
    int back = 0;
    for (int i = 0; i < 100000; i++) {
        double u = tr_now();
        back += u < t;
        t = u;
    }
    check(t0 > 0 && !back, "tr_now: positive and never goes back");
}

/* Rising order, repeats and negatives kept, against the order counted by hand; one value. */
static void test_sort(void) {
    double v[9] = {3.5, -1, 2, 2, 1e300, -0.25, 0, 7, 2},
           want[9] = {-1, -0.25, 0, 2, 2, 2, 3.5, 7, 1e300};
    tr_sort_doubles(v, 9);
    check(!memcmp(v, want, sizeof v), "tr_sort_doubles: 9 values in rising order");
    double one = 4;
    tr_sort_doubles(&one, 1);
    check(one == 4, "tr_sort_doubles: one value left as it is");
    double odd[5] = {9, -3, 4, 4, 1}, even[4] = {10, -2, 3, 1}, none[1] = {5};
    check(tr_median_doubles(odd, 5) == 4 && odd[0] == -3 && odd[4] == 9,
          "tr_median_doubles: 5 values: the middle one (4), sorted in place");
    check(tr_median_doubles(even, 4) == 2, "tr_median_doubles: 4 values: the middle two's mean");
    check(tr_median_doubles(none, 0) == 0 && none[0] == 5, "tr_median_doubles: none: 0");
}

/* A file of n bytes (byte i is i % 251, so there are NULs) under $TMPDIR, opened to read. */
static FILE *file_of(size_t n) {
    const char *tmp = getenv("TMPDIR");
    char path[512];
    snprintf(path, sizeof path, "%s/test_base_XXXXXX", tmp && *tmp ? tmp : "/tmp");
    int fd = mkstemp(path);
    if (fd < 0) return NULL;
    unlink(path);
    FILE *f = fdopen(fd, "w+b");
    for (size_t i = 0; f && i < n; i++)
        fputc((int)(i % 251), f);
    if (f) rewind(f);
    return f;
}

static int read_n(size_t n, size_t max, char **text, size_t *len) {
    FILE *f = file_of(n);
    if (!f) return -2;
    int rc = tr_read_all(f, max, text, len);
    fclose(f);
    return rc;
}

static void test_read_all(void) {
    char *text = NULL;
    size_t len = 1;
    int rc = read_n(0, SIZE_MAX, &text, &len);
    check(rc == 0 && len == 0 && text && !text[0], "tr_read_all: an empty file");
    free(text);
    size_t big = 200000; /* past the first 64 KiB: the buffer grows */
    rc = read_n(big, SIZE_MAX, &text, &len);
    int same = rc == 0 && len == big && !text[len];
    for (size_t i = 0; same && i < big; i++)
        same = (unsigned char)text[i] == i % 251;
    check(same, "tr_read_all: %zu bytes with NULs among them, a NUL after (len %zu)", big, len);
    if (!rc) free(text);
    rc = read_n(1000, 1000, &text, &len);
    check(rc == 0 && len == 1000, "tr_read_all: max bytes exactly are read");
    if (!rc) free(text);
    errno = 0;
    rc = read_n(1001, 1000, &text, &len);
    check(rc == -1 && errno == EFBIG, "tr_read_all: one byte more than max is EFBIG");
    FILE *f = file_of(big);
    errno = 0;
    rc = f ? tr_read_all(f, 70000, &text, &len) : -2;
    check(rc == -1 && errno == EFBIG && ftell(f) == 70001,
          "tr_read_all: EFBIG after the buffer grew, max + 1 bytes read");
    if (f) fclose(f);
    errno = 0;
    rc = read_n(1, 0, &text, &len);
    check(rc == -1 && errno == EFBIG, "tr_read_all: max 0 takes only an empty file");
    FILE *dir = fopen(".", "rb"); /* Linux opens a folder; reading it fails */
    errno = 0;
    rc = dir ? tr_read_all(dir, SIZE_MAX, &text, &len) : -1;
    check(rc == -1 && errno == EISDIR, "tr_read_all: a read error is -1 with its errno (%s)",
          strerror(errno));
    if (dir) fclose(dir);
}

static int is_dir(const char *path) {
    struct stat st;
    return !stat(path, &st) && S_ISDIR(st.st_mode);
}

static void test_mkdirs(void) {
    const char *tmp = getenv("TMPDIR");
    char top[512], path[2048], err[2400] = "";
    snprintf(top, sizeof top, "%s/test_base_XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(top)) {
        check(0, "tr_mkdirs: a temporary folder (%s)", strerror(errno));
        return;
    }
    snprintf(path, sizeof path, "%s/a/b/c", top);
    int rc = tr_mkdirs(path, err, sizeof err);
    check(rc == 0 && is_dir(path), "tr_mkdirs: a/b/c made (%s)", rc ? err : "");
    check(tr_mkdirs(path, err, sizeof err) == 0, "tr_mkdirs: made again, already there");
    snprintf(path, sizeof path, "%s/a/", top);
    check(tr_mkdirs(path, err, sizeof err) == 0, "tr_mkdirs: a trailing slash");
    /* longer than the 1024 bytes the trainer's copy cut it to (a folder of the wrong name) */
    size_t n = (size_t)snprintf(path, sizeof path, "%s", top);
    for (int i = 0; i < 6; i++) {
        path[n++] = '/';
        memset(path + n, 'a' + i, 200);
        n += 200;
    }
    path[n] = 0;
    rc = tr_mkdirs(path, err, sizeof err);
    check(rc == 0 && is_dir(path), "tr_mkdirs: a path of %zu bytes (%s)", n, rc ? err : "");
    char file[600], want[2200];
    snprintf(file, sizeof file, "%s/file", top);
    FILE *f = fopen(file, "w");
    if (f) fclose(f);
    rc = tr_mkdirs(file, err, sizeof err);
    snprintf(want, sizeof want, "'%s' exists and is not a folder", file);
    check(rc == -1 && !strcmp(err, want), "tr_mkdirs: a file in the way (%s)", err);
    snprintf(path, sizeof path, "%s/under", file);
    rc = tr_mkdirs(path, err, sizeof err);
    snprintf(want, sizeof want, "cannot create folder '%s': Not a directory", path);
    check(rc == -1 && !strcmp(err, want), "tr_mkdirs: under a file (%s)", err);
    rc = tr_mkdirs("", err, sizeof err);
    check(rc == -1 && !strcmp(err, "cannot create folder '': No such file or directory"),
          "tr_mkdirs: an empty path (%s)", err);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", top);
    if (system(cmd)) check(0, "removing %s", top);
}

int main(void) {
    test_errf();
    test_now();
    test_sort();
    test_read_all();
    test_mkdirs();
    printf("%d ok, %d failed\n", n_ok, n_fail);
    return n_fail ? 1 : 0;
}
