/* The CUDA backend's norms: LayerNorm and RMSNorm, forward (the residual add fused into one
 * variant) and backward, and the column sums their weight and bias gradients (and dbias) use,
 * per-chunk partials reduced in a fixed order. bf as in cuda_ops.cu; fp32 arithmetic,
 * bitwise reproducible. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/cuda/cuda_private.h"

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
