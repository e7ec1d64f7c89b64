/* A run's output files, for every part of the run that writes one (setup, the dumps,
 * provenance): one line for a file that could not be written, and a close that notices what
 * did not reach the file. Beneath the rest of trainer/run/: it calls none of it. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "trainer/run/run.h"

/* One line for an output file that could not be written (opened, written or closed). */
int run_cannot_write(const char *path, int e) {
    fprintf(stderr, "trainer run: cannot write '%s': %s\n", path, strerror(e ? e : EIO));
    return -1;
}

int run_write_whole(const char *path, const char *text) {
    char tmp[TR_PATH_MAX + 48];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f) return run_cannot_write(tmp, errno);
    fputs(text, f);
    if (run_close_output(f, tmp)) return unlink(tmp), -1;
    if (rename(tmp, path)) {
        int e = errno;
        unlink(tmp);
        return run_cannot_write(path, e);
    }
    return 0;
}

/* Closes an output file; -1 (and the line) when anything written to it did not reach it. */
int run_close_output(FILE *f, const char *path) {
    int e = ferror(f) ? (errno ? errno : EIO) : 0;
    if (fclose(f) && !e) e = errno ? errno : EIO;
    return e ? run_cannot_write(path, e) : 0;
}
