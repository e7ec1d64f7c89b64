/* Private to model/cuda/: error checks, the backend's one stream, its scratch memory, the
 * storage-dtype load/store helpers every kernel uses, and the launchers each .cu file exports
 * to the table in cuda_backend.cu. Included by .cu files only.
 *
 * The device helpers below have bodies in this header on purpose: without relocatable device
 * code (-rdc, which costs inlining and speed) a __device__ function must be visible in every
 * translation unit that calls it. They are static inline, so each file gets its own copy. */
#ifndef TR_CUDA_PRIVATE_H
#define TR_CUDA_PRIVATE_H

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

extern "C" {
#include "model/backend.h"
}

/* A device error mid-step is not recoverable: one line naming the call and place, then abort. */
void tr_cuda_fail(const char *what, const char *err, const char *file, int line);
#define CK(call)                                                                                \
    do {                                                                                        \
        cudaError_t e_ = (call);                                                                \
        if (e_ != cudaSuccess) tr_cuda_fail(#call, cudaGetErrorString(e_), __FILE__, __LINE__); \
    } while (0)
/* after every kernel launch: a bad configuration shows here, not at the next sync */
#define CK_LAUNCH() CK(cudaGetLastError())

/* The single stream every operation is ordered on (created in tr_backend_cuda). */
extern cudaStream_t tr_cuda_stream;

/* Every device allocation of the backend: cudaMalloc and cudaFree, with the bytes held
 * counted (tr_backend_cuda_memory) so that the run can show them beside the plan's figure. */
cudaError_t tr_cuda_malloc(void **p, size_t bytes);
cudaError_t tr_cuda_free(void *p);

/* Backend-private device scratch, one slot per user so that no two live uses overlap. Grows
 * (freeing the old block, which synchronizes the device) and never shrinks. */
enum { SCR_REDUCE, SCR_EMBED, SCR_ROPE, SCR_ATTN, SCR_SUMSQ, SCR_CUDNN, SCR_COUNT };
void *tr_cuda_scratch(int slot, size_t bytes);
/* adamw_multi's device tables grown to at least these bytes (cuda_ops.cu): 0, or -1 when the
 * device is out of memory */
int tr_cuda_adamw_reserve(size_t seg_bytes, size_t block_bytes);

/* Threads per block for the simple kernels, and a grid large enough to cover n items with
 * grid-stride loops (capped; the loops do the rest). */
#define TPB 256
static inline unsigned tr_cuda_grid(size_t n, unsigned per_block) {
    size_t g = (n + per_block - 1) / per_block;
    if (g < 1) g = 1;
    if (g > 65535u * 8u) g = 65535u * 8u;
    return (unsigned)g;
}

/* 1 when every pointer given is 16-byte aligned: 128-bit loads and stores are then legal on
 * any 8-element chunk that starts at an index divisible by 8. */
static inline int tr_cuda_aligned16(const void *a, const void *b, const void *c, const void *d) {
    return ((uintptr_t)a % 16 == 0) && ((uintptr_t)b % 16 == 0) && ((uintptr_t)c % 16 == 0) &&
           ((uintptr_t)d % 16 == 0);
}

/* grid-stride over 8-element chunks of n elements */
#define FOR_CHUNKS(i, n)                                                                          \
    for (size_t i = (blockIdx.x * (size_t)blockDim.x + threadIdx.x) * 8; i < (n);                \
         i += (size_t)gridDim.x * blockDim.x * 8)

/* ---- storage-dtype access on the device; bf = 1 for bf16 storage, 0 for fp32 ---------- */

static __device__ __forceinline__ float ldf(const void *p, size_t i, int bf) {
    return bf ? __bfloat162float(((const __nv_bfloat16 *)p)[i]) : ((const float *)p)[i];
}
static __device__ __forceinline__ void stf(void *p, size_t i, float v, int bf) {
    if (bf)
        ((__nv_bfloat16 *)p)[i] = __float2bfloat16_rn(v);
    else
        ((float *)p)[i] = v;
}

/* Elements i..i+3 (i divisible by 4) into v; one 16-byte (fp32) or 8-byte (bf16) access when
 * vec and the chunk is whole, else element by element up to n (missing elements read as 0).
 * A warp's request is contiguous in both dtypes. (ld8's fp32 path is two of these, 32 bytes
 * apart per thread: each request then touches twice the sectors it uses, bench/emu_memory.sh,
 * which matters where fp32 arrays dominate the traffic, as in AdamW.) */
static __device__ __forceinline__ void ld4(float v[4], const void *p, size_t i, size_t n, int bf,
                                           int vec) {
    if (vec && i + 4 <= n) {
        if (bf) {
            uint2 u = *(const uint2 *)((const __nv_bfloat16 *)p + i);
            float2 a = __bfloat1622float2(*(const __nv_bfloat162 *)&u.x);
            float2 b = __bfloat1622float2(*(const __nv_bfloat162 *)&u.y);
            v[0] = a.x, v[1] = a.y, v[2] = b.x, v[3] = b.y;
        } else {
            float4 a = *(const float4 *)((const float *)p + i);
            v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w;
        }
        return;
    }
#pragma unroll
    for (int k = 0; k < 4; k++) v[k] = i + k < n ? ldf(p, i + k, bf) : 0.0f;
}
static __device__ __forceinline__ void st4(void *p, size_t i, size_t n, const float v[4], int bf,
                                           int vec) {
    if (vec && i + 4 <= n) {
        if (bf) {
            __nv_bfloat162 a = __floats2bfloat162_rn(v[0], v[1]), b = __floats2bfloat162_rn(v[2], v[3]);
            uint2 u;
            u.x = *(const uint32_t *)&a;
            u.y = *(const uint32_t *)&b;
            *(uint2 *)((__nv_bfloat16 *)p + i) = u;
        } else {
            *(float4 *)((float *)p + i) = make_float4(v[0], v[1], v[2], v[3]);
        }
        return;
    }
#pragma unroll
    for (int k = 0; k < 4; k++)
        if (i + k < n) stf(p, i + k, v[k], bf);
}

/* Elements i..i+7 (i divisible by 8), as ld4 / st4: one 128-bit access for bf16, two ld4 /
 * st4 otherwise (fp32, or a chunk that is not whole or not aligned). */
static __device__ __forceinline__ void ld8(float v[8], const void *p, size_t i, size_t n, int bf,
                                           int vec) {
    if (bf && vec && i + 8 <= n) {
        uint4 u = *(const uint4 *)((const __nv_bfloat16 *)p + i);
        const __nv_bfloat162 *h = (const __nv_bfloat162 *)&u;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            float2 f = __bfloat1622float2(h[k]);
            v[2 * k] = f.x;
            v[2 * k + 1] = f.y;
        }
        return;
    }
    ld4(v, p, i, n, bf, vec);
    ld4(v + 4, p, i + 4, n, bf, vec);
}
static __device__ __forceinline__ void st8(void *p, size_t i, size_t n, const float v[8], int bf,
                                           int vec) {
    if (bf && vec && i + 8 <= n) {
        uint4 u;
        __nv_bfloat162 *h = (__nv_bfloat162 *)&u;
#pragma unroll
        for (int k = 0; k < 4; k++) h[k] = __floats2bfloat162_rn(v[2 * k], v[2 * k + 1]);
        *(uint4 *)((__nv_bfloat16 *)p + i) = u;
        return;
    }
    st4(p, i, n, v, bf, vec);
    st4(p, i + 4, n, v + 4, bf, vec);
}

static __device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
static __device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* ---- launchers (extern "C" so that the table file, or C, can call them) --------------- */
extern "C" {
/* cuda_attention_tc.cu: tensor-core attention: whether it applies (bf16, unless
 * tr_backend_simple_attention; hd 64 or 128, 16-byte aligned buffers); forward; backward given D = rowsum(dO * O) */
int tr_cuda_attention_tc_usable(int bf, int hd, const void *a, const void *b, const void *c,
                                const void *d);
void tr_cuda_attention_tc_forward(tr_buf *out, float *lse, const tr_buf *qkv, int B, int T, int H,
                                  int KV, int hd);
void tr_cuda_attention_tc_backward(tr_buf *dqkv, const tr_buf *dout, const tr_buf *qkv,
                                   const float *lse, const float *D, int B, int T, int H, int KV,
                                   int hd);
void tr_cuda_adamw_multi(int bf, const tr_adamw_seg *s, int n, float lr, float beta1,
                         float beta2, float eps, float bc1, float bc2, float gscale);
/* cuda_linear.cu */
int tr_cuda_linear_init(char *why, size_t whylen);
void tr_cuda_linear_gelu_forward(int bf, tr_buf *out, tr_buf *pre, const tr_buf *inp,
                                 const tr_buf *w, const tr_buf *bias, int N, int IC, int OC);
void tr_cuda_linear_backward_gelu(int bf, tr_buf *dinp, tr_buf *dw, tr_buf *dbias,
                                  const tr_buf *dout, const tr_buf *inp, const tr_buf *w,
                                  const tr_buf *pre, int N, int IC, int OC);
void tr_cuda_residual_norm_forward(int bf, tr_buf *sum, tr_buf *out, float *mean, float *rstd,
                                   const tr_buf *a, const tr_buf *b, const tr_buf *w,
                                   const tr_buf *bias, int N, int C, float eps, int rms);
void tr_cuda_linear_forward(int bf, tr_buf *out, const tr_buf *inp, const tr_buf *w, const tr_buf *bias,
                            int N, int IC, int OC);
void tr_cuda_linear_backward(int bf, tr_buf *dinp, tr_buf *dw, tr_buf *dbias, const tr_buf *dout,
                             const tr_buf *inp, const tr_buf *w, int N, int IC, int OC);
/* cuda_ops.cu: mode 0 sums x; mode 1 sums x * (y - mean) * rstd and x (LayerNorm dw, db);
 * mode 2 sums x * y * rstd (RMSNorm dw); into acc (and acc2) with +=, deterministic */
void tr_cuda_colsum(int bf, tr_buf *acc, tr_buf *acc2, const tr_buf *x, const tr_buf *y,
                    const float *mean, const float *rstd, int N, int C, int mode);
void tr_cuda_embedding_forward(int bf, tr_buf *out, const int *tokens, const tr_buf *wte, int N,
                               int C);
void tr_cuda_embedding_backward(int bf, tr_buf *dwte, const tr_buf *dout, const int *tokens, int N,
                                int C);
void tr_cuda_positions_forward(int bf, tr_buf *x, const tr_buf *wpe, int B, int T, int C);
void tr_cuda_positions_backward(int bf, tr_buf *dwpe, const tr_buf *dx, int B, int T, int C);
void tr_cuda_layernorm_forward(int bf, tr_buf *out, float *mean, float *rstd, const tr_buf *inp,
                               const tr_buf *w, const tr_buf *b, int N, int C, float eps);
void tr_cuda_layernorm_backward(int bf, tr_buf *dinp, tr_buf *dw, tr_buf *db, const tr_buf *dout,
                                const tr_buf *inp, const tr_buf *w, const float *mean,
                                const float *rstd, int N, int C);
void tr_cuda_rmsnorm_forward(int bf, tr_buf *out, float *rstd, const tr_buf *inp, const tr_buf *w,
                             int N, int C, float eps);
void tr_cuda_rmsnorm_backward(int bf, tr_buf *dinp, tr_buf *dw, const tr_buf *dout,
                              const tr_buf *inp, const tr_buf *w, const float *rstd, int N, int C);
void tr_cuda_rope_forward(int bf, tr_buf *qkv, int B, int T, int H, int KV, int hd, float theta);
void tr_cuda_rope_backward(int bf, tr_buf *dqkv, int B, int T, int H, int KV, int hd, float theta);
void tr_cuda_gelu_forward(int bf, tr_buf *out, const tr_buf *inp, size_t n);
void tr_cuda_gelu_backward(int bf, tr_buf *dinp, const tr_buf *dout, const tr_buf *inp, size_t n);
void tr_cuda_swiglu_forward(int bf, tr_buf *out, const tr_buf *inp, int N, int Hd);
void tr_cuda_swiglu_backward(int bf, tr_buf *dinp, const tr_buf *dout, const tr_buf *inp, int N,
                             int Hd);
void tr_cuda_add(int bf, tr_buf *out, const tr_buf *a, const tr_buf *b, size_t n);
void tr_cuda_softmax_xent(int bf, tr_buf *logits, float *losses, const int *targets, int N, int V,
                          int ld, float dscale, int want_grad);
void tr_cuda_xent_stats(int bf, float *stats, const tr_buf *logits, const int *targets, int lo,
                        int N, int V, int ld);
void tr_cuda_xent_finish(int bf, tr_buf *logits, float *losses, const float *all_stats, int R,
                         const int *targets, int lo, int N, int V, int ld, float dscale,
                         int want_grad);
double tr_cuda_sumsq(int bf, const tr_buf *x, size_t n);
void tr_cuda_scale(int bf, tr_buf *x, float s, size_t n);
void tr_cuda_adamw(int bf, float *master, tr_buf *param, const tr_buf *g, float *m, float *v,
                   size_t n, float lr, float beta1, float beta2, float eps, float wd, float bc1,
                   float bc2, float gscale);
/* cuda_attention.cu */
void tr_cuda_decode_attention(int bf, tr_buf *out, tr_buf *qkv, tr_buf *kc, tr_buf *vc, int pos,
                              int H, int KV, int hd, float theta);
void tr_cuda_attention_forward(int bf, tr_buf *out, float *lse, const tr_buf *qkv, int B, int T,
                               int H, int KV, int hd);
void tr_cuda_attention_backward(int bf, tr_buf *dqkv, const tr_buf *dout, const tr_buf *qkv,
                                const tr_buf *out, const float *lse, int B, int T, int H, int KV,
                                int hd);
/* cuda_attention_cudnn.cu: the same op on cuDNN's fused attention (bf16). 0, or -1 with the
 * reason in tr_cuda_attention_cudnn_error(); _workspace: the device bytes it needs at a shape
 * (0 when cuDNN cannot run it); _use_cudnn: TR_CUDA_ATTENTION's choice for this shape (auto
 * decides here, once per shape, by timing both) */
int tr_cuda_attention_cudnn_available(void);
const char *tr_cuda_attention_cudnn_error(void);
size_t tr_cuda_attention_cudnn_workspace(int B, int T, int H, int KV, int hd);
/* What the cuDNN scratch slot must hold at this shape: the workspace above, and under
 * TR_CUDA_ATTENTION=auto the buffers its first-call comparison of ours and cuDNN's uses. */
size_t tr_cuda_attention_cudnn_reserve(int B, int T, int H, int KV, int hd);
int tr_cuda_attention_cudnn_forward(tr_buf *out, float *lse, const tr_buf *qkv, int B, int T,
                                    int H, int KV, int hd);
int tr_cuda_attention_cudnn_backward(tr_buf *dqkv, const tr_buf *dout, const tr_buf *qkv,
                                     const tr_buf *out, const float *lse, int B, int T, int H,
                                     int KV, int hd);
int tr_cuda_attention_use_cudnn(int bf, const tr_buf *qkv, int B, int T, int H, int KV, int hd);
}

#endif
