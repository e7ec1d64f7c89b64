/* The model: a recipe's layer tree flattened into a program of layer ops that run on one
 * backend. Parameters live in one slab, activations in one arena sized before the first step
 * (by a measuring pass over the program), so peak memory is known up front. Also the cost of
 * every layer (FLOPs and bytes), shared by `trainer show`, the MFU figure and the planner. */
#ifndef TR_MODEL_H
#define TR_MODEL_H

#include <stddef.h>

#include "dsl/recipe.h"
#include "model/backend.h"
#include "parallel/comm/comm.h"

/* ---- cost model (model/cost.c): pure functions of the description ---------------------- */

/* Costs of one node (and everything under it), per token at sequence length T.
 * FLOP convention: 2 per multiply-add of every matrix product (linear layers, the LM head and
 * attention's two products); attention counts only the causal half (position t attends to
 * t+1 keys, averaged over t). Norms and element-wise ops are not counted. Training FLOPs are
 * 3x forward (backward = 2x forward). */
typedef struct {
    double params;        /* parameters owned (a tied head owns none) */
    double matrix_params; /* of which in tensors of 2+ dims (those get weight decay) */
    double param_bytes;   /* bytes of parameters, gradients and AdamW state (m, v) in fp32 */
    double grad_bytes;
    double optim_bytes;
    double fwd_flops;     /* forward FLOPs per token */
    double act_bytes;     /* bytes of activations kept for the backward, per token */
    /* for the planner's memory estimate (parallel/plan_cost.c): */
    double act_split_bytes; /* of act_bytes, what tensor parallelism splits (inside attention
                               and the MLP; the rest is the residual stream's) */
    double act_sel_bytes;   /* of act_bytes, what selective recompute drops (the MLP's
                               activation) */
    double residuals;       /* residual branches (full recompute keeps one stream each) */
    double matrix_ops;      /* matrix products in the forward (kernels: a fixed cost each) */
} tr_cost;

void tr_cost_node(const tr_model_desc *d, const tr_node *n, int T, tr_cost *out);
void tr_cost_model(const tr_model_desc *d, int T, tr_cost *out);

/* The model's blocks: the units pipeline parallelism splits into stages. One block per
 * repetition of every stack at the top of the model (the transformer blocks); the layers
 * before the first of them (embedding, positions) belong to block 0, any other top-level layer
 * to the block before it (the final norm and the head to the last). Fills the cost of each
 * block into out (up to max of them; out may be NULL) and returns how many there are: 1 when
 * the model has no top-level stack. model.c cuts its program at the same places. */
int tr_cost_blocks(const tr_model_desc *d, int T, tr_cost *out, int max);

/* Training FLOPs per token (3x forward), the figure MFU divides by. */
double tr_cost_train_flops_per_token(const tr_model_desc *d, int T);

/* ---- the model ------------------------------------------------------------------------- */

typedef struct tr_model tr_model;

#define TR_PARAM_NAME_MAX 128
#define TR_MAX_CHUNKS 256 /* pipeline chunks: pp x virtual stages */

/* Tensor parallelism: where rows of a process's tensor lie in the global (single-process)
 * tensor. Local rows [row, row + rows) are global rows [grow, grow + rows), at the tensor's
 * global columns [col, col + shape[1]). A segment is this rank's alone (copies 1), or held
 * identically by `copies` ranks of the tp group, of which this rank is copy `copy` (copy 0
 * writes it into checkpoints). `partial`: each copy computes only a part of the segment's
 * gradient (sequence-parallel norms, key/value heads shared by several ranks), which is
 * summed over the copies (tr_model_grad_group) before the optimizer step. */
typedef struct {
    int row, rows;
    int grow;
    int copies, copy;
    int partial;
} tr_param_seg;

#define TR_MAX_SEGS 3

typedef struct {
    char name[TR_PARAM_NAME_MAX]; /* e.g. "stack.0.residual0.attention.qkv.weight" */
    int ndim;
    int shape[2];  /* this process's tensor (shape[1] = 1 for vectors) */
    size_t offset; /* in elements, into the parameter (and gradient, master, m, v) slabs */
    size_t numel;
    size_t extent; /* elements the slab reserves from offset: numel, or more for a vocabulary
                      matrix whose rows are padded (pad_vocab; the padding rows stay 0) */
    int decay;     /* weight decay applies (matrices only) */
    float init_std; /* 0 with init_one = 1: ones; 0: zeros */
    int init_one;
    /* tensor parallelism (without it: gshape == shape, one segment, the identity) */
    int gshape[2]; /* the global tensor's shape */
    int col;       /* global column of local column 0 */
    int n_seg;     /* segments, in local row order, covering the local rows */
    tr_param_seg seg[TR_MAX_SEGS];
    /* pipeline parallelism: a tied embedding lives on the first stage (the embedding) and the
     * last (the head); each computes part of its gradient, summed over the pair
     * (tr_model_grad_group) so that both copies take the same step. The last stage's is
     * pp_copy 1: not written into checkpoints, not counted twice in the gradient norm. */
    int pp_tied, pp_copy;
} tr_param;

/* A run of elements contiguous in both the local and the global (flattened) tensor. */
typedef struct {
    size_t local, global, n;
    int seg; /* the segment it lies in */
} tr_run;

/* Local elements [lo, hi) of p as runs, in local order: fills up to max of them into out and
 * returns how many there are (call again with room for more when that exceeds max). */
int tr_param_runs(const tr_param *p, size_t lo, size_t hi, tr_run *out, int max);
/* The global flat index of local element i. */
size_t tr_param_global_index(const tr_param *p, size_t i);

typedef struct {
    size_t params, grads, optimizer, activations, scratch; /* bytes */
    /* a device backend's workspaces besides (tr_workspace_of): held on a GPU only, so not in
       the CPU's figures */
    size_t workspace;
    /* ZeRO-2 and 3's bucket buffers, sized and allocated at the start by the data-parallel
       layer (parallel/dp.c); 0 for a model alone */
    size_t buffers;
} tr_memory;

/* Activation recomputation: trade FLOPs for activation memory.
 *  NONE      keep every activation the backward needs;
 *  SELECTIVE recompute each MLP's activation (GELU/SwiGLU output, the widest tensor) from its
 *            pre-activation during the backward: one shared buffer instead of one per layer;
 *  FULL      keep only the residual stream between top-level residual branches; each branch's
 *            forward runs again just before its backward (about one more forward in all). */
typedef enum { TR_RECOMPUTE_NONE = 0, TR_RECOMPUTE_SELECTIVE, TR_RECOMPUTE_FULL } tr_recompute;

typedef struct {
    int B, T; /* the largest micro-batch: B sequences of T tokens */
    tr_recompute recompute;
    /* ZeRO-1: this process keeps the AdamW state of, and updates, only shard `shard` of
     * `shards` equal ranges of the (padded) parameter slab; shards <= 1: all of it. */
    int shards, shard;
    /* ZeRO-2: no gradient slab. Before any gradient of tensor i is written, the pre-gradient
     * hook places it (tr_model_set_grad_addr); the optimizer state is sized by the caller
     * (tr_model_alloc_optim) and the update runs over pieces (tr_model_adamw_pieces). */
    int external_grads;
    /* ZeRO-3 (implies external_grads): no parameter slab either. The process keeps pieces of
     * it (tr_model_set_pieces; their master weights and working copy are sized with the
     * optimizer state by tr_model_alloc_optim) and the op hook places each op's parameters
     * (tr_model_set_param_addr) before the op reads them. */
    int external_params;
    /* pad the vocabulary dimension of the LM head's products to a multiple of this (0: the
     * backend's pad_vocab). Padding rows of the embedding / head matrix are zero and get zero
     * gradients; losses, logits and checkpoints are those of the V real classes. */
    int pad_vocab;
    /* Tensor parallelism (Megatron-style) over a group of tp processes, of which this is
     * tp_rank: attention heads and key/value heads (or, when tp does not divide kv_heads, the
     * one key/value head a rank's query heads read, shared by tp / kv_heads ranks), the MLP's
     * hidden units and the (padded) vocabulary are split; norms, positions and the biases
     * of row-parallel products are replicated. The layers all-reduce (or, with
     * sequence_parallel, all-gather and reduce-scatter over rows of the B*T tokens) over
     * tp_comm, which must be given when tp > 1 except to tr_model_measure. tp 0 means 1. */
    int tp, tp_rank;
    int sequence_parallel;
    tr_comm *tp_comm;
    /* Pipeline parallelism: the program cut into n_chunks chunks at block boundaries
     * (tr_cost_blocks): chunk c = blocks [chunk_start[c], chunk_start[c + 1]). This process
     * holds the chunks with held[c]: their parameters, and activations for slots[c]
     * micro-batches in flight (at least 1). split_backward (zb-h1): the backward runs in two
     * parts, the input gradient then later the weight gradient, and keeps what the second
     * needs. n_chunks 0: one chunk, the whole model, one slot. */
    int n_chunks;
    int chunk_start[TR_MAX_CHUNKS + 1];
    unsigned char held[TR_MAX_CHUNKS];
    int slots[TR_MAX_CHUNKS];
    /* Gradient buffers of a held chunk between stages (0: slots[c], one per slot): grad_recv
     * for its output's gradient (received), grad_send for its input's (sent). Where chunk c
     * and chunk c + 1 are both held (zb-v's turn), chunk c + 1's send buffers are chunk c's
     * receive buffers (grad_send[c + 1] = grad_recv[c]): nothing goes between them. */
    int grad_recv[TR_MAX_CHUNKS], grad_send[TR_MAX_CHUNKS];
    int split_backward;
    /* pp_comm: the pipeline ranks of this process's dp and tp coordinates (the gradient norm
     * sums over them); tie_comm: the first and last of them, when the head is tied to the
     * embedding (NULL otherwise). Both may be NULL for tr_model_measure. */
    tr_comm *pp_comm, *tie_comm;
} tr_model_opts;

/* Build a model for micro-batches of at most B sequences of at most T tokens (T <= seq_len).
 * Allocates everything on `be`; returns -1 with a message on failure. */
int tr_model_init(tr_model **out, const tr_model_desc *desc, const tr_backend *be, int B, int T,
                  char *err, size_t errlen);
int tr_model_init_opts(tr_model **out, const tr_model_desc *desc, const tr_backend *be,
                       const tr_model_opts *opts, char *err, size_t errlen);
void tr_model_free(tr_model *m);

/* Bytes the model would allocate with storage dtype `dtype`, without allocating (the
 * measuring pass). */
int tr_model_measure(const tr_model_desc *desc, tr_dtype dtype, const tr_model_opts *opts,
                     tr_memory *mem, char *err, size_t errlen);
/* The same pass, keeping the result: a model with its parameter tensors, slab and memory
 * figures but no backend memory, for planning (tr_model_num_params, tr_model_param,
 * tr_model_slab_elements, tr_model_memory, tr_model_alloc_optim and tr_model_free only). */
int tr_model_plan(tr_model **out, const tr_model_desc *desc, tr_dtype dtype,
                  const tr_model_opts *opts, char *err, size_t errlen);
tr_memory tr_model_memory(const tr_model *m);
/* The device workspaces the model's kernels need (model/workspace.c): what a device backend
 * reserves at the model's start and tr_memory.workspace adds up. */
void tr_workspace_of(const tr_model *m, tr_workspace *w);

int tr_model_num_params(const tr_model *m); /* parameter tensors */
const tr_param *tr_model_param(const tr_model *m, int i);
size_t tr_model_num_elements(const tr_model *m); /* total parameter count */

/* Parameter tensor i to / from host fp32 (host holds tr_model_param(m, i)->numel floats).
 * Setting writes the fp32 master weights and the storage-dtype working copy. With
 * external_params both touch only the parts of the tensor inside this process's pieces. */
void tr_model_get_param(const tr_model *m, int i, float *host);
void tr_model_set_param(tr_model *m, int i, const float *host);
void tr_model_get_grad(const tr_model *m, int i, float *host);
/* This process's part of tensor i, from the whole global tensor (host fp32, gshape[0] *
 * gshape[1] floats): what a checkpoint or a Hugging Face model holds. */
void tr_model_set_param_global(tr_model *m, int i, const float *global);

/* The optimizer state, for checkpoints: AdamW's first and second moments of tensor i, and the
 * number of steps taken (the bias corrections depend on it). */
typedef enum { TR_STATE_ADAM_M = 0, TR_STATE_ADAM_V } tr_state_kind;
void tr_model_get_state(const tr_model *m, int i, tr_state_kind k, float *host);
/* get_state needs the tensor inside this process's optimizer shard (no sharding: always);
 * set_state keeps whatever part of the tensor falls inside the shard or the pieces. */
void tr_model_set_state(tr_model *m, int i, tr_state_kind k, const float *host);
/* The parts of tensor i this process keeps, of the parameters (k < 0) or of AdamW moment k:
 * up to max element ranges [lo[j], hi[j]) of the flattened tensor; returns how many (more
 * than max: call again with room for them). The whole tensor without sharding. */
int tr_model_held_parts(const tr_model *m, int i, int k, size_t *lo, size_t *hi, int max);
/* Slab elements [lo, hi) of the fp32 parameters (k < 0) or of AdamW moment k into host
 * memory, from what this process keeps: the whole slab, its optimizer shard (ZeRO-1) or its
 * pieces (ZeRO-2, 3: the range must lie inside one piece). Checkpoints: every rank writes the
 * ranges it keeps. Returns -1 when this process does not keep that range. */
int tr_model_read_range(const tr_model *m, int k, size_t lo, size_t hi, float *host);
/* The optimizer shard's AdamW moments (backend memory, tr_model_optim_range elements). */
float *tr_model_optim_state(tr_model *m, tr_state_kind k);
long tr_model_adam_steps(const tr_model *m);
void tr_model_set_adam_steps(tr_model *m, long t);

/* Deterministic initialisation: element i of a tensor depends only on (seed, name, i), so
 * any process holding any slice of a tensor initialises it the same way. GPT-2's scheme:
 * N(0, 0.02), residual output projections N(0, 0.02/sqrt(2*attention layers)), norms 1,
 * biases 0. */
void tr_model_init_params(tr_model *m, unsigned long long seed);

/* Forward over tokens (B, T) (host ids; B, T within the sizes given at init). With targets,
 * returns the mean cross entropy; with grad_scale > 0 it also seeds the backward with
 * d(loss)/d(logits) * grad_scale (use 1/accumulation_steps), computed chunk by chunk so the
 * (B, T, V) logits never exist at once. Without targets returns 0. */
float tr_model_forward(tr_model *m, const int *tokens, const int *targets, int B, int T,
                       float grad_scale);

/* Backward of the last forward (which had grad_scale > 0): accumulates into the gradients. */
void tr_model_backward(tr_model *m);

void tr_model_zero_grad(tr_model *m);
/* Bytes of one element of the storage dtype (planned models too). */
size_t tr_model_storage_bytes(const tr_model *m);
/* How collectives address the model's buffers: where they live, and their element type. */
tr_comm_mem tr_model_comm_mem(const tr_model *m);
tr_comm_dtype tr_model_comm_dtype(const tr_model *m);
double tr_model_grad_norm(tr_model *m);

/* Logits (B, V) of the last position of each sequence, into host memory. */
void tr_model_last_logits(tr_model *m, const int *tokens, int B, int T, float *logits);

/* Logits (B, T, V) of every position, into host memory (tests and tools; memory B*T*V). */
void tr_model_all_logits(tr_model *m, const int *tokens, int B, int T, float *logits);

/* Incremental decoding (sampling): a KV cache per attention layer, for one sequence of up to
 * seq_len tokens. Feed tokens at positions 0, 1, 2, ...; each call costs one token's forward,
 * the prefix is never recomputed. Needs a backend with decode_attention. */
typedef struct tr_kv_cache tr_kv_cache;
int tr_kv_cache_init(tr_kv_cache **out, tr_model *m, char *err, size_t errlen);
void tr_kv_cache_free(tr_kv_cache *c);
/* Feed `token` at position `pos` (< seq_len); logits (V) of the next token into host memory. */
void tr_model_decode(tr_model *m, tr_kv_cache *c, int token, int pos, float *logits);

typedef struct {
    float lr, beta1, beta2, eps, weight_decay;
    float grad_scale; /* multiplies every gradient first (gradient clipping) */
} tr_adamw;

/* One AdamW step over every parameter of this process's optimizer shard (all of them without
 * sharding); weight decay on matrices only. */
void tr_model_adamw_step(tr_model *m, const tr_adamw *opt);

/* ---- for the parallel runtime (parallel/) ------------------------------------------------
 * The parameter and gradient slabs hold every tensor back to back (tr_param.offset), padded
 * to tr_model_slab_elements, a multiple of the shard count, so they split into equal shards. */
size_t tr_model_slab_elements(const tr_model *m);
tr_buf *tr_model_param_slab(tr_model *m);
tr_buf *tr_model_grad_slab(tr_model *m);
/* The element range [lo, hi) of the slab whose optimizer state this process holds. */
void tr_model_optim_range(const tr_model *m, size_t *lo, size_t *hi);
/* Called during tr_model_backward as soon as parameter tensor i's gradient is final for this
 * backward (no later op adds to it), so its reduction can start while the backward goes on.
 * Tensors become ready in decreasing index order, except a tied embedding, ready last. */
typedef void (*tr_grad_hook)(void *ctx, int param);
void tr_model_set_grad_hook(tr_model *m, tr_grad_hook fn, void *ctx);
/* Which backward action makes tensor i's gradient final: 2 x the chunk of the op that does,
 * + 1 when that comes in a split backward's weight part. Tensors of one phase complete in the
 * same action of a pipeline's schedule; those of different phases, in actions between which
 * other micro-batches' may run (parallel/dp.c cuts its buckets along them). */
int tr_model_grad_phase(const tr_model *m, int i);
/* external_grads: called before the first gradient write of tensor i in a forward (the head)
 * or backward, to place its gradient (tr_model_set_grad_addr; zeroed by the caller). */
void tr_model_set_pre_grad_hook(tr_model *m, tr_grad_hook fn, void *ctx);
void tr_model_set_grad_addr(tr_model *m, int i, tr_buf *addr);
/* Called after the head's forward has added its part of a tied embedding's gradient (tensor
 * i): that part can be reduced now, before the embedding's backward writes the rest (placed
 * anew by the pre-gradient hook), instead of holding the gradient through the backward. */
void tr_model_set_partial_hook(tr_model *m, tr_grad_hook fn, void *ctx);

/* external_grads: AdamW over pieces of the slab [lo, hi), each with its gradient (storage
 * dtype, element lo first) and its offset into the optimizer state. */
typedef struct {
    size_t lo, hi;
    const tr_buf *grad;
    size_t state;
} tr_piece;
void tr_model_adamw_pieces(tr_model *m, const tr_adamw *opt, const tr_piece *p, int n);
/* (Re)allocate the optimizer state as `elems` zeroed elements (external_grads; with
 * external_params also the pieces' master weights and working copy); -1 when out of memory.
 * On a planned model (tr_model_plan) it records the sizes for tr_model_memory. */
int tr_model_alloc_optim(tr_model *m, size_t elems);

/* ---- ZeRO-3 (external_params) ----
 * The pieces of the slab this process keeps: piece k covers slab elements [lo, hi), stored at
 * `state` in the piece arrays (the same index as the optimizer state; grad unused). Set them
 * before initialising or loading parameters. */
void tr_model_set_pieces(tr_model *m, const tr_piece *p, int n);
/* The working copy (storage dtype) of the pieces and their fp32 master weights, indexed like
 * the optimizer state. */
tr_buf *tr_model_param_pieces(tr_model *m);
float *tr_model_master_pieces(tr_model *m);
/* Where op computations read parameter tensor i from until placed again. */
void tr_model_set_param_addr(tr_model *m, int i, tr_buf *addr);
/* Called before (after = 0) and after (after = 1) every op's forward (dir = +1: training,
 * evaluation, logits, decoding; dir = +2: the forward that full recompute repeats inside the
 * backward, the same ops' backward following) and backward (dir = -1). */
typedef void (*tr_op_hook)(void *ctx, int op, int dir, int after);
void tr_model_set_op_hook(tr_model *m, tr_op_hook fn, void *ctx);
/* During a dir = +2 forward: the op it stops before (its ops are [., end)); else 0. */
int tr_model_recompute_end(const tr_model *m);
int tr_model_num_ops(const tr_model *m);

/* ---- taps (tools: `trainer check`) --------------------------------------------------------
 * While set, fn is called after every op's forward (training and evaluation, not the forward
 * that full recompute repeats) with its output: rows [row0, row0 + rows) of the pass's N
 * tokens, cols wide; the stream (storage dtype, x) or, for the head, the per-token losses
 * (fp32 backend memory, f32). replica: another rank of the tp group holds the same rows (this
 * is not its copy 0). fn may change the output in place, before the ops after it read it. */
typedef struct {
    int op;
    tr_buf *x;
    float *f32;
    int rows, row0, N, cols;
    int replica;
} tr_tap;
typedef void (*tr_tap_fn)(void *ctx, const tr_tap *t);
void tr_model_set_tap(tr_model *m, tr_tap_fn fn, void *ctx);
/* The name of op i's output in the model's tree ("stack.0.residual0.attention"; the head's
 * per-token loss is "lm_head") and its width (cols); NULL for an op whose output is its
 * input (the start of a residual branch). The same on every rank of any layout. */
const char *tr_model_op_name(const tr_model *m, int i, int *cols);
/* The parameter tensors op `op` reads when it runs in direction dir, into p; returns how many
 * (at most 4). */
int tr_model_op_params(const tr_model *m, int op, int dir, int p[4]);

/* ---- tensor parallelism -------------------------------------------------------------------
 * The group over which segment s of tensor i's gradient must be summed (tr_param_seg.partial),
 * NULL when this process's gradient of it is complete. Called by the parallel runtime once
 * the gradients of a step are reduced over the data-parallel group (sums commute). */
tr_comm *tr_model_grad_group(const tr_model *m, int i, int s);
/* The tp group (NULL without tensor parallelism). */
tr_comm *tr_model_tp_group(const tr_model *m);
/* Sum of squares of gradient elements [lo, hi) of the slab, read from `grad` (slab element lo
 * first), each element weighted by 1/copies of its segment, so that the sum over the tp
 * group counts a replicated tensor once; without tensor parallelism the plain sum. */
double tr_model_grad_sumsq(const tr_model *m, const tr_buf *grad, size_t lo, size_t hi);
/* What tensor-parallel communication cost so far: collectives started, the bytes they made
 * this process send (tr_comm_bytes_sent), seconds the computation waited for them (exposed)
 * and seconds from their start to their completion (span; without a progress agent a
 * started collective moves only inside communication calls, so its span says little). */
typedef struct {
    long ops;
    double bytes, span_s, exposed_s;
} tr_tp_stats;
tr_tp_stats tr_model_tp_stats(const tr_model *m);

/* ---- pipeline parallelism ------------------------------------------------------------------
 * A model built with chunks runs them one at a time, for one micro-batch in one of the chunk's
 * slots (0 .. slots - 1): the executor (parallel/pipeline.c) moves the streams between ranks.
 * Without chunks the model is one chunk (0) of one slot. */
int tr_model_num_chunks(const tr_model *m);
int tr_model_chunk_held(const tr_model *m, int c);
/* Elements of one stream tensor of B x T tokens on this rank (rows x C: N / tp rows with
 * sequence parallelism): what goes between stages. */
size_t tr_model_stream_elems(const tr_model *m, int B, int T);
/* The tensor-parallel group whose ranks hold the same whole stream of B x T tokens (tp > 1
 * without sequence parallelism at this size), else NULL: the pipeline then sends each of them
 * a 1/tp slice and gathers the slices on arrival. */
tr_comm *tr_model_stream_replicas(const tr_model *m, int B, int T);
/* Chunk c's input stream in a slot (c > 0: receive the previous chunk's output into it) and
 * its output stream after its forward (send it), the gradient of its output (receive it; the
 * last chunk's comes from its head) and, after its backward, of its input (send it). */
tr_buf *tr_model_chunk_input(tr_model *m, int c, int slot);
tr_buf *tr_model_chunk_output(tr_model *m, int c, int slot);
tr_buf *tr_model_chunk_grad_output(tr_model *m, int c, int slot);
tr_buf *tr_model_chunk_grad_input(tr_model *m, int c, int slot);
/* The gradient buffers above are by slot, or with grad_recv / grad_send given, by buffer j
 * of the chunk's pools (tr_model_chunk_backward_bufs). Copy a stream of n elements (a chunk's
 * output into the next chunk's input when one rank holds both). */
void tr_model_copy_stream(tr_model *m, tr_buf *dst, const tr_buf *src, size_t n);
/* Forward of chunk c over B x T tokens (tokens: read by the chunk holding the embedding) into
 * the slot. The chunk holding the head: with targets (evaluation) returns the mean loss; in
 * training it stops before the head, whose loss and gradient the backward computes. */
float tr_model_chunk_forward(tr_model *m, int c, int slot, const int *tokens, const int *targets,
                             int B, int T);
/* Backward of chunk c for the micro-batch in the slot: TR_BWD_ALL, or (split_backward) the
 * input gradient first and the weight gradient later. The chunk holding the head starts with
 * its loss (returned; 0 elsewhere) and gradient, seeded with grad_scale; the others from
 * tr_model_chunk_grad_output. Gradients accumulate, as tr_model_backward's do. */
typedef enum { TR_BWD_ALL = 0, TR_BWD_INPUT, TR_BWD_WEIGHT } tr_bwd_part;
float tr_model_chunk_backward(tr_model *m, int c, int slot, const int *tokens, const int *targets,
                              int B, int T, float grad_scale, tr_bwd_part part);
/* The same, reading the output's gradient from receive buffer grecv and writing the input's
 * into send buffer gsend (tr_model_chunk_backward: both the slot). */
float tr_model_chunk_backward_bufs(tr_model *m, int c, int slot, int grecv, int gsend,
                                   const int *tokens, const int *targets, int B, int T,
                                   float grad_scale, tr_bwd_part part);
/* Incremental decoding of chunk c (tr_model_decode, one chunk): the chunk holding the
 * embedding reads `token`, the others their input (slot 0); the chunk holding the head writes
 * the logits, the others leave their output in slot 0. */
void tr_model_decode_chunk(tr_model *m, tr_kv_cache *cache, int c, int token, int pos,
                           float *logits);
/* While hold is 1, the gradient hook (tr_model_set_grad_hook) is not called: a pipeline's
 * backwards of a chunk before its last one in a step (their gradients are not final). */
void tr_model_hold_grad_hooks(tr_model *m, int hold);
/* The pipeline group given at init (NULL: none). */
tr_comm *tr_model_pp_group(const tr_model *m);

const tr_model_desc *tr_model_desc_of(const tr_model *m);
const tr_backend *tr_model_backend(const tr_model *m);

#endif
