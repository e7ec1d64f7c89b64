/* The CUDA backend's optimizer helpers: the sum of squares (in double, for gradient clipping)
 * and AdamW, one stretch or many stretches in one launch. bf as in cuda_ops.cu; fixed-order
 * reductions, bitwise reproducible. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/cuda/cuda_private.h"
#include "model/mutant.h"

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
