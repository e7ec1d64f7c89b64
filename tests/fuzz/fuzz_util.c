/* The fuzz targets' helpers (fuzz.h): scratch files and multi-part inputs. */
#include "fuzz.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char scratch[256];

static void remove_scratch(void) {
    DIR *d = opendir(scratch);
    if (d) {
        struct dirent *e;
        char p[512];
        while ((e = readdir(d)))
            if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
                snprintf(p, sizeof p, "%s/%s", scratch, e->d_name);
                unlink(p);
            }
        closedir(d);
    }
    rmdir(scratch);
}

const char *fz_dir(void) {
    if (scratch[0]) return scratch;
    const char *roots[2] = {"/dev/shm", "/tmp"};
    for (int i = 0; i < 2 && !scratch[0]; i++) {
        snprintf(scratch, sizeof scratch, "%s/trfuzz-XXXXXX", roots[i]);
        if (!mkdtemp(scratch)) scratch[0] = 0;
    }
    if (!scratch[0]) {
        fprintf(stderr, "fuzz: cannot make a scratch folder in /dev/shm or /tmp\n");
        abort();
    }
    atexit(remove_scratch);
    return scratch;
}

void fz_write(const char *name, const void *data, size_t size, char *path, size_t cap) {
    snprintf(path, cap, "%s/%s", fz_dir(), name);
    FILE *f = fopen(path, "wb");
    if (!f || (size && fwrite(data, 1, size, f) != size) || fclose(f)) {
        fprintf(stderr, "fuzz: cannot write %s\n", path);
        abort();
    }
}

void fz_remove(const char *name) {
    char p[512];
    snprintf(p, sizeof p, "%s/%s", fz_dir(), name);
    unlink(p);
}

void fz_note(const char *what, const char *err) {
    if (getenv("TR_FUZZ_VERBOSE")) fprintf(stderr, "%s: %s\n", what, err);
}

int fz_split(const uint8_t *data, size_t size, const uint8_t **part, size_t *len, int max) {
    const size_t sl = strlen(FZ_SEP);
    int n = 0;
    size_t start = 0;
    for (size_t i = 0; n < max - 1 && i + sl <= size; i++)
        if (!memcmp(data + i, FZ_SEP, sl)) {
            part[n] = data + start;
            len[n++] = i - start;
            start = i + sl;
            i += sl - 1;
        }
    part[n] = data + start;
    len[n++] = size - start;
    return n;
}
