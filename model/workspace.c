/* The device workspaces of a model's kernels, sized by one function from its shapes: the
 * plan's memory estimate (tr_memory.workspace) and the CUDA backend's one allocation at the
 * model's start (tr_backend.reserve) both take these figures, so that the device memory a run
 * allocates is the memory it predicted, byte for byte (issue 33). Each slot is a bound over
 * every call the model makes: model/cuda/ names the same constants (backend.h). */
#include "model/model_private.h"

size_t tr_workspace_bytes(const tr_workspace *w) {
    size_t t = 0;
    for (int k = 0; k < TR_WS_COUNT; k++) t += w->bytes[k];
    return t;
}

void tr_workspace_of(const tr_model *m, tr_workspace *w) {
    size_t N = (size_t)m->maxB * (size_t)m->maxT, T = (size_t)m->maxT;
    size_t C = (size_t)m->desc.dim, width = C, heads = 0, half = 0, vendor = 0;
    const tr_backend *be = m->be ? m->be : tr_backend_sizing();
    if (m->width_scratch > width) width = m->width_scratch; /* fc, qkv: bias gradients */
    if ((size_t)m->Vl > width) width = (size_t)m->Vl;       /* a biased head */
    for (int i = 0; i < m->n_ops; i++) {
        const op_t *op = &m->ops[i];
        if (op->kind != OP_ATTENTION) continue;
        size_t hd = C / (size_t)op->node->heads;
        if ((size_t)op->H > heads) heads = (size_t)op->H;
        if (hd / 2 > half) half = hd / 2;
        if (be && be->attention_workspace) { /* at the largest micro-batch: the same or less at
                                                any smaller one */
            size_t v = be->attention_workspace(m->maxB, m->maxT, op->H, op->KV, (int)hd);
            if (v > vendor) vendor = v;
        }
    }
    /* adamw_multi's stretches: each tensor's part of each piece, and a piece per tensor at
       most (the data-parallel buckets: parallel/dp.c) */
    size_t segs = 2 * (size_t)m->n_params + 1;
    size_t blocks = m->n_pad / TR_WS_ADAMW_CHUNK + segs;
    *w = (tr_workspace){{0}};
    w->bytes[TR_WS_CUBLASLT] = TR_WS_CUBLASLT_BYTES;
    w->bytes[TR_WS_REDUCE] = 2 * ((N + TR_WS_COLSUM_ROWS - 1) / TR_WS_COLSUM_ROWS) * width *
                             sizeof(float);
    w->bytes[TR_WS_EMBED] = (3 * N + 1) * sizeof(int);
    w->bytes[TR_WS_ROPE] = T * half * 2 * sizeof(float);
    w->bytes[TR_WS_ATTN] = N * heads * sizeof(float);
    w->bytes[TR_WS_SUMSQ] = (TR_WS_SUMSQ_BLOCKS + 1) * sizeof(double);
    w->bytes[TR_WS_ADAMW_SEGS] = segs * TR_WS_ADAMW_SEG_BYTES;
    w->bytes[TR_WS_ADAMW_BLOCKS] = blocks * TR_WS_ADAMW_BLOCK_BYTES;
    w->bytes[TR_WS_EMPTY] = TR_WS_EMPTY_BYTES;
    w->bytes[TR_WS_CUDNN] = vendor;
}
