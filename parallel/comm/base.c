/* The small helpers every library calls (base.h): the error line, the clock, sorting doubles,
 * reading a whole file, making folders. */
#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "parallel/comm/base.h"

int tr_verrf(char *err, size_t errlen, const char *fmt, va_list ap) {
    if (err && errlen) vsnprintf(err, errlen, fmt, ap);
    return -1;
}

int tr_errf(char *err, size_t errlen, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    tr_verrf(err, errlen, fmt, ap);
    va_end(ap);
    return -1;
}

double tr_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

void tr_sort_doubles(double *v, size_t n) {
    qsort(v, n, sizeof v[0], cmp_double);
}

double tr_median_doubles(double *v, size_t n) {
    if (!n) return 0;
    tr_sort_doubles(v, n);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int tr_read_all(FILE *f, size_t max, char **text, size_t *len) {
    size_t cap = max < (1u << 16) ? max + 1 : 1u << 16, n = 0; /* room for max + 1: too many */
    char *buf = malloc(cap + 1);
    for (;;) {
        if (!buf) {
            errno = ENOMEM;
            return -1;
        }
        n += fread(buf + n, 1, cap - n, f);
        int e = ferror(f) ? (errno ? errno : EIO) : n > max ? EFBIG : 0;
        if (e) {
            free(buf);
            errno = e;
            return -1;
        }
        if (n < cap) break; /* a short read without an error: the end */
        size_t grown = cap <= max / 2 ? 2 * cap : max + 1;
        char *g = grown < SIZE_MAX - 1 ? realloc(buf, grown + 1) : NULL;
        if (!g) free(buf);
        buf = g, cap = grown;
    }
    buf[n] = 0;
    *text = buf;
    *len = n;
    return 0;
}

int tr_mkdirs(const char *path, char *err, size_t errlen) {
    char *buf = strdup(path);
    if (!buf) return tr_errf(err, errlen, "cannot create folder '%s': %s", path, strerror(errno));
    for (char *p = buf + (*buf == '/');; p++) { /* each prefix ending at a '/', then all */
        if (*p == '/' || *p == '\0') {
            char c = *p;
            *p = '\0';
            if (mkdir(buf, 0755) != 0 && errno != EEXIST) {
                tr_errf(err, errlen, "cannot create folder '%s': %s", buf, strerror(errno));
                free(buf);
                return -1;
            }
            *p = c;
            if (c == '\0') break;
        }
    }
    free(buf);
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode))
        return tr_errf(err, errlen, "'%s' exists and is not a folder", path);
    return 0;
}

int tr_atomic_open(tr_atomic *a, const char *path, char *err, size_t errlen) {
    a->f = NULL;
    if (snprintf(a->path, sizeof a->path, "%s", path) >= (int)sizeof a->path)
        return tr_errf(err, errlen, "cannot write '%s': path too long", path);
    snprintf(a->tmp, sizeof a->tmp, "%s.tmp%ld", path, (long)getpid());
    a->f = fopen(a->tmp, "w");
    return a->f ? 0 : tr_errf(err, errlen, "cannot write '%s': %s", a->tmp, strerror(errno));
}

int tr_atomic_commit(tr_atomic *a, char *err, size_t errlen) {
    int e = ferror(a->f) ? (errno ? errno : EIO) : 0;
    if (!e && (fflush(a->f) || fsync(fileno(a->f)))) e = errno ? errno : EIO;
    if (fclose(a->f) && !e) e = errno ? errno : EIO;
    a->f = NULL;
    if (!e && rename(a->tmp, a->path)) e = errno ? errno : EIO;
    if (!e) return 0;
    unlink(a->tmp);
    return tr_errf(err, errlen, "cannot write '%s': %s", a->path, strerror(e));
}

void tr_atomic_abandon(tr_atomic *a) {
    if (a->f) fclose(a->f);
    a->f = NULL;
    unlink(a->tmp);
}

char *tr_read_file(const char *path, size_t max, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *text = NULL;
    int rc = tr_read_all(f, max, &text, len), e = errno;
    fclose(f);
    errno = e;
    return rc ? NULL : text;
}
