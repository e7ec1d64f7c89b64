/* parallel/comm/base.h, the helpers every library calls: the error line, the clock. */
#include <string.h>

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

int main(void) {
    test_errf();
    test_now();
    printf("%d ok, %d failed\n", n_ok, n_fail);
    return n_fail ? 1 : 0;
}
