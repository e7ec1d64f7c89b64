/* Helpers shared by every backend table: storage element sizes and addressing. */
#include "model/backend.h"

#include <stdint.h>

#include "parallel/comm/env.h"

static int simple_attention; /* TR_CUDA_ATTENTION=simple */

int tr_backend_env(char *err, size_t errlen) {
    static const char *const kernels[] = {"tc", "simple", NULL};
    int k = 0;
    if (tr_env_word("TR_CUDA_ATTENTION", kernels, &k, err, errlen) < 0) return -1;
    simple_attention = k == 1;
    return 0;
}

void tr_backend_set_simple_attention(int on) {
    simple_attention = on != 0;
}

int tr_backend_simple_attention(void) {
    return simple_attention;
}

size_t tr_dtype_size(tr_dtype t) {
    return t == TR_DTYPE_BF16 ? 2 : 4;
}

tr_buf *tr_buf_at(const tr_backend *be, const tr_buf *base, size_t i) {
    return (char *)(uintptr_t)base + i * tr_dtype_size(be->dtype);
}
