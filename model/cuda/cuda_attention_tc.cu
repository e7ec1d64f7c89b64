/* Causal attention on the tensor cores (bf16 storage, head size 64 or 128): the same
 * algorithm and conventions as cuda_attention.cu (FlashAttention-2's online softmax over key
 * tiles, lse (B,H,T) saved for the backward, scale 1/sqrt(hd), GQA by kv head h / (H/KV)), with
 * every product an mma.sync m16n8k16 (bf16 inputs, fp32 accumulation).
 *
 * NEVER RUN ON A GPU YET. It has run on the CUDA emulator of tests/cudaemu/ (mma.sync with the
 * PTX fragment layouts; both thread orders; under AddressSanitizer), matching the CPU backend
 * in test_cuda_kernels. It is the default where it applies (bf16, hd 64 or 128, the shared
 * memory fits); TR_CUDA_ATTENTION=simple selects the CUDA-core kernels instead, and
 * tests/gpu/check.sh benchmarks both.
 *
 * Layout: a block is 4 warps; a warp owns 16 rows (queries, or keys in the dk/dv pass), so a
 * block covers 64 rows; tiles of 64 rows are staged in shared memory as bf16, row-major with
 * a padded stride (LDD) and, where a product needs its transpose as the B operand, also
 * transposed (LDT). Fragment layouts (PTX ISA, mma.m16n8k16 for .bf16), with lane = 4 * gi +
 * t4: A (16 x 16, row-major) registers {(gi, 2t4..+1), (gi+8, 2t4..+1), (gi, 2t4+8..+9),
 * (gi+8, 2t4+8..+9)}; B (16 x 8, k x n) registers {(k = 2t4..+1, n = gi), (k = 2t4+8..+9,
 * n = gi)}; C (16 x 8 fp32) {(gi, 2t4), (gi, 2t4+1), (gi+8, 2t4), (gi+8, 2t4+1)}. A C tile of
 * scores becomes the A operand of the next product without leaving registers.
 *
 * As in the CUDA-core version, the backward uses no atomics: dq is one kernel over query tiles,
 * dk and dv another over key tiles (GQA's query heads summed in head order), so results are
 * bitwise reproducible. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/cuda/cuda_private.h"

typedef __nv_bfloat16 bf16;

#define TC_ROWS 64                /* rows per block, and per tile */
#define TC_THREADS 128            /* 4 warps x 16 rows */
#define TC_DMAX 128
#define LDD (TC_DMAX + 8)         /* stride of [rows][dims] tiles (bf16): conflict-free reads */
#define LDT (TC_ROWS + 8)         /* stride of [dims][rows] (transposed) tiles */
#define TILE_RD (TC_ROWS * LDD)   /* elements of a row-major tile */
#define TILE_TR (TC_DMAX * LDT)   /* elements of a transposed tile */

static __device__ __forceinline__ void mma16816(float c[4], const uint32_t a[4], uint32_t b0,
                                                uint32_t b1) {
#ifdef TR_CUDA_EMU /* the CPU emulator of tests/cudaemu/ */
    emu_mma16816(c, a, b0, b1);
#else
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

/* two bf16 (the lower column in the low half) */
static __device__ __forceinline__ uint32_t pack2(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *(uint32_t *)&v;
}
static __device__ __forceinline__ uint32_t ld2(const bf16 *p) {
    return *(const uint32_t *)p;
}

/* A fragment of rows [r0, r0+16), columns [c0, c0+16) of a row-major tile with stride ld */
static __device__ __forceinline__ void frag_a(uint32_t a[4], const bf16 *tile, int ld, int r0,
                                              int c0, int gi, int t4) {
    const bf16 *p = tile + (r0 + gi) * ld + c0 + 2 * t4;
    a[0] = ld2(p);
    a[1] = ld2(p + 8 * ld);
    a[2] = ld2(p + 8);
    a[3] = ld2(p + 8 * ld + 8);
}

/* B fragment (k x n = 16 x 8) whose column n is row n0 + n of a row-major tile, k its columns
 * [k0, k0+16): B = tile[n0.., k0..]^T */
static __device__ __forceinline__ void frag_b(uint32_t *b0, uint32_t *b1, const bf16 *tile, int ld,
                                              int n0, int k0, int gi, int t4) {
    const bf16 *p = tile + (n0 + gi) * ld + k0 + 2 * t4;
    *b0 = ld2(p);
    *b1 = ld2(p + 8);
}

/* A C tile pair (scores of 16 rows x 16 columns: n-tiles 2kk and 2kk+1) as an A fragment */
static __device__ __forceinline__ void c_to_a(uint32_t a[4], const float c0[4], const float c1[4]) {
    a[0] = pack2(c0[0], c0[1]);
    a[1] = pack2(c0[2], c0[3]);
    a[2] = pack2(c1[0], c1[1]);
    a[3] = pack2(c1[2], c1[3]);
}

/* c[nt] += a @ B over the hd / 8 n-tiles, B (k x n) = tile[n][k0 + k] of a transposed tile
 * (ld LDT): the second product of every pass (P V, dS K, P^T dO, dS^T Q) */
static __device__ __forceinline__ void mma_tiles(float c[][4], const uint32_t a[4], const bf16 *tile,
                                                 int k0, int nd, int gi, int t4) {
#pragma unroll
    for (int nt = 0; nt < TC_DMAX / 8; nt++)
        if (nt < nd) {
            uint32_t b0, b1;
            frag_b(&b0, &b1, tile, LDT, nt * 8, k0, gi, t4);
            mma16816(c[nt], a, b0, b1);
        }
}

/* The backward's two score products for this warp's 16 rows (r0) against a 64-row tile:
 * p = A1 B1^T and dp = A2 B2^T (row-major tiles, ld LDD), over the nk 16-wide steps of hd */
static __device__ __forceinline__ void two_products(float p[8][4], float dp[8][4], const bf16 *A1,
                                                    const bf16 *B1, const bf16 *A2, const bf16 *B2,
                                                    int r0, int nk, int gi, int t4) {
#pragma unroll
    for (int nt = 0; nt < 8; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) p[nt][e] = dp[nt][e] = 0.0f;
#pragma unroll
    for (int ks = 0; ks < TC_DMAX / 16; ks++)
        if (ks < nk) {
            uint32_t a1[4], a2[4];
            frag_a(a1, A1, LDD, r0, ks * 16, gi, t4);
            frag_a(a2, A2, LDD, r0, ks * 16, gi, t4);
#pragma unroll
            for (int nt = 0; nt < 8; nt++) {
                uint32_t b0, b1;
                frag_b(&b0, &b1, B1, LDD, nt * 8, ks * 16, gi, t4);
                mma16816(p[nt], a1, b0, b1);
                frag_b(&b0, &b1, B2, LDD, nt * 8, ks * 16, gi, t4);
                mma16816(dp[nt], a2, b0, b1);
            }
        }
}

/* the 8 bf16 of v rotated left by s (0-7) elements: element k of the result is element
 * (k + s) % 8 of v. Selects and shifts, no indexing of a register array by a lane's value
 * (which would put it in local memory). */
static __device__ __forceinline__ uint4 rot8(uint4 v, int s) {
    if (s & 4) v = make_uint4(v.z, v.w, v.x, v.y);
    if (s & 2) v = make_uint4(v.y, v.z, v.w, v.x);
    if (s & 1)
        v = make_uint4((v.x >> 16) | (v.y << 16), (v.y >> 16) | (v.z << 16),
                       (v.z >> 16) | (v.w << 16), (v.w >> 16) | (v.x << 16));
    return v;
}

/* rows [r0, r0+64) of hd columns (col0 within rows of stride S) into a row-major tile and,
 * when tr != NULL, its transpose; rows at or past T read as 0. 16-byte loads.
 * Element e of the loop is row rr = (e / 8) % 64, 8-column chunk j = e % 8 + 8 (e / 512): a
 * warp reads 4 whole 128-byte row segments, and its 16-byte row-major stores fill the 32
 * banks once per quarter warp. The transposed stores are 2-byte: column c + k of row rr.
 * Were every lane to store its k-th element at once, the 8 chunks (8 columns = 8 LDT rows
 * apart, a multiple of 32 banks) would all land in one bank: an 8-way conflict. Each lane
 * instead stores its elements rotated by its chunk, (k + j) % 8, so the 8 chunks hit 8
 * different banks (bench/emu_memory.sh measured 8.00x before, 1.00x after). */
static __device__ void load_tile(bf16 *rd, bf16 *tr, const bf16 *base, size_t S, int col0, int r0,
                                 int T, int hd) {
    int vpr = hd / 8;
    for (int e = threadIdx.x; e < TC_ROWS * vpr; e += TC_THREADS) {
        int rr = (e >> 3) % TC_ROWS, jl = e & 7, c = (jl + 8 * (e / (8 * TC_ROWS))) * 8;
        int r = r0 + rr;
        uint4 v = make_uint4(0u, 0u, 0u, 0u);
        if (r < T) v = *(const uint4 *)(base + (size_t)r * S + col0 + c);
        if (rd) *(uint4 *)(rd + rr * LDD + c) = v;
        if (tr) {
            uint4 w = rot8(v, jl);
            const bf16 *x = (const bf16 *)&w;
#pragma unroll
            for (int k = 0; k < 8; k++) tr[(c + ((k + jl) & 7)) * LDT + rr] = x[k];
        }
    }
}

/* This warp's 16 rows of an accumulator c (rows r0 + gi and r0 + gi + 8 of the mma C layout),
 * times sc0 / sc1 for the two, as bf16 to global rows grow0 + r0 + [0, 16) of dst (stride ld),
 * rows at or past T skipped. Through the warp's own 16 rows of a row-major tile no other warp
 * reads any more (stg): 4-byte fragment stores there, conflict-free with LDD, then 16-byte
 * copies out, so that a warp's store request covers whole 128-byte row segments. Stored
 * straight from the fragments, each request wrote 16 bytes per row: twice the sectors
 * (bench/emu_memory.sh). */
static __device__ __forceinline__ void store_acc(bf16 *stg, const float c[][4], float sc0,
                                                 float sc1, bf16 *dst, size_t ld, int grow0,
                                                 int T, int r0, int nd, int lane) {
    int gi = lane >> 2, t4 = lane & 3;
    __syncwarp(); /* every lane is done reading its rows of stg */
#pragma unroll
    for (int nt = 0; nt < TC_DMAX / 8; nt++)
        if (nt < nd) {
            *(uint32_t *)(stg + (r0 + gi) * LDD + nt * 8 + 2 * t4) =
                pack2(c[nt][0] * sc0, c[nt][1] * sc0);
            *(uint32_t *)(stg + (r0 + gi + 8) * LDD + nt * 8 + 2 * t4) =
                pack2(c[nt][2] * sc1, c[nt][3] * sc1);
        }
    __syncwarp();
    for (int e = lane; e < 16 * nd; e += 32) {
        int rr = e / nd, cc = (e % nd) * 8, r = grow0 + r0 + rr;
        if (r < T)
            *(uint4 *)(dst + (size_t)r * ld + cc) = *(const uint4 *)(stg + (r0 + rr) * LDD + cc);
    }
}

/* ---- forward ------------------------------------------------------------------------------ */

/* grid (query tiles, B*H); the last query tiles (the longest) first */
static __global__ void __launch_bounds__(TC_THREADS) attn_tc_fwd_k(bf16 *out, float *lse,
                                                                 const bf16 *qkv, int T, int H,
                                                                 int KV, int hd, float scale) {
    extern __shared__ __align__(16) unsigned char smem[];
    bf16 *Qs = (bf16 *)smem, *Ks = Qs + TILE_RD, *Vt = Ks + TILE_RD;
    int bh = blockIdx.y, b = bh / H, h = bh % H, g = h / (H / KV);
    int q0 = (gridDim.x - 1 - blockIdx.x) * TC_ROWS;
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, gi = lane >> 2, t4 = lane & 3;
    int r0 = warp * 16, nk = hd / 16, nd = hd / 8;
    size_t S = (size_t)(H + 2 * KV) * hd;
    const bf16 *base = qkv + (size_t)b * T * S;
    load_tile(Qs, NULL, base, S, h * hd, q0, T, hd);
    __syncthreads();
    uint32_t qf[TC_DMAX / 16][4];
#pragma unroll
    for (int ks = 0; ks < TC_DMAX / 16; ks++)
        if (ks < nk) frag_a(qf[ks], Qs, LDD, r0, ks * 16, gi, t4);
    float o[TC_DMAX / 8][4];
#pragma unroll
    for (int nt = 0; nt < TC_DMAX / 8; nt++) o[nt][0] = o[nt][1] = o[nt][2] = o[nt][3] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    int qrow[2] = {q0 + r0 + gi, q0 + r0 + gi + 8};
    int kend = min(T, q0 + TC_ROWS);
    for (int k0 = 0; k0 < kend; k0 += TC_ROWS) {
        __syncthreads(); /* the previous tile is no longer read */
        load_tile(Ks, NULL, base, S, (H + g) * hd, k0, T, hd);
        load_tile(NULL, Vt, base, S, (H + KV + g) * hd, k0, T, hd);
        __syncthreads();
        float s[8][4];
#pragma unroll
        for (int nt = 0; nt < 8; nt++) {
            s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
#pragma unroll
            for (int ks = 0; ks < TC_DMAX / 16; ks++)
                if (ks < nk) {
                    uint32_t b0, b1;
                    frag_b(&b0, &b1, Ks, LDD, nt * 8, ks * 16, gi, t4);
                    mma16816(s[nt], qf[ks], b0, b1);
                }
        }
        float mx[2] = {m[0], m[1]};
#pragma unroll
        for (int nt = 0; nt < 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int row = e >> 1, key = k0 + nt * 8 + 2 * t4 + (e & 1);
                float v = key <= qrow[row] && key < T ? s[nt][e] * scale : -INFINITY;
                s[nt][e] = v;
                mx[row] = fmaxf(mx[row], v);
            }
#pragma unroll
        for (int row = 0; row < 2; row++) { /* the 4 lanes of a quad share a row */
            mx[row] = fmaxf(mx[row], __shfl_xor_sync(0xffffffffu, mx[row], 1));
            mx[row] = fmaxf(mx[row], __shfl_xor_sync(0xffffffffu, mx[row], 2));
        }
        /* key 0 is in the first tile and visible to every row, so mx is finite */
        float alpha[2] = {__expf(m[0] - mx[0]), __expf(m[1] - mx[1])}, sum[2] = {0.0f, 0.0f};
#pragma unroll
        for (int nt = 0; nt < 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float p = __expf(s[nt][e] - mx[e >> 1]);
                s[nt][e] = p;
                sum[e >> 1] += p;
            }
#pragma unroll
        for (int row = 0; row < 2; row++) {
            sum[row] += __shfl_xor_sync(0xffffffffu, sum[row], 1);
            sum[row] += __shfl_xor_sync(0xffffffffu, sum[row], 2);
            l[row] = l[row] * alpha[row] + sum[row];
            m[row] = mx[row];
        }
#pragma unroll
        for (int nt = 0; nt < TC_DMAX / 8; nt++) {
            o[nt][0] *= alpha[0];
            o[nt][1] *= alpha[0];
            o[nt][2] *= alpha[1];
            o[nt][3] *= alpha[1];
        }
#pragma unroll
        for (int kk = 0; kk < 4; kk++) { /* O += P V over 16 keys at a time */
            uint32_t pa[4];
            c_to_a(pa, s[2 * kk], s[2 * kk + 1]);
            mma_tiles(o, pa, Vt, kk * 16, nd, gi, t4);
        }
    }
    /* Qs: this warp's rows are its own (the other warps read only K and V) */
    store_acc(Qs, o, 1.0f / l[0], 1.0f / l[1], out + (size_t)b * T * H * hd + (size_t)h * hd,
              (size_t)H * hd, q0, T, r0, nd, lane);
#pragma unroll
    for (int row = 0; row < 2; row++)
        if (t4 == 0 && qrow[row] < T)
            lse[((size_t)b * H + h) * T + qrow[row]] = m[row] + logf(l[row]);
}

/* ---- backward: dq ------------------------------------------------------------------------
 * Per query tile: over key tiles up to it, S = Q K^T, P = exp(scale S - lse), dP = dO V^T,
 * dS = P (dP - D), dq += dS K; dq = scale * dq. */
static __global__ void __launch_bounds__(TC_THREADS) attn_tc_dq_k(bf16 *dqkv, const bf16 *dout,
                                                                const bf16 *qkv, const float *lse,
                                                                const float *D, int T, int H,
                                                                int KV, int hd, float scale) {
    extern __shared__ __align__(16) unsigned char smem[];
    bf16 *Qs = (bf16 *)smem, *dOs = Qs + TILE_RD, *Ks = dOs + TILE_RD, *Vs = Ks + TILE_RD,
         *Kt = Vs + TILE_RD;
    int bh = blockIdx.y, b = bh / H, h = bh % H, g = h / (H / KV);
    int q0 = (gridDim.x - 1 - blockIdx.x) * TC_ROWS;
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, gi = lane >> 2, t4 = lane & 3;
    int r0 = warp * 16, nk = hd / 16, nd = hd / 8;
    size_t S = (size_t)(H + 2 * KV) * hd, OS = (size_t)H * hd;
    const bf16 *base = qkv + (size_t)b * T * S;
    load_tile(Qs, NULL, base, S, h * hd, q0, T, hd);
    load_tile(dOs, NULL, dout + (size_t)b * T * OS, OS, h * hd, q0, T, hd);
    int qrow[2] = {q0 + r0 + gi, q0 + r0 + gi + 8};
    float L[2], Dr[2];
#pragma unroll
    for (int row = 0; row < 2; row++) {
        int qc = qrow[row] < T ? qrow[row] : T - 1;
        L[row] = lse[((size_t)b * H + h) * T + qc];
        Dr[row] = D[((size_t)b * H + h) * T + qc];
    }
    float dq[TC_DMAX / 8][4];
#pragma unroll
    for (int nt = 0; nt < TC_DMAX / 8; nt++) dq[nt][0] = dq[nt][1] = dq[nt][2] = dq[nt][3] = 0.0f;
    int kend = min(T, q0 + TC_ROWS);
    for (int k0 = 0; k0 < kend; k0 += TC_ROWS) {
        __syncthreads();
        load_tile(Ks, Kt, base, S, (H + g) * hd, k0, T, hd);
        load_tile(Vs, NULL, base, S, (H + KV + g) * hd, k0, T, hd);
        __syncthreads();
        float p[8][4], dp[8][4]; /* S = Q K^T, dP = dO V^T */
        two_products(p, dp, Qs, Ks, dOs, Vs, r0, nk, gi, t4);
#pragma unroll
        for (int nt = 0; nt < 8; nt++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int row = e >> 1, key = k0 + nt * 8 + 2 * t4 + (e & 1);
                float pr = key <= qrow[row] && key < T ? __expf(scale * p[nt][e] - L[row]) : 0.0f;
                p[nt][e] = pr * (dp[nt][e] - Dr[row]); /* dS */
            }
        }
#pragma unroll
        for (int kk = 0; kk < 4; kk++) { /* dq += dS K over 16 keys at a time */
            uint32_t a[4];
            c_to_a(a, p[2 * kk], p[2 * kk + 1]);
            mma_tiles(dq, a, Kt, kk * 16, nd, gi, t4);
        }
    }
    /* Qs: this warp's rows are its own (the other warps read only K and V as B operands) */
    store_acc(Qs, dq, scale, scale, dqkv + (size_t)b * T * S + (size_t)h * hd, S, q0, T, r0, nd,
              lane);
}

/* ---- backward: dk, dv ----------------------------------------------------------------------
 * Per key tile of kv head g: over the G query heads of g (in order) and the query tiles from
 * the key tile on, S^T = K Q^T, P^T = exp(scale S^T - lse), dv += P^T dO, dP^T = V dO^T,
 * dS^T = P^T (dP^T - D), dk += dS^T Q; dk = scale * dk. */
static __global__ void __launch_bounds__(TC_THREADS) attn_tc_dkv_k(bf16 *dqkv, const bf16 *dout,
                                                                 const bf16 *qkv, const float *lse,
                                                                 const float *D, int T, int H,
                                                                 int KV, int hd, float scale) {
    extern __shared__ __align__(16) unsigned char smem[];
    bf16 *Ks = (bf16 *)smem, *Vs = Ks + TILE_RD, *Qs = Vs + TILE_RD, *dOs = Qs + TILE_RD,
         *Qt = dOs + TILE_RD, *dOt = Qt + TILE_TR;
    float *Ls = (float *)(dOt + TILE_TR), *Ds = Ls + TC_ROWS;
    int bg = blockIdx.y, b = bg / KV, g = bg % KV, G = H / KV;
    int k0 = (gridDim.x - 1 - blockIdx.x) * TC_ROWS; /* the first keys have the most queries */
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, gi = lane >> 2, t4 = lane & 3;
    int r0 = warp * 16, nk = hd / 16, nd = hd / 8;
    size_t S = (size_t)(H + 2 * KV) * hd, OS = (size_t)H * hd;
    const bf16 *base = qkv + (size_t)b * T * S, *obase = dout + (size_t)b * T * OS;
    load_tile(Ks, NULL, base, S, (H + g) * hd, k0, T, hd);
    load_tile(Vs, NULL, base, S, (H + KV + g) * hd, k0, T, hd);
    int krow[2] = {k0 + r0 + gi, k0 + r0 + gi + 8};
    float dk[TC_DMAX / 8][4], dv[TC_DMAX / 8][4];
#pragma unroll
    for (int nt = 0; nt < TC_DMAX / 8; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) dk[nt][e] = dv[nt][e] = 0.0f;
    for (int hh = 0; hh < G; hh++) {
        int h = g * G + hh;
        const float *lh = lse + ((size_t)b * H + h) * T, *Dh = D + ((size_t)b * H + h) * T;
        for (int q0 = k0; q0 < T; q0 += TC_ROWS) {
            __syncthreads();
            load_tile(Qs, Qt, base, S, h * hd, q0, T, hd);
            load_tile(dOs, dOt, obase, OS, h * hd, q0, T, hd);
            if (threadIdx.x < TC_ROWS) {
                int t = q0 + threadIdx.x;
                Ls[threadIdx.x] = t < T ? lh[t] : 0.0f;
                Ds[threadIdx.x] = t < T ? Dh[t] : 0.0f;
            }
            __syncthreads();
            /* rows: this warp's 16 keys; columns: the tile's queries. S^T = K Q^T, dP^T = V dO^T */
            float p[8][4], dp[8][4];
            two_products(p, dp, Ks, Qs, Vs, dOs, r0, nk, gi, t4);
#pragma unroll
            for (int nt = 0; nt < 8; nt++) {
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    int row = e >> 1, qc = nt * 8 + 2 * t4 + (e & 1), t = q0 + qc;
                    float pr = t >= krow[row] && t < T && krow[row] < T
                                   ? __expf(scale * p[nt][e] - Ls[qc])
                                   : 0.0f;
                    p[nt][e] = pr;
                    dp[nt][e] = pr * (dp[nt][e] - Ds[qc]); /* dS^T */
                }
            }
#pragma unroll
            for (int kk = 0; kk < 4; kk++) { /* over 16 queries at a time */
                uint32_t pa[4], sa[4];
                c_to_a(pa, p[2 * kk], p[2 * kk + 1]);
                c_to_a(sa, dp[2 * kk], dp[2 * kk + 1]);
                mma_tiles(dv, pa, dOt, kk * 16, nd, gi, t4);
                mma_tiles(dk, sa, Qt, kk * 16, nd, gi, t4);
            }
        }
    }
    /* Ks, Vs: this warp's rows are its own (the other warps read only Q and dO as B operands) */
    bf16 *kb = dqkv + (size_t)b * T * S + (size_t)(H + g) * hd;
    store_acc(Ks, dk, scale, scale, kb, S, k0, T, r0, nd, lane);
    store_acc(Vs, dv, 1.0f, 1.0f, kb + (size_t)KV * hd, S, k0, T, r0, nd, lane);
}

/* ---- launchers ------------------------------------------------------------------------------ */

#define SMEM_FWD (2 * TILE_RD * 2 + TILE_TR * 2)
#define SMEM_DQ (4 * TILE_RD * 2 + TILE_TR * 2)
#define SMEM_DKV (4 * TILE_RD * 2 + 2 * TILE_TR * 2 + 2 * TC_ROWS * 4)

extern "C" int tr_cuda_attention_tc_usable(int bf, int hd, const void *a, const void *b,
                                           const void *c, const void *d) {
    /* TR_CUDA_ATTENTION=simple (tr_backend_env): the CUDA-core kernels always */
    if (tr_backend_simple_attention()) return 0;
    static int smem_ok = -1; /* the dk/dv kernel's shared memory (107 KB) fits this GPU */
    if (smem_ok < 0) {
        int dev = 0, optin = 0;
        smem_ok = cudaGetDevice(&dev) == cudaSuccess &&
                  cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) ==
                      cudaSuccess &&
                  optin >= SMEM_DKV && optin >= SMEM_DQ && optin >= SMEM_FWD;
    }
    return smem_ok && bf && (hd == 64 || hd == 128) && tr_cuda_aligned16(a, b, c, d);
}

static void set_smem(const void *k, int bytes) {
    CK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
}

extern "C" void tr_cuda_attention_tc_forward(tr_buf *out, float *lse, const tr_buf *qkv, int B,
                                             int T, int H, int KV, int hd) {
    static int ready;
    if (!ready) {
        set_smem((const void *)attn_tc_fwd_k, SMEM_FWD);
        ready = 1;
    }
    dim3 grid((T + TC_ROWS - 1) / TC_ROWS, B * H);
    attn_tc_fwd_k<<<grid, TC_THREADS, SMEM_FWD, tr_cuda_stream>>>(
        (bf16 *)out, lse, (const bf16 *)qkv, T, H, KV, hd, 1.0f / sqrtf((float)hd));
    CK_LAUNCH();
}

/* D (B,H,T) = rowsum(dO * O) must be in place already (cuda_attention.cu computes it) */
extern "C" void tr_cuda_attention_tc_backward(tr_buf *dqkv, const tr_buf *dout, const tr_buf *qkv,
                                              const float *lse, const float *D, int B, int T,
                                              int H, int KV, int hd) {
    static int ready;
    if (!ready) {
        set_smem((const void *)attn_tc_dq_k, SMEM_DQ);
        set_smem((const void *)attn_tc_dkv_k, SMEM_DKV);
        ready = 1;
    }
    float scale = 1.0f / sqrtf((float)hd);
    dim3 gq((T + TC_ROWS - 1) / TC_ROWS, B * H), gk((T + TC_ROWS - 1) / TC_ROWS, B * KV);
    attn_tc_dq_k<<<gq, TC_THREADS, SMEM_DQ, tr_cuda_stream>>>(
        (bf16 *)dqkv, (const bf16 *)dout, (const bf16 *)qkv, lse, D, T, H, KV, hd, scale);
    CK_LAUNCH();
    attn_tc_dkv_k<<<gk, TC_THREADS, SMEM_DKV, tr_cuda_stream>>>(
        (bf16 *)dqkv, (const bf16 *)dout, (const bf16 *)qkv, lse, D, T, H, KV, hd, scale);
    CK_LAUNCH();
}
