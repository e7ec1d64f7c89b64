/* Causal attention without the T x T matrix (FlashAttention-2's algorithm: an online softmax
 * over key tiles held in shared memory; the backward recomputes the probabilities from the
 * saved log-sum-exp). qkv rows are [q (H*hd) | k (KV*hd) | v (KV*hd)], query head h reads
 * kv head h / (H/KV), scale 1/sqrt(hd), lse (B,H,T) in fp32.
 *
 * SLOW PATH: this version runs on the CUDA cores (fp32 FMAs from shared memory), not the tensor
 * cores. It is the correct, general one (any hd <= 128, fp32 or bf16 storage, any T), and the
 * reference the tensor-core kernels (cuda_attention_tc.cu, bf16 with hd 64 or 128, chosen with
 * the default where they apply; TR_CUDA_ATTENTION=simple forces this one) must match.
 *
 * Work layout: 8 lanes ("a group") own one row (a query, or a key in the dk/dv pass); lane j
 * of the group holds dimensions j, j+8, j+16, ... of that row in registers, dot products are
 * summed across the group with 3 shuffles. A block is 32 groups = 32 rows; tiles of 32 keys
 * (or queries) are staged in shared memory as fp32. Every sum runs in a fixed order and the
 * backward uses no atomics: dq is one pass over query rows, dk/dv another over key rows (GQA's
 * G query heads are summed inside the thread, in head order), so results are bitwise
 * reproducible. */
#include <math.h>

#include "model/cuda/cuda_private.h"

#define GRP 8                 /* lanes per row */
#define ROWS 32               /* rows per block */
#define THREADS (GRP * ROWS)  /* 256 */
#define TILE 32               /* keys (queries) per shared-memory tile; == ROWS */
#define DMAX 128              /* largest head size */
#define DPT (DMAX / GRP)      /* dimensions per lane at most */

/* sum over the 8 lanes of a group (groups are aligned to 8 lanes, so xor 1, 2, 4 stays inside) */
static __device__ __forceinline__ float group_sum(float v) {
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    v += __shfl_xor_sync(0xffffffffu, v, 2);
    v += __shfl_xor_sync(0xffffffffu, v, 4);
    return v;
}

/* rows [r0, r0 + TILE) of one head's hd columns (col0 within each row of stride S) into a
 * shared fp32 tile; rows at or past T read as 0 */
static __device__ __forceinline__ void load_tile(float (*dst)[DMAX], const void *src, size_t base,
                                                 size_t S, int col0, int r0, int T, int hd, int bf) {
    for (int e = threadIdx.x; e < TILE * hd; e += THREADS) {
        int rr = e / hd, d = e % hd, r = r0 + rr;
        dst[rr][d] = r < T ? ldf(src, base + (size_t)r * S + col0 + d, bf) : 0.0f;
    }
}

/* grid (query tiles, B*H), THREADS threads; last query tiles (the longest) first */
static __global__ void __launch_bounds__(THREADS) attn_fwd_k(void *out, float *lse, const void *qkv,
                                                           int T, int H, int KV, int hd,
                                                           float scale, int bf) {
    __shared__ float Ks[TILE][DMAX], Vs[TILE][DMAX];
    int bh = blockIdx.y, b = bh / H, h = bh % H, g = h / (H / KV);
    int q0 = (gridDim.x - 1 - blockIdx.x) * ROWS;
    int r = threadIdx.x / GRP, j = threadIdx.x % GRP, qi = q0 + r, qc = qi < T ? qi : T - 1;
    size_t S = (size_t)(H + 2 * KV) * hd, base = (size_t)b * T * S;
    float q[DPT], o[DPT];
#pragma unroll
    for (int i = 0; i < DPT; i++) {
        int d = j + GRP * i;
        q[i] = d < hd ? ldf(qkv, base + (size_t)qc * S + (size_t)h * hd + d, bf) * scale : 0.0f;
        o[i] = 0.0f;
    }
    float m = -INFINITY, l = 0.0f;
    int kend = min(T, q0 + ROWS);
    for (int k0 = 0; k0 < kend; k0 += TILE) {
        __syncthreads(); /* the previous tile is no longer read */
        load_tile(Ks, qkv, base, S, (H + g) * hd, k0, T, hd, bf);
        load_tile(Vs, qkv, base, S, (H + KV + g) * hd, k0, T, hd, bf);
        __syncthreads();
        float s[TILE], mx = m;
#pragma unroll
        for (int kk = 0; kk < TILE; kk++) {
            float p = 0.0f;
#pragma unroll
            for (int i = 0; i < DPT; i++)
                if (j + GRP * i < hd) p += q[i] * Ks[kk][j + GRP * i];
            p = group_sum(p);
            s[kk] = k0 + kk <= qc ? p : -INFINITY;
            mx = fmaxf(mx, s[kk]);
        }
        /* key 0 is in the first tile and visible to every query, so mx is finite here */
        float alpha = expf(m - mx);
        l *= alpha;
#pragma unroll
        for (int i = 0; i < DPT; i++) o[i] *= alpha;
#pragma unroll
        for (int kk = 0; kk < TILE; kk++) {
            float p = expf(s[kk] - mx);
            l += p;
#pragma unroll
            for (int i = 0; i < DPT; i++)
                if (j + GRP * i < hd) o[i] += p * Vs[kk][j + GRP * i];
        }
        m = mx;
    }
    if (qi < T) {
        float inv = 1.0f / l;
        size_t ob = ((size_t)b * T + qi) * (size_t)H * hd + (size_t)h * hd;
#pragma unroll
        for (int i = 0; i < DPT; i++)
            if (j + GRP * i < hd) stf(out, ob + j + GRP * i, o[i] * inv, bf);
        if (j == 0) lse[((size_t)b * H + h) * T + qi] = m + logf(l);
    }
}

/* D[b, h, t] = sum_d dout * out: one warp per row */
static __global__ void attn_bwd_d_k(float *D, const void *dout, const void *out, int B, int T, int H,
                                    int hd, int bf) {
    size_t row = (size_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32; /* (b*T + t)*H + h */
    int lane = threadIdx.x % 32;
    if (row >= (size_t)B * T * H) return;
    size_t off = row * hd;
    float s = 0.0f;
    for (int d = lane; d < hd; d += 32) s += ldf(dout, off + d, bf) * ldf(out, off + d, bf);
    s = warp_sum(s);
    int h = (int)(row % H);
    size_t bt = row / H, b = bt / T, t = bt % T;
    if (lane == 0) D[(b * H + h) * T + t] = s;
}

/* dq for one query row per group: over key tiles up to the row, p = exp(scale q.k - lse),
 * ds = p (dO.v - D), dq = scale sum ds k */
static __global__ void __launch_bounds__(THREADS) attn_bwd_dq_k(void *dqkv, const void *dout,
                                                              const void *qkv, const float *lse,
                                                              const float *D, int T, int H, int KV,
                                                              int hd, float scale, int bf) {
    __shared__ float Ks[TILE][DMAX], Vs[TILE][DMAX];
    int bh = blockIdx.y, b = bh / H, h = bh % H, g = h / (H / KV);
    int q0 = (gridDim.x - 1 - blockIdx.x) * ROWS;
    int r = threadIdx.x / GRP, j = threadIdx.x % GRP, qi = q0 + r, qc = qi < T ? qi : T - 1;
    size_t S = (size_t)(H + 2 * KV) * hd, base = (size_t)b * T * S;
    size_t ob = ((size_t)b * T + qc) * (size_t)H * hd + (size_t)h * hd;
    float q[DPT], dO[DPT], dq[DPT];
#pragma unroll
    for (int i = 0; i < DPT; i++) {
        int d = j + GRP * i;
        q[i] = d < hd ? ldf(qkv, base + (size_t)qc * S + (size_t)h * hd + d, bf) : 0.0f;
        dO[i] = d < hd ? ldf(dout, ob + d, bf) : 0.0f;
        dq[i] = 0.0f;
    }
    float L = lse[((size_t)b * H + h) * T + qc], Dq = D[((size_t)b * H + h) * T + qc];
    int kend = min(T, q0 + ROWS);
    for (int k0 = 0; k0 < kend; k0 += TILE) {
        __syncthreads();
        load_tile(Ks, qkv, base, S, (H + g) * hd, k0, T, hd, bf);
        load_tile(Vs, qkv, base, S, (H + KV + g) * hd, k0, T, hd, bf);
        __syncthreads();
#pragma unroll 4
        for (int kk = 0; kk < TILE; kk++) {
            float s = 0.0f, dp = 0.0f;
#pragma unroll
            for (int i = 0; i < DPT; i++)
                if (j + GRP * i < hd) {
                    s += q[i] * Ks[kk][j + GRP * i];
                    dp += dO[i] * Vs[kk][j + GRP * i];
                }
            s = group_sum(s);
            dp = group_sum(dp);
            float p = k0 + kk <= qc ? expf(scale * s - L) : 0.0f;
            float ds = p * (dp - Dq);
#pragma unroll
            for (int i = 0; i < DPT; i++)
                if (j + GRP * i < hd) dq[i] += ds * Ks[kk][j + GRP * i];
        }
    }
    if (qi < T) {
        size_t qb = base + (size_t)qi * S + (size_t)h * hd;
#pragma unroll
        for (int i = 0; i < DPT; i++)
            if (j + GRP * i < hd) stf(dqkv, qb + j + GRP * i, dq[i] * scale, bf);
    }
}

/* dk, dv for one key row per group of kv head g: over the G query heads of g (in order) and
 * the query tiles from the key's own tile on, dv += p dO, dk += scale ds q */
static __global__ void __launch_bounds__(THREADS) attn_bwd_dkv_k(void *dqkv, const void *dout,
                                                               const void *qkv, const float *lse,
                                                               const float *D, int T, int H,
                                                               int KV, int hd, float scale,
                                                               int bf) {
    __shared__ float Qs[TILE][DMAX], dOs[TILE][DMAX], Ls[TILE], Ds[TILE];
    int bg = blockIdx.y, b = bg / KV, g = bg % KV, G = H / KV;
    int k0 = (gridDim.x - 1 - blockIdx.x) * ROWS; /* the first keys have the most queries */
    int r = threadIdx.x / GRP, j = threadIdx.x % GRP, ki = k0 + r, kc = ki < T ? ki : T - 1;
    size_t S = (size_t)(H + 2 * KV) * hd, base = (size_t)b * T * S, OS = (size_t)H * hd;
    float k[DPT], v[DPT], dk[DPT], dv[DPT];
#pragma unroll
    for (int i = 0; i < DPT; i++) {
        int d = j + GRP * i;
        k[i] = d < hd ? ldf(qkv, base + (size_t)kc * S + (size_t)(H + g) * hd + d, bf) : 0.0f;
        v[i] = d < hd ? ldf(qkv, base + (size_t)kc * S + (size_t)(H + KV + g) * hd + d, bf) : 0.0f;
        dk[i] = dv[i] = 0.0f;
    }
    for (int hh = 0; hh < G; hh++) {
        int h = g * G + hh;
        const float *lh = lse + ((size_t)b * H + h) * T, *Dh = D + ((size_t)b * H + h) * T;
        for (int q0 = k0; q0 < T; q0 += TILE) {
            __syncthreads();
            load_tile(Qs, qkv, base, S, h * hd, q0, T, hd, bf);
            load_tile(dOs, dout, (size_t)b * T * OS, OS, h * hd, q0, T, hd, bf);
            if (threadIdx.x < TILE) {
                int t = q0 + threadIdx.x;
                Ls[threadIdx.x] = t < T ? lh[t] : 0.0f;
                Ds[threadIdx.x] = t < T ? Dh[t] : 0.0f;
            }
            __syncthreads();
#pragma unroll 4
            for (int qq = 0; qq < TILE; qq++) {
                float s = 0.0f, dp = 0.0f;
#pragma unroll
                for (int i = 0; i < DPT; i++)
                    if (j + GRP * i < hd) {
                        s += k[i] * Qs[qq][j + GRP * i];
                        dp += v[i] * dOs[qq][j + GRP * i];
                    }
                s = group_sum(s);
                dp = group_sum(dp);
                int t = q0 + qq;
                float p = (t >= kc && t < T) ? expf(scale * s - Ls[qq]) : 0.0f;
                float ds = p * (dp - Ds[qq]);
#pragma unroll
                for (int i = 0; i < DPT; i++)
                    if (j + GRP * i < hd) {
                        dv[i] += p * dOs[qq][j + GRP * i];
                        dk[i] += ds * Qs[qq][j + GRP * i];
                    }
            }
        }
    }
    if (ki < T) {
        size_t kb = base + (size_t)ki * S + (size_t)(H + g) * hd, vb = kb + (size_t)KV * hd;
#pragma unroll
        for (int i = 0; i < DPT; i++)
            if (j + GRP * i < hd) {
                stf(dqkv, kb + j + GRP * i, dk[i] * scale, bf);
                stf(dqkv, vb + j + GRP * i, dv[i], bf);
            }
    }
}

static void check_shape(int H, int KV, int hd) {
    if (hd < 1 || hd > DMAX || KV < 1 || H % KV)
        tr_cuda_fail("attention", "head size must be 1..128 and KV must divide H", __FILE__,
                     __LINE__);
}

extern "C" void tr_cuda_attention_forward(int bf, tr_buf *out, float *lse, const tr_buf *qkv,
                                          int B, int T, int H, int KV, int hd) {
    check_shape(H, KV, hd);
    if (B * T == 0) return;
    if (tr_cuda_attention_use_cudnn(bf, qkv, B, T, H, KV, hd)) { /* cuda_attention_cudnn.cu */
        if (tr_cuda_attention_cudnn_forward(out, lse, qkv, B, T, H, KV, hd) == 0) return;
        tr_cuda_fail("cuDNN attention forward", tr_cuda_attention_cudnn_error(), __FILE__, __LINE__);
    }
    if (tr_cuda_attention_tc_usable(bf, hd, out, qkv, qkv, qkv)) {
        tr_cuda_attention_tc_forward(out, lse, qkv, B, T, H, KV, hd);
        return;
    }
    dim3 grid((T + ROWS - 1) / ROWS, B * H);
    attn_fwd_k<<<grid, THREADS, 0, tr_cuda_stream>>>(out, lse, qkv, T, H, KV, hd,
                                                     1.0f / sqrtf((float)hd), bf);
    CK_LAUNCH();
}

extern "C" void tr_cuda_attention_backward(int bf, tr_buf *dqkv, const tr_buf *dout,
                                           const tr_buf *qkv, const tr_buf *out, const float *lse,
                                           int B, int T, int H, int KV, int hd) {
    check_shape(H, KV, hd);
    if (B * T == 0) return;
    if (tr_cuda_attention_use_cudnn(bf, qkv, B, T, H, KV, hd)) {
        if (tr_cuda_attention_cudnn_backward(dqkv, dout, qkv, out, lse, B, T, H, KV, hd) == 0)
            return;
        tr_cuda_fail("cuDNN attention backward", tr_cuda_attention_cudnn_error(), __FILE__,
                     __LINE__);
    }
    float scale = 1.0f / sqrtf((float)hd);
    size_t rows = (size_t)B * T * H;
    float *D = (float *)tr_cuda_scratch(SCR_ATTN, sizeof(float) * rows);
    attn_bwd_d_k<<<(unsigned)((rows + 7) / 8), 256, 0, tr_cuda_stream>>>(D, dout, out, B, T, H, hd,
                                                                         bf);
    CK_LAUNCH();
    if (tr_cuda_attention_tc_usable(bf, hd, dqkv, dout, qkv, qkv)) {
        tr_cuda_attention_tc_backward(dqkv, dout, qkv, lse, D, B, T, H, KV, hd);
        return;
    }
    dim3 gq((T + ROWS - 1) / ROWS, B * H), gk((T + ROWS - 1) / ROWS, B * KV);
    attn_bwd_dq_k<<<gq, THREADS, 0, tr_cuda_stream>>>(dqkv, dout, qkv, lse, D, T, H, KV, hd, scale,
                                                      bf);
    CK_LAUNCH();
    attn_bwd_dkv_k<<<gk, THREADS, 0, tr_cuda_stream>>>(dqkv, dout, qkv, lse, D, T, H, KV, hd, scale,
                                                       bf);
    CK_LAUNCH();
}

/* ---- decode: one new token against the KV cache (sampling) ------------------------------ */

/* Rotate this token's q and k heads by position pos (angles in double, as on the CPU) and
 * append its k and v to the caches. One block per head of q, k and v; threads over hd. */
static __global__ void decode_prep_k(void *qkv, void *kc, void *vc, int pos, int H, int KV,
                                     int hd, float theta, int bf) {
    int h = blockIdx.x, h2 = hd / 2, KS = KV * hd;
    size_t base = (size_t)h * hd;
    if (h < H + KV && theta > 0) {
        for (int i = threadIdx.x; i < h2; i += blockDim.x) {
            double ang = (double)pos * pow((double)theta, -2.0 * i / hd);
            float c = (float)cos(ang), s = (float)sin(ang);
            float a = ldf(qkv, base + i, bf), b = ldf(qkv, base + i + h2, bf);
            stf(qkv, base + i, a * c - b * s, bf);
            stf(qkv, base + i + h2, b * c + a * s, bf);
        }
    }
    __syncthreads();
    if (h >= H) { /* a k head (H .. H+KV) or a v head (H+KV .. H+2KV): into its cache row */
        int kv = h < H + KV ? h - H : h - H - KV;
        void *cache = h < H + KV ? kc : vc;
        for (int d = threadIdx.x; d < hd; d += blockDim.x)
            stf(cache, (size_t)pos * KS + (size_t)kv * hd + d, ldf(qkv, base + d, bf), bf);
    }
}

/* One block per query head: scores over cache rows 0..pos into fp32 scratch, softmax, then
 * out = P V with one thread per output element (hd <= 128 = blockDim). */
static __global__ void decode_attn_k(void *out, const void *qkv, const void *kc, const void *vc,
                                     float *scores, int pos, int H, int KV, int hd, float scale,
                                     int bf) {
    __shared__ float q[128], red[32];
    int h = blockIdx.x, kvh = h / (H / KV), KS = KV * hd, n = pos + 1;
    float *s = scores + (size_t)h * n;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) q[d] = ldf(qkv, (size_t)h * hd + d, bf);
    __syncthreads();
    float mx = -INFINITY;
    for (int j = threadIdx.x; j < n; j += blockDim.x) {
        float dot = 0.0f;
        for (int d = 0; d < hd; d++) dot += q[d] * ldf(kc, (size_t)j * KS + (size_t)kvh * hd + d, bf);
        s[j] = dot * scale;
        mx = fmaxf(mx, s[j]);
    }
    /* block max, then block sum of exp (fixed order: warp shuffles, then warp 0) */
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = mx;
    __syncthreads();
    if (threadIdx.x < 32) {
        float v = threadIdx.x < (blockDim.x + 31) / 32 ? red[threadIdx.x] : -INFINITY;
        for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
        if (threadIdx.x == 0) red[0] = v;
    }
    __syncthreads();
    mx = red[0];
    __syncthreads();
    float sum = 0.0f;
    for (int j = threadIdx.x; j < n; j += blockDim.x) {
        float p = __expf(s[j] - mx);
        s[j] = p;
        sum += p;
    }
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = sum;
    __syncthreads();
    if (threadIdx.x < 32) {
        float v = threadIdx.x < (blockDim.x + 31) / 32 ? red[threadIdx.x] : 0.0f;
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        if (threadIdx.x == 0) red[0] = v;
    }
    __syncthreads();
    float inv = 1.0f / red[0];
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float acc = 0.0f;
        for (int j = 0; j < n; j++) acc += s[j] * ldf(vc, (size_t)j * KS + (size_t)kvh * hd + d, bf);
        stf(out, (size_t)h * hd + d, acc * inv, bf);
    }
}

extern "C" void tr_cuda_decode_attention(int bf, tr_buf *out, tr_buf *qkv, tr_buf *kc, tr_buf *vc,
                                         int pos, int H, int KV, int hd, float theta) {
    check_shape(H, KV, hd);
    float *scores = (float *)tr_cuda_scratch(SCR_ATTN, sizeof(float) * (size_t)H * (pos + 1));
    decode_prep_k<<<H + 2 * KV, 128, 0, tr_cuda_stream>>>(qkv, kc, vc, pos, H, KV, hd, theta, bf);
    CK_LAUNCH();
    decode_attn_k<<<H, 128, 0, tr_cuda_stream>>>(out, qkv, kc, vc, scores, pos, H, KV, hd,
                                                 1.0f / sqrtf((float)hd), bf);
    CK_LAUNCH();
}
