/* Helpers shared by every backend table: storage element sizes and addressing. */
#include "model/backend.h"

#include <stdint.h>

size_t tr_dtype_size(tr_dtype t) {
    return t == TR_DTYPE_BF16 ? 2 : 4;
}

tr_buf *tr_buf_at(const tr_backend *be, const tr_buf *base, size_t i) {
    return (char *)(uintptr_t)base + i * tr_dtype_size(be->dtype);
}
