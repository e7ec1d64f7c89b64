/* The model's builder: the recipe's layer tree is flattened once into a program of ops
 * (embedding, norms, attention, MLP, residual begin/end, head); a measuring pass over that
 * program assigns every activation its offset in one arena and every parameter its place in
 * one slab. Also the model's accessors and the hooks of the parallel runtime. The model's
 * lifetime and memory (arena layout, figures, allocation) are model_memory.c; running the
 * program is exec.c; parameters and the optimizer are params.c. */
#include "model/model_private.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- building the program ------------------------------------------------------------- */

typedef struct {
    tr_model *m;
    size_t cursor;                /* activation arena cursor (storage elements) */
    size_t stat_cursor;           /* statistics arena cursor (floats) */
    size_t tcursor, tstat_cursor; /* transient arenas' cursors, reset per top-level branch */
    size_t N;                     /* rows of the largest micro-batch */
    size_t Ns;                    /* rows of the residual stream: N, or N / tp with sequence
                                     parallelism */
    int depth;
    /* pipeline chunks: blocks started so far, the chunk being built, whether it is held here
       (a chunk that is not takes no activations), whether the node being flattened is a child
       of the root (its stacks' repetitions are the blocks) */
    const tr_model_opts *o;
    const tr_node *root;
    int blocks, chunk, skip, top_level;
    char err[256];
} builder;

size_t model_align16(size_t n) {
    return (n + 15) & ~(size_t)15;
}

/* Under full recompute, everything inside a top-level residual branch is transient. */
static int in_branch(const builder *b) {
    return b->m->recompute == TR_RECOMPUTE_FULL && b->depth >= 1;
}

static size_t take(size_t *cursor, size_t *high, size_t width, size_t N) {
    size_t off = *cursor;
    *cursor += model_align16(width * N);
    if (high && *cursor > *high) *high = *cursor;
    return off;
}

/* An activation of `width` per row, over all N rows (the inside of a split layer) or over the
 * Ns rows of the residual stream (`stream`: outputs of layers, norms and their statistics). */
static size_t act_take(builder *b, size_t width, int stream) {
    size_t rows = stream ? b->Ns : b->N;
    if (b->skip) return 0; /* a chunk another pipeline rank holds */
    if (in_branch(b)) return TRANSIENT | take(&b->tcursor, &b->m->tact_floats, width, rows);
    return take(&b->cursor, NULL, width, rows);
}

static size_t stat_take(builder *b, size_t width, int stream) {
    size_t rows = stream ? b->Ns : b->N;
    if (b->skip) return 0;
    if (in_branch(b)) return TRANSIENT | take(&b->tstat_cursor, &b->m->tstat_floats, width, rows);
    return take(&b->stat_cursor, NULL, width, rows);
}

/* prefix: the node's name in the model's tree with a trailing dot ("stack.0.residual0."),
 * which names the op's output for tools (tr_model_op_name). */
static op_t *op_push(builder *b, op_kind kind, const tr_node *n, const char *prefix) {
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
    op->chunk = b->chunk;
    snprintf(op->name, sizeof(op->name), "%.*s", (int)strlen(prefix) - 1, prefix);
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
    m->n_floats += model_align16(p->numel);
    return m->n_params++;
}

/* ---- where a tensor-parallel rank's tensors lie in the global ones ----
 * A tensor is added with this rank's shape; these record the global shape and how its rows
 * and columns map there (model.h, tr_param_seg). */

/* Replicated on every rank of the tp group; `partial`: each computes part of its gradient. */
static void replicate(tr_model *m, int i, int partial) {
    tr_param *p = &m->params[i];
    p->seg[0].copies = m->tp;
    p->seg[0].copy = m->tpr;
    p->seg[0].partial = partial && m->tp > 1;
}

/* Rows split: local rows come in `n` segments of rows[k] rows, segment k at global row
 * grow[k] of a global tensor of grows rows. */
static void split_rows(tr_model *m, int i, int grows, int n, const int *rows, const int *grow) {
    tr_param *p = &m->params[i];
    p->gshape[0] = grows;
    p->n_seg = n;
    for (int k = 0, r = 0; k < n; r += rows[k], k++)
        p->seg[k] = (tr_param_seg){.row = r, .rows = rows[k], .grow = grow[k], .copies = 1};
}

/* Columns split: local columns are global columns [col, col + shape[1]) of gcols. */
static void split_cols(tr_model *m, int i, int gcols, int col) {
    tr_param *p = &m->params[i];
    p->gshape[1] = gcols;
    p->col = col;
}

/* A vocabulary matrix (V, C) just added with this rank's vn real rows: reserve its Vl rows
 * in the slab (the padding rows stay zero: the head's products run over Vl rows) and place
 * them at global row vlo. */
static void vocab_rows(tr_model *m, int i) {
    tr_param *p = &m->params[i];
    p->extent = (size_t)m->Vl * (size_t)p->shape[1];
    m->n_floats = p->offset + model_align16(p->extent);
    split_rows(m, i, m->desc.vocab, 1, &m->vn, &m->vlo);
}

/* Attention's parameters on this rank: its H / tp query heads, and either its KV / tp
 * key/value heads or (tp a multiple of KV) the one its query heads read, shared with the
 * tp / KV - 1 other ranks whose query heads read it (each computes part of its gradient). */
static void attention_params(builder *b, op_t *op, const tr_node *n, const char *prefix,
                             float std, float proj_std) {
    tr_model *m = b->m;
    const int C = m->desc.dim, H = n->heads, KV = n->kv_heads, hd = C / H, T = m->tp;
    if (H % T || (KV % T && T % KV)) { /* the layout refuses these first, with a hint */
        snprintf(b->err, sizeof(b->err), "model: tp %d must divide the heads (%d) and divide "
                 "or be a multiple of the kv_heads (%d) of every attention", T, H, KV);
        return;
    }
    int share = KV % T == 0 ? 1 : T / KV; /* ranks holding each key/value head */
    op->H = H / T;
    op->KV = share == 1 ? KV / T : 1;
    int kv0 = share == 1 ? m->tpr * op->KV : m->tpr / share; /* this rank's first kv head */
    int q = op->H * hd, kv = op->KV * hd, qkv = q + 2 * kv;
    int rows[3] = {q, kv, kv}, grow[3] = {m->tpr * q, H * hd + kv0 * hd, (H + KV) * hd + kv0 * hd};
    for (int k = 0; k < 2; k++) {
        if (k && !n->bias) break;
        int i = param_add(b, prefix, k ? "qkv.bias" : "qkv.weight", k ? 1 : 2, qkv, C,
                          k ? 0 : std, 0);
        split_rows(m, i, (H + 2 * KV) * hd, 3, rows, grow);
        for (int s = 1; s < 3 && share > 1; s++) /* the shared key/value rows */
            m->params[i].seg[s] = (tr_param_seg){.row = m->params[i].seg[s].row, .rows = kv,
                                                 .grow = grow[s], .copies = share,
                                                 .copy = m->tpr % share, .partial = 1};
        op->p[k] = i;
    }
    op->p[2] = param_add(b, prefix, "out.weight", 2, C, q, proj_std, 0);
    split_cols(m, op->p[2], H * hd, m->tpr * q);
    if (n->bias) { /* added once, after the products' partial sums are reduced */
        op->p[3] = param_add(b, prefix, "out.bias", 1, C, 1, 0, 0);
        replicate(m, op->p[3], 0);
    }
}

/* The MLP's parameters on this rank: hidden units [tpr * h, (tpr + 1) * h) of the first
 * product (of both its gate and up halves for SwiGLU) and the matching columns of the second. */
static void mlp_params(builder *b, op_t *op, const tr_node *n, const char *prefix, float std,
                       float proj_std) {
    tr_model *m = b->m;
    const int C = m->desc.dim, swiglu = n->activation == TR_ACT_SWIGLU;
    if (n->hidden % m->tp) {
        snprintf(b->err, sizeof(b->err), "model: tp %d must divide the hidden width (%d) of "
                 "every mlp", m->tp, n->hidden);
        return;
    }
    int h = n->hidden / m->tp, fc = swiglu ? 2 * h : h;
    int rows[2] = {h, h}, grow[2] = {m->tpr * h, n->hidden + m->tpr * h};
    op->hid = h;
    op->p[0] = param_add(b, prefix, "fc.weight", 2, fc, C, std, 0);
    split_rows(m, op->p[0], swiglu ? 2 * n->hidden : n->hidden, swiglu ? 2 : 1, rows, grow);
    if (n->bias) {
        op->p[1] = param_add(b, prefix, "fc.bias", 1, fc, 1, 0, 0);
        split_rows(m, op->p[1], swiglu ? 2 * n->hidden : n->hidden, swiglu ? 2 : 1, rows, grow);
    }
    op->p[2] = param_add(b, prefix, "proj.weight", 2, C, h, proj_std, 0);
    split_cols(m, op->p[2], n->hidden, m->tpr * h);
    if (n->bias) {
        op->p[3] = param_add(b, prefix, "proj.bias", 1, C, 1, 0, 0);
        replicate(m, op->p[3], 0);
    }
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

/* ---- pipeline chunks ----
 * The program is cut at block boundaries (tr_cost_blocks: each repetition of a top-level
 * stack starts a block). A chunk another rank holds is flattened like any other, so that ops
 * keep their indices on every rank, but takes no activations, and its parameters are dropped
 * afterwards (keep_held_params). */

static int chunk_of_block(const builder *b, int block) {
    int c = 0;
    while (c + 1 < b->m->n_chunks && b->o->chunk_start[c + 1] <= block)
        c++;
    return c;
}

/* Chunk c starts here: a held chunk after the first gets its own input stream, into which the
 * previous chunk's output is received. Returns the stream its first op reads. */
static size_t chunk_begin(builder *b, int c, size_t cur) {
    tr_model *m = b->m;
    chunk_t *k = &m->chunks[c];
    b->chunk = c;
    k->lo = m->n_ops;
    k->held = m->pipelined ? b->o->held[c] != 0 : 1;
    k->slots = m->pipelined && b->o->slots[c] > 1 ? b->o->slots[c] : 1;
    k->nrecv = m->pipelined && b->o->grad_recv[c] > 0 ? b->o->grad_recv[c] : k->slots;
    k->nsend = m->pipelined && b->o->grad_send[c] > 0 ? b->o->grad_send[c] : k->slots;
    b->skip = !k->held;
    k->abase = b->cursor;
    k->sbase = b->stat_cursor;
    if (c > 0) cur = act_take(b, (size_t)m->desc.dim, 1);
    k->in = cur;
    return cur;
}

/* Whether the split backward's weight part reads stream `t` of chunk ops [lo, n_ops): as the
 * input of an attention or MLP op (their only reads of the stream in that part). */
static int weights_read(const tr_model *m, int lo, size_t t) {
    for (int j = lo; j < m->n_ops; j++)
        if ((m->ops[j].kind == OP_ATTENTION || m->ops[j].kind == OP_MLP) && m->ops[j].in == t)
            return 1;
    return 0;
}

/* A split backward's output gradients (op->dy), kept from the input part for the weight part,
 * for the attention and MLP ops of the chunk ending here. Each goes over a tensor of the op
 * that only the input part reads, so that a micro-batch waiting for its weight part holds no
 * more than one in its forward (ZB-H1 at 1F1B's activation memory): the product's input
 * gradient (N, qkv or fc) over the op's q, k, v or pre-activation (s[0], same shape; not
 * with selective recompute, whose MLP recomputes its activation from it in the weight part),
 * the output product's (N, C) over the op's output stream when that has N rows (not with
 * sequence parallelism), is not the chunk's output (it may still be on its way to the next
 * stage) and is no weight part's input. What cannot go over a tensor gets its own room. */
static void place_output_grads(builder *b, int lo, size_t out) {
    tr_model *m = b->m;
    for (int i = lo; i < m->n_ops && m->split; i++) {
        op_t *op = &m->ops[i];
        if (op->kind != OP_ATTENTION && op->kind != OP_MLP) continue;
        int mlp = op->kind == OP_MLP, hd = mlp ? 0 : m->desc.dim / op->node->heads;
        size_t wide = mlp ? (size_t)(op->node->activation == TR_ACT_SWIGLU ? 2 : 1) * op->hid
                          : (size_t)(op->H + 2 * op->KV) * hd;
        int over_out = b->Ns == b->N && op->out != out && !weights_read(m, i + 1, op->out);
        op->dy[0] = over_out ? op->out : act_take(b, (size_t)m->desc.dim, 0);
        op->dy[1] = mlp && m->recompute == TR_RECOMPUTE_SELECTIVE ? act_take(b, wide, 0) : op->s[0];
    }
}

static void chunk_end(builder *b, size_t cur) {
    chunk_t *k = &b->m->chunks[b->chunk];
    place_output_grads(b, k->lo, cur);
    k->hi = b->m->n_ops;
    k->out = cur;
    k->aend = b->cursor;
    k->send = b->stat_cursor;
}

/* A repetition of a top-level stack: a new block, and a new chunk where a cut lies. Returns
 * the stream the block reads. */
static size_t block_begin(builder *b, size_t cur) {
    if (b->blocks++ == 0) return cur; /* block 0 began with the program */
    int c = chunk_of_block(b, b->blocks - 1);
    if (c == b->chunk) return cur;
    chunk_end(b, cur);
    return chunk_begin(b, c, cur);
}

/* cur: offset of the stream entering the node; returns the offset of the stream leaving it. */
static size_t flatten(builder *b, const tr_node *n, const char *prefix, size_t cur);

static size_t flatten_children(builder *b, const tr_node *n, const char *prefix, size_t cur) {
    for (int i = 0; i < n->n_children; i++) {
        char name[64], sub[TR_PARAM_NAME_MAX];
        child_name(n, i, name, sizeof(name));
        snprintf(sub, sizeof(sub), "%s%s.", prefix, name);
        b->top_level = n == b->root;
        cur = flatten(b, &n->children[i], sub, cur);
        if (b->err[0]) return cur;
    }
    return cur;
}

static size_t flatten(builder *b, const tr_node *n, const char *prefix, size_t cur) {
    tr_model *m = b->m;
    const int C = m->desc.dim;
    const float std = 0.02f,
                proj_std = 0.02f / sqrtf(2.0f * (float)(m->n_attention > 0 ? m->n_attention : 1));
    op_t *op;
    switch (n->kind) {
    case TR_NODE_SEQUENCE:
        return flatten_children(b, n, prefix, cur);
    case TR_NODE_STACK: {
        int top = b->top_level;
        for (int r = 0; r < n->repeat; r++) {
            char sub[TR_PARAM_NAME_MAX];
            snprintf(sub, sizeof(sub), "%s%d.", prefix, r);
            if (top) cur = block_begin(b, cur);
            cur = flatten_children(b, n, sub, cur);
            if (b->err[0]) return cur;
        }
        return cur;
    }
    case TR_NODE_RESIDUAL: {
        op = op_push(b, OP_RES_BEGIN, n, prefix);
        op->in = op->out = cur;
        int begin = m->n_ops - 1;
        if (b->depth == 0) b->tcursor = b->tstat_cursor = 0; /* a new top-level branch */
        b->depth++;
        if (b->depth > m->max_depth) m->max_depth = b->depth;
        size_t branch = flatten_children(b, n, prefix, cur);
        b->depth--;
        op = op_push(b, OP_RES_END, n, prefix);
        op->match = begin;
        if (b->depth == 0) m->last_branch_end = m->n_ops - 1;
        op->in = branch;
        op->s[0] = cur;
        op->out = act_take(b, (size_t)C, 1);
        return op->out;
    }
    case TR_NODE_EMBEDDING:
        op = op_push(b, OP_EMBED, n, prefix);
        op->p[0] = param_add(b, prefix, "weight", 2, m->vn, C, std, 0);
        vocab_rows(m, op->p[0]);
        m->embed_param = op->p[0];
        op->out = act_take(b, (size_t)C, 1);
        return op->out;
    case TR_NODE_POSITIONS:
        op = op_push(b, OP_POS, n, prefix);
        op->p[0] = param_add(b, prefix, "weight", 2, m->desc.seq_len, C, std, 0);
        replicate(m, op->p[0], m->sp); /* each rank adds it to its rows of the stream */
        op->in = op->out = cur; /* added in place: the embedding output is not needed later */
        return cur;
    case TR_NODE_ROPE: /* applied inside the attention layers that follow */
        return cur;
    case TR_NODE_LAYERNORM:
    case TR_NODE_RMSNORM:
        op = op_push(b, n->kind == TR_NODE_LAYERNORM ? OP_LAYERNORM : OP_RMSNORM, n, prefix);
        op->p[0] = param_add(b, prefix, "weight", 1, C, 1, 0, 1);
        replicate(m, op->p[0], m->sp);
        if (n->kind == TR_NODE_LAYERNORM && n->bias) {
            op->p[1] = param_add(b, prefix, "bias", 1, C, 1, 0, 0);
            replicate(m, op->p[1], m->sp);
        }
        op->in = cur;
        op->out = act_take(b, (size_t)C, 1);
        op->s[0] = stat_take(b, 1, 1); /* mean (unused by RMSNorm) */
        op->s[1] = stat_take(b, 1, 1); /* rstd */
        return op->out;
    case TR_NODE_ATTENTION: {
        op = op_push(b, OP_ATTENTION, n, prefix);
        attention_params(b, op, n, prefix, std, proj_std);
        if (b->err[0]) return cur;
        int hd = C / n->heads, q = op->H * hd, qkv = (op->H + 2 * op->KV) * hd;
        op->in = cur;
        op->s[0] = act_take(b, (size_t)qkv, 0);
        op->s[1] = act_take(b, (size_t)q, 0);
        op->s[2] = stat_take(b, (size_t)op->H, 0); /* lse */
        op->out = act_take(b, (size_t)C, 1); /* split backward: op->dy at the chunk's end */
        if (!b->skip && (size_t)qkv > m->width_scratch) m->width_scratch = (size_t)qkv;
        return op->out;
    }
    case TR_NODE_MLP: {
        op = op_push(b, OP_MLP, n, prefix);
        mlp_params(b, op, n, prefix, std, proj_std);
        if (b->err[0]) return cur;
        int h = op->hid, fc = n->activation == TR_ACT_SWIGLU ? 2 * h : h;
        op->in = cur;
        op->s[0] = act_take(b, (size_t)fc, 0);
        if (m->recompute == TR_RECOMPUTE_SELECTIVE) /* one shared buffer, recomputed */
            op->s[1] =
                b->skip ? 0 : TRANSIENT | take(&(size_t){0}, &m->tact_floats, (size_t)h, b->N);
        else
            op->s[1] = act_take(b, (size_t)h, 0);
        op->out = act_take(b, (size_t)C, 1); /* split backward: op->dy at the chunk's end */
        if (!b->skip && (size_t)fc > m->width_scratch) m->width_scratch = (size_t)fc;
        return op->out;
    }
    case TR_NODE_LM_HEAD:
        op = op_push(b, OP_HEAD, n, prefix);
        if (n->tied) {
            op->p[0] = m->embed_param;
        } else {
            op->p[0] = param_add(b, prefix, "weight", 2, m->vn, C, std, 0);
            vocab_rows(m, op->p[0]);
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

/* The pipeline options, checked (the layout checked them for the user; these are invariants
 * of callers): chunks cut at blocks 0 = start[0] < start[1] < ... < blocks. */
static int pipeline_opts(tr_model *m, const tr_model_desc *desc, const tr_model_opts *o, char *err,
                         size_t errlen) {
    int n = o->n_chunks > 0 ? o->n_chunks : 1, blocks = tr_cost_blocks(desc, 1, NULL, 0);
    m->pipelined = o->n_chunks > 0;
    m->head_here = 1; /* until keep_held_params says otherwise */
    m->split = m->pipelined && o->split_backward;
    m->n_chunks = n;
    m->chunks = calloc((size_t)n, sizeof(chunk_t));
    if (!m->chunks) {
        snprintf(err, errlen, "model: out of memory");
        return -1;
    }
    if (!m->pipelined) return 0;
    int ok = n <= TR_MAX_CHUNKS && o->chunk_start[0] == 0 && o->chunk_start[n] == blocks;
    for (int c = 0; ok && c < n; c++)
        ok = o->chunk_start[c] < o->chunk_start[c + 1];
    if (!ok) {
        snprintf(err, errlen, "model: %d pipeline chunks do not cut its %d blocks in order", n,
                 blocks);
        return -1;
    }
    if (m->split && m->recompute == TR_RECOMPUTE_FULL) {
        snprintf(err, errlen,
                 "model: a split backward needs the inputs of every product: "
                 "recompute \"none\" or \"selective\"");
        return -1;
    }
    m->pp_comm = o->pp_comm;
    m->tie_comm = o->tie_comm;
    return 0;
}

/* Pipeline parallelism: keep only the tensors the held chunks' ops read, in order, placed
 * anew in the slab; ops of other chunks lose theirs (they never run here). A tied embedding
 * is held by the first stage (the embedding) and the last (the head): pp_tied on both, and
 * the last stage's is the replica. */
static void keep_held_params(tr_model *m) {
    int np = m->n_params, *map = malloc((size_t)(np ? np : 1) * sizeof(int));
    int emb_op = -1, head_op = -1;
    for (int i = 0; i < np; i++)
        map[i] = -1;
    for (int i = 0; i < m->n_ops; i++) {
        const op_t *op = &m->ops[i];
        if (op->kind == OP_EMBED) emb_op = i;
        if (op->kind == OP_HEAD) head_op = i;
        for (int k = 0; k < 4 && m->chunks[op->chunk].held; k++)
            if (op->p[k] >= 0) map[op->p[k]] = 0;
    }
    int tied = emb_op >= 0 && head_op >= 0 && m->ops[head_op].p[0] == m->ops[emb_op].p[0];
    int emb_here = emb_op >= 0 && m->chunks[m->ops[emb_op].chunk].held;
    int head_here = head_op >= 0 && m->chunks[m->ops[head_op].chunk].held;
    m->head_here = head_here;
    int n = 0;
    m->n_floats = 0;
    for (int i = 0; i < np; i++) {
        if (map[i] < 0) continue;
        m->params[n] = m->params[i];
        m->params[n].offset = m->n_floats;
        m->n_floats += model_align16(m->params[n].extent);
        map[i] = n++;
    }
    m->n_params = n;
    for (int i = 0; i < m->n_ops; i++)
        for (int k = 0; k < 4; k++) {
            op_t *op = &m->ops[i];
            if (op->p[k] >= 0) op->p[k] = m->chunks[op->chunk].held ? map[op->p[k]] : -1;
        }
    m->embed_param = m->embed_param >= 0 ? map[m->embed_param] : -1;
    m->head_param = m->head_param >= 0 ? map[m->head_param] : -1;
    if (tied && emb_here != head_here) { /* the pair of stages shares it */
        tr_param *p = &m->params[emb_here ? m->embed_param : m->head_param];
        p->pp_tied = 1;
        p->pp_copy = head_here;
        m->has_copies = head_here;
    }
    free(map);
}

int model_build(tr_model *m, const tr_model_desc *desc, const tr_model_opts *o, char *err,
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
    m->tp = o->tp > 1 ? o->tp : 1;
    m->tpr = m->tp > 1 ? o->tp_rank : 0;
    m->sp = m->tp > 1 && o->sequence_parallel;
    m->tp_comm = o->tp_comm;
    if (m->tpr < 0 || m->tpr >= m->tp) {
        snprintf(err, errlen, "model: tensor-parallel rank %d of %d", o->tp_rank, m->tp);
        return -1;
    }
    if (m->sp && (size_t)B * (size_t)T % (size_t)m->tp) {
        snprintf(err, errlen, "model: sequence parallelism over %d ranks needs a multiple of %d "
                 "tokens per micro-batch (%d x %d)", m->tp, m->tp, B, T);
        return -1;
    }
    /* the vocabulary, padded to the backend's multiple on every rank, splits into tp equal
       runs of rows; the last rank's may be padding in part */
    int pad = o->pad_vocab > 0 ? o->pad_vocab : m->be && m->be->pad_vocab > 0 ? m->be->pad_vocab : 1;
    int vunit = pad * m->tp;
    m->Vp = (desc->vocab + vunit - 1) / vunit * vunit;
    m->Vl = m->Vp / m->tp;
    m->vlo = m->tpr * m->Vl;
    m->vn = desc->vocab - m->vlo < m->Vl ? desc->vocab - m->vlo : m->Vl;
    if (m->vn < 0) m->vn = 0;
    double layers = count_layers(root);
    if (layers > MAX_LAYERS) { /* refused before anything is built for it */
        snprintf(err, errlen, "model: %.4g layers once the repeats are unrolled (at most %.0f)",
                 layers, MAX_LAYERS);
        return -1;
    }
    m->n_attention = count_attention(root);
    if (pipeline_opts(m, desc, o, err, errlen)) return -1;
    builder b = {.m = m, .N = (size_t)B * (size_t)T, .o = o, .root = root};
    b.Ns = m->sp ? b.N / (size_t)m->tp : b.N;
    chunk_begin(&b, 0, 0);
    chunk_end(&b, flatten(&b, root, "", 0));
    if (!b.err[0] && m->max_depth >= 63)
        snprintf(b.err, sizeof(b.err), "model: residuals nested %d deep (at most 62)",
                 m->max_depth);
    if (b.err[0]) {
        snprintf(err, errlen, "%s", b.err);
        return -1;
    }
    if (m->pipelined) {
        keep_held_params(m);
        m->last_branch_end = -1; /* other micro-batches' forwards run between */
    }
    model_arena_layout(m);
    /* logits chunk: as many rows as fit in 8M floats, so a 50k vocabulary never needs the
       whole (N, V) matrix */
    size_t rows = (size_t)(8u << 20) / (size_t)m->Vl;
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

size_t tr_model_storage_bytes(const tr_model *m) {
    return m->es;
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

void tr_model_set_tap(tr_model *m, tr_tap_fn fn, void *ctx) {
    m->tap = fn;
    m->tap_ctx = ctx;
}

const char *tr_model_op_name(const tr_model *m, int i, int *cols) {
    const op_t *op = &m->ops[i];
    if (op->kind == OP_RES_BEGIN) return NULL; /* its output is its input */
    if (cols) *cols = op->kind == OP_HEAD ? 1 : m->desc.dim;
    return op->name;
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
