/* The small helpers every library calls (base.h): the error line, the clock. */
#include <stdarg.h>
#include <stdio.h>
#include <time.h>

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
