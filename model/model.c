/* The model executor: the recipe's layer tree is flattened once into a program of ops
 * (embedding, norms, attention, MLP, residual begin/end, head); a measuring pass over that
 * program assigns every activation its offset in one arena, and forward/backward walk it,
 * calling only the backend table. */
#include "model/model.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
} op_t;

/* Offsets with this bit set live in the transient arenas, which the recompute levels reuse:
 * "selective" keeps one MLP activation buffer there (recomputed from the pre-activation in
 * the backward), "full" every tensor inside a top-level residual branch (the branch's forward
 * runs again from its saved input just before its backward). */
#define TRANSIENT ((size_t)1 << 62)

struct tr_model {
    tr_model_desc desc; /* root points into the caller's recipe: it must outlive the model */
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
    int recompute_to;   /* inside the backward's repeated forward of ops [., recompute_to): 0
                           when not */
    tr_adamw_seg *segs; /* the optimizer step's stretches (reused every step) */
    int cap_segs;
    int n_attention;
    size_t head_rows; /* rows of logits computed at once */
    int Vp;           /* the vocabulary padded for the head's products (>= desc.vocab) */
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

/* ---- building the program ------------------------------------------------------------- */

typedef struct {
    tr_model *m;
    size_t cursor;                /* activation arena cursor (storage elements) */
    size_t stat_cursor;           /* statistics arena cursor (floats) */
    size_t tcursor, tstat_cursor; /* transient arenas' cursors, reset per top-level branch */
    size_t N;                     /* rows of the largest micro-batch */
    int depth;
    char err[256];
} builder;

static size_t align16(size_t n) {
    return (n + 15) & ~(size_t)15;
}

/* Under full recompute, everything inside a top-level residual branch is transient. */
static int in_branch(const builder *b) {
    return b->m->recompute == TR_RECOMPUTE_FULL && b->depth >= 1;
}

static size_t take(size_t *cursor, size_t *high, size_t width, size_t N) {
    size_t off = *cursor;
    *cursor += align16(width * N);
    if (high && *cursor > *high) *high = *cursor;
    return off;
}

static size_t act_take(builder *b, size_t width) {
    if (in_branch(b)) return TRANSIENT | take(&b->tcursor, &b->m->tact_floats, width, b->N);
    return take(&b->cursor, NULL, width, b->N);
}

static size_t stat_take(builder *b, size_t width) {
    if (in_branch(b)) return TRANSIENT | take(&b->tstat_cursor, &b->m->tstat_floats, width, b->N);
    return take(&b->stat_cursor, NULL, width, b->N);
}

static op_t *op_push(builder *b, op_kind kind, const tr_node *n) {
    tr_model *m = b->m;
    if (m->n_ops == m->cap_ops) {
        m->cap_ops = m->cap_ops ? 2 * m->cap_ops : 64;
        m->ops = realloc(m->ops, (size_t)m->cap_ops * sizeof(op_t));
    }
    op_t *op = &m->ops[m->n_ops++];
    memset(op, 0, sizeof(*op));
    op->kind = kind;
    op->node = n;
    op->p[0] = op->p[1] = op->p[2] = op->p[3] = -1;
    op->depth = b->depth;
    return op;
}

static int param_add(builder *b, const char *prefix, const char *name, int ndim, int s0, int s1,
                     float std, int one) {
    tr_model *m = b->m;
    if (m->n_params == m->cap_params) {
        m->cap_params = m->cap_params ? 2 * m->cap_params : 64;
        m->params = realloc(m->params, (size_t)m->cap_params * sizeof(tr_param));
    }
    tr_param *p = &m->params[m->n_params];
    memset(p, 0, sizeof(*p));
    snprintf(p->name, sizeof(p->name), "%s%s", prefix, name);
    p->ndim = ndim;
    p->shape[0] = s0;
    p->shape[1] = ndim > 1 ? s1 : 1;
    p->numel = (size_t)s0 * (size_t)p->shape[1];
    p->offset = m->n_floats;
    p->extent = p->numel;
    p->decay = ndim >= 2;
    p->init_std = std;
    p->init_one = one;
    p->gshape[0] = p->shape[0];
    p->gshape[1] = p->shape[1];
    p->n_seg = 1;
    p->seg[0] = (tr_param_seg){.row = 0, .rows = s0, .grow = 0, .copies = 1};
    m->n_floats += align16(p->numel);
    return m->n_params++;
}

/* A vocabulary matrix (V, C) just added: reserve Vp rows for it in the slab, the padding rows
 * zero (the head's products run over Vp rows). */
static void pad_rows(tr_model *m, int i) {
    tr_param *p = &m->params[i];
    p->extent = (size_t)m->Vp * (size_t)p->shape[1];
    m->n_floats = p->offset + align16(p->extent);
}

/* Layers once every stack is unrolled (a double: nested repeats can pass any integer type). */
static double count_layers(const tr_node *n) {
    double c = 0;
    for (int i = 0; i < n->n_children; i++)
        c += count_layers(&n->children[i]);
    return 1 + (n->kind == TR_NODE_STACK ? c * n->repeat : c);
}
#define MAX_LAYERS 1000000.0 /* unrolled: ~50,000 transformer blocks, far past any real model */

static int count_attention(const tr_node *n) {
    if (n->kind == TR_NODE_ATTENTION) return 1;
    int c = 0;
    for (int i = 0; i < n->n_children; i++)
        c += count_attention(&n->children[i]);
    return n->kind == TR_NODE_STACK ? c * n->repeat : c;
}

/* A child is named by its kind, with its ordinal among same-kind siblings when there are
 * several: "residual0", "residual1", "layernorm". */
static void child_name(const tr_node *parent, int i, char *out, size_t len) {
    const tr_node *c = &parent->children[i];
    int same = 0, ord = 0;
    for (int j = 0; j < parent->n_children; j++) {
        if (parent->children[j].kind == c->kind) {
            if (j < i) ord++;
            same++;
        }
    }
    if (same > 1)
        snprintf(out, len, "%s%d", tr_node_kind_name(c->kind), ord);
    else
        snprintf(out, len, "%s", tr_node_kind_name(c->kind));
}

/* cur: offset of the stream entering the node; returns the offset of the stream leaving it. */
static size_t flatten(builder *b, const tr_node *n, const char *prefix, size_t cur);

static size_t flatten_children(builder *b, const tr_node *n, const char *prefix, size_t cur) {
    for (int i = 0; i < n->n_children; i++) {
        char name[64], sub[TR_PARAM_NAME_MAX];
        child_name(n, i, name, sizeof(name));
        snprintf(sub, sizeof(sub), "%s%s.", prefix, name);
        cur = flatten(b, &n->children[i], sub, cur);
        if (b->err[0]) return cur;
    }
    return cur;
}

static size_t flatten(builder *b, const tr_node *n, const char *prefix, size_t cur) {
    tr_model *m = b->m;
    const int C = m->desc.dim, V = m->desc.vocab;
    const float std = 0.02f,
                proj_std = 0.02f / sqrtf(2.0f * (float)(m->n_attention > 0 ? m->n_attention : 1));
    op_t *op;
    switch (n->kind) {
    case TR_NODE_SEQUENCE:
        return flatten_children(b, n, prefix, cur);
    case TR_NODE_STACK:
        for (int r = 0; r < n->repeat; r++) {
            char sub[TR_PARAM_NAME_MAX];
            snprintf(sub, sizeof(sub), "%s%d.", prefix, r);
            cur = flatten_children(b, n, sub, cur);
            if (b->err[0]) return cur;
        }
        return cur;
    case TR_NODE_RESIDUAL: {
        op = op_push(b, OP_RES_BEGIN, n);
        op->in = op->out = cur;
        int begin = m->n_ops - 1;
        if (b->depth == 0) b->tcursor = b->tstat_cursor = 0; /* a new top-level branch */
        b->depth++;
        if (b->depth > m->max_depth) m->max_depth = b->depth;
        size_t branch = flatten_children(b, n, prefix, cur);
        b->depth--;
        op = op_push(b, OP_RES_END, n);
        op->match = begin;
        if (b->depth == 0) m->last_branch_end = m->n_ops - 1;
        op->in = branch;
        op->s[0] = cur;
        op->out = act_take(b, (size_t)C);
        return op->out;
    }
    case TR_NODE_EMBEDDING:
        op = op_push(b, OP_EMBED, n);
        op->p[0] = param_add(b, prefix, "weight", 2, V, C, std, 0);
        pad_rows(m, op->p[0]);
        m->embed_param = op->p[0];
        op->out = act_take(b, (size_t)C);
        return op->out;
    case TR_NODE_POSITIONS:
        op = op_push(b, OP_POS, n);
        op->p[0] = param_add(b, prefix, "weight", 2, m->desc.seq_len, C, std, 0);
        op->in = op->out = cur; /* added in place: the embedding output is not needed later */
        return cur;
    case TR_NODE_ROPE: /* applied inside the attention layers that follow */
        return cur;
    case TR_NODE_LAYERNORM:
    case TR_NODE_RMSNORM:
        op = op_push(b, n->kind == TR_NODE_LAYERNORM ? OP_LAYERNORM : OP_RMSNORM, n);
        op->p[0] = param_add(b, prefix, "weight", 1, C, 1, 0, 1);
        if (n->kind == TR_NODE_LAYERNORM && n->bias)
            op->p[1] = param_add(b, prefix, "bias", 1, C, 1, 0, 0);
        op->in = cur;
        op->out = act_take(b, (size_t)C);
        op->s[0] = stat_take(b, 1); /* mean (unused by RMSNorm) */
        op->s[1] = stat_take(b, 1); /* rstd */
        return op->out;
    case TR_NODE_ATTENTION: {
        int hd = C / n->heads, q = n->heads * hd, qkv = (n->heads + 2 * n->kv_heads) * hd;
        op = op_push(b, OP_ATTENTION, n);
        op->p[0] = param_add(b, prefix, "qkv.weight", 2, qkv, C, std, 0);
        if (n->bias) op->p[1] = param_add(b, prefix, "qkv.bias", 1, qkv, 1, 0, 0);
        op->p[2] = param_add(b, prefix, "out.weight", 2, C, q, proj_std, 0);
        if (n->bias) op->p[3] = param_add(b, prefix, "out.bias", 1, C, 1, 0, 0);
        op->in = cur;
        op->s[0] = act_take(b, (size_t)qkv);
        op->s[1] = act_take(b, (size_t)q);
        op->s[2] = stat_take(b, (size_t)n->heads); /* lse */
        op->out = act_take(b, (size_t)C);
        if ((size_t)qkv > m->width_scratch) m->width_scratch = (size_t)qkv;
        return op->out;
    }
    case TR_NODE_MLP: {
        int h = n->hidden, fc = n->activation == TR_ACT_SWIGLU ? 2 * h : h;
        op = op_push(b, OP_MLP, n);
        op->p[0] = param_add(b, prefix, "fc.weight", 2, fc, C, std, 0);
        if (n->bias) op->p[1] = param_add(b, prefix, "fc.bias", 1, fc, 1, 0, 0);
        op->p[2] = param_add(b, prefix, "proj.weight", 2, C, h, proj_std, 0);
        if (n->bias) op->p[3] = param_add(b, prefix, "proj.bias", 1, C, 1, 0, 0);
        op->in = cur;
        op->s[0] = act_take(b, (size_t)fc);
        if (m->recompute == TR_RECOMPUTE_SELECTIVE) /* one shared buffer, recomputed */
            op->s[1] = TRANSIENT | take(&(size_t){0}, &m->tact_floats, (size_t)h, b->N);
        else
            op->s[1] = act_take(b, (size_t)h);
        op->out = act_take(b, (size_t)C);
        if ((size_t)fc > m->width_scratch) m->width_scratch = (size_t)fc;
        return op->out;
    }
    case TR_NODE_LM_HEAD:
        op = op_push(b, OP_HEAD, n);
        if (n->tied) {
            op->p[0] = m->embed_param;
        } else {
            op->p[0] = param_add(b, prefix, "weight", 2, V, C, std, 0);
            pad_rows(m, op->p[0]);
        }
        m->head_param = op->p[0];
        op->in = cur;
        return cur;
    case TR_NODE_KIND_COUNT:
        break;
    }
    snprintf(b->err, sizeof(b->err), "model: unknown layer kind %d", (int)n->kind);
    return cur;
}

static int build(tr_model *m, const tr_model_desc *desc, const tr_model_opts *o, char *err,
                 size_t errlen) {
    int B = o->B, T = o->T;
    m->recompute = o->recompute;
    if (B < 1 || T < 1 || T > desc->seq_len) {
        snprintf(err, errlen, "model: micro-batch %d x %d does not fit seq_len %d", B, T,
                 desc->seq_len);
        return -1;
    }
    const tr_node *root = &desc->root;
    if (root->n_children < 2 || root->children[0].kind != TR_NODE_EMBEDDING ||
        root->children[root->n_children - 1].kind != TR_NODE_LM_HEAD) {
        snprintf(err, errlen, "model: must start with an embedding and end with an lm_head");
        return -1;
    }
    m->desc = *desc;
    m->maxB = B;
    m->maxT = T;
    m->embed_param = m->head_param = -1;
    int pad = o->pad_vocab > 0 ? o->pad_vocab : m->be && m->be->pad_vocab > 0 ? m->be->pad_vocab : 1;
    m->Vp = (desc->vocab + pad - 1) / pad * pad;
    double layers = count_layers(root);
    if (layers > MAX_LAYERS) { /* refused before anything is built for it */
        snprintf(err, errlen, "model: %.4g layers once the repeats are unrolled (at most %.0f)",
                 layers, MAX_LAYERS);
        return -1;
    }
    m->n_attention = count_attention(root);
    builder b = {.m = m, .N = (size_t)B * (size_t)T};
    flatten(&b, root, "", 0);
    if (!b.err[0] && m->max_depth >= 63)
        snprintf(b.err, sizeof(b.err), "model: residuals nested %d deep (at most 62)",
                 m->max_depth);
    if (b.err[0]) {
        snprintf(err, errlen, "%s", b.err);
        return -1;
    }
    m->act_floats = b.cursor;
    m->stat_floats = b.stat_cursor;
    /* logits chunk: as many rows as fit in 8M floats, so a 50k vocabulary never needs the
       whole (N, V) matrix */
    size_t rows = (size_t)(8u << 20) / (size_t)m->Vp;
    if (rows < 1) rows = 1;
    if (rows > b.N) rows = b.N;
    m->head_rows = rows;
    /* the slab splits into `shards` equal ranges (ZeRO); padding is never read as a tensor */
    size_t shards = o->shards > 1 ? (size_t)o->shards : 1, unit = 16 * shards;
    m->n_pad = (m->n_floats + unit - 1) / unit * unit;
    size_t per = m->n_pad / shards, shard = o->shards > 1 ? (size_t)o->shard : 0;
    m->opt_lo = shard * per;
    m->opt_hi = m->opt_lo + per;
    if (o->external_grads || o->external_params) /* ZeRO-2/3: the caller sizes the state */
        m->opt_lo = m->opt_hi = 0;
    m->external_grads = o->external_grads || o->external_params;
    m->external_params = o->external_params;
    /* a gradient is final after the backward of the first op (in forward order) using it */
    m->ready_op = malloc((size_t)(m->n_params ? m->n_params : 1) * sizeof(int));
    for (int i = 0; i < m->n_params; i++) m->ready_op[i] = m->n_ops;
    for (int i = m->n_ops - 1; i >= 0; i--)
        for (int k = 0; k < 4; k++)
            if (m->ops[i].p[k] >= 0) m->ready_op[m->ops[i].p[k]] = i;
    return 0;
}

static tr_memory memory_of(const tr_model *m) {
    size_t N = (size_t)m->maxB * (size_t)m->maxT, C = (size_t)m->desc.dim, F = sizeof(float);
    size_t es = m->es;
    tr_memory mem;
    /* storage-dtype weights and gradients; fp32 master weights (unless the storage is fp32)
       and AdamW m, v */
    mem.params = (m->external_params ? m->piece_elems : m->n_pad) * (es == F ? es : es + F);
    mem.grads = m->external_grads ? 0 : m->n_pad * es; /* ZeRO-2: the caller's buffers */
    mem.optimizer = 2 * (m->opt_hi - m->opt_lo) * F;
    mem.activations =
        (m->act_floats + m->tact_floats) * es + (m->stat_floats + m->tstat_floats) * F;
    mem.scratch = (2 * align16(m->width_scratch * N) + m->head_rows * (size_t)m->Vp +
                   2 * (size_t)(m->max_depth + 1) * align16(N * C)) *
                      es +
                  align16(N) * F + 2 * N * sizeof(int);
    return mem;
}

int tr_model_measure(const tr_model_desc *desc, tr_dtype dtype, const tr_model_opts *o,
                     tr_memory *mem, char *err, size_t errlen) {
    tr_model *m;
    if (tr_model_plan(&m, desc, dtype, o, err, errlen)) return -1;
    *mem = memory_of(m);
    tr_model_free(m);
    return 0;
}

int tr_model_plan(tr_model **out, const tr_model_desc *desc, tr_dtype dtype,
                  const tr_model_opts *o, char *err, size_t errlen) {
    *out = NULL;
    tr_model *m = calloc(1, sizeof(*m));
    if (!m) {
        snprintf(err, errlen, "model: out of memory");
        return -1;
    }
    m->es = tr_dtype_size(dtype);
    if (build(m, desc, o, err, errlen)) {
        tr_model_free(m);
        return -1;
    }
    *out = m;
    return 0;
}

int tr_model_init(tr_model **out, const tr_model_desc *desc, const tr_backend *be, int B, int T,
                  char *err, size_t errlen) {
    tr_model_opts o = {.B = B, .T = T, .recompute = TR_RECOMPUTE_NONE};
    return tr_model_init_opts(out, desc, be, &o, err, errlen);
}

int tr_model_init_opts(tr_model **out, const tr_model_desc *desc, const tr_backend *be,
                       const tr_model_opts *o, char *err, size_t errlen) {
    int B = o->B, T = o->T;
    *out = NULL;
    tr_model *m = calloc(1, sizeof(*m));
    if (!m) {
        snprintf(err, errlen, "model: out of memory");
        return -1;
    }
    m->be = be;
    m->es = tr_dtype_size(be->dtype);
    if (build(m, desc, o, err, errlen)) {
        tr_model_free(m);
        return -1;
    }
    size_t N = (size_t)B * (size_t)T, C = (size_t)desc->dim, F = sizeof(float), es = m->es;
    int ng = 2 * (m->max_depth + 1);
    int own_params = !m->external_params; /* ZeRO-3: pieces only (tr_model_alloc_optim) */
    m->param = own_params ? be->alloc(m->n_pad * es) : NULL;
    m->master = !own_params || be->dtype == TR_DTYPE_F32 ? m->param : be->alloc(m->n_pad * F);
    m->grad = m->external_grads ? NULL : be->alloc(m->n_pad * es);
    m->adam_m = be->alloc((m->opt_hi - m->opt_lo) * F);
    m->adam_v = be->alloc((m->opt_hi - m->opt_lo) * F);
    m->act = be->alloc(m->act_floats * es);
    m->stats = be->alloc(m->stat_floats * F);
    m->tact = be->alloc((m->tact_floats ? m->tact_floats : 16) * es);
    m->tstats = be->alloc((m->tstat_floats ? m->tstat_floats : 16) * F);
    m->scratch1 = be->alloc(align16(m->width_scratch * N) * es);
    m->scratch2 = be->alloc(align16(m->width_scratch * N) * es);
    m->logits = be->alloc(m->head_rows * (size_t)m->Vp * es);
    m->losses = be->alloc(align16(N) * F);
    m->tokens = be->alloc(N * sizeof(int));
    m->targets = be->alloc(N * sizeof(int));
    m->host_losses = malloc(N * F);
    m->gbuf = calloc((size_t)ng, sizeof(tr_buf *));
    m->gaddr = calloc((size_t)(m->n_params ? m->n_params : 1), sizeof(tr_buf *));
    for (int i = 0; m->grad && i < m->n_params; i++)
        m->gaddr[i] = tr_buf_at(be, m->grad, m->params[i].offset);
    m->paddr = calloc((size_t)(m->n_params ? m->n_params : 1), sizeof(tr_buf *));
    for (int i = 0; m->param && m->paddr && i < m->n_params; i++)
        m->paddr[i] = tr_buf_at(be, m->param, m->params[i].offset);
    int ok = ((m->param && m->master) || !own_params) && (m->grad || m->external_grads) &&
             m->adam_m && m->adam_v && m->act && m->stats && m->gaddr && m->paddr &&
             m->tact && m->tstats && m->scratch1 && m->scratch2 && m->logits && m->losses &&
             m->tokens && m->targets && m->host_losses && m->gbuf;
    for (int i = 0; ok && i < ng; i++)
        ok = (m->gbuf[i] = be->alloc(align16(N * C) * es)) != NULL;
    if (!ok) {
        tr_memory mem = memory_of(m);
        snprintf(err, errlen, "model: cannot allocate %.2f GiB on the %s backend",
                 (double)(mem.params + mem.grads + mem.optimizer + mem.activations + mem.scratch) /
                     (1 << 30),
                 be->name);
        tr_model_free(m);
        return -1;
    }
    *out = m;
    return 0;
}

void tr_model_free(tr_model *m) {
    if (!m) return;
    const tr_backend *be = m->be;
    if (be) {
        if (m->master != m->param) be->free(m->master);
        be->free(m->param);
        if (m->wpar != m->master) be->free(m->wpar);
        be->free(m->grad);
        be->free(m->adam_m);
        be->free(m->adam_v);
        be->free(m->act);
        be->free(m->stats);
        be->free(m->tact);
        be->free(m->tstats);
        be->free(m->scratch1);
        be->free(m->scratch2);
        be->free(m->logits);
        be->free(m->losses);
        be->free(m->tokens);
        be->free(m->targets);
        if (m->gbuf)
            for (int i = 0; i < 2 * (m->max_depth + 1); i++)
                be->free(m->gbuf[i]);
    }
    free(m->gbuf);
    free(m->host_losses);
    free(m->ops);
    free(m->params);
    free(m->ready_op);
    free(m->gaddr);
    free(m->paddr);
    free(m->pieces);
    free(m->segs);
    free(m);
}

tr_memory tr_model_memory(const tr_model *m) {
    return memory_of(m);
}
int tr_model_num_params(const tr_model *m) {
    return m->n_params;
}
const tr_param *tr_model_param(const tr_model *m, int i) {
    return &m->params[i];
}
size_t tr_model_num_elements(const tr_model *m) {
    size_t n = 0;
    for (int i = 0; i < m->n_params; i++)
        n += m->params[i].numel;
    return n;
}
const tr_model_desc *tr_model_desc_of(const tr_model *m) {
    return &m->desc;
}
const tr_backend *tr_model_backend(const tr_model *m) {
    return m->be;
}

/* ZeRO-3: the part [lo, hi) of tensor i inside piece k, at `at` in the piece arrays; 0 when
 * they do not meet. */
static int piece_part(const tr_model *m, int k, int i, size_t *lo, size_t *hi, size_t *at) {
    const tr_param *p = &m->params[i];
    const tr_piece *pc = &m->pieces[k];
    *lo = p->offset > pc->lo ? p->offset : pc->lo;
    *hi = p->offset + p->numel < pc->hi ? p->offset + p->numel : pc->hi;
    *at = pc->state + (*lo - pc->lo);
    return *lo < *hi;
}

void tr_model_get_param(const tr_model *m, int i, float *host) {
    const tr_param *p = &m->params[i];
    if (m->external_params) { /* the parts of it this process keeps */
        size_t lo, hi, at;
        for (int k = 0; k < m->n_pieces; k++)
            if (piece_part(m, k, i, &lo, &hi, &at))
                m->be->download(host + (lo - p->offset), m->master + at, (hi - lo) * sizeof(float));
        return;
    }
    m->be->download(host, m->master + p->offset, p->numel * sizeof(float));
}

void tr_model_set_param(tr_model *m, int i, const float *host) {
    const tr_param *p = &m->params[i];
    if (m->external_params) {
        size_t lo, hi, at;
        for (int k = 0; k < m->n_pieces; k++)
            if (piece_part(m, k, i, &lo, &hi, &at)) {
                m->be->upload(m->master + at, host + (lo - p->offset), (hi - lo) * sizeof(float));
                if (m->wpar != m->master)
                    m->be->to_storage(tr_buf_at(m->be, m->wpar, at), host + (lo - p->offset),
                                      hi - lo);
            }
        return;
    }
    m->be->upload(m->master + p->offset, host, p->numel * sizeof(float));
    if (m->master != m->param)
        m->be->to_storage(tr_buf_at(m->be, m->param, p->offset), host, p->numel);
}

void tr_model_get_grad(const tr_model *m, int i, float *host) {
    const tr_param *p = &m->params[i];
    (void)p;
    m->be->from_storage(host, m->gaddr[i], m->params[i].numel);
}

void tr_model_get_state(const tr_model *m, int i, tr_state_kind k, float *host) {
    const tr_param *p = &m->params[i];
    /* checkpoints use these without optimizer sharding: the tensor is inside the shard */
    const float *src = (k == TR_STATE_ADAM_M ? m->adam_m : m->adam_v) + (p->offset - m->opt_lo);
    m->be->download(host, src, p->numel * sizeof(float));
}

void tr_model_set_state(tr_model *m, int i, tr_state_kind k, const float *host) {
    const tr_param *p = &m->params[i];
    if (m->n_pieces) { /* ZeRO-2, 3: the parts of the tensor inside this process's pieces */
        size_t lo, hi, at;
        for (int j = 0; j < m->n_pieces; j++)
            if (piece_part(m, j, i, &lo, &hi, &at))
                m->be->upload((k == TR_STATE_ADAM_M ? m->adam_m : m->adam_v) + at,
                              host + (lo - p->offset), (hi - lo) * sizeof(float));
        return;
    }
    /* with a sharded optimizer, keep the part of the tensor inside this process's shard */
    size_t lo = p->offset > m->opt_lo ? p->offset : m->opt_lo;
    size_t hi = p->offset + p->numel < m->opt_hi ? p->offset + p->numel : m->opt_hi;
    if (lo >= hi) return;
    float *dst = (k == TR_STATE_ADAM_M ? m->adam_m : m->adam_v) + (lo - m->opt_lo);
    m->be->upload(dst, host + (lo - p->offset), (hi - lo) * sizeof(float));
}

int tr_model_held_parts(const tr_model *m, int i, int k, size_t *lo, size_t *hi, int max) {
    const tr_param *p = &m->params[i];
    int n = 0;
    if (k < 0 ? m->external_params : m->n_pieces > 0) { /* its parts inside the pieces */
        size_t a, b, at;
        for (int j = 0; j < m->n_pieces; j++)
            if (piece_part(m, j, i, &a, &b, &at)) {
                if (n < max) lo[n] = a - p->offset, hi[n] = b - p->offset;
                n++;
            }
        return n;
    }
    size_t a = p->offset, b = p->offset + p->numel; /* the slab, or the optimizer shard */
    if (k >= 0) {
        if (a < m->opt_lo) a = m->opt_lo;
        if (b > m->opt_hi) b = m->opt_hi;
    }
    if (a >= b) return 0;
    if (max > 0) lo[0] = a - p->offset, hi[0] = b - p->offset;
    return 1;
}

int tr_model_read_range(const tr_model *m, int k, size_t lo, size_t hi, float *host) {
    const float *src = k < 0 ? m->master : k == TR_STATE_ADAM_M ? m->adam_m : m->adam_v;
    if (hi <= lo) return 0;
    if (k < 0 ? m->external_params : m->n_pieces > 0) { /* kept in pieces */
        for (int i = 0; i < m->n_pieces; i++) {
            const tr_piece *pc = &m->pieces[i];
            if (lo >= pc->lo && hi <= pc->hi) {
                m->be->download(host, src + pc->state + (lo - pc->lo), (hi - lo) * sizeof(float));
                return 0;
            }
        }
        return -1;
    }
    size_t base = k < 0 ? 0 : m->opt_lo, top = k < 0 ? m->n_pad : m->opt_hi;
    if (lo < base || hi > top) return -1;
    m->be->download(host, src + (lo - base), (hi - lo) * sizeof(float));
    return 0;
}

float *tr_model_optim_state(tr_model *m, tr_state_kind k) {
    return k == TR_STATE_ADAM_M ? m->adam_m : m->adam_v;
}

long tr_model_adam_steps(const tr_model *m) {
    return m->adam_t;
}

void tr_model_set_adam_steps(tr_model *m, long t) {
    m->adam_t = t;
}

/* ---- tensor-parallel placement ----------------------------------------------------------- */

int tr_param_runs(const tr_param *p, size_t lo, size_t hi, tr_run *out, int max) {
    size_t C = (size_t)p->shape[1], G = (size_t)p->gshape[1];
    int n = 0;
    for (int s = 0; s < p->n_seg && lo < hi; s++) {
        const tr_param_seg *g = &p->seg[s];
        size_t a = (size_t)g->row * C, b = (size_t)(g->row + g->rows) * C;
        if (a < lo) a = lo;
        if (b > hi) b = hi;
        while (a < b) { /* whole segment rows are one run when they span the global rows */
            size_t r = a / C, c = a % C, len = C == G ? b - a : (C - c < b - a ? C - c : b - a);
            if (n < max)
                out[n] = (tr_run){.local = a, .global = ((size_t)g->grow + (r - (size_t)g->row)) *
                                                           G + (size_t)p->col + c,
                                  .n = len, .seg = s};
            n++;
            a += len;
        }
    }
    return n;
}

size_t tr_param_global_index(const tr_param *p, size_t i) {
    tr_run r;
    tr_param_runs(p, i, i + 1, &r, 1);
    return r.global;
}

void tr_model_set_param_global(tr_model *m, int i, const float *global) {
    const tr_param *p = &m->params[i];
    float *host = malloc((p->numel ? p->numel : 1) * sizeof(float));
    if (!host) {
        fprintf(stderr, "trainer: out of memory for tensor %s\n", p->name);
        abort();
    }
    int n = tr_param_runs(p, 0, p->numel, NULL, 0);
    tr_run *r = malloc((size_t)(n ? n : 1) * sizeof(tr_run));
    if (!r) abort();
    tr_param_runs(p, 0, p->numel, r, n);
    for (int k = 0; k < n; k++) memcpy(host + r[k].local, global + r[k].global, r[k].n * sizeof(float));
    free(r);
    tr_model_set_param(m, i, host);
    free(host);
}

tr_comm *tr_model_grad_group(const tr_model *m, int i, int s) {
    (void)m, (void)i, (void)s;
    return NULL;
}

double tr_model_grad_sumsq(const tr_model *m, const tr_buf *grad, size_t lo, size_t hi) {
    return hi > lo ? m->be->sumsq(grad, hi - lo) : 0.0;
}

tr_tp_stats tr_model_tp_stats(const tr_model *m) {
    (void)m;
    return (tr_tp_stats){0};
}

/* ---- initialisation ------------------------------------------------------------------- */

static uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static uint64_t hash_name(const char *s) {
    uint64_t h = 1469598103934665603ULL; /* FNV-1a */
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ULL;
    return h;
}

/* Standard normal for element i of a stream: Box-Muller on two counter-based uniforms. */
static float normal_at(uint64_t key, uint64_t i) {
    uint64_t a = mix64(key + 2 * i * 0x9e3779b97f4a7c15ULL + 1);
    uint64_t b = mix64(key + (2 * i + 1) * 0x9e3779b97f4a7c15ULL + 1);
    double u1 = ((double)(a >> 11) + 0.5) / 9007199254740992.0; /* (0, 1) */
    double u2 = (double)(b >> 11) / 9007199254740992.0;
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

void tr_model_init_params(tr_model *m, unsigned long long seed) {
    size_t maxn = 0;
    for (int i = 0; i < m->n_params; i++)
        if (m->params[i].numel > maxn) maxn = m->params[i].numel;
    float *host = malloc(maxn * sizeof(float));
    for (int i = 0; i < m->n_params; i++) {
        const tr_param *p = &m->params[i];
        uint64_t key = mix64(seed ^ hash_name(p->name));
        for (size_t j = 0; j < p->numel; j++)
            host[j] = p->init_one ? 1.0f : p->init_std > 0 ? p->init_std * normal_at(key, j) : 0;
        tr_model_set_param(m, i, host);
    }
    free(host);
    if (m->grad) m->be->zero(m->grad, m->n_pad * m->es);
    m->be->zero(m->adam_m, (m->opt_hi - m->opt_lo) * sizeof(float));
    m->be->zero(m->adam_v, (m->opt_hi - m->opt_lo) * sizeof(float));
    m->adam_t = 0;
}

/* ---- forward / backward --------------------------------------------------------------- */

static tr_buf *ACT(const tr_model *m, size_t off) {
    if (off & TRANSIENT) return tr_buf_at(m->be, m->tact, off & ~TRANSIENT);
    return tr_buf_at(m->be, m->act, off);
}
static float *STAT(const tr_model *m, size_t off) {
    if (off & TRANSIENT) return m->tstats + (off & ~TRANSIENT);
    return m->stats + off;
}
static tr_buf *P(const tr_model *m, int i) {
    return i < 0 ? NULL : m->paddr[i];
}
/* ZeRO-3's op hook around everything an op computes (dir +1 forward, -1 backward) */
static void op_begin(tr_model *m, int i, int dir) {
    if (m->ohook) m->ohook(m->octx, i, dir > 0 && m->recompute_to ? 2 : dir, 0);
}
static void op_end(tr_model *m, int i, int dir) {
    if (m->ohook) m->ohook(m->octx, i, dir > 0 && m->recompute_to ? 2 : dir, 1);
}
static tr_buf *G(const tr_model *m, int i) {
    return i < 0 ? NULL : m->gaddr[i];
}
/* row r of an (N, width) storage buffer */
static tr_buf *ROW(const tr_model *m, const tr_buf *base, size_t r, size_t width) {
    return tr_buf_at(m->be, base, r * width);
}

/* One op forward over B sequences of T tokens (the head is not run here). */
static void forward_op(tr_model *m, const op_t *op, int B, int T) {
    const tr_backend *be = m->be;
    const int N = B * T, C = m->desc.dim;
    const tr_node *n = op->node;
    switch (op->kind) {
    case OP_EMBED:
        be->embedding_forward(ACT(m, op->out), m->tokens, P(m, op->p[0]), N, C);
        break;
    case OP_POS:
        be->positions_forward(ACT(m, op->out), P(m, op->p[0]), B, T, C);
        break;
    case OP_LAYERNORM:
        be->layernorm_forward(ACT(m, op->out), STAT(m, op->s[0]), STAT(m, op->s[1]), ACT(m, op->in),
                              P(m, op->p[0]), P(m, op->p[1]), N, C, n->eps);
        break;
    case OP_RMSNORM:
        be->rmsnorm_forward(ACT(m, op->out), STAT(m, op->s[1]), ACT(m, op->in), P(m, op->p[0]), N,
                            C, n->eps);
        break;
    case OP_ATTENTION: {
        int H = n->heads, KV = n->kv_heads, hd = C / H, qkv = (H + 2 * KV) * hd;
        be->linear_forward(ACT(m, op->s[0]), ACT(m, op->in), P(m, op->p[0]), P(m, op->p[1]), N, C,
                           qkv);
        if (n->rope_theta > 0) be->rope_forward(ACT(m, op->s[0]), B, T, H, KV, hd, n->rope_theta);
        be->attention_forward(ACT(m, op->s[1]), STAT(m, op->s[2]), ACT(m, op->s[0]), B, T, H, KV,
                              hd);
        be->linear_forward(ACT(m, op->out), ACT(m, op->s[1]), P(m, op->p[2]), P(m, op->p[3]), N,
                           H * hd, C);
        break;
    }
    case OP_MLP: {
        int h = n->hidden, swiglu = n->activation == TR_ACT_SWIGLU;
        /* the GELU in the product's epilogue; not under selective recompute, whose backward
           recomputes the activation with gelu_forward and must get the same bits */
        int fuse = !swiglu && be->linear_gelu_forward && m->recompute != TR_RECOMPUTE_SELECTIVE;
        if (fuse)
            be->linear_gelu_forward(ACT(m, op->s[1]), ACT(m, op->s[0]), ACT(m, op->in),
                                    P(m, op->p[0]), P(m, op->p[1]), N, C, h);
        else
            be->linear_forward(ACT(m, op->s[0]), ACT(m, op->in), P(m, op->p[0]), P(m, op->p[1]), N,
                               C, swiglu ? 2 * h : h);
        if (swiglu)
            be->swiglu_forward(ACT(m, op->s[1]), ACT(m, op->s[0]), N, h);
        else if (!fuse)
            be->gelu_forward(ACT(m, op->s[1]), ACT(m, op->s[0]), (size_t)N * (size_t)h);
        be->linear_forward(ACT(m, op->out), ACT(m, op->s[1]), P(m, op->p[2]), P(m, op->p[3]), N, h,
                           C);
        break;
    }
    case OP_RES_BEGIN:
        break;
    case OP_RES_END:
        be->add(ACT(m, op->out), ACT(m, op->s[0]), ACT(m, op->in), (size_t)N * (size_t)C);
        break;
    case OP_HEAD:
        break;
    }
}

/* A residual's end followed by the norm of its output: one fused pass when the backend has it. */
static int fuses_with_next(const tr_model *m, int i, int to) {
    const op_t *op = &m->ops[i], *nx = op + 1;
    return m->be->residual_norm_forward && op->kind == OP_RES_END && i + 1 < to &&
           (nx->kind == OP_LAYERNORM || nx->kind == OP_RMSNORM) && nx->in == op->out;
}

/* Run ops [from, to) forward, stopping at the head; returns the head op when reached. */
static const op_t *forward_range(tr_model *m, int from, int to, int B, int T) {
    for (int i = from; i < to; i++) {
        if (m->ops[i].kind == OP_HEAD) return &m->ops[i];
        if (fuses_with_next(m, i, to)) {
            const op_t *r = &m->ops[i], *nm = r + 1;
            int rms = nm->kind == OP_RMSNORM;
            op_begin(m, i, +1);
            op_begin(m, i + 1, +1);
            m->be->residual_norm_forward(ACT(m, r->out), ACT(m, nm->out),
                                         rms ? NULL : STAT(m, nm->s[0]), STAT(m, nm->s[1]),
                                         ACT(m, r->s[0]), ACT(m, r->in), P(m, nm->p[0]),
                                         P(m, nm->p[1]), B * T, m->desc.dim, nm->node->eps, rms);
            op_end(m, i, +1);
            op_end(m, i + 1, +1);
            i++;
            continue;
        }
        op_begin(m, i, +1);
        forward_op(m, &m->ops[i], B, T);
        op_end(m, i, +1);
    }
    return NULL;
}

/* Run every op but the head; returns the head op (build() checked there is one). */
static const op_t *forward_body(tr_model *m, int B, int T) {
    return forward_range(m, 0, m->n_ops, B, T);
}

float tr_model_forward(tr_model *m, const int *tokens, const int *targets, int B, int T,
                       float grad_scale) {
    const tr_backend *be = m->be;
    const int N = B * T, C = m->desc.dim, V = m->desc.vocab;
    be->upload(m->tokens, tokens, (size_t)N * sizeof(int));
    const op_t *head = forward_body(m, B, T);
    m->lastB = B;
    m->lastT = T;
    m->last_scale = targets ? grad_scale : 0;
    if (!targets) return 0;
    be->upload(m->targets, targets, (size_t)N * sizeof(int));
    int hi = (int)(head - m->ops);
    op_begin(m, hi, +1);
    const tr_buf *x = ACT(m, head->in), *w = P(m, head->p[0]);
    int want = grad_scale > 0;
    if (want && m->pre_hook) m->pre_hook(m->pre_ctx, head->p[0]);
    tr_buf *dw = G(m, head->p[0]), *dx = m->gbuf[0];
    float dscale = grad_scale / (float)N;
    for (int r = 0; r < N; r += (int)m->head_rows) {
        int n = N - r < (int)m->head_rows ? N - r : (int)m->head_rows;
        be->linear_forward(m->logits, ROW(m, x, (size_t)r, (size_t)C), w, NULL, n, C, m->Vp);
        be->softmax_xent(m->logits, m->losses + r, m->targets + r, n, V, m->Vp, dscale, want);
        if (want)
            be->linear_backward(ROW(m, dx, (size_t)r, (size_t)C), dw, NULL, m->logits,
                                ROW(m, x, (size_t)r, (size_t)C), w, n, C, m->Vp);
    }
    op_end(m, hi, +1);
    /* a tied embedding: the head's part of its gradient is done; its backward adds the rest */
    if (want && m->partial_hook && head->p[0] == m->embed_param)
        m->partial_hook(m->partial_ctx, head->p[0]);
    be->download(m->host_losses, m->losses, (size_t)N * sizeof(float));
    double sum = 0;
    for (int i = 0; i < N; i++)
        sum += m->host_losses[i];
    return (float)(sum / N);
}

void tr_model_backward(tr_model *m) {
    const tr_backend *be = m->be;
    const int B = m->lastB, T = m->lastT, N = B * T, C = m->desc.dim;
    /* Gradient streams: level d of residual nesting ping-pongs between gbuf[2d] and
       gbuf[2d+1]; a residual's skip gradient stays in the enclosing level's buffer, so the
       branch never overwrites it and no copy is needed. */
    tr_buf *g = m->gbuf[0];
    tr_buf *skip[64];
    for (int i = m->n_ops - 1; i >= 0; i--) {
        const op_t *op = &m->ops[i];
        const tr_node *n = op->node;
        op_begin(m, i, -1);
        if (m->pre_hook && op->kind != OP_HEAD) /* the head's gradient was placed in forward */
            for (int k = 0; k < 4; k++)
                if (op->p[k] >= 0) m->pre_hook(m->pre_ctx, op->p[k]);
        tr_buf *a = m->gbuf[2 * op->depth], *b = m->gbuf[2 * op->depth + 1];
        tr_buf *next = g == a ? b : a;
        switch (op->kind) {
        case OP_HEAD:
            break;
        case OP_RES_END:
            skip[op->depth] = g;
            /* full recompute: the branch's tensors were overwritten by later branches; run
               its forward again from its input (kept) before going back through it */
            if (m->recompute == TR_RECOMPUTE_FULL && op->depth == 0 && i != m->last_branch_end) {
                m->recompute_to = i;
                forward_range(m, op->match + 1, i, B, T);
                m->recompute_to = 0;
            }
            break;
        case OP_RES_BEGIN:
            be->add(skip[op->depth], skip[op->depth], g, (size_t)N * (size_t)C);
            g = skip[op->depth];
            break;
        case OP_LAYERNORM:
            be->layernorm_backward(next, G(m, op->p[0]), G(m, op->p[1]), g, ACT(m, op->in),
                                   P(m, op->p[0]), STAT(m, op->s[0]), STAT(m, op->s[1]), N, C);
            g = next;
            break;
        case OP_RMSNORM:
            be->rmsnorm_backward(next, G(m, op->p[0]), g, ACT(m, op->in), P(m, op->p[0]),
                                 STAT(m, op->s[1]), N, C);
            g = next;
            break;
        case OP_ATTENTION: {
            int H = n->heads, KV = n->kv_heads, hd = C / H, qkv = (H + 2 * KV) * hd;
            be->linear_backward(m->scratch1, G(m, op->p[2]), G(m, op->p[3]), g, ACT(m, op->s[1]),
                                P(m, op->p[2]), N, H * hd, C);
            be->attention_backward(m->scratch2, m->scratch1, ACT(m, op->s[0]), ACT(m, op->s[1]),
                                   STAT(m, op->s[2]), B, T, H, KV, hd);
            if (n->rope_theta > 0) be->rope_backward(m->scratch2, B, T, H, KV, hd, n->rope_theta);
            be->linear_backward(next, G(m, op->p[0]), G(m, op->p[1]), m->scratch2, ACT(m, op->in),
                                P(m, op->p[0]), N, C, qkv);
            g = next;
            break;
        }
        case OP_MLP: {
            int h = n->hidden, swiglu = n->activation == TR_ACT_SWIGLU;
            if (m->recompute == TR_RECOMPUTE_SELECTIVE) { /* the shared activation buffer */
                if (swiglu)
                    be->swiglu_forward(ACT(m, op->s[1]), ACT(m, op->s[0]), N, h);
                else
                    be->gelu_forward(ACT(m, op->s[1]), ACT(m, op->s[0]), (size_t)N * (size_t)h);
            }
            if (!swiglu && be->linear_backward_gelu) { /* through the GELU in one call */
                be->linear_backward_gelu(m->scratch2, G(m, op->p[2]), G(m, op->p[3]), g,
                                         ACT(m, op->s[1]), P(m, op->p[2]), ACT(m, op->s[0]), N, h,
                                         C);
            } else {
                be->linear_backward(m->scratch1, G(m, op->p[2]), G(m, op->p[3]), g,
                                    ACT(m, op->s[1]), P(m, op->p[2]), N, h, C);
                if (swiglu)
                    be->swiglu_backward(m->scratch2, m->scratch1, ACT(m, op->s[0]), N, h);
                else
                    be->gelu_backward(m->scratch2, m->scratch1, ACT(m, op->s[0]),
                                      (size_t)N * (size_t)h);
            }
            be->linear_backward(next, G(m, op->p[0]), G(m, op->p[1]), m->scratch2, ACT(m, op->in),
                                P(m, op->p[0]), N, C, swiglu ? 2 * h : h);
            g = next;
            break;
        }
        case OP_POS:
            be->positions_backward(G(m, op->p[0]), g, B, T, C);
            break;
        case OP_EMBED:
            be->embedding_backward(G(m, op->p[0]), g, m->tokens, N, C);
            break;
        }
        if (m->hook)
            for (int k = 0; k < 4; k++)
                if (op->p[k] >= 0 && m->ready_op[op->p[k]] == i) m->hook(m->hook_ctx, op->p[k]);
        op_end(m, i, -1);
    }
}

void tr_model_zero_grad(tr_model *m) {
    if (m->grad) m->be->zero(m->grad, m->n_pad * m->es); /* placed gradients: the caller's */
}

double tr_model_grad_norm(tr_model *m) {
    /* padding between tensors is never written, so the whole slab can be summed at once */
    return m->grad ? sqrt(m->be->sumsq(m->grad, m->n_pad)) : NAN;
}

void tr_model_adamw_step(tr_model *m, const tr_adamw *o) {
    /* the optimizer shard (all of the slab without sharding) is one piece of the slab */
    tr_piece all = {m->opt_lo, m->opt_hi, tr_buf_at(m->be, m->grad, m->opt_lo), 0};
    tr_model_adamw_pieces(m, o, &all, 1);
}

size_t tr_model_slab_elements(const tr_model *m) {
    return m->n_pad;
}
tr_buf *tr_model_param_slab(tr_model *m) {
    return m->param;
}
tr_buf *tr_model_grad_slab(tr_model *m) {
    return m->grad;
}
void tr_model_optim_range(const tr_model *m, size_t *lo, size_t *hi) {
    *lo = m->opt_lo;
    *hi = m->opt_hi;
}
void tr_model_set_grad_hook(tr_model *m, tr_grad_hook fn, void *ctx) {
    m->hook = fn;
    m->hook_ctx = ctx;
}
void tr_model_set_pre_grad_hook(tr_model *m, tr_grad_hook fn, void *ctx) {
    m->pre_hook = fn;
    m->pre_ctx = ctx;
}
void tr_model_set_partial_hook(tr_model *m, tr_grad_hook fn, void *ctx) {
    m->partial_hook = fn;
    m->partial_ctx = ctx;
}
void tr_model_set_grad_addr(tr_model *m, int i, tr_buf *addr) {
    m->gaddr[i] = addr;
}

int tr_model_alloc_optim(tr_model *m, size_t elems) {
    const tr_backend *be = m->be;
    size_t n = elems ? elems : 16;
    if (!be) { /* a planned model: the sizes only */
        m->opt_lo = 0;
        m->opt_hi = elems;
        if (m->external_params) m->piece_elems = elems;
        return 0;
    }
    be->free(m->adam_m);
    be->free(m->adam_v);
    m->adam_m = be->alloc(n * sizeof(float));
    m->adam_v = be->alloc(n * sizeof(float));
    m->opt_lo = 0;
    m->opt_hi = elems;
    int ok = m->adam_m && m->adam_v;
    if (m->external_params) { /* the pieces' master weights and working copy, zeroed */
        if (m->wpar != m->master) be->free(m->wpar);
        be->free(m->master);
        m->master = be->alloc(n * sizeof(float));
        m->wpar = be->dtype == TR_DTYPE_F32 ? (tr_buf *)m->master : be->alloc(n * m->es);
        m->piece_elems = elems;
        ok = ok && m->master && m->wpar;
        if (ok) {
            be->zero(m->master, n * sizeof(float));
            if (m->wpar != m->master) be->zero(m->wpar, n * m->es);
        }
    }
    if (ok) {
        be->zero(m->adam_m, n * sizeof(float));
        be->zero(m->adam_v, n * sizeof(float));
    }
    return ok ? 0 : -1;
}

void tr_model_set_pieces(tr_model *m, const tr_piece *p, int n) {
    free(m->pieces);
    m->pieces = malloc((size_t)(n ? n : 1) * sizeof(tr_piece));
    memcpy(m->pieces, p, (size_t)n * sizeof(tr_piece));
    m->n_pieces = n;
}

tr_buf *tr_model_param_pieces(tr_model *m) {
    return m->wpar;
}
float *tr_model_master_pieces(tr_model *m) {
    return m->master;
}

void tr_model_set_param_addr(tr_model *m, int i, tr_buf *addr) {
    m->paddr[i] = addr;
}

void tr_model_set_op_hook(tr_model *m, tr_op_hook fn, void *ctx) {
    m->ohook = fn;
    m->octx = ctx;
}

int tr_model_recompute_end(const tr_model *m) {
    return m->recompute_to;
}

int tr_model_num_ops(const tr_model *m) {
    return m->n_ops;
}

int tr_model_op_params(const tr_model *m, int i, int dir, int p[4]) {
    const op_t *op = &m->ops[i];
    int n = 0;
    /* the backward of the embedding and positions reads only the gradient; the head's
       backward happened in its forward */
    if (dir < 0 && (op->kind == OP_EMBED || op->kind == OP_POS || op->kind == OP_HEAD)) return 0;
    for (int k = 0; k < 4; k++)
        if (op->p[k] >= 0) p[n++] = op->p[k];
    return n;
}

void tr_model_adamw_pieces(tr_model *m, const tr_adamw *o, const tr_piece *pc, int n) {
    m->adam_t++;
    float bc1 = (float)(1.0 - pow((double)o->beta1, (double)m->adam_t));
    float bc2 = (float)(1.0 - pow((double)o->beta2, (double)m->adam_t));
    int ns = 0;
    for (int k = 0; k < n; k++)
        for (int i = 0; i < m->n_params; i++) { /* each tensor's part of the piece */
            const tr_param *p = &m->params[i];
            size_t lo = p->offset > pc[k].lo ? p->offset : pc[k].lo;
            size_t hi = p->offset + p->numel < pc[k].hi ? p->offset + p->numel : pc[k].hi;
            if (lo >= hi) continue;
            size_t at = pc[k].state + (lo - pc[k].lo);
            /* ZeRO-3 keeps the weights of its pieces like their state; else in the slab */
            size_t w = m->external_params ? at : lo;
            if (ns == m->cap_segs) {
                m->cap_segs = m->cap_segs ? 2 * m->cap_segs : 64;
                m->segs = realloc(m->segs, (size_t)m->cap_segs * sizeof(tr_adamw_seg));
                if (!m->segs) {
                    fprintf(stderr, "trainer: out of memory for the optimizer step\n");
                    abort();
                }
            }
            m->segs[ns++] = (tr_adamw_seg){
                .master = m->master + w,
                .param = tr_buf_at(m->be, m->external_params ? m->wpar : m->param, w),
                .grad = tr_buf_at(m->be, pc[k].grad, lo - pc[k].lo),
                .m = m->adam_m + at, .v = m->adam_v + at, .n = hi - lo,
                .wd = p->decay ? o->weight_decay : 0.0f};
        }
    if (m->be->adamw_multi) { /* one pass (one launch) over every stretch */
        m->be->adamw_multi(m->segs, ns, o->lr, o->beta1, o->beta2, o->eps, bc1, bc2,
                           o->grad_scale);
        return;
    }
    for (int k = 0; k < ns; k++) {
        const tr_adamw_seg *g = &m->segs[k];
        m->be->adamw(g->master, g->param, g->grad, g->m, g->v, g->n, o->lr, o->beta1, o->beta2,
                     o->eps, g->wd, bc1, bc2, o->grad_scale);
    }
}

void tr_model_last_logits(tr_model *m, const int *tokens, int B, int T, float *logits) {
    const tr_backend *be = m->be;
    const int C = m->desc.dim, V = m->desc.vocab;
    be->upload(m->tokens, tokens, (size_t)B * T * sizeof(int));
    const op_t *head = forward_body(m, B, T);
    op_begin(m, (int)(head - m->ops), +1);
    for (int b = 0; b < B; b++) {
        const tr_buf *x = ROW(m, ACT(m, head->in), (size_t)b * T + (size_t)(T - 1), (size_t)C);
        be->linear_forward(m->logits, x, P(m, head->p[0]), NULL, 1, C, m->Vp);
        be->from_storage(logits + (size_t)b * V, m->logits, (size_t)V);
    }
    op_end(m, (int)(head - m->ops), +1);
}

void tr_model_all_logits(tr_model *m, const int *tokens, int B, int T, float *logits) {
    const tr_backend *be = m->be;
    const int N = B * T, C = m->desc.dim, V = m->desc.vocab;
    be->upload(m->tokens, tokens, (size_t)N * sizeof(int));
    const op_t *head = forward_body(m, B, T);
    op_begin(m, (int)(head - m->ops), +1);
    for (int r = 0; r < N; r += (int)m->head_rows) {
        int n = N - r < (int)m->head_rows ? N - r : (int)m->head_rows;
        be->linear_forward(m->logits, ROW(m, ACT(m, head->in), (size_t)r, (size_t)C),
                           P(m, head->p[0]), NULL, n, C, m->Vp);
        for (int i = 0; i < n; i++) /* the V real columns of each row */
            be->from_storage(logits + (size_t)(r + i) * V,
                             tr_buf_at(be, m->logits, (size_t)i * (size_t)m->Vp), (size_t)V);
    }
    op_end(m, (int)(head - m->ops), +1);
}

/* ---- incremental decoding ------------------------------------------------------------- */

struct tr_kv_cache {
    tr_model *m;
    tr_buf **k, **v; /* per op: (seq_len, KV*hd) caches of the attention ops, NULL elsewhere */
};

int tr_kv_cache_init(tr_kv_cache **out, tr_model *m, char *err, size_t errlen) {
    *out = NULL;
    if (!m->be->decode_attention) {
        snprintf(err, errlen, "the %s backend cannot decode with a KV cache", m->be->name);
        return -1;
    }
    tr_kv_cache *c = calloc(1, sizeof(*c));
    c->m = m;
    c->k = calloc((size_t)m->n_ops, sizeof(tr_buf *));
    c->v = calloc((size_t)m->n_ops, sizeof(tr_buf *));
    for (int i = 0; i < m->n_ops; i++) {
        const tr_node *n = m->ops[i].node;
        if (m->ops[i].kind != OP_ATTENTION) continue;
        size_t bytes = (size_t)m->desc.seq_len * (size_t)(n->kv_heads * (m->desc.dim / n->heads)) *
                       m->es;
        c->k[i] = m->be->alloc(bytes);
        c->v[i] = m->be->alloc(bytes);
        if (!c->k[i] || !c->v[i]) {
            snprintf(err, errlen, "cannot allocate the KV cache");
            tr_kv_cache_free(c);
            return -1;
        }
    }
    *out = c;
    return 0;
}

void tr_kv_cache_free(tr_kv_cache *c) {
    if (!c) return; /* NULL is a no-op */
    for (int i = 0; i < c->m->n_ops; i++) {
        c->m->be->free(c->k[i]);
        c->m->be->free(c->v[i]);
    }
    free(c->k);
    free(c->v);
    free(c);
}

void tr_model_decode(tr_model *m, tr_kv_cache *c, int token, int pos, float *logits) {
    const tr_backend *be = m->be;
    const int C = m->desc.dim, V = m->desc.vocab;
    be->upload(m->tokens, &token, sizeof(int));
    for (int i = 0; i < m->n_ops; i++) {
        const op_t *op = &m->ops[i];
        const tr_node *n = op->node;
        op_begin(m, i, +1);
        if (op->kind == OP_POS) { /* row `pos` of the position table */
            be->positions_forward(ACT(m, op->out), ROW(m, P(m, op->p[0]), (size_t)pos, (size_t)C),
                                  1, 1, C);
        } else if (op->kind == OP_ATTENTION) {
            int H = n->heads, KV = n->kv_heads, hd = C / H, qkv = (H + 2 * KV) * hd;
            be->linear_forward(ACT(m, op->s[0]), ACT(m, op->in), P(m, op->p[0]), P(m, op->p[1]),
                               1, C, qkv);
            be->decode_attention(ACT(m, op->s[1]), ACT(m, op->s[0]), c->k[i], c->v[i], pos, H, KV,
                                 hd, n->rope_theta);
            be->linear_forward(ACT(m, op->out), ACT(m, op->s[1]), P(m, op->p[2]), P(m, op->p[3]),
                               1, H * hd, C);
        } else if (op->kind == OP_HEAD) {
            be->linear_forward(m->logits, ACT(m, op->in), P(m, op->p[0]), NULL, 1, C, m->Vp);
            be->from_storage(logits, m->logits, (size_t)V);
            op_end(m, i, +1);
            return;
        } else {
            forward_op(m, op, 1, 1);
        }
        op_end(m, i, +1);
    }
}
