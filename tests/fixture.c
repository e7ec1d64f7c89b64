/* TRFX reader: "TRFX" | u32 version 1 | u32 count | entries (see tests/reference/README.md). */
#include "fixture.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int rd(FILE *f, void *p, size_t n) {
    return fread(p, 1, n, f) == n ? 0 : -1;
}

int fx_load(fx_file *out, const char *path) {
    memset(out, 0, sizeof(*out));
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "%s: cannot open\n", path);
        return -1;
    }
    char magic[4];
    uint32_t version, count;
    if (rd(f, magic, 4) || memcmp(magic, "TRFX", 4) || rd(f, &version, 4) || version != 1 ||
        rd(f, &count, 4)) {
        fprintf(stderr, "%s: not a TRFX version 1 file\n", path);
        fclose(f);
        return -1;
    }
    out->e = calloc(count, sizeof(fx_entry));
    out->count = (int)count;
    for (uint32_t i = 0; i < count; i++) {
        fx_entry *e = &out->e[i];
        uint32_t len, dtype, ndim, d;
        if (rd(f, &len, 4) || len >= sizeof(e->name) || rd(f, e->name, len) || rd(f, &dtype, 4) ||
            rd(f, &ndim, 4) || ndim > 4)
            goto bad;
        e->dtype = (int)dtype;
        e->ndim = (int)ndim;
        e->numel = 1;
        for (uint32_t k = 0; k < ndim; k++) {
            if (rd(f, &d, 4)) goto bad;
            e->dims[k] = (int)d;
            e->numel *= d;
        }
        e->data = malloc(e->numel * 4 + 1);
        if (rd(f, e->data, e->numel * 4)) goto bad;
    }
    fclose(f);
    return 0;
bad:
    fprintf(stderr, "%s: truncated or malformed\n", path);
    fclose(f);
    fx_free(out);
    return -1;
}

const fx_entry *fx_find(const fx_file *f, const char *name) {
    for (int i = 0; i < f->count; i++)
        if (!strcmp(f->e[i].name, name)) return &f->e[i];
    return NULL;
}

const fx_entry *fx_nth(const fx_file *f, const char *prefix, int n) {
    size_t len = strlen(prefix);
    for (int i = 0; i < f->count; i++)
        if (!strncmp(f->e[i].name, prefix, len) && n-- == 0) return &f->e[i];
    return NULL;
}

void fx_free(fx_file *f) {
    if (!f->e) return;
    for (int i = 0; i < f->count; i++) free(f->e[i].data);
    free(f->e);
    f->e = NULL;
    f->count = 0;
}
