/* The fuzz targets without libFuzzer: runs LLVMFuzzerTestOneInput once over every file named
 * on the command line or held in a folder named there (a target's corpus and its regression
 * inputs), each in a buffer of exactly its size so ASan sees any read past the end. Fails when
 * a folder is empty or unreadable, so a corpus that went missing does not pass as "no crash". */
#include "fuzz.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static int replay_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "replay: cannot open %s\n", path);
        return -1;
    }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *buf = malloc(n > 0 ? (size_t)n : 1);
    if (!buf || n < 0 || fread(buf, 1, (size_t)n, f) != (size_t)n) {
        fprintf(stderr, "replay: cannot read %s\n", path);
        fclose(f);
        free(buf);
        return -1;
    }
    fclose(f);
    LLVMFuzzerTestOneInput(buf, (size_t)n);
    free(buf);
    return 0;
}

static int by_name(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Every plain file of dir, in name order; the count run, or -1. */
static int replay_dir(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) {
        fprintf(stderr, "replay: cannot open folder %s\n", dir);
        return -1;
    }
    char **names = NULL;
    int n = 0, cap = 0, rc = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 64;
            char **g = realloc(names, (size_t)cap * sizeof *g);
            if (!g) abort();
            names = g;
        }
        size_t len = strlen(dir) + strlen(e->d_name) + 2;
        names[n] = malloc(len);
        if (!names[n]) abort();
        snprintf(names[n++], len, "%s/%s", dir, e->d_name);
    }
    closedir(d);
    qsort(names, (size_t)n, sizeof *names, by_name);
    int ran = 0;
    for (int i = 0; i < n; i++) {
        struct stat st;
        if (!stat(names[i], &st) && S_ISREG(st.st_mode)) {
            if (replay_file(names[i])) rc = -1;
            ran++;
        }
        free(names[i]);
    }
    free(names);
    if (!ran) fprintf(stderr, "replay: %s holds no inputs\n", dir);
    return rc || !ran ? -1 : ran;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s CORPUS_DIR_OR_FILE...\n", argv[0]);
        return 2;
    }
    int total = 0;
    for (int i = 1; i < argc; i++) {
        struct stat st;
        int k = !stat(argv[i], &st) && S_ISDIR(st.st_mode) ? replay_dir(argv[i])
                                                             : (replay_file(argv[i]) ? -1 : 1);
        if (k < 0) return 1;
        total += k;
    }
    printf("%s: %d inputs replayed, none crashed\n", argv[0], total);
    return 0;
}
