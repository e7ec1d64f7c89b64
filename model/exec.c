/* The model's executor: forward and backward over the program of ops (training, evaluation,
 * logits for tools), and incremental decoding with a KV cache; every computation is a call
 * into the backend table. */
#include "model/model_private.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
