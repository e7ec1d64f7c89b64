/* Fuzz target: the safetensors reader of checkpoints and Hugging Face import
 * (trainer/checkpoint/checkpoint.h: tr_st_open, tr_st_find, tr_st_read_f32). The input is the
 * file; when
 * it opens, every tensor of a known dtype is read into a buffer of its shape's size. */
#include <stdlib.h>

#include "fuzz.h"
#include "trainer/checkpoint/checkpoint.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[512], err[1200];
    fz_write("model.safetensors", data, size, path, sizeof path);
    tr_st_file f;
    if (tr_st_open(&f, path, err, sizeof err)) {
        fz_note("safetensors", err);
        return 0;
    }
    for (int i = 0; i < f.n; i++) {
        const tr_st_entry *e = &f.e[i];
        if (tr_st_find(&f, e->name) == NULL) abort(); /* every entry can be found by name */
        size_t numel = 1;
        for (int d = 0; d < e->ndim; d++)
            numel *= (size_t)e->shape[d];
        if (e->dtype == TR_ST_OTHER || numel > ((size_t)1 << 24)) continue;
        float *out = malloc(numel ? numel * sizeof(float) : 1);
        if (out) tr_st_read_f32(&f, e, out, err, sizeof err);
        free(out);
    }
    tr_st_close(&f);
    return 0;
}
