/* The small helpers every library calls, each written once. Here, beside env.h, in tr_base:
 * a library of no dependencies that tr_dsl and tr_parallel link, so every library (tr_dsl,
 * tr_data, tr_parallel, tr_model, tr_dp) and the trainer reach it. */
#ifndef TR_PARALLEL_BASE_H
#define TR_PARALLEL_BASE_H

#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>

/* Arguments a and b of a function are a printf format and its first value: checked. */
#ifdef __GNUC__
#define TR_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define TR_PRINTF(a, b)
#endif

/* err (of errlen bytes; NULL or 0: nothing written) <- the formatted line, truncated to fit.
 * Returns -1, so that a failing path reads `return tr_errf(err, errlen, "...", ...);`.
 * tr_verrf: the same from a va_list, for a helper that puts a prefix first. */
TR_PRINTF(3, 4) int tr_errf(char *err, size_t errlen, const char *fmt, ...);
TR_PRINTF(3, 0) int tr_verrf(char *err, size_t errlen, const char *fmt, va_list ap);

/* CLOCK_MONOTONIC in seconds: the clock every duration (a step, a wait, a collective, a save)
 * is timed with. */
double tr_now(void);

/* v's n values in rising order (qsort, NaN-free values). */
void tr_sort_doubles(double *v, size_t n);

/* The median of v's n values (the mean of the middle two when n is even; 0 when n is 0),
 * sorting v in place. */
double tr_median_doubles(double *v, size_t n);

/* The rest of stream f, to its end, in *text (malloc'd, a NUL after its *len bytes, which may
 * hold NULs of their own; f stays open). 0, or -1 with errno: the read's, ENOMEM, or EFBIG
 * when there are more than max bytes (then no more than max + 1 were read). */
int tr_read_all(FILE *f, size_t max, char **text, size_t *len);
/* The same for the file at path: its bytes (malloc'd, NUL after *len of them), or NULL with
 * errno (the open's, the read's, EFBIG over max bytes). */
char *tr_read_file(const char *path, size_t max, size_t *len);

/* path and every folder above it made (0755) as `mkdir -p` does, whatever its length: 0, or
 * -1 with err "cannot create folder 'FOLDER': why" or "'PATH' exists and is not a folder". */
int tr_mkdirs(const char *path, char *err, size_t errlen);

/* A file that appears whole or not at all: tr_atomic_open opens a temporary beside `path`
 * (a->f, to write to); tr_atomic_commit flushes it to the disk and renames it over `path`,
 * tr_atomic_abandon removes it. Each 0, or -1 with err "cannot write 'PATH': why" (the
 * temporary removed). */
typedef struct {
    FILE *f;
    char path[4096], tmp[4096 + 32];
} tr_atomic;
int tr_atomic_open(tr_atomic *a, const char *path, char *err, size_t errlen);
int tr_atomic_commit(tr_atomic *a, char *err, size_t errlen);
void tr_atomic_abandon(tr_atomic *a);

#endif
