/* Helpers shared by every backend table: storage element sizes and addressing. */
#include "model/backend.h"

#include <stdint.h>

#include "parallel/comm/env.h"

static tr_attention_impl attention; /* TR_CUDA_ATTENTION */
static const tr_backend *sizing;    /* tr_backend_set_sizing */

void tr_backend_set_sizing(const tr_backend *be) {
    sizing = be;
}

const tr_backend *tr_backend_sizing(void) {
    return sizing;
}

int tr_backend_env(char *err, size_t errlen) {
    static const char *const kernels[] = {"tc", "simple", "cudnn", "auto", NULL};
    int k = 0;
    if (tr_env_word("TR_CUDA_ATTENTION", kernels, &k, err, errlen) < 0) return -1;
    attention = (tr_attention_impl)k;
    return 0;
}

void tr_backend_set_simple_attention(int on) {
    attention = on ? TR_ATTENTION_SIMPLE : TR_ATTENTION_TC;
}

int tr_backend_simple_attention(void) {
    return attention == TR_ATTENTION_SIMPLE;
}

void tr_backend_set_attention(tr_attention_impl a) {
    attention = a;
}

tr_attention_impl tr_backend_attention(void) {
    return attention;
}

size_t tr_dtype_size(tr_dtype t) {
    return t == TR_DTYPE_BF16 ? 2 : 4;
}

tr_buf *tr_buf_at(const tr_backend *be, const tr_buf *base, size_t i) {
    return (char *)(uintptr_t)base + i * tr_dtype_size(be->dtype);
}
