/* The CUDA backend's tables (bf16 and fp32 storage), its lazy initialisation (device check,
 * the one stream, cuBLASLt), device memory, host fp32 <-> storage conversions, scratch, and the
 * table of peak rates that MFU divides by. The kernels live in cuda_ops.cu, cuda_linear.cu and
 * cuda_attention.cu; every entry here is a thin wrapper that passes the storage dtype on. */
#include <cublasLt.h>
#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/cuda/cuda_private.h"
#include "model/mutant.h"
extern "C" {
#include "parallel/comm/comm.h" /* tr_comm_local_rank */
}

cudaStream_t tr_cuda_stream;

void tr_cuda_fail(const char *what, const char *err, const char *file, int line) {
    fprintf(stderr, "cuda: %s failed: %s (%s:%d)\n", what, err, file, line);
    fflush(stderr);
    abort();
}

/* ---- device memory held --------------------------------------------------------------- */

/* the live allocations (a few dozen: the model's arenas, the data-parallel buffers, the
   workspace), so that a free knows its size */
static struct {
    void *p;
    size_t n;
} *held;
static size_t n_held, cap_held, held_bytes, held_peak;

cudaError_t tr_cuda_malloc(void **p, size_t bytes) {
    if (n_held == cap_held) {
        size_t cap = cap_held ? 2 * cap_held : 64;
        void *q = realloc(held, cap * sizeof(*held));
        if (!q) return cudaErrorMemoryAllocation;
        held = (decltype(held))q;
        cap_held = cap;
    }
    cudaError_t e = cudaMalloc(p, bytes);
    if (e != cudaSuccess) return e;
    held[n_held].p = *p, held[n_held++].n = bytes;
    held_bytes += bytes;
    if (held_bytes > held_peak) held_peak = held_bytes;
    return cudaSuccess;
}

cudaError_t tr_cuda_free(void *p) {
    if (!p) return cudaSuccess;
    for (size_t i = 0; i < n_held; i++)
        if (held[i].p == p) {
            held_bytes -= held[i].n;
            held[i] = held[--n_held];
            break;
        }
    return cudaFree(p);
}

extern "C" void tr_backend_cuda_memory(size_t *now, size_t *peak) {
    if (now) *now = held_bytes;
    if (peak) *peak = held_peak;
}

extern "C" int tr_backend_cuda_device_use(size_t *used, size_t *total) {
    size_t free_b = 0;
    *used = *total = 0;
    if (cudaMemGetInfo(&free_b, total) != cudaSuccess) return -1;
    *used = *total - free_b;
    return 0;
}

extern "C" void tr_backend_cuda_step_done(int step) {
#ifdef TR_CUDA_EMU
    /* the emulator's own count is the check of this one: every cudaMalloc comes through here */
    emu_mem_stats st;
    emu_mem_counts(&st);
    if (st.live != held_bytes)
        tr_cuda_fail("device memory accounting", "the emulator holds other bytes than counted",
                     __FILE__, __LINE__);
    emu_mem_step(step);
#else
    (void)step;
#endif
}

/* ---- scratch --------------------------------------------------------------------------- */

static void *scr[SCR_COUNT];
static size_t scr_cap[SCR_COUNT];

void *tr_cuda_scratch(int slot, size_t bytes) {
    if (bytes <= scr_cap[slot]) return scr[slot];
    /* beyond the plan's (cu_reserve): sampling's decode attention after training, or a
       program without a model (the kernel tests); the emulator refuses it inside training */
    size_t cap = (bytes + ((size_t)1 << 20) - 1) & ~(((size_t)1 << 20) - 1); /* whole MiB */
    CK(tr_cuda_free(scr[slot])); /* synchronizes the device: no kernel still reads the old block */
    scr[slot] = NULL;
    scr_cap[slot] = 0;
    CK(tr_cuda_malloc(&scr[slot], cap));
    scr_cap[slot] = cap;
    return scr[slot];
}

/* What every zero-byte buffer is (a ZeRO-2/3 rank's slab-wide optimizer state, for one): one
 * block allocated with the workspaces, never freed, so that an empty buffer costs no
 * cudaMalloc of its own and is still a distinct non-NULL device address. */
static void *empty_block;

/* The plan's workspaces (model/workspace.c), allocated at the model's start: the scratch
 * slots here, the optimizer's tables (cuda_ops.cu); cuBLASLt's was allocated with its handle. */
static int cu_reserve(const tr_workspace *w) {
    /* in the order of SCR_* (cuda_private.h) */
    static const int slot[] = {TR_WS_REDUCE, TR_WS_EMBED, TR_WS_ROPE,
                               TR_WS_ATTN,   TR_WS_SUMSQ, TR_WS_CUDNN};
    static_assert(sizeof slot / sizeof slot[0] == SCR_COUNT, "a workspace for every scratch slot");
    if (!empty_block && tr_cuda_malloc(&empty_block, w->bytes[TR_WS_EMPTY]) != cudaSuccess) {
        (void)cudaGetLastError();
        empty_block = NULL;
        return -1;
    }
    for (int k = 0; k < SCR_COUNT; k++) {
        size_t n = w->bytes[slot[k]];
        if (n <= scr_cap[k]) continue;
        CK(tr_cuda_free(scr[k]));
        scr[k] = NULL;
        scr_cap[k] = 0;
        if (tr_cuda_malloc(&scr[k], n) != cudaSuccess) {
            (void)cudaGetLastError();
            return -1;
        }
        scr_cap[k] = n;
    }
    return tr_cuda_adamw_reserve(w->bytes[TR_WS_ADAMW_SEGS], w->bytes[TR_WS_ADAMW_BLOCKS]);
}

/* ---- memory ---------------------------------------------------------------------------- */

static void *cu_alloc(size_t bytes) {
    void *p = NULL;
    if (bytes == 0) {
        if (!empty_block && tr_cuda_malloc(&empty_block, TR_WS_EMPTY_BYTES) != cudaSuccess) {
            (void)cudaGetLastError(); /* before any model's reserve: the kernel tests */
            empty_block = NULL;
        }
        return empty_block;
    }
    if (tr_cuda_malloc(&p, bytes) != cudaSuccess) {
        (void)cudaGetLastError(); /* out of memory is reported as NULL, not sticky */
        return NULL;
    }
    CK(cudaMemsetAsync(p, 0, bytes, tr_cuda_stream));
    return p;
}
static void cu_free(void *p) {
    if (p && p != empty_block) CK(tr_cuda_free(p));
}
/* Host memory may be reused as soon as these return, so each one waits for its copy. */
static void cu_upload(void *dst, const void *src, size_t bytes) {
    if (!bytes) return;
    CK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, tr_cuda_stream));
    TR_WAIT("cuda.upload", CK(cudaStreamSynchronize(tr_cuda_stream)));
}
static void cu_download(void *dst, const void *src, size_t bytes) {
    if (!bytes) return;
    CK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, tr_cuda_stream));
    TR_WAIT("cuda.download", CK(cudaStreamSynchronize(tr_cuda_stream)));
}
static void cu_zero(void *p, size_t bytes) {
    if (bytes) CK(cudaMemsetAsync(p, 0, bytes, tr_cuda_stream));
}
/* device to device: on the stream, the host does not wait */
static void cu_copy(void *dst, const void *src, size_t bytes) {
    if (bytes) CK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, tr_cuda_stream));
}

/* host fp32 <-> bf16 with round-to-nearest-even, as __float2bfloat16_rn; NaN stays NaN */
static uint16_t f2bf(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof(u));
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
static float bf2f(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

#define CONV_CHUNK ((size_t)1 << 20)
static uint16_t *conv_buf;

static uint16_t *conv(void) {
    if (!conv_buf) conv_buf = (uint16_t *)malloc(CONV_CHUNK * sizeof(uint16_t));
    if (!conv_buf) tr_cuda_fail("malloc (conversion buffer)", "out of memory", __FILE__, __LINE__);
    return conv_buf;
}
static void bf_to_storage(tr_buf *dst, const float *src, size_t n) {
    uint16_t *h = conv();
    for (size_t i = 0; i < n; i += CONV_CHUNK) {
        size_t k = n - i < CONV_CHUNK ? n - i : CONV_CHUNK;
        for (size_t j = 0; j < k; j++) h[j] = f2bf(src[i + j]);
        cu_upload((uint16_t *)dst + i, h, k * sizeof(uint16_t));
    }
}
static void bf_from_storage(float *dst, const tr_buf *src, size_t n) {
    uint16_t *h = conv();
    for (size_t i = 0; i < n; i += CONV_CHUNK) {
        size_t k = n - i < CONV_CHUNK ? n - i : CONV_CHUNK;
        cu_download(h, (const uint16_t *)src + i, k * sizeof(uint16_t));
        for (size_t j = 0; j < k; j++) dst[i + j] = bf2f(h[j]);
    }
}
static void f32_to_storage(tr_buf *dst, const float *src, size_t n) {
    cu_upload(dst, src, n * sizeof(float));
}
static void f32_from_storage(float *dst, const tr_buf *src, size_t n) {
    cu_download(dst, src, n * sizeof(float));
}

/* ---- the two tables: one wrapper per dtype and op -------------------------------------- */

#define WRAP(name, params, ...)                                            \
    static void bf_##name params { tr_cuda_##name(1, __VA_ARGS__); }      \
    static void f32_##name params { tr_cuda_##name(0, __VA_ARGS__); }

WRAP(linear_forward,
     (tr_buf * out, const tr_buf *inp, const tr_buf *w, const tr_buf *bias, int N, int IC, int OC),
     out, inp, w, bias, N, IC, OC)
WRAP(linear_backward,
     (tr_buf * dinp, tr_buf *dw, tr_buf *dbias, const tr_buf *dout, const tr_buf *inp,
      const tr_buf *w, int N, int IC, int OC),
     dinp, dw, dbias, dout, inp, w, N, IC, OC)
WRAP(embedding_forward, (tr_buf * out, const int *tokens, const tr_buf *wte, int N, int C), out,
     tokens, wte, N, C)
WRAP(embedding_backward, (tr_buf * dwte, const tr_buf *dout, const int *tokens, int N, int C), dwte,
     dout, tokens, N, C)
WRAP(positions_forward, (tr_buf * x, const tr_buf *wpe, int B, int T, int C), x, wpe, B, T, C)
WRAP(positions_backward, (tr_buf * dwpe, const tr_buf *dx, int B, int T, int C), dwpe, dx, B, T, C)
WRAP(layernorm_forward,
     (tr_buf * out, float *mean, float *rstd, const tr_buf *inp, const tr_buf *w, const tr_buf *b,
      int N, int C, float eps),
     out, mean, rstd, inp, w, b, N, C, eps)
WRAP(layernorm_backward,
     (tr_buf * dinp, tr_buf *dw, tr_buf *db, const tr_buf *dout, const tr_buf *inp, const tr_buf *w,
      const float *mean, const float *rstd, int N, int C),
     dinp, dw, db, dout, inp, w, mean, rstd, N, C)
WRAP(rmsnorm_forward,
     (tr_buf * out, float *rstd, const tr_buf *inp, const tr_buf *w, int N, int C, float eps), out,
     rstd, inp, w, N, C, eps)
WRAP(rmsnorm_backward,
     (tr_buf * dinp, tr_buf *dw, const tr_buf *dout, const tr_buf *inp, const tr_buf *w,
      const float *rstd, int N, int C),
     dinp, dw, dout, inp, w, rstd, N, C)
WRAP(rope_forward, (tr_buf * qkv, int B, int T, int H, int KV, int hd, float theta), qkv, B, T, H,
     KV, hd, theta)
WRAP(rope_backward, (tr_buf * dqkv, int B, int T, int H, int KV, int hd, float theta), dqkv, B, T,
     H, KV, hd, theta)
WRAP(attention_forward,
     (tr_buf * out, float *lse, const tr_buf *qkv, int B, int T, int H, int KV, int hd), out, lse,
     qkv, B, T, H, KV, hd)
WRAP(attention_backward,
     (tr_buf * dqkv, const tr_buf *dout, const tr_buf *qkv, const tr_buf *out, const float *lse,
      int B, int T, int H, int KV, int hd),
     dqkv, dout, qkv, out, lse, B, T, H, KV, hd)
WRAP(decode_attention,
     (tr_buf * out, tr_buf *qkv, tr_buf *kc, tr_buf *vc, int pos, int H, int KV, int hd,
      float theta),
     out, qkv, kc, vc, pos, H, KV, hd, theta)
WRAP(gelu_forward, (tr_buf * out, const tr_buf *inp, size_t n), out, inp, n)
WRAP(gelu_backward, (tr_buf * dinp, const tr_buf *dout, const tr_buf *inp, size_t n), dinp, dout,
     inp, n)
WRAP(swiglu_forward, (tr_buf * out, const tr_buf *inp, int N, int Hd), out, inp, N, Hd)
WRAP(swiglu_backward, (tr_buf * dinp, const tr_buf *dout, const tr_buf *inp, int N, int Hd), dinp,
     dout, inp, N, Hd)
WRAP(add, (tr_buf * out, const tr_buf *a, const tr_buf *b, size_t n), out, a, b, n)
WRAP(residual_norm_forward,
     (tr_buf * sum, tr_buf *out, float *mean, float *rstd, const tr_buf *a, const tr_buf *b,
      const tr_buf *w, const tr_buf *bias, int N, int C, float eps, int rms),
     sum, out, mean, rstd, a, b, w, bias, N, C, eps, rms)
WRAP(linear_gelu_forward,
     (tr_buf * out, tr_buf *pre, const tr_buf *inp, const tr_buf *w, const tr_buf *bias, int N,
      int IC, int OC),
     out, pre, inp, w, bias, N, IC, OC)
WRAP(linear_backward_gelu,
     (tr_buf * dinp, tr_buf *dw, tr_buf *dbias, const tr_buf *dout, const tr_buf *inp,
      const tr_buf *w, const tr_buf *pre, int N, int IC, int OC),
     dinp, dw, dbias, dout, inp, w, pre, N, IC, OC)
WRAP(softmax_xent,
     (tr_buf * logits, float *losses, const int *targets, int N, int V, int ld, float dscale,
      int want_grad),
     logits, losses, targets, N, V, ld, dscale, want_grad)
WRAP(xent_stats,
     (float *stats, const tr_buf *logits, const int *targets, int lo, int N, int V, int ld), stats,
     logits, targets, lo, N, V, ld)
WRAP(xent_finish,
     (tr_buf * logits, float *losses, const float *all_stats, int R, const int *targets, int lo,
      int N, int V, int ld, float dscale, int want_grad),
     logits, losses, all_stats, R, targets, lo, N, V, ld, dscale, want_grad)
WRAP(scale, (tr_buf * x, float s, size_t n), x, s, n)
WRAP(adamw,
     (float *master, tr_buf *param, const tr_buf *g, float *m, float *v, size_t n, float lr,
      float beta1, float beta2, float eps, float wd, float bc1, float bc2, float gscale),
     master, param, g, m, v, n, lr, beta1, beta2, eps, wd, bc1, bc2, gscale)

WRAP(adamw_multi,
     (const tr_adamw_seg *s, int n, float lr, float beta1, float beta2, float eps, float bc1,
      float bc2, float gscale),
     s, n, lr, beta1, beta2, eps, bc1, bc2, gscale)

static double bf_sumsq(const tr_buf *x, size_t n) { return tr_cuda_sumsq(1, x, n); }
static double f32_sumsq(const tr_buf *x, size_t n) { return tr_cuda_sumsq(0, x, n); }

/* Filled field by field at initialisation (designated initializers are C++20), so an entry
 * added to backend.h later starts as NULL here instead of shifting every other one. */
#define FILL(t, P, NAME, DT)                                                                      \
    do {                                                                                          \
        memset(&(t), 0, sizeof(t));                                                               \
        (t).name = NAME, (t).dtype = DT, (t).pad_vocab = TR_CUDA_PAD_VOCAB;                       \
        (t).alloc = cu_alloc, (t).free = cu_free, (t).upload = cu_upload;                         \
        (t).download = cu_download, (t).zero = cu_zero, (t).copy = cu_copy;                      \
        (t).to_storage = P##_to_storage, (t).from_storage = P##_from_storage;                     \
        (t).linear_forward = P##_linear_forward, (t).linear_backward = P##_linear_backward;       \
        (t).embedding_forward = P##_embedding_forward;                                            \
        (t).embedding_backward = P##_embedding_backward;                                          \
        (t).positions_forward = P##_positions_forward;                                            \
        (t).positions_backward = P##_positions_backward;                                          \
        (t).layernorm_forward = P##_layernorm_forward;                                            \
        (t).layernorm_backward = P##_layernorm_backward;                                          \
        (t).rmsnorm_forward = P##_rmsnorm_forward, (t).rmsnorm_backward = P##_rmsnorm_backward;   \
        (t).rope_forward = P##_rope_forward, (t).rope_backward = P##_rope_backward;               \
        (t).attention_forward = P##_attention_forward;                                            \
        (t).attention_backward = P##_attention_backward;                                          \
        (t).decode_attention = P##_decode_attention;                                              \
        (t).gelu_forward = P##_gelu_forward, (t).gelu_backward = P##_gelu_backward;               \
        (t).swiglu_forward = P##_swiglu_forward, (t).swiglu_backward = P##_swiglu_backward;       \
        (t).add = P##_add, (t).softmax_xent = P##_softmax_xent, (t).sumsq = P##_sumsq;            \
        (t).xent_stats = P##_xent_stats, (t).xent_finish = P##_xent_finish;                       \
        (t).scale = P##_scale, (t).adamw = P##_adamw;                                             \
        (t).residual_norm_forward = P##_residual_norm_forward;                                    \
        (t).linear_gelu_forward = P##_linear_gelu_forward;                                        \
        (t).linear_backward_gelu = P##_linear_backward_gelu;                                      \
        (t).adamw_multi = P##_adamw_multi, (t).reserve = cu_reserve;                              \
    } while (0)

static tr_backend bf16_table, f32_table;

/* bf16's attention_workspace: cuDNN's plans' bytes where TR_CUDA_ATTENTION runs cuDNN (cudnn,
 * or auto, which may keep it, and then also the buffers its decision compares), built for the
 * shape now so that the plan counts them and the run allocates them at its start
 * (cu_reserve), not in its first step. fp32 runs ours. */
static size_t bf_attention_workspace(int B, int T, int H, int KV, int hd) {
    tr_attention_impl a = tr_backend_attention();
    if (a != TR_ATTENTION_CUDNN && a != TR_ATTENTION_AUTO) return 0;
    return tr_cuda_attention_cudnn_reserve(B, T, H, KV, hd);
}

/* ---- initialisation -------------------------------------------------------------------- */

static int init_state; /* 0: not tried, 1: ready, -1: failed (reason kept) */
static char init_why[512];

static int init(void) {
    int n = 0, drv = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        /* no driver at all also reads "insufficient driver": the driver version is then 0 */
        int no_driver = e == cudaErrorInsufficientDriver &&
                        (cudaDriverGetVersion(&drv) != cudaSuccess || drv == 0);
        if (no_driver || e == cudaErrorNoDevice || e == cudaSuccess)
            snprintf(init_why, sizeof(init_why), "%s (%s)", TR_NO_GPU_FOUND,
                     no_driver ? "no NVIDIA driver" : "the driver sees no device");
        else /* a GPU or driver that is there but fails: its own words */
            snprintf(init_why, sizeof(init_why), "no usable CUDA device: %s",
                     cudaGetErrorString(e));
        (void)cudaGetLastError();
        return -1;
    }
    /* one GPU per process on a host: the process's rank among those on its host picks it
       (CUDA_VISIBLE_DEVICES, applied by the driver, decides which devices there are); more
       processes than GPUs share them round robin (comm.h then stages their collectives) */
    int local_size = 1, dev = tr_comm_local_rank(&local_size) % n;
    if ((e = cudaSetDevice(dev)) != cudaSuccess) {
        snprintf(init_why, sizeof(init_why), "cannot use CUDA device %d: %s", dev,
                 cudaGetErrorString(e));
        return -1;
    }
    cudaDeviceProp p;
    if ((e = cudaGetDevice(&dev)) != cudaSuccess ||
        (e = cudaGetDeviceProperties(&p, dev)) != cudaSuccess) {
        snprintf(init_why, sizeof(init_why), "cannot query the CUDA device: %s",
                 cudaGetErrorString(e));
        return -1;
    }
    if (p.major < 8) {
        snprintf(init_why, sizeof(init_why),
                 "%.200s has compute capability %d.%d; the CUDA backend needs 8.0 (Ampere) or newer",
                 p.name, p.major, p.minor);
        return -1;
    }
    if ((e = cudaStreamCreateWithFlags(&tr_cuda_stream, cudaStreamNonBlocking)) != cudaSuccess) {
        snprintf(init_why, sizeof(init_why), "cudaStreamCreate failed: %s", cudaGetErrorString(e));
        return -1;
    }
    if (tr_cuda_linear_init(init_why, sizeof(init_why))) return -1;
    FILL(bf16_table, bf, "cuda-bf16", TR_DTYPE_BF16);
    FILL(f32_table, f32, "cuda-fp32", TR_DTYPE_F32);
    bf16_table.device_memory = f32_table.device_memory = 1;
    bf16_table.attention_workspace = bf_attention_workspace;
    return 0;
}

extern "C" void *tr_backend_cuda_stream(void) {
    return init_state == 1 ? (void *)tr_cuda_stream : NULL;
}

extern "C" const tr_backend *tr_backend_cuda(tr_dtype dtype, char *why, size_t whylen) {
    if (init_state == 0) init_state = init() ? -1 : 1;
    if (init_state < 0) {
        if (why && whylen) snprintf(why, whylen, "%s", init_why);
        return NULL;
    }
    return dtype == TR_DTYPE_BF16 ? &bf16_table : &f32_table;
}

/* Dense peak rates by device name (datasheets): bf16 tensor cores with fp32 accumulation,
 * and plain fp32 (the fp32 backend uses no TF32). First match wins, so specific names first. */
static const struct {
    const char *name;
    double bf16, fp32;
} peaks[] = {
    {"GH200", 989e12, 67e12},    {"H200", 989e12, 67e12},      {"H100 PCIe", 756e12, 51e12},
    {"H100 NVL", 835e12, 60e12}, {"H100", 989e12, 67e12},      {"H800", 989e12, 67e12},
    {"A100", 312e12, 19.5e12},   {"A800", 312e12, 19.5e12},    {"L40S", 362e12, 91.6e12},
    {"L4", 121e12, 30.3e12},     {"A10G", 70e12, 31.2e12},     {"RTX 4090", 165e12, 82.6e12},
    {"RTX 3090", 71e12, 35.6e12}, {"RTX 6000 Ada", 364e12, 91.1e12},
};

extern "C" double tr_backend_cuda_peak(tr_dtype dtype, char *name, size_t namelen) {
    int dev = 0;
    cudaDeviceProp p;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&p, dev) != cudaSuccess) {
        (void)cudaGetLastError();
        if (name && namelen) snprintf(name, namelen, "none");
        return 0;
    }
    if (name && namelen) snprintf(name, namelen, "%s", p.name);
    for (size_t i = 0; i < sizeof(peaks) / sizeof(peaks[0]); i++)
        if (strstr(p.name, peaks[i].name))
            return dtype == TR_DTYPE_BF16 ? peaks[i].bf16 : peaks[i].fp32;
    return 0;
}

/* CUDA's versions are 1000 * major + 10 * minor; cuBLASLt's 10000 * major + 100 * minor + patch. */
extern "C" int tr_backend_cuda_versions(tr_cuda_versions *v) {
    memset(v, 0, sizeof(*v));
    int drv = 0, rt = 0;
    if (cudaDriverGetVersion(&drv) == cudaSuccess && drv > 0)
        snprintf(v->driver, sizeof(v->driver), "%d.%d", drv / 1000, drv % 1000 / 10);
    if (cudaRuntimeGetVersion(&rt) == cudaSuccess)
        snprintf(v->runtime, sizeof(v->runtime), "%d.%d", rt / 1000, rt % 1000 / 10);
    size_t lt = cublasLtGetVersion();
    snprintf(v->cublaslt, sizeof(v->cublaslt), "%zu.%zu.%zu", lt / 10000, lt % 10000 / 100,
             lt % 100);
    return 0;
}

/* ---- NVML, loaded at run time --------------------------------------------------------------
 * The few entry points the ledger samples, declared here from NVML's documented C API (the
 * toolkit ships no nvml.h): every call returns 0 (NVML_SUCCESS) on success; a device is an
 * opaque handle; power is in milliwatts, clocks in MHz, temperatures in degrees C. */
typedef struct nvml_device *nvml_dev;
static struct {
    int tried, ok;
    nvml_dev dev;
    int (*power)(nvml_dev, unsigned *);                /* nvmlDeviceGetPowerUsage */
    int (*clock)(nvml_dev, int, unsigned *);           /* nvmlDeviceGetClockInfo */
    int (*temp)(nvml_dev, int, unsigned *);            /* nvmlDeviceGetTemperature */
} g_nvml;
enum { NVML_CLOCK_SM = 1, NVML_TEMPERATURE_GPU = 0 };

/* NVML's handle of this process's CUDA device, found by its PCI bus id (NVML numbers devices
 * without CUDA_VISIBLE_DEVICES). 0 when every entry point and the device are there. */
static int nvml_open(void) {
    void *h = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) return -1;
    int (*init_v2)(void) = (int (*)(void))dlsym(h, "nvmlInit_v2");
    int (*by_bus)(const char *, nvml_dev *) =
        (int (*)(const char *, nvml_dev *))dlsym(h, "nvmlDeviceGetHandleByPciBusId_v2");
    g_nvml.power = (int (*)(nvml_dev, unsigned *))dlsym(h, "nvmlDeviceGetPowerUsage");
    g_nvml.clock = (int (*)(nvml_dev, int, unsigned *))dlsym(h, "nvmlDeviceGetClockInfo");
    g_nvml.temp = (int (*)(nvml_dev, int, unsigned *))dlsym(h, "nvmlDeviceGetTemperature");
    char bus[64];
    int dev = 0;
    if (!init_v2 || !by_bus || !g_nvml.power || !g_nvml.clock || !g_nvml.temp || init_v2() != 0 ||
        cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetPCIBusId(bus, (int)sizeof(bus), dev) != cudaSuccess ||
        by_bus(bus, &g_nvml.dev) != 0)
        return -1; /* the library stays loaded: NVML may hold threads */
    return 0;
}

extern "C" int tr_backend_cuda_telemetry(tr_gpu_telemetry *t) {
    t->power_w = t->sm_mhz = t->temp_c = NAN;
    if (!g_nvml.tried) g_nvml.tried = 1, g_nvml.ok = nvml_open() == 0;
    if (!g_nvml.ok) return -1;
    unsigned mw = 0, mhz = 0, c = 0;
    if (g_nvml.power(g_nvml.dev, &mw) == 0) t->power_w = mw / 1000.0;
    if (g_nvml.clock(g_nvml.dev, NVML_CLOCK_SM, &mhz) == 0) t->sm_mhz = mhz;
    if (g_nvml.temp(g_nvml.dev, NVML_TEMPERATURE_GPU, &c) == 0) t->temp_c = c;
    return 0;
}
