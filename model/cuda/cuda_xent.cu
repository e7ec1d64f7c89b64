/* The CUDA backend's softmax cross entropy: one block per row over the whole vocabulary, and
 * the same over a vocabulary split by tensor parallelism (per-rank statistics, then a finish
 * that combines every rank's). bf as in cuda_ops.cu; fp32 arithmetic, fixed-order reductions. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/cuda/cuda_private.h"

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
