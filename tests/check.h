/* The C tests' one check: prints "ok  " or "FAIL" and the message, and counts both; a test
 * ends with printf("%d ok, %d failed\n", n_ok, n_fail) and a non-zero exit on failure. */
#ifndef TR_TESTS_CHECK_H
#define TR_TESTS_CHECK_H

#include <stdarg.h>
#include <stdio.h>

static int n_fail, n_ok;

#ifdef __GNUC__
__attribute__((format(printf, 2, 3)))
#endif
static int
check(int cond, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    printf("%s ", cond ? "ok  " : "FAIL");
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    if (cond)
        n_ok++;
    else
        n_fail++;
    return cond;
}

#endif
