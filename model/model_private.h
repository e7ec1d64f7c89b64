/* Private to model/: the flattened program (ops) and the model's state, shared by the
 * builder (model.c), the model's memory (model_memory.c), the parameter and optimizer code
 * (params.c) and the executor (exec.c). */
#ifndef TR_MODEL_PRIVATE_H
#define TR_MODEL_PRIVATE_H

#include "model/model.h"

typedef enum {
    OP_EMBED,
    OP_POS,
    OP_LAYERNORM,
    OP_RMSNORM,
    OP_ATTENTION,
    OP_MLP,
    OP_RES_BEGIN,
    OP_RES_END,
    OP_HEAD
} op_kind;

typedef struct {
    op_kind kind;
    const tr_node *node;
    int p[4];       /* parameter tensors: weight, bias, weight2, bias2 (-1: none) */
    size_t in, out; /* activation offsets (floats) of the input and output streams, (N, C) */
    size_t s[3];    /* saved tensors: LN mean, rstd; ATTN qkv, att, lse; MLP fc, act;
                       RES_END s[0] = the skip stream */
    int depth;      /* residual nesting level the op runs at */
    int match;      /* RES_END: index of its RES_BEGIN */
    int H, KV, hid; /* this rank's query heads, key/value heads (ATTENTION), hidden units
                       (MLP): the node's, divided by tensor parallelism */
    int chunk;      /* the pipeline chunk it belongs to */
    size_t dy[2];   /* split backward (ATTENTION, MLP): the output gradients of the layer's
                       two products, kept from the input part for the weight part: (N, C) of
                       the output product, (N, qkv or fc) of the input product; each over a
                       tensor only the input part reads where one fits (model.c:
                       place_output_grads) */
    char name[TR_PARAM_NAME_MAX]; /* its node in the model's tree: "stack.0.residual0.mlp" */
} op_t;

/* A pipeline chunk: ops [lo, hi) of the program. A held chunk's activations take arena range
 * [abase, aend) (statistics [sbase, send)) in the layout of one micro-batch; the arena holds
 * `slots` copies of it from aoff (soff), one per micro-batch in flight. in: the stream entering
 * it (for chunk > 0 a buffer of its own, which the previous chunk's output is received into);
 * out: the stream leaving it. gin / gout: per slot, the gradient of the output (received, or
 * from the head) and of the input (to send), Ns x C each, from gslot (or pools of their own
 * size: tr_model_opts.grad_recv / grad_send). */
typedef struct {
    int lo, hi;
    int held, slots;
    size_t in, out;
    size_t abase, aend, sbase, send;
    size_t aoff, soff;
    int gslot;
    int nrecv, nsend; /* gradient buffers: receive ones from gslot, then send ones */
    int gshared;      /* its send buffers are chunk - 1's receive ones (both held) */
} chunk_t;

/* Offsets with this bit set live in the transient arenas, which the recompute levels reuse:
 * "selective" keeps one MLP activation buffer there (recomputed from the pre-activation in
 * the backward), "full" every tensor inside a top-level residual branch (the branch's forward
 * runs again from its saved input just before its backward). */
#define TRANSIENT ((size_t)1 << 62)

struct tr_model {
    tr_model_desc desc; /* root points into the caller's recipe: it must outlive the model */
    /* pipeline chunks (one, the whole program, without pipeline parallelism); the slot in use
       shifts every non-transient activation offset by ashift (statistics: sshift) */
    chunk_t *chunks;
    int n_chunks, pipelined, split;
    size_t ashift, sshift;
    tr_buf **gio; /* per chunk and slot (from chunk.gslot): gin, gout alternate */
    int n_gio;
    tr_comm *tie_comm; /* the first and last pipeline stages (a tied embedding), or NULL */
    tr_comm *pp_comm;  /* the pipeline ranks with this rank's dp and tp coordinates */
    int has_copies;    /* some tensor is a pipeline replica (tr_param.pp_copy) */
    int head_here;     /* this process holds the head's chunk */
    int hooks_held;    /* the gradient hook is not called (tr_model_hold_grad_hooks) */
    const tr_backend *be;
    int maxB, maxT;
    op_t *ops;
    int n_ops, cap_ops;
    tr_param *params;
    int n_params, cap_params;
    size_t n_floats;    /* parameter slab size (elements, with alignment padding) */
    size_t act_floats;  /* activation arena size (storage elements) */
    size_t stat_floats; /* fp32 statistics arena size (norm mean/rstd, attention lse) */
    size_t tact_floats, tstat_floats; /* transient arenas (recompute) */
    tr_recompute recompute;
    size_t es;            /* bytes of one storage element */
    size_t width_scratch; /* widest per-token scratch (floats) for attention/MLP backward */
    int max_depth;
    int last_branch_end; /* the last top-level RES_END: its branch is intact at backward */
    size_t n_pad;        /* slab elements, padded to a multiple of the shard count */
    size_t opt_lo, opt_hi; /* this process's optimizer shard of the slab */
    int *ready_op;       /* per parameter: the op after whose backward its gradient is final */
    tr_grad_hook hook, pre_hook, partial_hook;
    void *hook_ctx, *pre_ctx, *partial_ctx;
    tr_buf **gaddr;      /* per parameter: where its gradient lives (the slab, or placed) */
    int external_grads;
    /* ZeRO-3: no parameter slab; this process keeps pieces of it (master and working copy,
       indexed like the optimizer state), and every op's parameters are placed by the op hook
       before it runs (paddr) */
    int external_params;
    tr_buf **paddr;      /* per parameter: where the op reads it (the slab, or placed) */
    tr_buf *wpar;        /* ZeRO-3: the working copy of the pieces (== master in fp32) */
    tr_piece *pieces;    /* ZeRO-3: the pieces of the slab this process keeps */
    int n_pieces;
    size_t piece_elems;
    tr_op_hook ohook;
    void *octx;
    tr_tap_fn tap; /* tools: each op's output after its forward (tr_model_set_tap) */
    void *tap_ctx;
    int pass_n;    /* tokens of the pass running (B x T) */
    int recompute_to;   /* inside the backward's repeated forward of ops [., recompute_to): 0
                           when not */
    tr_adamw_seg *segs; /* the optimizer step's stretches (reused every step) */
    int cap_segs;
    int n_attention;
    size_t head_rows; /* rows of logits computed at once */
    int Vp;           /* the vocabulary padded for the head's products (>= desc.vocab) */
    /* tensor parallelism: a group of tp ranks, this one tpr; sequence parallelism (sp) keeps
       the residual stream, norms and their gradients on Ns = N / tp rows */
    int tp, tpr, sp;
    tr_comm *tp_comm;
    struct {
        int copies;     /* ranks sharing each key/value head */
        tr_comm *comm;  /* the ranks sharing this rank's */
    } kvg[4];
    int n_kvg;
    int Vl;           /* vocabulary rows of this rank's embedding / head (Vp / tp) */
    int vlo, vn;      /* its first global row, and how many of its rows are real classes */
    tr_buf *xfull, *gfull; /* sp: (N, C) the gathered input of a split product, and the full
                              gradient or the partial sums before a reduce-scatter */
    float *vgather;   /* tp: one row of Vp logits gathered from every rank (decoding, tools) */
    float *xstats;    /* tp: the head's row statistics, (tp + 1) x head_rows x 3 */
    int *ltokens;     /* tp: token ids in this rank's vocabulary rows, -1 elsewhere */
    int *host_ltokens; /* tp: the same, made in host memory and uploaded */
    int sp_now;       /* the pass running keeps the stream on N / tp rows (training and
                         evaluation with sp; decoding never) */
    tr_tp_stats tps;
    int head_param;   /* parameter index of the head's weight (embedding's when tied) */
    int embed_param;
    /* backend memory; tr_buf in the storage dtype, float always fp32 */
    tr_buf *param, *grad, *act, *tact;
    float *master, *adam_m, *adam_v, *stats, *tstats; /* master == param when storage is fp32 */
    tr_buf *scratch1, *scratch2, *logits;
    float *losses;
    tr_buf **gbuf; /* 2 * (max_depth + 1) gradient streams, (N, C) each */
    int *tokens, *targets;
    float *host_losses;
    long adam_t;
    int lastB, lastT;
    float last_scale;
};

/* Between the builder (model.c) and the model's memory (model_memory.c). */

/* n rounded up to a multiple of 16 elements: every tensor's start in the slab and arenas. */
size_t model_align16(size_t n);

/* Flattens desc's layer tree into m's program for micro-batches of o->B x o->T and measures
 * it: every parameter's place in the slab, every activation's offset in the arenas, the
 * optimizer's shard. m comes zeroed, with be (NULL in a plan) and es set; nothing is
 * allocated from the backend. */
int model_build(tr_model *m, const tr_model_desc *desc, const tr_model_opts *o, char *err,
                size_t errlen);

/* Where each held chunk's slots lie in the arenas (model_memory.c), once the chunks are
 * built: sets the arenas' sizes and the gradient buffers between stages. */
void model_arena_layout(tr_model *m);

#endif
