/* The table of operations every backend implements (model/cpu/ today, model/cuda/ next).
 * Layers call only this table, never a backend directly. All tensors are row-major; pointers
 * name memory of the backend that owns the table (host memory for the CPU backend).
 *
 * Conventions, shared by every backend and checked by tests/test_kernels.c:
 *  - N = B*T rows (tokens); C = model width; hd = head size; H query heads, KV key/value heads.
 *  - A linear layer's weight is (OC, IC), PyTorch's layout: out = inp @ w^T + bias.
 *  - Gradients of parameters ACCUMULATE (+=) so micro-batches add up; gradients of activations
 *    (dinp, dqkv, ...) are OVERWRITTEN.
 *  - qkv rows are [q (H*hd) | k (KV*hd) | v (KV*hd)]; query head h reads kv head h / (H/KV).
 *  - Tensors are in the backend's storage dtype (`tr_buf`: fp32 on the CPU, bf16 or fp32 on
 *    CUDA) except those typed float, which are always fp32: norm statistics, attention's
 *    log-sum-exp, per-token losses, master weights and AdamW state. Sums accumulate in fp32. */
#ifndef TR_BACKEND_H
#define TR_BACKEND_H

#include <stddef.h>

typedef enum { TR_DTYPE_F32 = 0, TR_DTYPE_BF16 } tr_dtype;

/* An element of the backend's storage dtype. It is void on purpose: the element size depends
 * on the backend, so addresses are computed in bytes (tr_buf_at), never with `p + i`
 * (-Wpointer-arith makes that an error). */
typedef void tr_buf;

/* One stretch of parameters for adamw_multi: n elements of the master weights, their working
 * copy (== master when the storage is fp32), gradient and moments; wd its weight decay. */
typedef struct {
    float *master;
    tr_buf *param;
    const tr_buf *grad;
    float *m, *v;
    size_t n;
    float wd;
} tr_adamw_seg;

/* The CUDA backend's vocabulary padding (its pad_vocab): the planner plans a GPU cluster it
 * does not run on with it, so it is known without a GPU or a CUDA build. */
#define TR_CUDA_PAD_VOCAB 128

/* A device backend's workspaces (the CUDA backend's; a CPU needs none), in bytes, sized by
 * one function from the model's shapes (tr_workspace_of, model/workspace.c): the plan's memory
 * estimate adds them up (tr_memory.workspace) and the backend allocates them once, at the
 * model's start (tr_backend.reserve), so that the two agree byte for byte. */
enum {
    TR_WS_CUBLASLT,     /* cuBLASLt's workspace: TR_WS_CUBLASLT_BYTES */
    TR_WS_REDUCE,       /* column sums (bias, norm weight gradients): 2 x row chunks x width */
    TR_WS_EMBED,        /* the embedding backward's token permutation: 3N + 1 ints */
    TR_WS_ROPE,         /* rotary position table: T x head_dim / 2 float pairs */
    TR_WS_ATTN,         /* attention backward's row terms: N x heads floats */
    TR_WS_SUMSQ,        /* the gradient norm's partial sums */
    TR_WS_ADAMW_SEGS,   /* adamw_multi's table of stretches */
    TR_WS_ADAMW_BLOCKS, /* and of its blocks */
    TR_WS_EMPTY,        /* the one block every empty buffer points at: TR_WS_EMPTY_BYTES */
    TR_WS_CUDNN,        /* cuDNN's attention (TR_CUDA_ATTENTION=cudnn or auto, bf16): what
                           the backend's attention_workspace says for the model's largest
                           shape; 0 without a device to ask (a plan of another cluster) */
    TR_WS_COUNT
};
typedef struct {
    size_t bytes[TR_WS_COUNT];
} tr_workspace;
/* The constants the CUDA kernels and this sizing share (model/cuda/ uses these names). */
#define TR_WS_CUBLASLT_BYTES ((size_t)32 << 20) /* what cuBLASLt asks for on Hopper */
#define TR_WS_COLSUM_ROWS 256                   /* rows per partial column sum */
#define TR_WS_SUMSQ_BLOCKS 1024                 /* blocks of the sum of squares */
#define TR_WS_ADAMW_CHUNK ((size_t)256 * 8 * 4) /* elements per adamw_multi block */
#define TR_WS_ADAMW_SEG_BYTES 64                /* one stretch in the device table, at most */
#define TR_WS_ADAMW_BLOCK_BYTES 8               /* one block */
#define TR_WS_EMPTY_BYTES 256                   /* cudaMalloc's alignment */
size_t tr_workspace_bytes(const tr_workspace *w);

typedef struct tr_backend {
    const char *name;
    tr_dtype dtype; /* storage dtype of every tr_buf */
    /* 1 when its buffers are device memory (collectives on them take TR_COMM_DEVICE) */
    int device_memory;
    /* the model pads the vocabulary dimension of the LM head's products to a multiple of this
     * (1: no padding): aligned rows for the GPU's matrix kernels */
    int pad_vocab;

    /* memory */
    void *(*alloc)(size_t bytes); /* zeroed, 64-byte aligned; NULL on failure */
    void (*free)(void *p);
    void (*upload)(void *dst, const void *src, size_t bytes);   /* host -> backend */
    void (*download)(void *dst, const void *src, size_t bytes); /* backend -> host */
    void (*zero)(void *p, size_t bytes);
    /* backend -> backend (the ranges do not overlap), ordered like the ops: data parallelism
     * moves its gradient and parameter buckets with it */
    void (*copy)(void *dst, const void *src, size_t bytes);
    /* host fp32 <-> storage dtype, n elements (a plain copy when the dtype is fp32) */
    void (*to_storage)(tr_buf *dst, const float *src_host, size_t n);
    void (*from_storage)(float *dst_host, const tr_buf *src, size_t n);

    /* out(N,OC) = inp(N,IC) @ w(OC,IC)^T + bias(OC); bias may be NULL */
    void (*linear_forward)(tr_buf *out, const tr_buf *inp, const tr_buf *w, const tr_buf *bias, int N,
                           int IC, int OC);
    /* dinp(N,IC) = dout(N,OC) @ w (skipped when dinp is NULL); dw(OC,IC) += dout^T @ inp
     * (skipped when dw is NULL: tensor parallelism computes dinp first and reduces it while
     * the weight gradient is computed); dbias(OC) += column sums of dout (skipped when dbias
     * is NULL) */
    void (*linear_backward)(tr_buf *dinp, tr_buf *dw, tr_buf *dbias, const tr_buf *dout,
                            const tr_buf *inp, const tr_buf *w, int N, int IC, int OC);

    /* out(N,C) = wte[tokens[n]]; a token < 0 (another rank's part of a vocabulary split by
     * tensor parallelism) gives a row of zeros, and its backward adds nothing */
    void (*embedding_forward)(tr_buf *out, const int *tokens, const tr_buf *wte, int N, int C);
    /* dwte[tokens[n]] += dout[n]; deterministic (no ordering-dependent sums) */
    void (*embedding_backward)(tr_buf *dwte, const tr_buf *dout, const int *tokens, int N, int C);
    /* x(B,T,C) += wpe[t] (in place) */
    void (*positions_forward)(tr_buf *x, const tr_buf *wpe, int B, int T, int C);
    /* dwpe[t] += sum_b dx[b,t] */
    void (*positions_backward)(tr_buf *dwpe, const tr_buf *dx, int B, int T, int C);

    /* LayerNorm over the last dim: out = (inp - mean) * rstd * w + b; b may be NULL.
     * mean, rstd (N) are saved for the backward. */
    void (*layernorm_forward)(tr_buf *out, float *mean, float *rstd, const tr_buf *inp,
                              const tr_buf *w, const tr_buf *b, int N, int C, float eps);
    void (*layernorm_backward)(tr_buf *dinp, tr_buf *dw, tr_buf *db, const tr_buf *dout,
                               const tr_buf *inp, const tr_buf *w, const float *mean,
                               const float *rstd, int N, int C);
    /* RMSNorm: out = inp * rstd * w, rstd = 1/sqrt(mean(inp^2) + eps) */
    void (*rmsnorm_forward)(tr_buf *out, float *rstd, const tr_buf *inp, const tr_buf *w, int N,
                            int C, float eps);
    void (*rmsnorm_backward)(tr_buf *dinp, tr_buf *dw, const tr_buf *dout, const tr_buf *inp,
                             const tr_buf *w, const float *rstd, int N, int C);

    /* Rotary embedding in place on the q and k parts of qkv (B,T,(H+2KV)*hd), the
     * "rotate half" convention: pairs (i, i + hd/2), angle t * theta^(-2i/hd). The backward
     * rotates the gradient back (in place on dqkv). */
    void (*rope_forward)(tr_buf *qkv, int B, int T, int H, int KV, int hd, float theta);
    void (*rope_backward)(tr_buf *dqkv, int B, int T, int H, int KV, int hd, float theta);

    /* Causal attention, scale 1/sqrt(hd). out (B,T,H*hd); lse (B,H,T) the log-sum-exp of each
     * query's scaled scores, saved for the backward. Never holds more than a tile of the T*T
     * scores per thread. */
    void (*attention_forward)(tr_buf *out, float *lse, const tr_buf *qkv, int B, int T, int H,
                              int KV, int hd);
    /* dqkv (B,T,(H+2KV)*hd) overwritten */
    void (*attention_backward)(tr_buf *dqkv, const tr_buf *dout, const tr_buf *qkv, const tr_buf *out,
                               const float *lse, int B, int T, int H, int KV, int hd);

    /* Optional (NULL: this backend cannot decode incrementally). One new token of one
     * sequence at position `pos`: rotates its q and k by position pos when theta > 0 (in place
     * in qkv, (H+2KV)*hd), appends its k and v to the caches kc, vc (rows of KV*hd) at row pos,
     * and writes out (H*hd) = the attention of q over cache rows 0..pos. */
    void (*decode_attention)(tr_buf *out, tr_buf *qkv, tr_buf *kc, tr_buf *vc, int pos, int H,
                             int KV, int hd, float theta);

    /* GELU, tanh approximation */
    void (*gelu_forward)(tr_buf *out, const tr_buf *inp, size_t n);
    void (*gelu_backward)(tr_buf *dinp, const tr_buf *dout, const tr_buf *inp, size_t n);
    /* inp (N, 2*Hd) = [gate | up]; out (N, Hd) = silu(gate) * up */
    void (*swiglu_forward)(tr_buf *out, const tr_buf *inp, int N, int Hd);
    void (*swiglu_backward)(tr_buf *dinp, const tr_buf *dout, const tr_buf *inp, int N, int Hd);

    /* out = a + b (out may alias a or b) */
    void (*add)(tr_buf *out, const tr_buf *a, const tr_buf *b, size_t n);

    /* Softmax cross entropy over V classes, in place: logits (N rows of ld >= V, the first V
     * the classes) become dloss/dlogits * dscale (only when want_grad; columns V..ld-1 then
     * 0), losses (N) get -log p[target]. A target < 0 is ignored (loss 0, gradient 0). */
    void (*softmax_xent)(tr_buf *logits, float *losses, const int *targets, int N, int V, int ld,
                         float dscale, int want_grad);

    /* Optional (NULL: no tensor parallelism on this backend): softmax cross entropy over a
     * vocabulary split by tensor parallelism. Each rank holds the V classes [lo, lo + V) of
     * the vocabulary in columns 0..V-1 of its logits (N rows of ld >= V).
     * xent_stats: stats (N, 3) = this rank's row maximum m (-inf when V = 0), sum of
     * exp(x - m) over its classes, and x[target - lo] when the target is one of its classes
     * (else 0). The ranks all-gather their stats; then
     * xent_finish, given every rank's stats (R, N, 3), rank after rank: M = max m_r,
     * S = sum_r s_r exp(m_r - M) (in double), losses[n] = log S + M - x_target (0 for a target
     * < 0); with want_grad the logits become (exp(x - M) / S - [j == target - lo]) * dscale
     * (columns V..ld-1 and rows of ignored targets 0). */
    void (*xent_stats)(float *stats, const tr_buf *logits, const int *targets, int lo, int N,
                       int V, int ld);
    void (*xent_finish)(tr_buf *logits, float *losses, const float *all_stats, int R,
                        const int *targets, int lo, int N, int V, int ld, float dscale,
                        int want_grad);

    /* Optional fusions (NULL: the model runs the parts one by one). Each must give what its
     * parts give, element for element.
     * sum = a + b (rounded to the storage dtype), then LayerNorm (rms = 0; bias may be NULL)
     * or RMSNorm (rms = 1; mean unused) of sum into out: a residual add and the next norm. */
    void (*residual_norm_forward)(tr_buf *sum, tr_buf *out, float *mean, float *rstd,
                                  const tr_buf *a, const tr_buf *b, const tr_buf *w,
                                  const tr_buf *bias, int N, int C, float eps, int rms);
    /* pre = linear_forward(inp, w, bias); out = gelu(pre) */
    void (*linear_gelu_forward)(tr_buf *out, tr_buf *pre, const tr_buf *inp, const tr_buf *w,
                                const tr_buf *bias, int N, int IC, int OC);
    /* linear_backward, then dinp = gelu_backward(dinp, pre): the backward of a linear layer
     * whose input was gelu(pre), through that gelu */
    void (*linear_backward_gelu)(tr_buf *dinp, tr_buf *dw, tr_buf *dbias, const tr_buf *dout,
                                 const tr_buf *inp, const tr_buf *w, const tr_buf *pre, int N,
                                 int IC, int OC);

    /* sum of squares, accumulated in double */
    double (*sumsq)(const tr_buf *x, size_t n);
    void (*scale)(tr_buf *x, float s, size_t n);
    /* PyTorch AdamW on n elements of the fp32 master weights: p -= lr*wd*p; g' = g*gscale;
     * m,v updated; p -= lr * mhat / (sqrt(vhat) + eps), with mhat = m/bc1, vhat = v/bc2
     * (bc = 1 - beta^t); then the working copy `param` (storage dtype) = p. When the storage
     * dtype is fp32, param == master and there is no copy. */
    void (*adamw)(float *master, tr_buf *param, const tr_buf *g, float *m, float *v, size_t n,
                  float lr, float beta1, float beta2, float eps, float wd, float bc1, float bc2,
                  float gscale);
    /* Optional: adamw over many stretches at once (one launch on a GPU); the same results
     * as adamw on each. */
    void (*adamw_multi)(const tr_adamw_seg *s, int n, float lr, float beta1, float beta2,
                        float eps, float bc1, float bc2, float gscale);
    /* Optional (device backends): allocate the workspaces w, each slot grown to at least its
     * size; 0, or -1 when the device is out of memory. */
    int (*reserve)(const tr_workspace *w);
    /* Optional (device backends): the bytes of TR_WS_CUDNN the attention it runs needs at
     * this shape, the larger of its forward's and backward's (cuDNN's plans, built for the
     * shape: their engine's own workspace and ours beside it); 0 when it runs ours. */
    size_t (*attention_workspace)(int B, int T, int H, int KV, int hd);
} tr_backend;

/* The device backend this process trains on, named once it is chosen (trainer/util.c), so
 * that a sizing pass without a backend of its own (the plan's exact memory, model/workspace.c)
 * asks it what it alone can say: cuDNN's workspace. NULL: none (the CPU, or a plan of a
 * cluster this process does not run on). */
void tr_backend_set_sizing(const tr_backend *be);
const tr_backend *tr_backend_sizing(void);

/* Bytes of one storage element. */
size_t tr_dtype_size(tr_dtype t);

/* The address of element i of a storage-dtype buffer. */
tr_buf *tr_buf_at(const tr_backend *be, const tr_buf *base, size_t i);

/* The CPU backend (model/cpu/): fp32, OpenMP, BLAS. */
const tr_backend *tr_backend_cpu(void);

/* How the BLAS this process loaded runs its threads: "openmp" (OpenBLAS's OpenMP build: the
 * same pool as our kernels), "pthreads" (a pool of its own, which spins against ours: about
 * half speed), "sequential", or "unknown" (not OpenBLAS). When it is "pthreads", `fix` gets one
 * line naming the library file and the remedy, else "". */
const char *tr_backend_cpu_blas_threads(char *fix, size_t fixlen);

/* Called first in main: where OpenBLAS fell back to kernels older than AVX2 (what it takes
 * for a CPU model it does not know; model/cpu/blas_core.c) on a CPU with AVX2 and FMA or
 * AVX-512, and OPENBLAS_CORETYPE is not set, sets it to the kernels the CPU's features run
 * (Haswell's, SkylakeX's) and executes the program again with the same arguments; returns
 * where nothing is to change, or the exec failed (then on the kernels OpenBLAS chose). Set
 * OPENBLAS_CORETYPE to keep a choice of one's own. */
void tr_backend_cpu_blas_core(char **argv);

/* The threads one rank's CPU kernels run on (OpenMP's team size: OMP_NUM_THREADS, else the
 * cores this process may use, until tr_backend_cpu_set_threads). */
int tr_backend_cpu_threads(void);

/* Run the CPU kernels and the BLAS on n threads from now on (n >= 1). */
void tr_backend_cpu_set_threads(int n);

/* The CUDA backend (model/cuda/) on the current GPU with storage dtype `dtype`, or NULL with
 * the reason in `why` (this build has no CUDA, no GPU is present, ...): it starts with
 * TR_NO_GPU_FOUND when the machine has none (no driver, or the driver sees no device), and
 * gives the driver's error for a GPU that is there but cannot be used. Not thread-safe: one
 * GPU per process. */
#define TR_NO_GPU_FOUND "no GPU found"
const tr_backend *tr_backend_cuda(tr_dtype dtype, char *why, size_t whylen);

/* The backends' settings from the environment, read and checked once, at start, by
 * tr_backend_env (the trainer calls it before it chooses a backend, whichever it chooses):
 * TR_CUDA_ATTENTION=tc|simple|cudnn|auto, the CUDA backend's attention (ours: tensor-core
 * kernels where they apply, the default; or the CUDA-core ones always; cuDNN's fused attention
 * for bf16, model/cuda/cuda_attention_cudnn.cu; or auto: both timed on the run's shapes at the
 * first step, the faster kept, their outputs compared). 0, or -1 with one line in err.
 * tr_backend_set_attention / tr_backend_set_simple_attention make the same choice from a program
 * (the kernel tests switch with them); tr_backend_attention / _simple_attention read it. */
typedef enum {
    TR_ATTENTION_TC,
    TR_ATTENTION_SIMPLE,
    TR_ATTENTION_CUDNN,
    TR_ATTENTION_AUTO
} tr_attention_impl;
int tr_backend_env(char *err, size_t errlen);
void tr_backend_set_simple_attention(int on);
int tr_backend_simple_attention(void);
void tr_backend_set_attention(tr_attention_impl a);
tr_attention_impl tr_backend_attention(void);

/* The CUDA backend's stream (a cudaStream_t) once it is initialised, else NULL: what device
 * collectives order themselves against (tr_comm_device_init). */
void *tr_backend_cuda_stream(void);

/* The device memory the CUDA backend holds now and at most (bytes; 0 without CUDA). After
 * training step `step` (1, 2, ...; 0: training is over) no more may be allocated until
 * step_done(0): on the CUDA emulator a cudaMalloc then fails the run (tests/cudaemu). */
void tr_backend_cuda_memory(size_t *now, size_t *peak);
void tr_backend_cuda_step_done(int step);
/* What the device has in use, every process's and the runtime's own (CUDA context, cuBLASLt,
 * cuDNN, NCCL's buffers) beside the backend's, and its size (cudaMemGetInfo): 0, or -1
 * without CUDA. */
int tr_backend_cuda_device_use(size_t *used, size_t *total);

/* The current GPU's name and its peak dense rate in FLOP/s for `dtype` from a table of known
 * devices (H100/H200 SXM bf16: 989e12, A100: 312e12, ...); 0 when the device is unknown. */
double tr_backend_cuda_peak(tr_dtype dtype, char *name, size_t namelen);

/* The CUDA driver and the libraries this process runs with, for provenance
 * (trainer/report/provenance.h): "13.0", cuBLASLt "13.0.2". 0, or -1 with every field "" when this
 * build has no CUDA (or, for the driver, when none answers). */
typedef struct {
    char driver[32], runtime[32], cublaslt[32];
} tr_cuda_versions;
int tr_backend_cuda_versions(tr_cuda_versions *v);

/* The current GPU's power draw (W), SM clock (MHz) and temperature (C), from NVML, which is
 * loaded at run time (libnvidia-ml.so.1 comes with the driver; the build does not link it). 0,
 * or -1 when this build has no CUDA, there is no NVML or the device does not answer (the
 * fields are then NAN). Each call costs three NVML queries. */
typedef struct {
    double power_w, sm_mhz, temp_c;
} tr_gpu_telemetry;
int tr_backend_cuda_telemetry(tr_gpu_telemetry *t);

#endif
