/* The CUDA backend's memory-bound operations on activations: embeddings (token and position),
 * rotary embedding, GELU and SwiGLU, residual add and scale. Norms are in cuda_norms.cu, the
 * softmax cross entropy in cuda_xent.cu, the optimizer's helpers in cuda_optim.cu. Each launcher
 * takes bf (1: bf16 storage, 0: fp32) and works for both; all arithmetic and every sum is fp32,
 * and every reduction runs in a fixed order, so results are bitwise reproducible. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/cuda/cuda_private.h"
#include "model/mutant.h"

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
