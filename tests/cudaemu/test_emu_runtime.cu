/* Test of the CUDA emulator itself (tests/cudaemu/emu.h, emu_runtime.cc), so that a kernel test
 * passing on it means something. CUDA C source, compiled exactly like the .cu files of
 * model/cuda/ for the emulator (to_cc.sh, -include emu.h, -DTR_CUDA_EMU, the same warnings) and
 * linked with the emulator's runtime only (emu_runtime.cc and the files beside it). The checks
 * are in this file (1, 2, 3, 5: what kernels rely on, run in both thread orders, and main) and
 * in test_emu_runtime_hazards.cu (4, 6, 7, 8, 9: what must be refused, reported or reordered).
 * Every expected value is computed here on the host from CUDA's and PTX's documented semantics,
 * never from the emulator's code.
 *
 *   1 thread and block indices in 1-D, 2-D and 3-D launches: each (block, thread) exactly once
 *   2 __syncthreads: block-wide tree reductions (256, 1024, 100 threads; threads that exit early)
 *   3 warp shuffles (xor/idx/down/up, with and without width) for int, float and double
 *   4 dynamic shared memory and its opt-in limit, launch configurations that must be refused,
 *     static and dynamic shared memory poisoned per block (static: outside AddressSanitizer)
 *   5 mma.m16n8k16 (emu_mma16816) with fragments loaded per the PTX ISA layout
 *   6 bugs the emulator must report, each in a forked child: divergent barrier (deadlock), a
 *     shuffle mask leaving out live lanes, lanes at different shuffles; under AddressSanitizer
 *     out-of-bounds device, dynamic and static shared memory accesses
 *   7 TR_EMU_ORDER=reverse changes the outcome of a missing __syncthreads, not of a correct kernel
 *   8 the runtime API: cudaMalloc's 0xff fill, copies and frees of pointers that are not
 *     allocations are refused with an error
 *   9 the adversarial scheduler (unless TR_EMU_SCHED=eager): a copy on a second stream that
 *     does not wait for the kernel writing its source reads stale data in some of 16 trials;
 *     with cudaStreamWaitEvent it never does
 * Checks 1, 2, 3 and 5 run in the default thread order and again under TR_EMU_ORDER=reverse.
 * Prints one line per check; exits 0 only when every check passes. */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_emu_runtime.h"

/* ---- reporting ------------------------------------------------------------------------- */

static int n_pass, n_fail;
static const char *order_tag = "";

void check(int ok, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    printf("%s ", ok ? "PASS" : "FAIL");
    vprintf(fmt, ap);
    printf("%s\n", order_tag);
    fflush(stdout);
    va_end(ap);
    if (ok)
        n_pass++;
    else
        n_fail++;
}

void *dev_alloc(size_t n) {
    void *p = NULL;
    CK(cudaMalloc(&p, n));
    return p;
}
static void *host_alloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "out of memory\n");
        exit(2);
    }
    return p;
}
static void to_dev(void *d, const void *h, size_t n) {
    CK(cudaMemcpy(d, h, n, cudaMemcpyHostToDevice));
}
void to_host(void *h, const void *d, size_t n) {
    CK(cudaMemcpy(h, d, n, cudaMemcpyDeviceToHost));
}

/* ==== 1. thread and block indices ========================================================= */

/* every thread records its threadIdx, blockIdx, blockDim and gridDim at its linear index and
 * counts itself there */
__global__ void k_index(unsigned *rec, int *out, int *hits, unsigned total) {
    unsigned nt = blockDim.x * blockDim.y * blockDim.z;
    unsigned t = (threadIdx.z * blockDim.y + threadIdx.y) * blockDim.x + threadIdx.x;
    unsigned b = (blockIdx.z * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x;
    unsigned i = b * nt + t;
    if (i >= total) return; /* shows as a missing index */
    unsigned *r = rec + (size_t)i * 12;
    r[0] = threadIdx.x, r[1] = threadIdx.y, r[2] = threadIdx.z;
    r[3] = blockIdx.x, r[4] = blockIdx.y, r[5] = blockIdx.z;
    r[6] = blockDim.x, r[7] = blockDim.y, r[8] = blockDim.z;
    r[9] = gridDim.x, r[10] = gridDim.y, r[11] = gridDim.z;
    out[i] = (int)i;
    hits[i] += 1;
}

static void check_index(const char *what, dim3 g, dim3 b) {
    unsigned nt = b.x * b.y * b.z, total = g.x * g.y * g.z * nt;
    unsigned *rec = (unsigned *)dev_alloc((size_t)total * 12 * sizeof(unsigned));
    int *out = (int *)dev_alloc(total * sizeof(int)), *hits = (int *)dev_alloc(total * sizeof(int));
    CK(cudaMemset(rec, 0xff, (size_t)total * 12 * sizeof(unsigned))); /* poison */
    CK(cudaMemset(out, 0xff, total * sizeof(int)));
    CK(cudaMemset(hits, 0, total * sizeof(int)));
    k_index<<<g, b>>>(rec, out, hits, total);
    cudaError_t launch = cudaGetLastError();
    unsigned *hrec = (unsigned *)host_alloc((size_t)total * 12 * sizeof(unsigned));
    int *hout = (int *)host_alloc(total * sizeof(int)),
        *hhits = (int *)host_alloc(total * sizeof(int));
    to_host(hrec, rec, (size_t)total * 12 * sizeof(unsigned));
    to_host(hout, out, total * sizeof(int));
    to_host(hhits, hits, total * sizeof(int));
    unsigned missing = 0, multiple = 0, wrong = 0;
    for (unsigned i = 0; i < total; i++) {
        unsigned bl = i / nt, t = i % nt;
        // clang-format off
        unsigned want[12] = {t % b.x,  t / b.x % b.y,  t / (b.x * b.y),  /* threadIdx */
                             bl % g.x, bl / g.x % g.y, bl / (g.x * g.y), /* blockIdx */
                             b.x,      b.y,            b.z,              /* blockDim */
                             g.x,      g.y,            g.z};             /* gridDim */
        // clang-format on
        if (hhits[i] == 0)
            missing++;
        else if (hhits[i] > 1)
            multiple++;
        if (hout[i] != (int)i || memcmp(want, hrec + (size_t)i * 12, sizeof(want))) wrong++;
    }
    check(launch == cudaSuccess && !missing && !multiple && !wrong,
          "1 indices %s grid(%u,%u,%u) block(%u,%u,%u): %u threads, %u missing, %u written more "
          "than once, %u with wrong threadIdx/blockIdx/blockDim/gridDim",
          what, g.x, g.y, g.z, b.x, b.y, b.z, total, missing, multiple, wrong);
    free(hrec), free(hout), free(hhits);
    CK(cudaFree(rec));
    CK(cudaFree(out));
    CK(cudaFree(hits));
}

/* ==== 2. __syncthreads ===================================================================== */

/* tree reduction of the block's blockDim.x values: before stride s every partial sum lies in
 * [0, 2s), so starting at 512 serves any block size up to 1024 */
__global__ void k_reduce(const int *in, int *out) {
    __shared__ int sh[1024];
    int t = (int)threadIdx.x, n = (int)blockDim.x;
    sh[t] = in[blockIdx.x * blockDim.x + threadIdx.x];
    __syncthreads();
    for (int s = 512; s > 0; s >>= 1) {
        if (t < s && t + s < n) sh[t] += sh[t + s];
        __syncthreads();
    }
    if (t == 0) out[blockIdx.x] = sh[0];
}

/* threads nlive.. return before the first barrier; the others reduce their nlive values */
__global__ void k_reduce_early(const int *in, int *out, int nlive) {
    __shared__ int sh[1024];
    int t = (int)threadIdx.x;
    if (t >= nlive) return;
    sh[t] = in[blockIdx.x * blockDim.x + threadIdx.x];
    __syncthreads();
    for (int s = 512; s > 0; s >>= 1) {
        if (t < s && t + s < nlive) sh[t] += sh[t + s];
        __syncthreads();
    }
    if (t == 0) out[blockIdx.x] = sh[0];
}

/* threads leave as the tree narrows: at stride s every thread >= s exits before the barrier */
__global__ void k_reduce_shrink(const int *in, int *out) {
    __shared__ int sh[1024];
    int t = (int)threadIdx.x, n = (int)blockDim.x;
    sh[t] = in[blockIdx.x * blockDim.x + threadIdx.x];
    __syncthreads();
    for (int s = 512; s > 0; s >>= 1) {
        if (t >= s) return;
        if (t + s < n) sh[t] += sh[t + s];
        __syncthreads();
    }
    if (t == 0) out[blockIdx.x] = sh[0];
}

static int input_value(unsigned i) {
    return (int)((i * 2654435761u) >> 22) - 500;
}

static void check_reduce(int kind, int nblocks, int nt, int nlive) {
    int n = nblocks * nt;
    int *h = (int *)host_alloc(n * sizeof(int)), got[8];
    long long want[8];
    for (int i = 0; i < n; i++)
        h[i] = input_value((unsigned)i);
    for (int b = 0; b < nblocks; b++) {
        want[b] = 0;
        for (int t = 0; t < (kind == 1 ? nlive : nt); t++)
            want[b] += h[b * nt + t];
    }
    int *din = (int *)dev_alloc(n * sizeof(int)), *dout = (int *)dev_alloc(nblocks * sizeof(int));
    to_dev(din, h, n * sizeof(int));
    const char *what;
    if (kind == 0) {
        what = "all threads";
        k_reduce<<<nblocks, nt>>>(din, dout);
    } else if (kind == 1) {
        what = "threads exit before the barriers";
        k_reduce_early<<<nblocks, nt>>>(din, dout, nlive);
    } else {
        what = "threads exit as the tree narrows";
        k_reduce_shrink<<<nblocks, nt>>>(din, dout);
    }
    cudaError_t launch = cudaGetLastError();
    to_host(got, dout, nblocks * sizeof(int));
    int bad = 0;
    char detail[256] = "";
    for (int b = 0; b < nblocks; b++)
        if (got[b] != want[b]) {
            if (!bad)
                snprintf(detail, sizeof(detail), " (block %d: %d, want %lld)", b, got[b], want[b]);
            bad++;
        }
    if (kind == 1)
        check(launch == cudaSuccess && !bad,
              "2 __syncthreads reduction, %d blocks of %d threads, %d "
              "live (%s): %d of %d block sums exact%s",
              nblocks, nt, nlive, what, nblocks - bad, nblocks, detail);
    else
        check(launch == cudaSuccess && !bad,
              "2 __syncthreads reduction, %d blocks of %d threads "
              "(%s): %d of %d block sums exact%s",
              nblocks, nt, what, nblocks - bad, nblocks, detail);
    free(h);
    CK(cudaFree(din));
    CK(cudaFree(dout));
}

/* ==== 3. warp shuffles ===================================================================== */

enum {
    OP_BFLY_SUM, /* xor butterfly 16, 8, 4, 2, 1: every lane the warp's sum */
    OP_IDX5,     /* __shfl_sync(v, 5): broadcast */
    OP_IDX5_W8,  /* __shfl_sync(v, 5, 8): lane 5 of each group of 8 */
    OP_IDX13_W8, /* __shfl_sync(v, 13, 8): srcLane modulo width */
    OP_IDX37,    /* __shfl_sync(v, 37): srcLane modulo 32 */
    OP_DOWN3,
    OP_DOWN3_W8,
    OP_DOWN16_W16, /* every source is past its segment: own values */
    OP_UP3,
    OP_UP3_W8,
    OP_UP1_W4,
    OP_XOR5,
    OP_XOR3_W8,
    OP_XOR8_W8, /* partner in the earlier group of 8: its value; in the later one: own value */
    NOPS
};
static const char *op_name[NOPS] = {
    "xor-butterfly-sum", "idx(5)", "idx(5,w8)", "idx(13,w8)", "idx(37)", "down(3)",   "down(3,w8)",
    "down(16,w16)",      "up(3)",  "up(3,w8)",  "up(1,w4)",   "xor(5)",  "xor(3,w8)", "xor(8,w8)"};

/* one kernel per type (no templates: to_cc.sh rewrites only k<<<...>>> launches) */
#define SHFL_KERNEL(T, NAME)                                                                       \
    __global__ void NAME(const T *in, T *out) {                                                    \
        unsigned g = (blockIdx.x * blockDim.y + threadIdx.y) * blockDim.x + threadIdx.x;           \
        T v = in[g], s = v, *o = out + (size_t)g * NOPS;                                           \
        for (int m = 16; m > 0; m >>= 1)                                                           \
            s += __shfl_xor_sync(FULL, s, m);                                                      \
        o[OP_BFLY_SUM] = s;                                                                        \
        o[OP_IDX5] = __shfl_sync(FULL, v, 5);                                                      \
        o[OP_IDX5_W8] = __shfl_sync(FULL, v, 5, 8);                                                \
        o[OP_IDX13_W8] = __shfl_sync(FULL, v, 13, 8);                                              \
        o[OP_IDX37] = __shfl_sync(FULL, v, 37);                                                    \
        o[OP_DOWN3] = __shfl_down_sync(FULL, v, 3);                                                \
        o[OP_DOWN3_W8] = __shfl_down_sync(FULL, v, 3, 8);                                          \
        o[OP_DOWN16_W16] = __shfl_down_sync(FULL, v, 16, 16);                                      \
        o[OP_UP3] = __shfl_up_sync(FULL, v, 3);                                                    \
        o[OP_UP3_W8] = __shfl_up_sync(FULL, v, 3, 8);                                              \
        o[OP_UP1_W4] = __shfl_up_sync(FULL, v, 1, 4);                                              \
        o[OP_XOR5] = __shfl_xor_sync(FULL, v, 5);                                                  \
        o[OP_XOR3_W8] = __shfl_xor_sync(FULL, v, 3, 8);                                            \
        o[OP_XOR8_W8] = __shfl_xor_sync(FULL, v, 8, 8);                                            \
    }
SHFL_KERNEL(int, k_shfl_int)
SHFL_KERNEL(float, k_shfl_float)
SHFL_KERNEL(double, k_shfl_double)

/* The source lane per the CUDA Programming Guide ("Warp Shuffle Functions"), with w the width
 * and each group of w lanes a segment:
 *   __shfl_sync: lane srcLane % w of the caller's segment;
 *   __shfl_up_sync: caller - delta, own value if that falls below the segment;
 *   __shfl_down_sync: caller + delta, own value if that passes the segment's end;
 *   __shfl_xor_sync: caller ^ laneMask; a lane of an earlier segment may be read, one of a
 *   later segment gives the caller its own value (PTX shfl.bfly: j <= maxLane). */
static int seg(int lane, int w) {
    return lane / w * w;
}
static int idx_src(int lane, int src, int w) {
    return seg(lane, w) + src % w;
}
static int up_src(int lane, int d, int w) {
    return lane - d < seg(lane, w) ? lane : lane - d;
}
static int down_src(int lane, int d, int w) {
    return lane + d >= seg(lane, w) + w ? lane : lane + d;
}
static int xor_src(int lane, int m, int w) {
    return (lane ^ m) >= seg(lane, w) + w ? lane : lane ^ m;
}

static int src_lane(int op, int lane) {
    switch (op) {
    case OP_IDX5:
        return idx_src(lane, 5, 32);
    case OP_IDX5_W8:
        return idx_src(lane, 5, 8);
    case OP_IDX13_W8:
        return idx_src(lane, 13, 8);
    case OP_IDX37:
        return idx_src(lane, 37, 32);
    case OP_DOWN3:
        return down_src(lane, 3, 32);
    case OP_DOWN3_W8:
        return down_src(lane, 3, 8);
    case OP_DOWN16_W16:
        return down_src(lane, 16, 16);
    case OP_UP3:
        return up_src(lane, 3, 32);
    case OP_UP3_W8:
        return up_src(lane, 3, 8);
    case OP_UP1_W4:
        return up_src(lane, 1, 4);
    case OP_XOR5:
        return xor_src(lane, 5, 32);
    case OP_XOR3_W8:
        return xor_src(lane, 3, 8);
    case OP_XOR8_W8:
        return xor_src(lane, 8, 8);
    default:
        abort();
    }
}

/* the butterfly on the host, lane by lane the same additions (bitwise the same result) */
#define HOST_BFLY(T, NAME)                                                                         \
    static void NAME(const T *in, T *sum, int n) {                                                 \
        for (int w = 0; w < n; w += 32) {                                                          \
            T s[32], ns[32];                                                                       \
            memcpy(s, in + w, sizeof(s));                                                          \
            for (int m = 16; m > 0; m >>= 1) {                                                     \
                for (int l = 0; l < 32; l++)                                                       \
                    ns[l] = s[l] + s[l ^ m];                                                       \
                memcpy(s, ns, sizeof(s));                                                          \
            }                                                                                      \
            memcpy(sum + w, s, sizeof(s));                                                         \
        }                                                                                          \
    }
HOST_BFLY(int, bfly_int)
HOST_BFLY(float, bfly_float)
HOST_BFLY(double, bfly_double)

/* compares out[g][op] bitwise with the documented source lane's input (warps are formed from
 * the linear thread index, so lane = g % 32 for whole-warp blocks) */
static void compare_shfl(const char *tname, size_t esz, int n, const unsigned char *in,
                         const unsigned char *out, const unsigned char *bsum, dim3 grid,
                         dim3 block) {
    int bad[NOPS] = {0}, nbad = 0;
    for (int g = 0; g < n; g++) {
        int lane = g % 32, warp0 = g - lane;
        for (int op = 0; op < NOPS; op++) {
            const unsigned char *want = op == OP_BFLY_SUM
                                            ? bsum + g * esz
                                            : in + (size_t)(warp0 + src_lane(op, lane)) * esz;
            if (memcmp(out + ((size_t)g * NOPS + op) * esz, want, esz)) bad[op]++;
        }
    }
    char detail[512] = "";
    size_t len = 0;
    for (int op = 0; op < NOPS; op++)
        if (bad[op]) {
            nbad++;
            len += (size_t)snprintf(detail + len, sizeof(detail) - len, " %s:%d", op_name[op],
                                    bad[op]);
            if (len >= sizeof(detail)) len = sizeof(detail) - 1;
        }
    check(!nbad, "3 shuffles %s, grid %u block (%u,%u): %d operations x %d lanes, %s%s", tname,
          grid.x, block.x, block.y, NOPS, n,
          nbad ? "wrong lanes per operation:" : "all as documented", detail);
}

#define CHECK_SHFL(T, KERNEL, BFLY, VALUE)                                                         \
    do {                                                                                           \
        dim3 grid(3), block(16, 4); /* 2-D blocks: lanes follow the linear thread index */         \
        int n = (int)(grid.x * block.x * block.y);                                                 \
        T *in = (T *)host_alloc(n * sizeof(T)),                                                    \
          *out = (T *)host_alloc((size_t)n * NOPS * sizeof(T));                                    \
        T *sum = (T *)host_alloc(n * sizeof(T));                                                   \
        for (int i = 0; i < n; i++)                                                                \
            in[i] = VALUE;                                                                         \
        T *din = (T *)dev_alloc(n * sizeof(T)),                                                    \
          *dout = (T *)dev_alloc((size_t)n * NOPS * sizeof(T));                                    \
        to_dev(din, in, n * sizeof(T));                                                            \
        KERNEL<<<grid, block>>>(din, dout);                                                        \
        CK(cudaGetLastError());                                                                    \
        to_host(out, dout, sizeof(T) * NOPS * n);                                                  \
        BFLY(in, sum, n);                                                                          \
        compare_shfl(#T, sizeof(T), n, (const unsigned char *)in, (const unsigned char *)out,      \
                     (const unsigned char *)sum, grid, block);                                     \
        free(in), free(out), free(sum);                                                            \
        CK(cudaFree(din));                                                                         \
        CK(cudaFree(dout));                                                                        \
    } while (0)

static void check_shuffles(void) {
    /* distinct in every lane, warp and block; the doubles differ only in their low 32 bits,
     * so a shuffle that moved 4 bytes would show */
    CHECK_SHFL(int, k_shfl_int, bfly_int, i * 7 - 600);
    CHECK_SHFL(float, k_shfl_float, bfly_float, 1.0f + (float)i * 0.125f);
    CHECK_SHFL(double, k_shfl_double, bfly_double, 1.0 + (double)i * 0x1p-40);
}

/* ==== 5. mma.m16n8k16 ====================================================================== */

/* bf16 = the top 16 bits of a float (exact for small integers) */
static __device__ __host__ uint32_t bf16_bits(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    return u >> 16;
}
/* the lower-indexed element in the lower half */
static __device__ uint32_t pack2(float lo, float hi) {
    return bf16_bits(lo) | bf16_bits(hi) << 16;
}

/* Each warp w computes D = C + A B with A 16x16 (row-major, A + 256 w), B 16x8 (row-major
 * k x n, B + 128 w), C and D 16x8 (row-major). Fragments per the PTX ISA, "Matrix Fragments for
 * mma.m16n8k16 with floating point type", with g = lane / 4 and t = lane % 4:
 *   A register r (a[2r], a[2r+1]): row g + 8 (r & 1), columns 2t + 8 (r >> 1) + {0, 1}
 *   B register r (b[2r], b[2r+1]): rows 2t + 8 r + {0, 1}, column g
 *   C/D element i: row g + 8 (i >> 1), column 2t + (i & 1) */
__global__ void k_mma(const float *A, const float *B, const float *C, float *D) {
    int w = (int)threadIdx.x / 32, lane = (int)threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const float *a_ = A + 256 * w, *b_ = B + 128 * w;
    uint32_t a[4], b[2];
    float c[4];
    for (int r = 0; r < 4; r++) {
        int row = g + 8 * (r & 1), col = 2 * t + 8 * (r >> 1);
        a[r] = pack2(a_[row * 16 + col], a_[row * 16 + col + 1]);
    }
    for (int r = 0; r < 2; r++) {
        int row = 2 * t + 8 * r;
        b[r] = pack2(b_[row * 8 + g], b_[(row + 1) * 8 + g]);
    }
    for (int i = 0; i < 4; i++)
        c[i] = C[128 * w + (g + 8 * (i >> 1)) * 8 + 2 * t + (i & 1)];
    emu_mma16816(c, a, b[0], b[1]);
    for (int i = 0; i < 4; i++)
        D[128 * w + (g + 8 * (i >> 1)) * 8 + 2 * t + (i & 1)] = c[i];
}

static void check_mma(void) {
    enum { W = 2 }; /* two warps, each its own product */
    static float A[W * 256], B[W * 128], C[W * 128], D[W * 128];
    for (int w = 0; w < W; w++) {
        for (int i = 0; i < 16; i++)
            for (int k = 0; k < 16; k++)
                A[w * 256 + i * 16 + k] = (float)((i * 5 + k * 3 + w * 4) % 9 - 4);
        for (int k = 0; k < 16; k++)
            for (int j = 0; j < 8; j++)
                B[w * 128 + k * 8 + j] = (float)((k * 7 + j * 2 + w * 3) % 7 - 3);
        for (int i = 0; i < 16; i++)
            for (int j = 0; j < 8; j++)
                C[w * 128 + i * 8 + j] = (float)(i * 3 - j * 5 + w);
    }
    float *dA = (float *)dev_alloc(sizeof(A)), *dB = (float *)dev_alloc(sizeof(B));
    float *dC = (float *)dev_alloc(sizeof(C)), *dD = (float *)dev_alloc(sizeof(D));
    to_dev(dA, A, sizeof(A)), to_dev(dB, B, sizeof(B)), to_dev(dC, C, sizeof(C));
    k_mma<<<1, 32 * W>>>(dA, dB, dC, dD);
    cudaError_t e = cudaGetLastError();
    to_host(D, dD, sizeof(D));
    int bad = 0;
    char detail[160] = "";
    for (int w = 0; w < W; w++)
        for (int i = 0; i < 16; i++)
            for (int j = 0; j < 8; j++) {
                double want = C[w * 128 + i * 8 + j];
                for (int k = 0; k < 16; k++)
                    want += (double)A[w * 256 + i * 16 + k] * B[w * 128 + k * 8 + j];
                float got = D[w * 128 + i * 8 + j];
                if ((double)got != want) {
                    if (!bad)
                        snprintf(detail, sizeof(detail), " (warp %d D[%d][%d] = %g, want %g)", w, i,
                                 j, got, want);
                    bad++;
                }
            }
    check(e == cudaSuccess && !bad,
          "5 mma m16n8k16 bf16 -> f32, PTX fragment layout, %d warps: %d of "
          "%d elements of C + A B exact%s",
          W, W * 128 - bad, W * 128, detail);
    CK(cudaFree(dA));
    CK(cudaFree(dB));
    CK(cudaFree(dC));
    CK(cudaFree(dD));
}

/* ==== main ================================================================================= */

static void functional_checks(void) {
    check_index("1-D", dim3(5), dim3(96));
    check_index("2-D", dim3(3, 4), dim3(16, 6));
    check_index("3-D", dim3(2, 3, 4), dim3(4, 3, 5));
    check_index("3-D, block along z", dim3(3, 1, 2), dim3(1, 2, 64));
    check_reduce(0, 3, 256, 0);
    check_reduce(0, 2, 1024, 0);
    check_reduce(0, 3, 100, 0);
    check_reduce(1, 3, 256, 200);
    check_reduce(1, 2, 128, 77);
    check_reduce(2, 3, 256, 0);
    check_reduce(2, 2, 100, 0);
    check_shuffles();
    check_mma();
}

int main(void) {
    unsetenv("TR_EMU_ORDER");
    check_adversarial();
    functional_checks();
    check_smem();
    check_detection();
    check_order();
    check_api();
    setenv("TR_EMU_ORDER", "reverse", 1);
    order_tag = " [TR_EMU_ORDER=reverse]";
    functional_checks();
    unsetenv("TR_EMU_ORDER");
    order_tag = "";
    printf("%d checks passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
