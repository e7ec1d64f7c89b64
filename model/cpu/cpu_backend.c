/* The CPU backend: every operation of model/backend.h in fp32 on host memory, parallel with
 * OpenMP, matrix products through OpenBLAS. It is the reference the CUDA backend is tested
 * against, so every reduction runs in a fixed order (bitwise reproducible for a thread count). */
#define _GNU_SOURCE /* madvise(MADV_HUGEPAGE) in sys/mman.h, dladdr in dlfcn.h */
#include "model/backend.h"

#include <cblas.h>
#include <dlfcn.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

/* Attention tiles: a query tile of BQ rows meets key tiles of BK keys. BQ == BK keeps the
 * causal boundary on the diagonal tile only. 64x64 scores = 16 KiB, well inside L1. */
#define BQ 64
#define BK 64
/* Rows per partial-sum chunk in the norm backwards: fixed, so sums do not depend on the
 * number of threads. */
#define NORM_CHUNK 64

/* ---- helpers -------------------------------------------------------------------------- */

/* exp(x) in fp32 that gcc vectorizes (no libm call): Cody-Waite reduction x = n ln2 + r,
 * |r| <= ln2/2, and Cephes' expf polynomial (relative error < 2e-7 in [-87, 88]).
 * Below -87 it returns 0 (denormals flushed: harmless for softmax), above 88 +inf. */
static inline float fast_expf(float x) {
    /* written so that a NaN input takes the clamp too: no NaN reaches the int conversion */
    float xc = x >= -87.0f ? (x <= 88.0f ? x : 88.0f) : -87.0f;
    /* round to nearest with the 1.5*2^23 trick: no libm call, vectorizes */
    float n = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    float r = xc - n * 0.693359375f;
    r = r + n * 2.12194440e-4f;
    float z = r * r;
    float y = ((((1.9875691500e-4f * r + 1.3981999507e-3f) * r + 8.3334519073e-3f) * r +
                4.1665795894e-2f) * r + 1.6666665459e-1f) * r + 5.0000001201e-1f;
    y = y * z + r + 1.0f;
    int32_t e = ((int32_t)n + 127) << 23;
    float s;
    memcpy(&s, &e, sizeof s);
    y *= s;
    return x >= -87.0f ? (x <= 88.0f ? y : INFINITY) : (x < -87.0f ? 0.0f : x); /* NaN: x */
}

/* sigmoid through fast_expf: 1/(1+exp(-x)), exact limits 0 and 1 at the ends */
static inline float fast_sigmoidf(float x) { return 1.0f / (1.0f + fast_expf(-x)); }

/* ---- memory --------------------------------------------------------------------------- */

/* Large blocks (parameter slabs, activation arenas) are 2 MiB aligned and asked to be backed by
 * transparent huge pages: streaming kernels over tens of MiB are TLB-bound on 4 KiB pages,
 * worst in a VM. The memset touches every page now, so no page faults land in a step. */
#define HUGE_PAGE ((size_t)2 << 20)
static void *cpu_alloc(size_t bytes) {
    size_t align = bytes >= HUGE_PAGE ? HUGE_PAGE : 64;
    size_t n = (bytes + align - 1) & ~(align - 1);
    if (n == 0) n = 64;
    if (n < bytes) return NULL; /* overflow */
    void *p = aligned_alloc(align, n);
    if (!p) return NULL;
#ifdef MADV_HUGEPAGE
    if (align == HUGE_PAGE) madvise(p, n, MADV_HUGEPAGE); /* a hint: failure is harmless */
#endif
    memset(p, 0, n);
    return p;
}
static void cpu_free(void *p) { free(p); }
static void cpu_copy(void *dst, const void *src, size_t bytes) {
    if (bytes) memcpy(dst, src, bytes);
}
static void cpu_zero(void *p, size_t bytes) {
    if (bytes) memset(p, 0, bytes);
}
static void cpu_to_storage(tr_buf *dst, const float *src, size_t n) {
    cpu_copy(dst, src, n * sizeof(float));
}
static void cpu_from_storage(float *dst, const tr_buf *src, size_t n) {
    cpu_copy(dst, src, n * sizeof(float));
}

/* ---- linear ---------------------------------------------------------------------------- */

static void linear_forward(tr_buf *out_, const tr_buf *inp_, const tr_buf *w_, const tr_buf *bias_,
                           int N, int IC, int OC) {
    float *out = out_;
    const float *inp = inp_;
    const float *w = w_;
    const float *bias = bias_;
    float beta = 0.0f;
    if (bias) {
        /* out starts as the broadcast bias; the product accumulates onto it (beta = 1) */
#pragma omp parallel for schedule(static)
        for (int n = 0; n < N; n++) memcpy(out + (size_t)n * OC, bias, sizeof(float) * OC);
        beta = 1.0f;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, IC, 1.0f, inp, IC, w, IC, beta,
                out, OC);
}

static void linear_backward(tr_buf *dinp_, tr_buf *dw_, tr_buf *dbias_, const tr_buf *dout_,
                            const tr_buf *inp_, const tr_buf *w_, int N, int IC, int OC) {
    float *dinp = dinp_;
    float *dw = dw_;
    float *dbias = dbias_;
    const float *dout = dout_;
    const float *inp = inp_;
    const float *w = w_;
    if (dinp) /* (N,IC) = (N,OC) @ (OC,IC) */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, IC, OC, 1.0f, dout, OC, w, IC,
                    0.0f, dinp, IC);
    /* (OC,IC) += (N,OC)^T @ (N,IC) */
    if (dw)
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, IC, N, 1.0f, dout, OC, inp, IC,
                    1.0f, dw, IC);
    if (dbias) {
        /* column sums: each block of 64 columns walks the rows in order (deterministic) */
        int nblk = (OC + 63) / 64;
#pragma omp parallel for schedule(static)
        for (int blk = 0; blk < nblk; blk++) {
            int o0 = blk * 64, no = OC - o0 < 64 ? OC - o0 : 64;
            float acc[64] = {0};
            for (int n = 0; n < N; n++) {
                const float *restrict d = dout + (size_t)n * OC + o0;
                for (int o = 0; o < no; o++) acc[o] += d[o];
            }
            for (int o = 0; o < no; o++) dbias[o0 + o] += acc[o];
        }
    }
}

/* ---- embeddings ------------------------------------------------------------------------ */

static void embedding_forward(tr_buf *out_, const int *tokens, const tr_buf *wte_, int N, int C) {
    float *out = out_;
    const float *wte = wte_;
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        if (tokens[n] < 0) /* another rank's row of a split vocabulary */
            memset(out + (size_t)n * C, 0, sizeof(float) * C);
        else
            memcpy(out + (size_t)n * C, wte + (size_t)tokens[n] * C, sizeof(float) * C);
    }
}

/* Each thread owns a slice of the C columns and walks the tokens in order, so a row of dwte
 * hit by many tokens is summed in token order whatever the thread count. */
static void embedding_backward(tr_buf *dwte_, const tr_buf *dout_, const int *tokens, int N, int C) {
    float *dwte = dwte_;
    const float *dout = dout_;
#pragma omp parallel
    {
        int nt = omp_get_num_threads(), id = omp_get_thread_num();
        int per = ((C + nt - 1) / nt + 15) & ~15; /* 16-float slices keep lines apart */
        int c0 = id * per, c1 = c0 + per < C ? c0 + per : C;
        for (int n = 0; n < N && c0 < c1; n++) {
            if (tokens[n] < 0) continue; /* another rank's row */
            float *restrict d = dwte + (size_t)tokens[n] * C;
            const float *restrict g = dout + (size_t)n * C;
            for (int c = c0; c < c1; c++) d[c] += g[c];
        }
    }
}

static void positions_forward(tr_buf *x_, const tr_buf *wpe_, int B, int T, int C) {
    float *x = x_;
    const float *wpe = wpe_;
#pragma omp parallel for schedule(static)
    for (int bt = 0; bt < B * T; bt++) {
        float *restrict r = x + (size_t)bt * C;
        const float *restrict p = wpe + (size_t)(bt % T) * C;
        for (int c = 0; c < C; c++) r[c] += p[c];
    }
}

static void positions_backward(tr_buf *dwpe_, const tr_buf *dx_, int B, int T, int C) {
    float *dwpe = dwpe_;
    const float *dx = dx_;
#pragma omp parallel for schedule(static)
    for (int t = 0; t < T; t++) {
        float *restrict d = dwpe + (size_t)t * C;
        for (int b = 0; b < B; b++) {
            const float *restrict g = dx + ((size_t)b * T + t) * C;
            for (int c = 0; c < C; c++) d[c] += g[c];
        }
    }
}

/* ---- norms ----------------------------------------------------------------------------- */

/* One row of LayerNorm (shared by the plain and the residual-fused forward, so both give the
 * same bits). */
static inline void layernorm_row(float *restrict y, const float *restrict x, const float *w,
                                 const float *b, int C, float eps, float *mean, float *rstd) {
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int c = 0; c < C; c++) s += x[c];
    float m = s / C;
    float v = 0.0f; /* two-pass variance: no cancellation */
#pragma omp simd reduction(+ : v)
    for (int c = 0; c < C; c++) {
        float d = x[c] - m;
        v += d * d;
    }
    float rs = 1.0f / sqrtf(v / C + eps);
    if (b)
        for (int c = 0; c < C; c++) y[c] = (x[c] - m) * rs * w[c] + b[c];
    else
        for (int c = 0; c < C; c++) y[c] = (x[c] - m) * rs * w[c];
    if (mean) *mean = m;
    if (rstd) *rstd = rs;
}

static void layernorm_forward(tr_buf *out_, float *mean, float *rstd, const tr_buf *inp_,
                              const tr_buf *w_, const tr_buf *b_, int N, int C, float eps) {
    float *out = out_;
    const float *inp = inp_;
    const float *w = w_;
    const float *b = b_;
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++)
        layernorm_row(out + (size_t)n * C, inp + (size_t)n * C, w, b, C, eps,
                      mean ? mean + n : NULL, rstd ? rstd + n : NULL);
}

/* Sums the per-chunk partials part (nchunk, C) into acc (C) in chunk order. */
static void reduce_chunks(float *restrict acc, const float *restrict part, int nchunk, int C) {
#pragma omp parallel for schedule(static)
    for (int c = 0; c < C; c++) {
        float s = 0.0f;
        for (int k = 0; k < nchunk; k++) s += part[(size_t)k * C + c];
        acc[c] += s;
    }
}

/* dinp = rstd * (dnorm - mean(dnorm) - norm * mean(dnorm * norm)), dnorm = dout * w;
 * dw += sum_n dout * norm, db += sum_n dout, via fixed NORM_CHUNK-row partials. */
static void layernorm_backward(tr_buf *dinp_, tr_buf *dw_, tr_buf *db_, const tr_buf *dout_,
                               const tr_buf *inp_, const tr_buf *w_, const float *mean,
                               const float *rstd, int N, int C) {
    float *dinp = dinp_;
    float *dw = dw_;
    float *db = db_;
    const float *dout = dout_;
    const float *inp = inp_;
    const float *w = w_;
    int nchunk = (N + NORM_CHUNK - 1) / NORM_CHUNK;
    float *part = malloc(sizeof(float) * (size_t)nchunk * C * 2); /* [dw | db] partials */
    if (!part) abort(); /* out of host memory in a kernel: nothing sane to return */
#pragma omp parallel for schedule(static)
    for (int k = 0; k < nchunk; k++) {
        float *restrict pw = part + (size_t)k * C;
        float *restrict pb = part + ((size_t)nchunk + k) * C;
        for (int c = 0; c < C; c++) pw[c] = pb[c] = 0.0f;
        int n1 = (k + 1) * NORM_CHUNK < N ? (k + 1) * NORM_CHUNK : N;
        for (int n = k * NORM_CHUNK; n < n1; n++) {
            const float *restrict x = inp + (size_t)n * C;
            const float *restrict g = dout + (size_t)n * C;
            float *restrict dx = dinp + (size_t)n * C;
            float m = mean[n], rs = rstd[n];
            float a = 0.0f, bsum = 0.0f;
#pragma omp simd reduction(+ : a, bsum)
            for (int c = 0; c < C; c++) {
                float nrm = (x[c] - m) * rs, dn = g[c] * w[c];
                a += dn;
                bsum += dn * nrm;
                pw[c] += g[c] * nrm;
                pb[c] += g[c];
            }
            a /= C;
            bsum /= C;
            for (int c = 0; c < C; c++) {
                float nrm = (x[c] - m) * rs;
                dx[c] = rs * (g[c] * w[c] - a - nrm * bsum);
            }
        }
    }
    reduce_chunks(dw, part, nchunk, C);
    if (db) reduce_chunks(db, part + (size_t)nchunk * C, nchunk, C);
    free(part);
}

static inline void rmsnorm_row(float *restrict y, const float *restrict x, const float *w, int C,
                               float eps, float *rstd) {
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int c = 0; c < C; c++) s += x[c] * x[c];
    float rs = 1.0f / sqrtf(s / C + eps);
    for (int c = 0; c < C; c++) y[c] = x[c] * rs * w[c];
    if (rstd) *rstd = rs;
}

static void rmsnorm_forward(tr_buf *out_, float *rstd, const tr_buf *inp_, const tr_buf *w_, int N,
                            int C, float eps) {
    float *out = out_;
    const float *inp = inp_;
    const float *w = w_;
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++)
        rmsnorm_row(out + (size_t)n * C, inp + (size_t)n * C, w, C, eps, rstd ? rstd + n : NULL);
}

/* sum = a + b, then the norm of sum: one pass over the rows instead of two */
static void residual_norm_forward(tr_buf *sum_, tr_buf *out_, float *mean, float *rstd,
                                  const tr_buf *a_, const tr_buf *b_, const tr_buf *w_,
                                  const tr_buf *bias_, int N, int C, float eps, int rms) {
    float *sum = sum_, *out = out_;
    const float *a = a_, *b = b_, *w = w_, *bias = bias_;
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        size_t o = (size_t)n * C;
        float *restrict x = sum + o;
        const float *restrict pa = a + o, *restrict pb = b + o;
        for (int c = 0; c < C; c++) x[c] = pa[c] + pb[c];
        if (rms)
            rmsnorm_row(out + o, x, w, C, eps, rstd ? rstd + n : NULL);
        else
            layernorm_row(out + o, x, w, bias, C, eps, mean ? mean + n : NULL,
                          rstd ? rstd + n : NULL);
    }
}

/* y = x * r * w, r = (mean(x^2)+eps)^-1/2: dx = r * (dout*w) - x * r^3 * mean(dout*w*x) */
static void rmsnorm_backward(tr_buf *dinp_, tr_buf *dw_, const tr_buf *dout_, const tr_buf *inp_,
                             const tr_buf *w_, const float *rstd, int N, int C) {
    float *dinp = dinp_;
    float *dw = dw_;
    const float *dout = dout_;
    const float *inp = inp_;
    const float *w = w_;
    int nchunk = (N + NORM_CHUNK - 1) / NORM_CHUNK;
    float *part = malloc(sizeof(float) * (size_t)nchunk * C);
    if (!part) abort();
#pragma omp parallel for schedule(static)
    for (int k = 0; k < nchunk; k++) {
        float *restrict pw = part + (size_t)k * C;
        for (int c = 0; c < C; c++) pw[c] = 0.0f;
        int n1 = (k + 1) * NORM_CHUNK < N ? (k + 1) * NORM_CHUNK : N;
        for (int n = k * NORM_CHUNK; n < n1; n++) {
            const float *restrict x = inp + (size_t)n * C;
            const float *restrict g = dout + (size_t)n * C;
            float *restrict dx = dinp + (size_t)n * C;
            float rs = rstd[n], s = 0.0f;
#pragma omp simd reduction(+ : s)
            for (int c = 0; c < C; c++) {
                s += g[c] * w[c] * x[c];
                pw[c] += g[c] * x[c] * rs;
            }
            float k3 = rs * rs * rs * s / C;
            for (int c = 0; c < C; c++) dx[c] = rs * g[c] * w[c] - x[c] * k3;
        }
    }
    reduce_chunks(dw, part, nchunk, C);
    free(part);
}

/* ---- rotary embedding ------------------------------------------------------------------ */

/* cos/sin table (T, hd/2) for this call: angle in double, then rounded to float */
static float *rope_table(int T, int hd, float theta) {
    int h2 = hd / 2;
    float *tab = malloc(sizeof(float) * (size_t)T * h2 * 2);
    if (!tab) abort();
#pragma omp parallel for schedule(static)
    for (int t = 0; t < T; t++)
        for (int i = 0; i < h2; i++) {
            double ang = t * pow((double)theta, -2.0 * i / hd);
            tab[((size_t)t * h2 + i) * 2] = (float)cos(ang);
            tab[((size_t)t * h2 + i) * 2 + 1] = (float)sin(ang);
        }
    return tab;
}

/* Rotates pairs (i, i+hd/2) of the q and k heads by +angle (dir = 1) or -angle (dir = -1,
 * the transpose, which is the backward). */
static void rope_apply(float *qkv, int B, int T, int H, int KV, int hd, float theta, float dir) {
    int h2 = hd / 2, stride = (H + 2 * KV) * hd;
    float *tab = rope_table(T, hd, theta);
#pragma omp parallel for schedule(static)
    for (int bt = 0; bt < B * T; bt++) {
        const float *restrict cs = tab + (size_t)(bt % T) * h2 * 2;
        float *row = qkv + (size_t)bt * stride;
        for (int h = 0; h < H + KV; h++) { /* q heads then k heads: contiguous */
            float *restrict x1 = row + (size_t)h * hd;
            float *restrict x2 = x1 + h2;
            for (int i = 0; i < h2; i++) {
                float c = cs[2 * i], s = dir * cs[2 * i + 1];
                float a = x1[i], b = x2[i];
                x1[i] = a * c - b * s;
                x2[i] = b * c + a * s;
            }
        }
    }
    free(tab);
}
static void rope_forward(tr_buf *qkv_, int B, int T, int H, int KV, int hd, float theta) {
    float *qkv = qkv_;
    rope_apply(qkv, B, T, H, KV, hd, theta, 1.0f);
}
static void rope_backward(tr_buf *dqkv_, int B, int T, int H, int KV, int hd, float theta) {
    float *dqkv = dqkv_;
    rope_apply(dqkv, B, T, H, KV, hd, theta, -1.0f);
}

/* ---- attention ------------------------------------------------------------------------- */

/* dst (cols, rows; ldd) = src (rows, cols; lds)^T. The attention products then all run as NN
 * sgemm: OpenBLAS 0.3.21 sends these NT shapes to its packing path, the NN ones to its faster
 * small-matrix kernel. */
static void transpose(float *restrict dst, int ldd, const float *restrict src, int lds, int rows,
                      int cols) {
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) dst[(size_t)c * ldd + r] = src[(size_t)r * lds + c];
}

/* s (nq, BK) = scale * q (nq, hd; ld) @ kt (hd, BK), then the causal mask: key j0+c is hidden
 * from query i0+r when j0+c > i0+r (set to -inf). */
static void scores_tile(float *restrict s, const float *q, const float *kt, int ld, int nq, int nk,
                        int hd, float scale, int i0, int j0) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nq, nk, hd, scale, q, ld, kt, BK, 0.0f,
                s, BK);
    if (j0 + nk - 1 > i0) /* the diagonal tile */
        for (int r = 0; r < nq; r++)
            for (int c = i0 + r - j0 + 1; c < nk; c++) s[r * BK + c] = -INFINITY;
}

/* FlashAttention-2 forward: one work item = (b, h, query tile); an online softmax over the key
 * tiles at or below the diagonal; the output accumulates in place in out. */
static void attention_forward(tr_buf *out_, float *lse, const tr_buf *qkv_, int B, int T, int H,
                              int KV, int hd) {
    float *out = out_;
    const float *qkv = qkv_;
    int S = (H + 2 * KV) * hd, OS = H * hd, G = H / KV, nqt = (T + BQ - 1) / BQ;
    float scale = 1.0f / sqrtf((float)hd);
#pragma omp parallel
    {
        float s[BQ * BK], m[BQ], l[BQ];
        float *kt = malloc(sizeof(float) * (size_t)hd * BK); /* (hd, BK) */
        if (!kt) abort();
        /* longest rows (last query tiles) first for dynamic load balance */
#pragma omp for schedule(dynamic, 1)
        for (int it = 0; it < B * H * nqt; it++) {
            int qt = nqt - 1 - it % nqt, bh = it / nqt, b = bh / H, h = bh % H;
            int i0 = qt * BQ, nq = T - i0 < BQ ? T - i0 : BQ;
            const float *q = qkv + ((size_t)b * T + i0) * S + (size_t)h * hd;
            const float *kb = qkv + (size_t)b * T * S + (size_t)(H + h / G) * hd;
            const float *vb = kb + (size_t)KV * hd;
            float *o = out + ((size_t)b * T + i0) * OS + (size_t)h * hd;
            for (int r = 0; r < nq; r++) {
                m[r] = -INFINITY;
                l[r] = 0.0f;
            }
            for (int j0 = 0; j0 <= i0 + nq - 1; j0 += BK) {
                int nk = T - j0 < BK ? T - j0 : BK;
                const float *k = kb + (size_t)j0 * S, *v = vb + (size_t)j0 * S;
                transpose(kt, BK, k, S, nk, hd);
                scores_tile(s, q, kt, S, nq, nk, hd, scale, i0, j0);
                for (int r = 0; r < nq; r++) {
                    float *restrict sr = s + r * BK;
                    float mx = m[r];
#pragma omp simd reduction(max : mx)
                    for (int c = 0; c < nk; c++) mx = sr[c] > mx ? sr[c] : mx;
                    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
                    for (int c = 0; c < nk; c++) {
                        float p = fast_expf(sr[c] - mx);
                        sr[c] = p;
                        sum += p;
                    }
                    float alpha = fast_expf(m[r] - mx); /* 0 on the first tile */
                    l[r] = l[r] * alpha + sum;
                    m[r] = mx;
                    if (j0 > 0) {
                        float *restrict orow = o + (size_t)r * OS;
                        for (int d = 0; d < hd; d++) orow[d] *= alpha;
                    }
                }
                /* o (nq, hd) (+)= p (nq, nk) @ v (nk, hd) */
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nq, hd, nk, 1.0f, s, BK,
                            v, S, j0 > 0 ? 1.0f : 0.0f, o, OS);
            }
            float *lr = lse + ((size_t)b * H + h) * T + i0;
            for (int r = 0; r < nq; r++) {
                float inv = 1.0f / l[r];
                float *restrict orow = o + (size_t)r * OS;
                for (int d = 0; d < hd; d++) orow[d] *= inv;
                lr[r] = m[r] + logf(l[r]);
            }
        }
        free(kt);
    }
}

/* FlashAttention-2 backward. One work item = (b, kv head g): it owns dk/dv of g and dq of the
 * G query heads that read g, so there are no races and every sum runs in a fixed order. For
 * each key tile: P = exp(S - lse), dV += P^T dO, dP = dO V^T, dS = P * (dP - D),
 * dQ += scale dS K, dK += scale dS^T Q, with D = rowsum(dO * O). */
static void attention_backward(tr_buf *dqkv_, const tr_buf *dout_, const tr_buf *qkv_, const tr_buf *out_,
                               const float *lse, int B, int T, int H, int KV, int hd) {
    float *dqkv = dqkv_;
    const float *dout = dout_;
    const float *qkv = qkv_;
    const float *out = out_;
    int S = (H + 2 * KV) * hd, OS = H * hd, G = H / KV;
    float scale = 1.0f / sqrtf((float)hd);
#pragma omp parallel
    {
        float pt[BK * BQ], dst[BK * BQ], ds[BQ * BK];
        float *dk = malloc(sizeof(float) * ((size_t)4 * BK * hd + (size_t)G * T));
        if (!dk) abort();
        float *dv = dk + (size_t)BK * hd;  /* (BK, hd) each */
        float *qt = dv + (size_t)BK * hd;  /* (hd, BQ) */
        float *dot = qt + (size_t)BQ * hd; /* (hd, BQ) */
        float *D = dot + (size_t)BQ * hd;  /* (G, T) */
#pragma omp for schedule(dynamic, 1)
        for (int bg = 0; bg < B * KV; bg++) {
            int b = bg / KV, g = bg % KV;
            const float *base = qkv + (size_t)b * T * S;
            float *dbase = dqkv + (size_t)b * T * S;
            for (int hh = 0; hh < G; hh++) {
                int h = g * G + hh;
                for (int t = 0; t < T; t++) {
                    const float *restrict o = out + ((size_t)b * T + t) * OS + (size_t)h * hd;
                    const float *restrict d = dout + ((size_t)b * T + t) * OS + (size_t)h * hd;
                    float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
                    for (int i = 0; i < hd; i++) acc += o[i] * d[i];
                    D[(size_t)hh * T + t] = acc;
                    memset(dbase + (size_t)t * S + (size_t)h * hd, 0, sizeof(float) * hd);
                }
            }
            for (int j0 = 0; j0 < T; j0 += BK) {
                int nk = T - j0 < BK ? T - j0 : BK;
                const float *k = base + (size_t)j0 * S + (size_t)(H + g) * hd;
                const float *v = k + (size_t)KV * hd;
                memset(dk, 0, sizeof(float) * (size_t)2 * BK * hd);
                for (int hh = 0; hh < G; hh++) {
                    int h = g * G + hh;
                    const float *lh = lse + ((size_t)b * H + h) * T;
                    for (int i0 = (j0 / BQ) * BQ; i0 < T; i0 += BQ) {
                        int nq = T - i0 < BQ ? T - i0 : BQ;
                        const float *q = base + (size_t)i0 * S + (size_t)h * hd;
                        const float *dO = dout + ((size_t)b * T + i0) * OS + (size_t)h * hd;
                        float *dq = dbase + (size_t)i0 * S + (size_t)h * hd;
                        /* pt (nk, nq) = scale * k @ q^T: key-major, so that with q and dO
                         * transposed every product below is NN */
                        transpose(qt, BQ, q, S, nq, hd);
                        transpose(dot, BQ, dO, OS, nq, hd);
                        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nk, nq, hd, scale,
                                    k, S, qt, BQ, 0.0f, pt, BQ);
                        const float *restrict lr = lh + i0;
                        const float *restrict Dr = D + (size_t)hh * T + i0;
                        for (int c = 0; c < nk; c++) {
                            float *restrict pc = pt + c * BQ;
                            /* causal: query i0+r sees key j0+c only when r >= j0+c-i0 */
                            int r0 = j0 + c - i0 > 0 ? j0 + c - i0 : 0;
                            for (int r = 0; r < r0; r++) pc[r] = 0.0f;
                            for (int r = r0; r < nq; r++) pc[r] = fast_expf(pc[r] - lr[r]);
                        }
                        /* dv (nk, hd) += pt (nk, nq) @ dO (nq, hd) */
                        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nk, hd, nq, 1.0f, pt,
                                    BQ, dO, OS, 1.0f, dv, hd);
                        /* dpt (nk, nq) = v (nk, hd) @ dO (nq, hd)^T */
                        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nk, nq, hd, 1.0f, v,
                                    S, dot, BQ, 0.0f, dst, BQ);
                        for (int c = 0; c < nk; c++) {
                            float *restrict dc = dst + c * BQ;
                            const float *restrict pc = pt + c * BQ;
                            for (int r = 0; r < nq; r++) dc[r] = pc[r] * (dc[r] - Dr[r]) * scale;
                        }
                        /* dk (nk, hd) += dst (nk, nq) @ q (nq, hd) */
                        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nk, hd, nq, 1.0f,
                                    dst, BQ, q, S, 1.0f, dk, hd);
                        for (int c = 0; c < nk; c++) /* ds = dst^T, (nq, nk) */
                            for (int r = 0; r < nq; r++) ds[r * BK + c] = dst[c * BQ + r];
                        /* dq (nq, hd) += ds (nq, nk) @ k (nk, hd) */
                        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nq, hd, nk, 1.0f,
                                    ds, BK, k, S, 1.0f, dq, S);
                    }
                }
                float *dkg = dbase + (size_t)j0 * S + (size_t)(H + g) * hd;
                float *dvg = dkg + (size_t)KV * hd;
                for (int c = 0; c < nk; c++) {
                    memcpy(dkg + (size_t)c * S, dk + (size_t)c * hd, sizeof(float) * hd);
                    memcpy(dvg + (size_t)c * S, dv + (size_t)c * hd, sizeof(float) * hd);
                }
            }
        }
        free(dk);
    }
}

/* One query row against the cache, like one row of attention_forward (same exp, same
 * scaling), without the tiling: the decode step of sampling. */
static void decode_attention(tr_buf *out_, tr_buf *qkv_, tr_buf *kc_, tr_buf *vc_, int pos, int H,
                             int KV, int hd, float theta) {
    float *out = out_, *qkv = qkv_, *kc = kc_, *vc = vc_;
    int h2 = hd / 2, G = H / KV, KS = KV * hd;
    if (theta > 0) /* rotate q and k heads by this position, as rope_forward would */
        for (int h = 0; h < H + KV; h++) {
            float *x1 = qkv + (size_t)h * hd, *x2 = x1 + h2;
            for (int i = 0; i < h2; i++) {
                double ang = pos * pow((double)theta, -2.0 * i / hd);
                float c = (float)cos(ang), sn = (float)sin(ang), a = x1[i], b = x2[i];
                x1[i] = a * c - b * sn;
                x2[i] = b * c + a * sn;
            }
        }
    memcpy(kc + (size_t)pos * KS, qkv + (size_t)H * hd, sizeof(float) * (size_t)KS);
    memcpy(vc + (size_t)pos * KS, qkv + (size_t)(H + KV) * hd, sizeof(float) * (size_t)KS);
    float scale = 1.0f / sqrtf((float)hd);
    float *s = malloc(sizeof(float) * (size_t)(pos + 1));
    if (!s) abort();
    for (int h = 0; h < H; h++) {
        const float *q = qkv + (size_t)h * hd;
        const float *k = kc + (size_t)(h / G) * hd, *v = vc + (size_t)(h / G) * hd;
        float mx = -INFINITY, sum = 0.0f;
        for (int j = 0; j <= pos; j++) {
            float d = 0.0f;
            for (int c = 0; c < hd; c++) d += q[c] * k[(size_t)j * KS + c];
            s[j] = d * scale;
            mx = s[j] > mx ? s[j] : mx;
        }
        for (int j = 0; j <= pos; j++) sum += (s[j] = fast_expf(s[j] - mx));
        float *o = out + (size_t)h * hd;
        for (int c = 0; c < hd; c++) o[c] = 0.0f;
        for (int j = 0; j <= pos; j++) {
            float p = s[j] / sum;
            for (int c = 0; c < hd; c++) o[c] += p * v[(size_t)j * KS + c];
        }
    }
    free(s);
}

/* ---- pointwise ------------------------------------------------------------------------- */

#define GELU_K 0.7978845608028654f /* sqrt(2/pi) */
#define GELU_C 0.044715f

/* 0.5x(1 + tanh(u)) = x * sigmoid(2u), u = k(x + c x^3): one exp, no cancellation */
static void gelu_forward(tr_buf *out_, const tr_buf *inp_, size_t n) {
    float *out = out_;
    const float *inp = inp_;
    float *restrict y = out;
    const float *restrict x = inp;
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) {
        float xi = x[i], u = GELU_K * (xi + GELU_C * xi * xi * xi);
        y[i] = xi * fast_sigmoidf(2.0f * u);
    }
}

/* d/dx = 0.5(1+tanh u) + 0.5x(1-tanh^2 u) u'; with s = sigmoid(2u): 1+tanh = 2s,
 * 1-tanh^2 = 4s(1-s), u' = k(1 + 3c x^2) */
static inline float gelu_grad(float xi) {
    float u = GELU_K * (xi + GELU_C * xi * xi * xi);
    float s = fast_sigmoidf(2.0f * u);
    float du = GELU_K * (1.0f + 3.0f * GELU_C * xi * xi);
    return s + 2.0f * xi * s * (1.0f - s) * du;
}

static void gelu_backward(tr_buf *dinp_, const tr_buf *dout_, const tr_buf *inp_, size_t n) {
    float *dinp = dinp_;
    const float *dout = dout_;
    const float *inp = inp_;
    float *restrict dx = dinp;
    const float *restrict g = dout, *restrict x = inp;
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) dx[i] = g[i] * gelu_grad(x[i]);
}

/* The MLP's GELU fused with its neighbours: the same arithmetic as the parts (BLAS does the
 * products either way; the CPU gains nothing more from fusing them) */
static void linear_gelu_forward(tr_buf *out, tr_buf *pre, const tr_buf *inp, const tr_buf *w,
                                const tr_buf *bias, int N, int IC, int OC) {
    linear_forward(pre, inp, w, bias, N, IC, OC);
    gelu_forward(out, pre, (size_t)N * (size_t)OC);
}

static void linear_backward_gelu(tr_buf *dinp_, tr_buf *dw, tr_buf *dbias, const tr_buf *dout,
                                 const tr_buf *inp, const tr_buf *w, const tr_buf *pre_, int N,
                                 int IC, int OC) {
    linear_backward(dinp_, dw, dbias, dout, inp, w, N, IC, OC);
    float *dx = dinp_;
    const float *x = pre_;
    size_t n = (size_t)N * (size_t)IC;
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) dx[i] = dx[i] * gelu_grad(x[i]);
}

static void swiglu_forward(tr_buf *out_, const tr_buf *inp_, int N, int Hd) {
    float *out = out_;
    const float *inp = inp_;
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *restrict gt = inp + (size_t)n * 2 * Hd;
        const float *restrict up = gt + Hd;
        float *restrict y = out + (size_t)n * Hd;
        for (int i = 0; i < Hd; i++) y[i] = gt[i] * fast_sigmoidf(gt[i]) * up[i];
    }
}

/* silu'(g) = sig(g) (1 + g (1 - sig(g))) */
static void swiglu_backward(tr_buf *dinp_, const tr_buf *dout_, const tr_buf *inp_, int N, int Hd) {
    float *dinp = dinp_;
    const float *dout = dout_;
    const float *inp = inp_;
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *restrict gt = inp + (size_t)n * 2 * Hd;
        const float *restrict up = gt + Hd;
        const float *restrict d = dout + (size_t)n * Hd;
        float *restrict dg = dinp + (size_t)n * 2 * Hd;
        float *restrict du = dg + Hd;
        for (int i = 0; i < Hd; i++) {
            float gi = gt[i], sg = fast_sigmoidf(gi);
            dg[i] = d[i] * up[i] * sg * (1.0f + gi * (1.0f - sg));
            du[i] = d[i] * gi * sg;
        }
    }
}

/* out may alias a or b, so no restrict; gcc still vectorizes (elementwise, same index) */
static void add(tr_buf *out_, const tr_buf *a_, const tr_buf *b_, size_t n) {
    float *out = out_;
    const float *a = a_;
    const float *b = b_;
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

/* ---- loss ------------------------------------------------------------------------------ */

/* loss = log(sum exp(x - max)) - (x[t] - max); grad = (softmax - onehot) * dscale */
static void softmax_xent(tr_buf *logits_, float *losses, const int *targets, int N, int V, int ld,
                         float dscale, int want_grad) {
    float *logits = logits_;
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        float *restrict x = logits + (size_t)n * ld;
        int t = targets[n];
        if (want_grad && ld > V) memset(x + V, 0, sizeof(float) * (size_t)(ld - V));
        if (t < 0) {
            losses[n] = 0.0f;
            if (want_grad) memset(x, 0, sizeof(float) * V);
            continue;
        }
        float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
        for (int j = 0; j < V; j++) mx = x[j] > mx ? x[j] : mx;
        float xt = x[t];
        /* float partial sums over 1024-wide blocks (vectorized), the blocks added in double */
        double sum = 0.0;
        for (int j0 = 0; j0 < V; j0 += 1024) {
            int j1 = j0 + 1024 < V ? j0 + 1024 : V;
            float bs = 0.0f;
            if (want_grad) {
#pragma omp simd reduction(+ : bs)
                for (int j = j0; j < j1; j++) {
                    float e = fast_expf(x[j] - mx);
                    x[j] = e;
                    bs += e;
                }
            } else {
#pragma omp simd reduction(+ : bs)
                for (int j = j0; j < j1; j++) bs += fast_expf(x[j] - mx);
            }
            sum += bs;
        }
        losses[n] = (float)(log(sum) - ((double)xt - mx));
        if (want_grad) {
            float k = (float)(dscale / sum);
            for (int j = 0; j < V; j++) x[j] *= k;
            x[t] -= dscale;
        }
    }
}

/* The same over a vocabulary split by tensor parallelism (backend.h): this rank's classes
 * [lo, lo + V) are its columns 0..V-1. Row statistics first: max, sum of exp(x - max), and
 * the target's logit when it is one of this rank's classes. */
static void xent_stats(float *stats, const tr_buf *logits_, const int *targets, int lo, int N,
                       int V, int ld) {
    const float *logits = logits_;
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *restrict x = logits + (size_t)n * ld;
        float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
        for (int j = 0; j < V; j++) mx = x[j] > mx ? x[j] : mx;
        double sum = 0.0; /* as softmax_xent: float blocks of 1024, added in double */
        for (int j0 = 0; j0 < V; j0 += 1024) {
            int j1 = j0 + 1024 < V ? j0 + 1024 : V;
            float bs = 0.0f;
#pragma omp simd reduction(+ : bs)
            for (int j = j0; j < j1; j++) bs += fast_expf(x[j] - mx);
            sum += bs;
        }
        int t = targets[n] - lo;
        stats[3 * n] = mx;
        stats[3 * n + 1] = (float)sum;
        stats[3 * n + 2] = targets[n] >= 0 && t >= 0 && t < V ? x[t] : 0.0f;
    }
}

/* Every rank's statistics (R, N, 3) combined: M = max m_r, S = sum_r s_r exp(m_r - M); the
 * loss log S + M - x_target, and the gradient of this rank's classes. */
static void xent_finish(tr_buf *logits_, float *losses, const float *all, int R,
                        const int *targets, int lo, int N, int V, int ld, float dscale,
                        int want_grad) {
    float *logits = logits_;
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        float *restrict x = logits + (size_t)n * ld;
        if (want_grad && ld > V) memset(x + V, 0, sizeof(float) * (size_t)(ld - V));
        if (targets[n] < 0) {
            losses[n] = 0.0f;
            if (want_grad) memset(x, 0, sizeof(float) * (size_t)V);
            continue;
        }
        float M = -INFINITY, xt = 0.0f;
        for (int r = 0; r < R; r++) {
            const float *st = all + ((size_t)r * N + n) * 3;
            M = st[0] > M ? st[0] : M;
            xt += st[2]; /* one rank's is the target's, the others' are 0 */
        }
        double S = 0.0;
        for (int r = 0; r < R; r++) {
            const float *st = all + ((size_t)r * N + n) * 3;
            if (st[1] > 0) S += (double)st[1] * exp((double)st[0] - M);
        }
        losses[n] = (float)(log(S) - ((double)xt - M));
        if (!want_grad) continue;
        float k = (float)(dscale / S);
        for (int j = 0; j < V; j++) x[j] = fast_expf(x[j] - M) * k;
        int t = targets[n] - lo;
        if (t >= 0 && t < V) x[t] -= dscale;
    }
}

/* ---- optimizer helpers ----------------------------------------------------------------- */

#define SUMSQ_CHUNK 65536 /* fixed chunks: the sum does not depend on the thread count */

static double sumsq(const tr_buf *x_, size_t n) {
    const float *x = x_;
    size_t nchunk = (n + SUMSQ_CHUNK - 1) / SUMSQ_CHUNK;
    if (nchunk == 0) return 0.0;
    double *part = malloc(sizeof(double) * nchunk);
    if (!part) abort();
#pragma omp parallel for schedule(static)
    for (size_t k = 0; k < nchunk; k++) {
        size_t i1 = (k + 1) * SUMSQ_CHUNK < n ? (k + 1) * SUMSQ_CHUNK : n;
        double s = 0.0;
#pragma omp simd reduction(+ : s)
        for (size_t i = k * SUMSQ_CHUNK; i < i1; i++) s += (double)x[i] * x[i];
        part[k] = s;
    }
    double s = 0.0;
    for (size_t k = 0; k < nchunk; k++) s += part[k];
    free(part);
    return s;
}

static void scale(tr_buf *x_, float s, size_t n) {
    float *x = x_;
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) x[i] *= s;
}

/* torch.optim.AdamW: p *= 1 - lr*wd; m, v updated with g*gscale; p -= lr mhat/(sqrt(vhat)+eps).
 * The storage dtype is fp32, so the master weights are the parameters (param == master). */
static void adamw(float *master, tr_buf *param, const tr_buf *g_, float *m, float *v, size_t n,
                  float lr, float beta1, float beta2, float eps, float wd, float bc1, float bc2,
                  float gscale) {
    (void)param;
    float *restrict pp = master, *restrict mm = m, *restrict vv = v;
    const float *restrict gg = g_;
    float decay = 1.0f - lr * wd, ib1 = 1.0f / bc1, ib2 = 1.0f / bc2;
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) {
        float gi = gg[i] * gscale;
        float mi = beta1 * mm[i] + (1.0f - beta1) * gi;
        float vi = beta2 * vv[i] + (1.0f - beta2) * gi * gi;
        mm[i] = mi;
        vv[i] = vi;
        pp[i] = pp[i] * decay - lr * (mi * ib1) / (sqrtf(vi * ib2) + eps);
    }
}

/* every stretch in one parallel region (no fork/join per small tensor) */
static void adamw_multi(const tr_adamw_seg *sg, int ns, float lr, float beta1, float beta2,
                        float eps, float bc1, float bc2, float gscale) {
    float ib1 = 1.0f / bc1, ib2 = 1.0f / bc2;
#pragma omp parallel
    for (int k = 0; k < ns; k++) {
        float *restrict pp = sg[k].master, *restrict mm = sg[k].m, *restrict vv = sg[k].v;
        const float *restrict gg = sg[k].grad;
        float decay = 1.0f - lr * sg[k].wd;
        size_t n = sg[k].n;
#pragma omp for schedule(static) nowait
        for (size_t i = 0; i < n; i++) {
            float gi = gg[i] * gscale;
            float mi = beta1 * mm[i] + (1.0f - beta1) * gi;
            float vi = beta2 * vv[i] + (1.0f - beta2) * gi * gi;
            mm[i] = mi;
            vv[i] = vi;
            pp[i] = pp[i] * decay - lr * (mi * ib1) / (sqrtf(vi * ib2) + eps);
        }
    }
}

/* ---- the table ------------------------------------------------------------------------- */

static const tr_backend cpu_backend = {
    .name = "cpu",
    .dtype = TR_DTYPE_F32,
    .pad_vocab = 1,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .upload = cpu_copy,
    .download = cpu_copy,
    .zero = cpu_zero,
    .copy = cpu_copy,
    .to_storage = cpu_to_storage,
    .from_storage = cpu_from_storage,
    .linear_forward = linear_forward,
    .linear_backward = linear_backward,
    .embedding_forward = embedding_forward,
    .embedding_backward = embedding_backward,
    .positions_forward = positions_forward,
    .positions_backward = positions_backward,
    .layernorm_forward = layernorm_forward,
    .layernorm_backward = layernorm_backward,
    .rmsnorm_forward = rmsnorm_forward,
    .rmsnorm_backward = rmsnorm_backward,
    .rope_forward = rope_forward,
    .rope_backward = rope_backward,
    .attention_forward = attention_forward,
    .attention_backward = attention_backward,
    .decode_attention = decode_attention,
    .gelu_forward = gelu_forward,
    .gelu_backward = gelu_backward,
    .swiglu_forward = swiglu_forward,
    .swiglu_backward = swiglu_backward,
    .add = add,
    .residual_norm_forward = residual_norm_forward,
    .linear_gelu_forward = linear_gelu_forward,
    .linear_backward_gelu = linear_backward_gelu,
    .softmax_xent = softmax_xent,
    .xent_stats = xent_stats,
    .xent_finish = xent_finish,
    .sumsq = sumsq,
    .scale = scale,
    .adamw = adamw,
    .adamw_multi = adamw_multi,
};

const tr_backend *tr_backend_cpu(void) { return &cpu_backend; }

int tr_backend_cpu_threads(void) { return omp_get_max_threads(); }

void tr_backend_cpu_set_threads(int n) {
    if (n < 1) return;
    omp_set_num_threads(n); /* OpenBLAS's OpenMP build follows the team size */
#ifdef OPENBLAS_VERSION
    openblas_set_num_threads(n); /* its pthreads build keeps a pool of its own */
#endif
}

const char *tr_backend_cpu_blas_threads(char *fix, size_t fixlen) {
    if (fixlen) fix[0] = 0;
#ifdef OPENBLAS_VERSION
    int kind = openblas_get_parallel(); /* 0 sequential, 1 pthreads, 2 OpenMP */
    if (kind == 0) return "sequential";
    if (kind == 2) return "openmp";
    Dl_info where = {0};
    dladdr((void *)cblas_sgemm, &where);
    snprintf(fix, fixlen,
             "%s is OpenBLAS's pthreads build: its thread pool spins against our OpenMP one (about "
             "half speed); apt-get install libopenblas-openmp-dev, then rebuild: rm -rf build && "
             "./setup.sh",
             where.dli_fname ? where.dli_fname : "the BLAS library");
    return "pthreads";
#else
    return "unknown";
#endif
}
