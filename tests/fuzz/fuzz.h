/* What the fuzz targets (tests/fuzz/fuzz_*.c) share: libFuzzer's entry point, a scratch folder
 * for parsers that only read from a path, and a splitter for inputs made of several files.
 * Each target is built twice: with libFuzzer (TR_FUZZ=ON, clang) and, in every other build,
 * with replay.c's main, which runs it over its committed corpus under ctest. */
#ifndef TR_FUZZ_H
#define TR_FUZZ_H

#include <stddef.h>
#include <stdint.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* This process's scratch folder (in /dev/shm, else /tmp): made at first use, removed at exit. */
const char *fz_dir(void);

/* Write size bytes to fz_dir()/name (replacing it); its path into path. A failure here is the
 * harness's, not the parser's: it aborts. */
void fz_write(const char *name, const void *data, size_t size, char *path, size_t cap);

/* Remove fz_dir()/name if it is there. */
void fz_remove(const char *name);

/* With TR_FUZZ_VERBOSE set, print what the parser said about an input (to see how deep the
 * seeds reach); else nothing. */
void fz_note(const char *what, const char *err);

/* The parts of data between the separator lines "\n=====\n" (FZ_SEP), at most max (the last
 * part keeps any further separators); returns the count, at least 1. */
#define FZ_SEP "\n=====\n"
int fz_split(const uint8_t *data, size_t size, const uint8_t **part, size_t *len, int max);

#endif
