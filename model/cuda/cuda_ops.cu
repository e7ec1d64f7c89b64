/* The CUDA backend's memory-bound operations: embeddings, norms, rotary embedding, GELU and
 * SwiGLU, residual add, softmax cross entropy, and the optimizer's helpers. Each launcher takes
 * bf (1: bf16 storage, 0: fp32) and works for both; all arithmetic and every sum is fp32 (sumsq:
 * double), and every reduction runs in a fixed order, so results are bitwise reproducible. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/cuda/cuda_private.h"
#include "model/mutant.h"

/* Rows per partial-sum chunk of the column sums (dbias, norm weight grads): fixed, so the
 * order of every sum depends only on N. */
#define COLSUM_ROWS TR_WS_COLSUM_ROWS

/* ---- column sums: per-chunk partials, then a fixed-order reduce ------------------------- */

/* grid (ceil(C/32), nchunk), block (32, 8): part[s][c] (and part2) over rows of chunk s */
static __global__ void colsum_partial(float *part, float *part2, const void *x, const void *y,
                                      const float *mean, const float *rstd, int N, int C, int mode,
                                      int bf) {
    __shared__ float red[8][33], red2[8][33];
    int tx = threadIdx.x, ty = threadIdx.y, c = blockIdx.x * 32 + tx, s = blockIdx.y;
    int r0 = s * COLSUM_ROWS, r1 = min(N, r0 + COLSUM_ROWS);
    float a = 0.0f, a2 = 0.0f;
    if (c < C) {
        for (int r = r0 + ty; r < r1; r += 8) {
            size_t i = (size_t)r * C + c;
            float g = ldf(x, i, bf);
            if (mode == 0) {
                a += g;
            } else if (mode == 1) {
                a += g * (ldf(y, i, bf) - mean[r]) * rstd[r];
                a2 += g;
            } else {
                a += g * ldf(y, i, bf) * rstd[r];
            }
        }
    }
    red[ty][tx] = a;
    red2[ty][tx] = a2;
    __syncthreads();
    if (ty == 0 && c < C) {
        float t = 0.0f, t2 = 0.0f;
        for (int k = 0; k < 8; k++) {
            t += red[k][tx];
            t2 += red2[k][tx];
        }
        part[(size_t)s * C + c] = t;
        if (part2) part2[(size_t)s * C + c] = t2;
    }
}

static __global__ void colsum_finish(void *acc, const float *part, int nchunk, int C, int bf) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float t = 0.0f;
    for (int s = 0; s < nchunk; s++) t += part[(size_t)s * C + c];
    stf(acc, c, ldf(acc, c, bf) + t, bf);
}

extern "C" void tr_cuda_colsum(int bf, tr_buf *acc, tr_buf *acc2, const tr_buf *x, const tr_buf *y,
                               const float *mean, const float *rstd, int N, int C, int mode) {
    int nchunk = (N + COLSUM_ROWS - 1) / COLSUM_ROWS;
    if (nchunk == 0 || C == 0) return;
    float *part = (float *)tr_cuda_scratch(SCR_REDUCE, sizeof(float) * (size_t)nchunk * C * 2);
    float *part2 = acc2 ? part + (size_t)nchunk * C : NULL;
    dim3 grid((C + 31) / 32, nchunk), block(32, 8);
    colsum_partial<<<grid, block, 0, tr_cuda_stream>>>(part, part2, x, y, mean, rstd, N, C, mode, bf);
    CK_LAUNCH();
    colsum_finish<<<(C + TPB - 1) / TPB, TPB, 0, tr_cuda_stream>>>(acc, part, nchunk, C, bf);
    CK_LAUNCH();
    if (acc2) {
        colsum_finish<<<(C + TPB - 1) / TPB, TPB, 0, tr_cuda_stream>>>(acc2, part2, nchunk, C, bf);
        CK_LAUNCH();
    }
}

/* ---- embeddings ------------------------------------------------------------------------ */

/* one thread per 8 columns of a row: out[n, c..c+7] = wte[tokens[n], c..c+7], zeros for a
 * token < 0 (another rank's part of a vocabulary split by tensor parallelism) */
static __global__ void embedding_fwd_k(void *out, const int *tokens, const void *wte, int N, int C,
                                       int bf, int vec) {
    int C8 = (C + 7) / 8;
    for (size_t t = blockIdx.x * (size_t)blockDim.x + threadIdx.x; t < (size_t)N * C8;
         t += (size_t)gridDim.x * blockDim.x) {
        size_t n = t / C8, c = (t % C8) * 8;
        size_t dst = n * C;
        float v[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        if (tokens[n] >= 0) {
            size_t src = (size_t)tokens[n] * C;
            ld8(v, wte, src + c, src + C, bf, vec);
        }
        st8(out, dst + c, dst + C, v, bf, vec);
    }
}

extern "C" void tr_cuda_embedding_forward(int bf, tr_buf *out, const int *tokens, const tr_buf *wte,
                                          int N, int C) {
    int vec = C % 8 == 0 && tr_cuda_aligned16(out, wte, out, out);
    size_t work = (size_t)N * ((C + 7) / 8);
    embedding_fwd_k<<<tr_cuda_grid(work, TPB), TPB, 0, tr_cuda_stream>>>(out, tokens, wte, N, C, bf,
                                                                        vec);
    CK_LAUNCH();
}

/* One block row per distinct token u: its rows perm[start[u] .. start[u+1]) (in token order,
 * from a stable sort) are summed in that order, then added to dwte[tok[u]]. No atomics. */
static __global__ void embedding_bwd_k(void *dwte, const void *dout, const int *perm,
                                       const int *seg_tok, const int *seg_start, int C, int bf,
                                       int vec) {
    int u = blockIdx.x;
    size_t c = ((size_t)blockIdx.y * blockDim.x + threadIdx.x) * 8;
    if (c >= (size_t)C) return;
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0}, v[8];
    for (int r = seg_start[u]; r < seg_start[u + 1]; r++) {
        size_t row = (size_t)perm[r] * C;
        ld8(v, dout, row + c, row + C, bf, vec);
#pragma unroll
        for (int k = 0; k < 8; k++) acc[k] += v[k];
    }
    size_t row = (size_t)seg_tok[u] * C;
    ld8(v, dwte, row + c, row + C, bf, vec);
#pragma unroll
    for (int k = 0; k < 8; k++) v[k] += acc[k];
    st8(dwte, row + c, row + C, v, bf, vec);
}

/* host buffers for the token sort: grown, never shrunk (one GPU per process) */
static int *h_tok, *h_pack, *h_count;
static size_t h_tok_cap, h_pack_cap, h_count_cap;

static void *grow(void *p, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return p;
    void *q = realloc(p, need * elem);
    if (!q) tr_cuda_fail("realloc (embedding backward host buffers)", "out of memory", __FILE__,
                         __LINE__);
    *cap = need;
    return q;
}

extern "C" void tr_cuda_embedding_backward(int bf, tr_buf *dwte, const tr_buf *dout,
                                           const int *tokens, int N, int C) {
    if (N <= 0) return;
    /* The tokens are needed on the host for a stable counting sort. This is the last op of a
     * backward, so waiting for the stream here costs next to nothing. */
    h_tok = (int *)grow(h_tok, &h_tok_cap, (size_t)N, sizeof(int));
    h_pack = (int *)grow(h_pack, &h_pack_cap, (size_t)3 * N + 1, sizeof(int));
    CK(cudaMemcpyAsync(h_tok, tokens, sizeof(int) * (size_t)N, cudaMemcpyDeviceToHost,
                       tr_cuda_stream));
    TR_WAIT("cuda.emb_tokens", CK(cudaStreamSynchronize(tr_cuda_stream)));
    /* tokens < 0 (another rank's vocabulary rows, tensor parallelism) add nothing: left out */
    int maxt = -1, Nv = 0;
    for (int n = 0; n < N; n++) {
        maxt = h_tok[n] > maxt ? h_tok[n] : maxt;
        Nv += h_tok[n] >= 0;
    }
    if (Nv == 0) return;
    h_count = (int *)grow(h_count, &h_count_cap, (size_t)maxt + 2, sizeof(int));
    memset(h_count, 0, sizeof(int) * ((size_t)maxt + 2));
    for (int n = 0; n < N; n++)
        if (h_tok[n] >= 0) h_count[h_tok[n] + 1]++;
    /* pack: perm (Nv) | seg_tok (U) | seg_start (U + 1), U distinct tokens */
    int U = 0;
    for (int t = 0; t <= maxt; t++) U += h_count[t + 1] > 0;
    int *perm = h_pack, *seg_tok = h_pack + Nv, *seg_start = seg_tok + U;
    int u = 0;
    for (int t = 0; t <= maxt; t++) {
        if (h_count[t + 1] > 0) {
            seg_tok[u] = t;
            seg_start[u] = h_count[t];
            u++;
        }
        h_count[t + 1] += h_count[t]; /* exclusive prefix: h_count[t] = first slot of t */
    }
    seg_start[U] = Nv;
    for (int n = 0; n < N; n++)
        if (h_tok[n] >= 0) perm[h_count[h_tok[n]]++] = n; /* stable */
    size_t bytes = sizeof(int) * ((size_t)Nv + 2 * (size_t)U + 1);
    int *d = (int *)tr_cuda_scratch(SCR_EMBED, bytes);
    CK(cudaMemcpyAsync(d, h_pack, bytes, cudaMemcpyHostToDevice, tr_cuda_stream));
    int vec = C % 8 == 0 && tr_cuda_aligned16(dwte, dout, dwte, dwte);
    int C8 = (C + 7) / 8, bx = 128;
    dim3 grid(U, (C8 + bx - 1) / bx);
    embedding_bwd_k<<<grid, bx, 0, tr_cuda_stream>>>(dwte, dout, d, d + Nv, d + Nv + U, C, bf, vec);
    CK_LAUNCH();
    /* h_pack is rewritten by the next call only after its own stream synchronize above */
}

/* x[b, t, :] += wpe[t, :] */
static __global__ void positions_fwd_k(void *x, const void *wpe, int BT, int T, int C, int bf,
                                       int vec) {
    int C8 = (C + 7) / 8;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (size_t)BT * C8;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t bt = i / C8, c = (i % C8) * 8, row = bt * C, prow = (bt % T) * C;
        float a[8], p[8];
        ld8(a, x, row + c, row + C, bf, vec);
        ld8(p, wpe, prow + c, prow + C, bf, vec);
#pragma unroll
        for (int k = 0; k < 8; k++) a[k] += p[k];
        st8(x, row + c, row + C, a, bf, vec);
    }
}

extern "C" void tr_cuda_positions_forward(int bf, tr_buf *x, const tr_buf *wpe, int B, int T, int C) {
    int vec = C % 8 == 0 && tr_cuda_aligned16(x, wpe, x, x);
    size_t work = (size_t)B * T * ((C + 7) / 8);
    positions_fwd_k<<<tr_cuda_grid(work, TPB), TPB, 0, tr_cuda_stream>>>(x, wpe, B * T, T, C, bf,
                                                                        vec);
    CK_LAUNCH();
}

/* dwpe[t, :] += sum over b in order of dx[b, t, :] */
static __global__ void positions_bwd_k(void *dwpe, const void *dx, int B, int T, int C, int bf,
                                       int vec) {
    int C8 = (C + 7) / 8;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (size_t)T * C8;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t t = i / C8, c = (i % C8) * 8;
        float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0}, v[8];
        for (int b = 0; b < B; b++) {
            size_t row = ((size_t)b * T + t) * C;
            ld8(v, dx, row + c, row + C, bf, vec);
#pragma unroll
            for (int k = 0; k < 8; k++) acc[k] += v[k];
        }
        ld8(v, dwpe, t * C + c, t * C + C, bf, vec);
#pragma unroll
        for (int k = 0; k < 8; k++) v[k] += acc[k];
        st8(dwpe, t * C + c, t * C + C, v, bf, vec);
    }
}

extern "C" void tr_cuda_positions_backward(int bf, tr_buf *dwpe, const tr_buf *dx, int B, int T,
                                           int C) {
    int vec = C % 8 == 0 && tr_cuda_aligned16(dwpe, dx, dwpe, dwpe);
    size_t work = (size_t)T * ((C + 7) / 8);
    positions_bwd_k<<<tr_cuda_grid(work, TPB), TPB, 0, tr_cuda_stream>>>(dwpe, dx, B, T, C, bf, vec);
    CK_LAUNCH();
}

/* ---- norms: one warp per row, 8 rows per block ----------------------------------------- */

#define ROWS_PER_BLOCK 8

static __global__ void layernorm_fwd_k(void *out, float *mean, float *rstd, const void *inp,
                                       const void *w, const void *b, int N, int C, float eps, int bf,
                                       int vec) {
    int row = blockIdx.x * ROWS_PER_BLOCK + threadIdx.y, lane = threadIdx.x;
    if (row >= N) return;
    size_t base = (size_t)row * C;
    float v[8], s = 0.0f;
    for (int c = lane * 8; c < C; c += 256) {
        ld8(v, inp, base + c, base + C, bf, vec);
#pragma unroll
        for (int k = 0; k < 8; k++) s += v[k]; /* missing elements read as 0 */
    }
    float m = warp_sum(s) / C, q = 0.0f;
    for (int c = lane * 8; c < C; c += 256) { /* two-pass variance: no cancellation */
        ld8(v, inp, base + c, base + C, bf, vec);
#pragma unroll
        for (int k = 0; k < 8; k++) {
            float d = c + k < C ? v[k] - m : 0.0f;
            q += d * d;
        }
    }
    float rs = 1.0f / sqrtf(warp_sum(q) / C + eps);
    for (int c = lane * 8; c < C; c += 256) {
        float wv[8], bv[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        ld8(v, inp, base + c, base + C, bf, vec);
        ld8(wv, w, c, C, bf, vec);
        if (b) ld8(bv, b, c, C, bf, vec);
#pragma unroll
        for (int k = 0; k < 8; k++) v[k] = (v[k] - m) * rs * wv[k] + bv[k];
        st8(out, base + c, base + C, v, bf, vec);
    }
    if (lane == 0) {
        if (mean) mean[row] = m;
        if (rstd) rstd[row] = rs;
    }
}

extern "C" void tr_cuda_layernorm_forward(int bf, tr_buf *out, float *mean, float *rstd,
                                          const tr_buf *inp, const tr_buf *w, const tr_buf *b, int N,
                                          int C, float eps) {
    int vec = C % 8 == 0 && tr_cuda_aligned16(out, inp, w, b ? b : w);
    dim3 block(32, ROWS_PER_BLOCK);
    layernorm_fwd_k<<<(N + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK, block, 0, tr_cuda_stream>>>(
        out, mean, rstd, inp, w, b, N, C, eps, bf, vec);
    CK_LAUNCH();
}

/* sum = a + b, rounded to the storage dtype, then LayerNorm (rms = 0) or RMSNorm (rms = 1) of
 * that rounded sum, as the unfused add + norm compute it; each lane rereads only what it
 * wrote itself */
static __global__ void residual_norm_fwd_k(void *sum, void *out, float *mean, float *rstd,
                                           const void *a, const void *b, const void *w,
                                           const void *bias, int N, int C, float eps, int rms,
                                           int bf, int vec) {
    int row = blockIdx.x * ROWS_PER_BLOCK + threadIdx.y, lane = threadIdx.x;
    if (row >= N) return;
    size_t base = (size_t)row * C;
    float v[8], u[8], s = 0.0f;
    for (int c = lane * 8; c < C; c += 256) {
        ld8(v, a, base + c, base + C, bf, vec);
        ld8(u, b, base + c, base + C, bf, vec);
#pragma unroll
        for (int k = 0; k < 8; k++) {
            float x = v[k] + u[k];
            v[k] = bf ? __bfloat162float(__float2bfloat16_rn(x)) : x;
            s += rms ? v[k] * v[k] : v[k]; /* missing elements are 0 */
        }
        st8(sum, base + c, base + C, v, bf, vec);
    }
    float m = 0.0f, rs;
    if (rms) {
        rs = 1.0f / sqrtf(warp_sum(s) / C + eps);
    } else {
        m = warp_sum(s) / C;
        float q = 0.0f;
        for (int c = lane * 8; c < C; c += 256) { /* two-pass variance */
            ld8(v, sum, base + c, base + C, bf, vec);
#pragma unroll
            for (int k = 0; k < 8; k++) {
                float d = c + k < C ? v[k] - m : 0.0f;
                q += d * d;
            }
        }
        rs = 1.0f / sqrtf(warp_sum(q) / C + eps);
    }
    for (int c = lane * 8; c < C; c += 256) {
        float wv[8], bv[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        ld8(v, sum, base + c, base + C, bf, vec);
        ld8(wv, w, c, C, bf, vec);
        if (bias && !rms) ld8(bv, bias, c, C, bf, vec);
#pragma unroll
        for (int k = 0; k < 8; k++) v[k] = (v[k] - m) * rs * wv[k] + bv[k];
        st8(out, base + c, base + C, v, bf, vec);
    }
    if (lane == 0) {
        if (mean && !rms) mean[row] = m;
        if (rstd) rstd[row] = rs;
    }
}

extern "C" void tr_cuda_residual_norm_forward(int bf, tr_buf *sum, tr_buf *out, float *mean,
                                              float *rstd, const tr_buf *a, const tr_buf *b,
                                              const tr_buf *w, const tr_buf *bias, int N, int C,
                                              float eps, int rms) {
    int vec = C % 8 == 0 && tr_cuda_aligned16(sum, out, a, b) &&
              tr_cuda_aligned16(w, bias ? bias : w, w, w);
    dim3 block(32, ROWS_PER_BLOCK);
    residual_norm_fwd_k<<<(N + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK, block, 0, tr_cuda_stream>>>(
        sum, out, mean, rstd, a, b, w, bias, N, C, eps, rms, bf, vec);
    CK_LAUNCH();
}

/* dinp = rstd * (dout*w - mean(dout*w) - nrm * mean(dout*w*nrm)) */
static __global__ void layernorm_bwd_k(void *dinp, const void *dout, const void *inp, const void *w,
                                       const float *mean, const float *rstd, int N, int C, int bf,
                                       int vec) {
    int row = blockIdx.x * ROWS_PER_BLOCK + threadIdx.y, lane = threadIdx.x;
    if (row >= N) return;
    size_t base = (size_t)row * C;
    float m = mean[row], rs = rstd[row], a = 0.0f, bs = 0.0f;
    float x[8], g[8], wv[8];
    for (int c = lane * 8; c < C; c += 256) {
        ld8(x, inp, base + c, base + C, bf, vec);
        ld8(g, dout, base + c, base + C, bf, vec);
        ld8(wv, w, c, C, bf, vec);
#pragma unroll
        for (int k = 0; k < 8; k++) { /* missing elements: g = 0, so they add nothing */
            float dn = g[k] * wv[k];
            a += dn;
            bs += dn * (x[k] - m) * rs;
        }
    }
    a = warp_sum(a) / C;
    bs = warp_sum(bs) / C;
    for (int c = lane * 8; c < C; c += 256) {
        ld8(x, inp, base + c, base + C, bf, vec);
        ld8(g, dout, base + c, base + C, bf, vec);
        ld8(wv, w, c, C, bf, vec);
#pragma unroll
        for (int k = 0; k < 8; k++) x[k] = rs * (g[k] * wv[k] - a - (x[k] - m) * rs * bs);
        st8(dinp, base + c, base + C, x, bf, vec);
    }
}

extern "C" void tr_cuda_layernorm_backward(int bf, tr_buf *dinp, tr_buf *dw, tr_buf *db,
                                           const tr_buf *dout, const tr_buf *inp, const tr_buf *w,
                                           const float *mean, const float *rstd, int N, int C) {
    int vec = C % 8 == 0 && tr_cuda_aligned16(dinp, dout, inp, w);
    dim3 block(32, ROWS_PER_BLOCK);
    layernorm_bwd_k<<<(N + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK, block, 0, tr_cuda_stream>>>(
        dinp, dout, inp, w, mean, rstd, N, C, bf, vec);
    CK_LAUNCH();
    tr_cuda_colsum(bf, dw, db, dout, inp, mean, rstd, N, C, 1);
}

static __global__ void rmsnorm_fwd_k(void *out, float *rstd, const void *inp, const void *w, int N,
                                     int C, float eps, int bf, int vec) {
    int row = blockIdx.x * ROWS_PER_BLOCK + threadIdx.y, lane = threadIdx.x;
    if (row >= N) return;
    size_t base = (size_t)row * C;
    float v[8], wv[8], s = 0.0f;
    for (int c = lane * 8; c < C; c += 256) {
        ld8(v, inp, base + c, base + C, bf, vec);
#pragma unroll
        for (int k = 0; k < 8; k++) s += v[k] * v[k];
    }
    float rs = 1.0f / sqrtf(warp_sum(s) / C + eps);
    for (int c = lane * 8; c < C; c += 256) {
        ld8(v, inp, base + c, base + C, bf, vec);
        ld8(wv, w, c, C, bf, vec);
#pragma unroll
        for (int k = 0; k < 8; k++) v[k] = v[k] * rs * wv[k];
        st8(out, base + c, base + C, v, bf, vec);
    }
    if (lane == 0 && rstd) rstd[row] = rs;
}

extern "C" void tr_cuda_rmsnorm_forward(int bf, tr_buf *out, float *rstd, const tr_buf *inp,
                                        const tr_buf *w, int N, int C, float eps) {
    int vec = C % 8 == 0 && tr_cuda_aligned16(out, inp, w, w);
    dim3 block(32, ROWS_PER_BLOCK);
    rmsnorm_fwd_k<<<(N + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK, block, 0, tr_cuda_stream>>>(
        out, rstd, inp, w, N, C, eps, bf, vec);
    CK_LAUNCH();
}

/* dx = rs * dout*w - x * rs^3 * mean(dout*w*x) */
static __global__ void rmsnorm_bwd_k(void *dinp, const void *dout, const void *inp, const void *w,
                                     const float *rstd, int N, int C, int bf, int vec) {
    int row = blockIdx.x * ROWS_PER_BLOCK + threadIdx.y, lane = threadIdx.x;
    if (row >= N) return;
    size_t base = (size_t)row * C;
    float rs = rstd[row], s = 0.0f, x[8], g[8], wv[8];
    for (int c = lane * 8; c < C; c += 256) {
        ld8(x, inp, base + c, base + C, bf, vec);
        ld8(g, dout, base + c, base + C, bf, vec);
        ld8(wv, w, c, C, bf, vec);
#pragma unroll
        for (int k = 0; k < 8; k++) s += g[k] * wv[k] * x[k];
    }
    float k3 = rs * rs * rs * warp_sum(s) / C;
    for (int c = lane * 8; c < C; c += 256) {
        ld8(x, inp, base + c, base + C, bf, vec);
        ld8(g, dout, base + c, base + C, bf, vec);
        ld8(wv, w, c, C, bf, vec);
#pragma unroll
        for (int k = 0; k < 8; k++) x[k] = rs * g[k] * wv[k] - x[k] * k3;
        st8(dinp, base + c, base + C, x, bf, vec);
    }
}

extern "C" void tr_cuda_rmsnorm_backward(int bf, tr_buf *dinp, tr_buf *dw, const tr_buf *dout,
                                         const tr_buf *inp, const tr_buf *w, const float *rstd,
                                         int N, int C) {
    int vec = C % 8 == 0 && tr_cuda_aligned16(dinp, dout, inp, w);
    dim3 block(32, ROWS_PER_BLOCK);
    rmsnorm_bwd_k<<<(N + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK, block, 0, tr_cuda_stream>>>(
        dinp, dout, inp, w, rstd, N, C, bf, vec);
    CK_LAUNCH();
    tr_cuda_colsum(bf, dw, NULL, dout, inp, NULL, rstd, N, C, 2);
}

/* ---- rotary embedding ------------------------------------------------------------------ */

/* tab[t, i] = (cos, sin) of t * theta^(-2i/hd), the angle in double as on the CPU */
static __global__ void rope_table_k(float2 *tab, int T, int h2, int hd, float theta) {
    for (size_t j = blockIdx.x * (size_t)blockDim.x + threadIdx.x; j < (size_t)T * h2;
         j += (size_t)gridDim.x * blockDim.x) {
        int t = (int)(j / h2), i = (int)(j % h2);
        double ang = t * pow((double)theta, -2.0 * i / hd);
        tab[j] = make_float2((float)cos(ang), (float)sin(ang));
    }
}

/* pairs (i, i + hd/2) of the H query and KV key heads of each row, rotated by dir * angle */
static __global__ void rope_apply_k(void *qkv, const float2 *tab, int BT, int T, int H, int KV,
                                    int hd, float dir, int bf) {
    int h2 = hd / 2, nh = H + KV;
    size_t S = (size_t)(H + 2 * KV) * hd, total = (size_t)BT * nh * h2;
    for (size_t j = blockIdx.x * (size_t)blockDim.x + threadIdx.x; j < total;
         j += (size_t)gridDim.x * blockDim.x) {
        int i = (int)(j % h2);
        size_t rest = j / h2;
        int h = (int)(rest % nh);
        size_t bt = rest / nh;
        float2 cs = tab[(bt % T) * h2 + i];
        float c = cs.x, s = dir * cs.y;
        size_t i1 = bt * S + (size_t)h * hd + i, i2 = i1 + h2;
        float a = ldf(qkv, i1, bf), b = ldf(qkv, i2, bf);
        stf(qkv, i1, a * c - b * s, bf);
        stf(qkv, i2, b * c + a * s, bf);
    }
}

static void rope(int bf, tr_buf *qkv, int B, int T, int H, int KV, int hd, float theta, float dir) {
    int h2 = hd / 2;
    float2 *tab = (float2 *)tr_cuda_scratch(SCR_ROPE, sizeof(float2) * (size_t)T * h2);
    rope_table_k<<<tr_cuda_grid((size_t)T * h2, TPB), TPB, 0, tr_cuda_stream>>>(tab, T, h2, hd, theta);
    CK_LAUNCH();
    size_t work = (size_t)B * T * (H + KV) * h2;
    rope_apply_k<<<tr_cuda_grid(work, TPB), TPB, 0, tr_cuda_stream>>>(qkv, tab, B * T, T, H, KV, hd,
                                                                     dir, bf);
    CK_LAUNCH();
}
extern "C" void tr_cuda_rope_forward(int bf, tr_buf *qkv, int B, int T, int H, int KV, int hd,
                                     float theta) {
    rope(bf, qkv, B, T, H, KV, hd, theta, 1.0f);
}
extern "C" void tr_cuda_rope_backward(int bf, tr_buf *dqkv, int B, int T, int H, int KV, int hd,
                                      float theta) {
    rope(bf, dqkv, B, T, H, KV, hd, theta, -1.0f);
}

/* ---- pointwise ------------------------------------------------------------------------- */

#define GELU_K 0.7978845608028654f /* sqrt(2/pi) */
#define GELU_C 0.044715f

/* grid-stride over 8-element chunks of n elements */
#define FOR_CHUNKS(i, n)                                                                          \
    for (size_t i = (blockIdx.x * (size_t)blockDim.x + threadIdx.x) * 8; i < (n);                \
         i += (size_t)gridDim.x * blockDim.x * 8)

/* 0.5x(1 + tanh(u)) = x * sigmoid(2u), u = k(x + c x^3) */
static __global__ void gelu_fwd_k(void *out, const void *inp, size_t n, int bf, int vec) {
    FOR_CHUNKS(i, n) {
        float x[8];
        ld8(x, inp, i, n, bf, vec);
#pragma unroll
        for (int k = 0; k < 8; k++) {
            float u = GELU_K * (x[k] + GELU_C * x[k] * x[k] * x[k]);
            x[k] = x[k] / (1.0f + expf(-2.0f * u));
        }
        st8(out, i, n, x, bf, vec);
    }
}

static __global__ void gelu_bwd_k(void *dinp, const void *dout, const void *inp, size_t n, int bf,
                                  int vec) {
    FOR_CHUNKS(i, n) {
        float x[8], g[8];
        ld8(x, inp, i, n, bf, vec);
        ld8(g, dout, i, n, bf, vec);
#pragma unroll
        for (int k = 0; k < 8; k++) {
            float xi = x[k], u = GELU_K * (xi + GELU_C * xi * xi * xi);
            float s = 1.0f / (1.0f + expf(-2.0f * u));
            float du = GELU_K * (1.0f + 3.0f * GELU_C * xi * xi);
            x[k] = g[k] * (s + 2.0f * xi * s * (1.0f - s) * du);
        }
        st8(dinp, i, n, x, bf, vec);
    }
}

extern "C" void tr_cuda_gelu_forward(int bf, tr_buf *out, const tr_buf *inp, size_t n) {
    int vec = tr_cuda_aligned16(out, inp, out, out);
    gelu_fwd_k<<<tr_cuda_grid(n, TPB * 8), TPB, 0, tr_cuda_stream>>>(out, inp, n, bf, vec);
    CK_LAUNCH();
}
extern "C" void tr_cuda_gelu_backward(int bf, tr_buf *dinp, const tr_buf *dout, const tr_buf *inp,
                                      size_t n) {
    int vec = tr_cuda_aligned16(dinp, dout, inp, inp);
    gelu_bwd_k<<<tr_cuda_grid(n, TPB * 8), TPB, 0, tr_cuda_stream>>>(dinp, dout, inp, n, bf, vec);
    CK_LAUNCH();
}

/* inp (N, 2Hd) = [gate | up], out (N, Hd) = silu(gate) * up; one thread per 8 outputs */
static __global__ void swiglu_fwd_k(void *out, const void *inp, int N, int Hd, int bf, int vec) {
    int H8 = (Hd + 7) / 8;
    for (size_t j = blockIdx.x * (size_t)blockDim.x + threadIdx.x; j < (size_t)N * H8;
         j += (size_t)gridDim.x * blockDim.x) {
        size_t n = j / H8, i = (j % H8) * 8, gb = n * 2 * Hd, ob = n * Hd;
        float g[8], u[8];
        ld8(g, inp, gb + i, gb + Hd, bf, vec);
        ld8(u, inp, gb + Hd + i, gb + 2 * Hd, bf, vec);
#pragma unroll
        for (int k = 0; k < 8; k++) g[k] = g[k] / (1.0f + expf(-g[k])) * u[k];
        st8(out, ob + i, ob + Hd, g, bf, vec);
    }
}

/* silu'(g) = sig(g) (1 + g (1 - sig(g))) */
static __global__ void swiglu_bwd_k(void *dinp, const void *dout, const void *inp, int N, int Hd,
                                    int bf, int vec) {
    int H8 = (Hd + 7) / 8;
    for (size_t j = blockIdx.x * (size_t)blockDim.x + threadIdx.x; j < (size_t)N * H8;
         j += (size_t)gridDim.x * blockDim.x) {
        size_t n = j / H8, i = (j % H8) * 8, gb = n * 2 * Hd, ob = n * Hd;
        float g[8], u[8], d[8], dg[8], du[8];
        ld8(g, inp, gb + i, gb + Hd, bf, vec);
        ld8(u, inp, gb + Hd + i, gb + 2 * Hd, bf, vec);
        ld8(d, dout, ob + i, ob + Hd, bf, vec);
#pragma unroll
        for (int k = 0; k < 8; k++) {
            float sg = 1.0f / (1.0f + expf(-g[k]));
            dg[k] = d[k] * u[k] * sg * (1.0f + g[k] * (1.0f - sg));
            du[k] = d[k] * g[k] * sg;
        }
        st8(dinp, gb + i, gb + Hd, dg, bf, vec);
        st8(dinp, gb + Hd + i, gb + 2 * Hd, du, bf, vec);
    }
}

extern "C" void tr_cuda_swiglu_forward(int bf, tr_buf *out, const tr_buf *inp, int N, int Hd) {
    int vec = Hd % 8 == 0 && tr_cuda_aligned16(out, inp, out, out);
    size_t work = (size_t)N * ((Hd + 7) / 8);
    swiglu_fwd_k<<<tr_cuda_grid(work, TPB), TPB, 0, tr_cuda_stream>>>(out, inp, N, Hd, bf, vec);
    CK_LAUNCH();
}
extern "C" void tr_cuda_swiglu_backward(int bf, tr_buf *dinp, const tr_buf *dout, const tr_buf *inp,
                                        int N, int Hd) {
    int vec = Hd % 8 == 0 && tr_cuda_aligned16(dinp, dout, inp, inp);
    size_t work = (size_t)N * ((Hd + 7) / 8);
    swiglu_bwd_k<<<tr_cuda_grid(work, TPB), TPB, 0, tr_cuda_stream>>>(dinp, dout, inp, N, Hd, bf,
                                                                     vec);
    CK_LAUNCH();
}

/* out = a + b; out may alias a or b (each element is read before it is written, by the same
 * thread) */
static __global__ void add_k(void *out, const void *a, const void *b, size_t n, int bf, int vec) {
    FOR_CHUNKS(i, n) {
        float x[8], y[8];
        ld8(x, a, i, n, bf, vec);
        ld8(y, b, i, n, bf, vec);
#pragma unroll
        for (int k = 0; k < 8; k++) x[k] += y[k];
        st8(out, i, n, x, bf, vec);
    }
}
extern "C" void tr_cuda_add(int bf, tr_buf *out, const tr_buf *a, const tr_buf *b, size_t n) {
    int vec = tr_cuda_aligned16(out, a, b, out);
    add_k<<<tr_cuda_grid(n, TPB * 8), TPB, 0, tr_cuda_stream>>>(out, a, b, n, bf, vec);
    CK_LAUNCH();
}

static __global__ void scale_k(void *x, float s, size_t n, int bf, int vec) {
    FOR_CHUNKS(i, n) {
        float v[8];
        ld8(v, x, i, n, bf, vec);
#pragma unroll
        for (int k = 0; k < 8; k++) v[k] *= s;
        st8(x, i, n, v, bf, vec);
    }
}
extern "C" void tr_cuda_scale(int bf, tr_buf *x, float s, size_t n) {
    int vec = tr_cuda_aligned16(x, x, x, x);
    scale_k<<<tr_cuda_grid(n, TPB * 8), TPB, 0, tr_cuda_stream>>>(x, s, n, bf, vec);
    CK_LAUNCH();
}

/* ---- softmax cross entropy: one block per row, logits read twice, written once ---------- */

#define XENT_THREADS 512

/* (m, s) pairs: s = sum exp(x - m); combining rescales to the larger m */
static __device__ __forceinline__ void lse_combine(float *m, float *s, float m2, float s2) {
    float M = fmaxf(*m, m2);
    float a = *m == -INFINITY ? 0.0f : *s * expf(*m - M);
    float b = m2 == -INFINITY ? 0.0f : s2 * expf(m2 - M);
    *m = M;
    *s = a + b;
}

/* (m, s) of this thread's columns j = tid, tid + blockDim.x, ... < V of the row at base: one
 * read, s rescaled whenever m grows; (-inf, 0) when it has none */
static __device__ __forceinline__ void thread_lse(float *m_, float *s_, const void *logits,
                                                  size_t base, int V, int bf) {
    float m = -INFINITY, s = 0.0f;
    for (int j = threadIdx.x; j < V; j += blockDim.x) {
        float x = ldf(logits, base + j, bf);
        if (x > m) {
            s = (m == -INFINITY ? 0.0f : s * expf(m - x)) + 1.0f;
            m = x;
        } else {
            s += expf(x - m);
        }
    }
    *m_ = m;
    *s_ = s;
}

static __global__ void softmax_xent_k(void *logits, float *losses, const int *targets, int V,
                                      int ld, float dscale, int want_grad, int bf) {
    __shared__ float sm[XENT_THREADS / 32], ss[XENT_THREADS / 32];
    int n = blockIdx.x, tid = threadIdx.x, lane = tid & 31, wid = tid >> 5;
    size_t base = (size_t)n * ld;
    int t = targets[n];
    if (want_grad) /* the padding columns: no class, no gradient */
        for (int j = V + tid; j < ld; j += blockDim.x) stf(logits, base + j, 0.0f, bf);
    if (t < 0) { /* ignored position: loss 0, gradient 0 */
        if (tid == 0) losses[n] = 0.0f;
        if (want_grad)
            for (int j = tid; j < V; j += blockDim.x) stf(logits, base + j, 0.0f, bf);
        return;
    }
    float m, s;
    thread_lse(&m, &s, logits, base, V, bf);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
        lse_combine(&m, &s, m2, s2);
    }
    if (lane == 0) {
        sm[wid] = m;
        ss[wid] = s;
    }
    __syncthreads();
    m = sm[0];
    s = ss[0];
    for (int w = 1; w < (int)blockDim.x / 32; w++) lse_combine(&m, &s, sm[w], ss[w]);
    /* every thread now holds the same (m, s), combined in the same order */
    float xt = ldf(logits, base + t, bf);
    if (tid == 0) losses[n] = logf(s) - (xt - m);
    if (want_grad) {
        __syncthreads(); /* every thread has read x[t] before anyone overwrites it */
        float k = dscale / s;
        for (int j = tid; j < V; j += blockDim.x) {
            float p = expf(ldf(logits, base + j, bf) - m) * k;
            stf(logits, base + j, j == t ? p - dscale : p, bf);
        }
    }
}

extern "C" void tr_cuda_softmax_xent(int bf, tr_buf *logits, float *losses, const int *targets,
                                     int N, int V, int ld, float dscale, int want_grad) {
    if (N <= 0) return;
    softmax_xent_k<<<N, XENT_THREADS, 0, tr_cuda_stream>>>(logits, losses, targets, V, ld, dscale,
                                                           want_grad, bf);
    CK_LAUNCH();
}

/* ---- the same over a vocabulary split by tensor parallelism (backend.h): each rank's row
 * statistics, all-gathered by the caller, then each rank's losses and gradient ------------- */

/* v reduced over the block (max, or sum when sum), the same value in every thread; red holds
 * one float per warp. Ends on a barrier so that red can be reused at once. */
static __device__ float block_reduce(float v, int sum, float *red) {
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    v = sum ? warp_sum(v) : warp_max(v);
    if (lane == 0) red[wid] = v;
    __syncthreads();
    v = red[0];
    for (int w = 1; w < (int)blockDim.x / 32; w++) v = sum ? v + red[w] : fmaxf(v, red[w]);
    __syncthreads();
    return v;
}

/* stats (N, 3): row max m, sum of exp(x - m), x[target - lo] when this rank holds the target
 * (else 0). Each thread's (m, s) is rescaled to the row max before the sum. */
static __global__ void xent_stats_k(float *stats, const void *logits, const int *targets, int lo,
                                    int V, int ld, int bf) {
    __shared__ float red[XENT_THREADS / 32];
    int n = blockIdx.x;
    size_t base = (size_t)n * ld;
    float m, s;
    thread_lse(&m, &s, logits, base, V, bf);
    float M = block_reduce(m, 0, red);
    s = block_reduce(m == -INFINITY ? 0.0f : s * expf(m - M), 1, red);
    if (threadIdx.x == 0) {
        int t = targets[n] - lo;
        stats[3 * n] = M; /* -inf when V = 0 */
        stats[3 * n + 1] = s;
        stats[3 * n + 2] = targets[n] >= 0 && t >= 0 && t < V ? ldf(logits, base + t, bf) : 0.0f;
    }
}

/* Row n of every rank's stats (R, N, 3): M = max m_r, S = sum_r s_r exp(m_r - M) in double,
 * and the target's logit (one rank's; the others give 0). Each warp computes them itself, in
 * the same butterfly order, so every thread holds the same bits without a barrier; R is small
 * (one or two terms per lane). */
static __device__ void xent_combine(float *M, double *S, float *xt, const float *all, int R,
                                    int N, int n) {
    float m = -INFINITY, x = 0.0f;
    for (int r = threadIdx.x & 31; r < R; r += 32) {
        m = fmaxf(m, all[((size_t)r * N + n) * 3]);
        x += all[((size_t)r * N + n) * 3 + 2];
    }
    m = warp_max(m);
    double s = 0.0;
    for (int r = threadIdx.x & 31; r < R; r += 32) {
        const float *st = all + ((size_t)r * N + n) * 3;
        if (st[1] > 0) s += (double)st[1] * exp((double)st[0] - m); /* a rank with V = 0: none */
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    *M = m;
    *S = s;
    *xt = warp_sum(x);
}

/* losses = log S + M - x_target; with want_grad this rank's logits become
 * (exp(x - M) / S - onehot) * dscale, padding columns and ignored rows 0 */
static __global__ void xent_finish_k(void *logits, float *losses, const float *all, int R,
                                     const int *targets, int lo, int N, int V, int ld,
                                     float dscale, int want_grad, int bf) {
    int n = blockIdx.x, tid = threadIdx.x;
    size_t base = (size_t)n * ld;
    if (want_grad)
        for (int j = V + tid; j < ld; j += blockDim.x) stf(logits, base + j, 0.0f, bf);
    if (targets[n] < 0) {
        if (tid == 0) losses[n] = 0.0f;
        if (want_grad)
            for (int j = tid; j < V; j += blockDim.x) stf(logits, base + j, 0.0f, bf);
        return;
    }
    float M, xt;
    double S;
    xent_combine(&M, &S, &xt, all, R, N, n);
    if (tid == 0) losses[n] = (float)(log(S) - ((double)xt - M));
    if (!want_grad) return;
    float k = (float)(dscale / S);
    int t = targets[n] - lo; /* each thread reads and writes only its own columns */
    for (int j = tid; j < V; j += blockDim.x) {
        float p = expf(ldf(logits, base + j, bf) - M) * k;
        stf(logits, base + j, j == t ? p - dscale : p, bf);
    }
}

extern "C" void tr_cuda_xent_stats(int bf, float *stats, const tr_buf *logits, const int *targets,
                                   int lo, int N, int V, int ld) {
    if (N <= 0) return;
    xent_stats_k<<<N, XENT_THREADS, 0, tr_cuda_stream>>>(stats, logits, targets, lo, V, ld, bf);
    CK_LAUNCH();
}
extern "C" void tr_cuda_xent_finish(int bf, tr_buf *logits, float *losses, const float *all_stats,
                                    int R, const int *targets, int lo, int N, int V, int ld,
                                    float dscale, int want_grad) {
    if (N <= 0) return;
    xent_finish_k<<<N, XENT_THREADS, 0, tr_cuda_stream>>>(logits, losses, all_stats, R, targets,
                                                          lo, N, V, ld, dscale, want_grad, bf);
    CK_LAUNCH();
}

/* ---- optimizer helpers ----------------------------------------------------------------- */

#define SUMSQ_BLOCKS TR_WS_SUMSQ_BLOCKS

/* block partials in double over a grid that depends only on n, then one block sums them */
static __global__ void sumsq_k(double *part, const void *x, size_t n, int bf, int vec) {
    __shared__ double red[TPB];
    double s = 0.0;
    FOR_CHUNKS(i, n) {
        float v[8];
        ld8(v, x, i, n, bf, vec);
#pragma unroll
        for (int k = 0; k < 8; k++) s += (double)v[k] * v[k];
    }
    red[threadIdx.x] = s;
    __syncthreads();
    for (int w = TPB / 2; w > 0; w >>= 1) {
        if ((int)threadIdx.x < w) red[threadIdx.x] += red[threadIdx.x + w];
        __syncthreads();
    }
    if (threadIdx.x == 0) part[blockIdx.x] = red[0];
}

static __global__ void sumsq_finish_k(double *out, const double *part, int nb) {
    if (threadIdx.x == 0 && blockIdx.x == 0) {
        double s = 0.0;
        for (int i = 0; i < nb; i++) s += part[i];
        out[0] = s;
    }
}

extern "C" double tr_cuda_sumsq(int bf, const tr_buf *x, size_t n) {
    if (n == 0) return 0.0;
    unsigned nb = tr_cuda_grid(n, TPB * 8);
    if (nb > SUMSQ_BLOCKS) nb = SUMSQ_BLOCKS;
    double *part = (double *)tr_cuda_scratch(SCR_SUMSQ, sizeof(double) * (SUMSQ_BLOCKS + 1));
    int vec = tr_cuda_aligned16(x, x, x, x);
    sumsq_k<<<nb, TPB, 0, tr_cuda_stream>>>(part + 1, x, n, bf, vec);
    CK_LAUNCH();
    sumsq_finish_k<<<1, 32, 0, tr_cuda_stream>>>(part, part + 1, (int)nb);
    CK_LAUNCH();
    double s;
    CK(cudaMemcpyAsync(&s, part, sizeof(double), cudaMemcpyDeviceToHost, tr_cuda_stream));
    TR_WAIT("cuda.sumsq", CK(cudaStreamSynchronize(tr_cuda_stream)));
    return s;
}

/* torch.optim.AdamW on fp32 master weights; the bf16 working copy is rounded from them */
/* AdamW on elements i..i+3: 4 per thread, so that every array's accesses are whole sectors */
static __device__ __forceinline__ void adamw4(float *master, void *param, const void *g, float *m,
                                              float *v, size_t i, size_t n, float lr, float beta1,
                                              float beta2, float eps, float decay, float ib1,
                                              float ib2, float gscale, int bf, int vec, int copy) {
    float p[4], gg[4], mm[4], vv[4];
    ld4(p, master, i, n, 0, vec);
    ld4(gg, g, i, n, bf, vec);
    ld4(mm, m, i, n, 0, vec);
    ld4(vv, v, i, n, 0, vec);
#pragma unroll
    for (int k = 0; k < 4; k++) {
        float gi = gg[k] * gscale;
        mm[k] = beta1 * mm[k] + (1.0f - beta1) * gi;
        vv[k] = beta2 * vv[k] + (1.0f - beta2) * gi * gi;
        p[k] = p[k] * decay - lr * (mm[k] * ib1) / (sqrtf(vv[k] * ib2) + eps);
    }
    st4(master, i, n, p, 0, vec);
    st4(m, i, n, mm, 0, vec);
    st4(v, i, n, vv, 0, vec);
    if (copy) st4(param, i, n, p, bf, vec);
}

static __global__ void adamw_k(float *master, void *param, const void *g, float *m, float *v,
                               size_t n, float lr, float beta1, float beta2, float eps, float decay,
                               float ib1, float ib2, float gscale, int bf, int vec, int copy) {
    for (size_t i = (blockIdx.x * (size_t)blockDim.x + threadIdx.x) * 4; i < n;
         i += (size_t)gridDim.x * blockDim.x * 4)
        adamw4(master, param, g, m, v, i, n, lr, beta1, beta2, eps, decay, ib1, ib2, gscale, bf,
               vec, copy);
}

/* ---- AdamW over many stretches in one launch -------------------------------------------
 * A block takes MS_CHUNK elements of one stretch (the block table maps blocks to stretches);
 * the element arithmetic is adamw_k's. The tables are uploaded only when the stretches change
 * (normally once: the same pointers every step). */
typedef struct {
    float *master;
    void *param;
    const void *g;
    float *m, *v;
    size_t n;
    float wd;
    int vec;
} ms_seg;
typedef struct {
    int seg;
    unsigned chunk;
} ms_blk;
#define MS_CHUNK ((size_t)TPB * 8 * 4) /* TR_WS_ADAMW_CHUNK */

static __global__ void adamw_multi_k(const ms_seg *segs, const ms_blk *blks, float lr, float beta1,
                                     float beta2, float eps, float ib1, float ib2, float gscale,
                                     int bf, int copy) {
    ms_blk bk = blks[blockIdx.x];
    ms_seg s = segs[bk.seg];
    size_t lo = (size_t)bk.chunk * MS_CHUNK, hi = lo + MS_CHUNK < s.n ? lo + MS_CHUNK : s.n;
    /* as the host computes it for adamw_k: no fused multiply-add, so the bits agree */
    float decay = __fsub_rn(1.0f, __fmul_rn(lr, s.wd));
    for (size_t i = lo + (size_t)threadIdx.x * 4; i < hi; i += (size_t)blockDim.x * 4)
        adamw4(s.master, s.param, s.g, s.m, s.v, i, s.n, lr, beta1, beta2, eps, decay, ib1, ib2,
               gscale, bf, s.vec, copy);
}

static_assert(sizeof(ms_seg) <= TR_WS_ADAMW_SEG_BYTES && sizeof(ms_blk) <= TR_WS_ADAMW_BLOCK_BYTES,
              "the workspace plan (model/workspace.c) sizes the tables with these");
static_assert(MS_CHUNK == TR_WS_ADAMW_CHUNK, "the workspace plan's block size");

static ms_seg *ms_host, *ms_dev;
static ms_blk *mb_host, *mb_dev;
static int ms_n, ms_cap, mb_n, mb_cap;

int tr_cuda_adamw_reserve(size_t seg_bytes, size_t block_bytes) {
    int ns = (int)(seg_bytes / TR_WS_ADAMW_SEG_BYTES), nb = (int)(block_bytes / TR_WS_ADAMW_BLOCK_BYTES);
    if (ns > ms_cap) { /* the device table at the plan's size, the host one as large */
        ms_seg *h = (ms_seg *)calloc((size_t)ns, sizeof(ms_seg));
        void *d = NULL;
        if (!h || tr_cuda_malloc(&d, seg_bytes) != cudaSuccess) {
            free(h);
            (void)cudaGetLastError();
            return -1;
        }
        free(ms_host);
        if (ms_dev) CK(tr_cuda_free(ms_dev));
        ms_host = h, ms_dev = (ms_seg *)d, ms_cap = ns, ms_n = 0;
    }
    if (nb > mb_cap) {
        ms_blk *h = (ms_blk *)malloc((size_t)nb * sizeof(ms_blk));
        void *d = NULL;
        if (!h || tr_cuda_malloc(&d, block_bytes) != cudaSuccess) {
            free(h);
            (void)cudaGetLastError();
            return -1;
        }
        free(mb_host);
        if (mb_dev) CK(tr_cuda_free(mb_dev));
        mb_host = h, mb_dev = (ms_blk *)d, mb_cap = nb, ms_n = 0;
    }
    return 0;
}

extern "C" void tr_cuda_adamw_multi(int bf, const tr_adamw_seg *sg, int ns, float lr, float beta1,
                                    float beta2, float eps, float bc1, float bc2, float gscale) {
    if (ns == 0) return;
    int same = ns == ms_n;
    if (ns > ms_cap) { /* grow the host and device tables */
        free(ms_host);
        if (ms_dev) CK(tr_cuda_free(ms_dev));
        ms_cap = ns;
        ms_host = (ms_seg *)calloc((size_t)ms_cap, sizeof(ms_seg));
        CK(tr_cuda_malloc((void **)&ms_dev, (size_t)ms_cap * sizeof(ms_seg)));
        if (!ms_host) tr_cuda_fail("adamw_multi", "out of host memory", __FILE__, __LINE__);
        same = 0;
    }
    size_t blocks = 0;
    for (int k = 0; k < ns; k++) {
        ms_seg x;
        memset(&x, 0, sizeof(x)); /* padding too: compared with memcmp */
        x.master = sg[k].master, x.param = sg[k].param, x.g = sg[k].grad;
        x.m = sg[k].m, x.v = sg[k].v, x.n = sg[k].n, x.wd = sg[k].wd;
        x.vec = tr_cuda_aligned16(x.master, x.param, x.g, x.m) && tr_cuda_aligned16(x.v, x.v, x.v, x.v);
        if (same && memcmp(&ms_host[k], &x, sizeof(x))) same = 0;
        ms_host[k] = x;
        blocks += (x.n + MS_CHUNK - 1) / MS_CHUNK;
    }
    if (!same) { /* new stretches: the block table again, both uploaded */
        if (blocks > (size_t)mb_cap) {
            free(mb_host);
            if (mb_dev) CK(tr_cuda_free(mb_dev));
            mb_cap = (int)blocks;
            mb_host = (ms_blk *)malloc((size_t)mb_cap * sizeof(ms_blk));
            CK(tr_cuda_malloc((void **)&mb_dev, (size_t)mb_cap * sizeof(ms_blk)));
            if (!mb_host) tr_cuda_fail("adamw_multi", "out of host memory", __FILE__, __LINE__);
        }
        mb_n = 0;
        for (int k = 0; k < ns; k++)
            for (size_t c = 0; c * MS_CHUNK < ms_host[k].n; c++) mb_host[mb_n++] = (ms_blk){k, (unsigned)c};
        CK(cudaMemcpyAsync(ms_dev, ms_host, (size_t)ns * sizeof(ms_seg), cudaMemcpyHostToDevice,
                           tr_cuda_stream));
        CK(cudaMemcpyAsync(mb_dev, mb_host, (size_t)mb_n * sizeof(ms_blk), cudaMemcpyHostToDevice,
                           tr_cuda_stream));
        TR_WAIT("cuda.ms_tables", CK(cudaStreamSynchronize(tr_cuda_stream))); /* the host tables may change next call */
        ms_n = ns;
    }
    if (mb_n == 0) return;
    int copy = (void *)sg[0].param != (void *)sg[0].master;
    adamw_multi_k<<<(unsigned)mb_n, TPB, 0, tr_cuda_stream>>>(ms_dev, mb_dev, lr, beta1, beta2, eps,
                                                            1.0f / bc1, 1.0f / bc2, gscale, bf, copy);
    CK_LAUNCH();
}

extern "C" void tr_cuda_adamw(int bf, float *master, tr_buf *param, const tr_buf *g, float *m,
                              float *v, size_t n, float lr, float beta1, float beta2, float eps,
                              float wd, float bc1, float bc2, float gscale) {
    if (n == 0) return;
    int copy = (void *)param != (void *)master;
    int vec = tr_cuda_aligned16(master, param, g, m) && tr_cuda_aligned16(v, v, v, v);
    adamw_k<<<tr_cuda_grid(n, TPB * 4), TPB, 0, tr_cuda_stream>>>(
        master, param, g, m, v, n, lr, beta1, beta2, eps, 1.0f - lr * wd, 1.0f / bc1, 1.0f / bc2,
        gscale, bf, vec, copy);
    CK_LAUNCH();
}
