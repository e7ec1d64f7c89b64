/* The model's executor: forward and backward over the program of ops (training, evaluation,
 * logits for tools), and incremental decoding with a KV cache; every computation is a call
 * into the backend table.
 *
 * Tensor parallelism (Megatron-LM, Shoeybi et al. 2019; sequence parallelism, Korthikanti et
 * al. 2022): a split layer reads the whole (N, C) input, computes with its rank's heads or
 * hidden units, and its output product yields partial sums that are all-reduced over the tp
 * group (with sequence parallelism: reduce-scattered, so that the residual stream and the norms
 * hold N / tp rows, and all-gathered again before the next split layer). The backward mirrors
 * it, and reduces each input gradient while the weight gradient that does not depend on it is
 * computed. The vocabulary is split too: the embedding's rows and the head's logits, whose
 * cross entropy combines per-row statistics of every rank (one small all-gather) instead of
 * gathering the logits. */
#include "model/model_private.h"
#include "model/mutant.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- accessors ------------------------------------------------------------------------- */

/* Activations of the slot in use (use_slot): offsets are those of one micro-batch's layout,
 * shifted (modulo 2^64) to the slot's copy of its chunk. */
static tr_buf *ACT(const tr_model *m, size_t off) {
    if (off & TRANSIENT) return tr_buf_at(m->be, m->tact, off & ~TRANSIENT);
    return tr_buf_at(m->be, m->act, off + m->ashift);
}
static float *STAT(const tr_model *m, size_t off) {
    if (off & TRANSIENT) return m->tstats + (off & ~TRANSIENT);
    return m->stats + (off + m->sshift);
}
static void use_slot(tr_model *m, int c, int slot) {
    const chunk_t *k = &m->chunks[c];
    m->ashift = k->aoff + (size_t)slot * (k->aend - k->abase) - k->abase;
    m->sshift = k->soff + (size_t)slot * (k->send - k->sbase) - k->sbase;
}
static tr_buf *P(const tr_model *m, int i) {
    return i < 0 ? NULL : m->paddr[i];
}
static int stream_rows(const tr_model *m, int N);
static int stream_row0(const tr_model *m, int N);
/* ZeRO-3's op hook around everything an op computes (dir +1 forward, -1 backward) */
static void op_begin(tr_model *m, int i, int dir) {
    if (m->ohook) m->ohook(m->octx, i, dir > 0 && m->recompute_to ? 2 : dir, 0);
}
static void op_end(tr_model *m, int i, int dir) {
    if (m->ohook) m->ohook(m->octx, i, dir > 0 && m->recompute_to ? 2 : dir, 1);
    if (m->tap && dir > 0 && !m->recompute_to && m->ops[i].kind != OP_RES_BEGIN) {
        const op_t *op = &m->ops[i];
        int N = m->pass_n, head = op->kind == OP_HEAD, rows = head ? N : stream_rows(m, N);
        tr_tap t = {.op = i,
                    .x = head ? NULL : ACT(m, op->out),
                    .f32 = head ? m->losses : NULL,
                    .rows = rows,
                    .row0 = head ? 0 : stream_row0(m, N),
                    .N = N,
                    .cols = head ? 1 : m->desc.dim,
                    .replica = rows == N && m->tpr > 0};
        m->tap(m->tap_ctx, &t);
    }
}
static tr_buf *G(const tr_model *m, int i) {
    return i < 0 ? NULL : m->gaddr[i];
}
/* row r of an (N, width) storage buffer */
static tr_buf *ROW(const tr_model *m, const tr_buf *base, size_t r, size_t width) {
    return tr_buf_at(m->be, base, r * width);
}

/* ---- tensor-parallel communication -------------------------------------------------------
 * Host memory in fp32 (tr_model_init_opts refuses tp > 1 on other backends). Each records
 * the time it took: blocking ones are exposed in full; a non-blocking one is exposed only for
 * the time its wait took. */

/* Rows of the residual stream in this pass, and the first global row this rank holds. */
static int stream_rows(const tr_model *m, int N) {
    return m->sp_now ? N / m->tp : N;
}
static int stream_row0(const tr_model *m, int N) {
    return m->sp_now ? m->tpr * (N / m->tp) : 0;
}

typedef struct {
    tr_comm_req *req;
    double t0;
} tp_req;

static tp_req tp_start(tr_model *m, tr_comm_req *r) {
    m->tps.ops++;
    return (tp_req){r, tr_now()};
}

static void tp_wait(tr_model *m, tp_req r) {
    if (!r.req) return;
    double done_at;
    done_at = tr_now();
    TR_WAIT("tp.wait", m->tps.exposed_s += tr_comm_wait_done(r.req, &done_at));
    m->tps.span_s += done_at - r.t0;
}

/* An operation of the tp group on the model's buffers (storage dtype, or fp32 for `f32`). */
static tp_req tp_op(tr_model *m, tr_comm_op op, const void *send, void *recv, size_t n, int f32) {
    return tp_start(m, tr_comm_start(m->tp_comm, op, send, recv, n,
                                     f32 ? TR_COMM_F32 : tr_model_comm_dtype(m), -1, 0,
                                     tr_model_comm_mem(m)));
}

/* The sum over the tp group of n elements, in place. */
static tp_req tp_isum(tr_model *m, tr_buf *x, size_t n) {
    return tp_op(m, TR_COMM_OP_ALL_REDUCE, NULL, x, n, 0);
}
static void tp_sum(tr_model *m, tr_buf *x, size_t n) {
    tp_wait(m, tp_isum(m, x, n));
}

/* Sequence parallelism: every rank's `rows` rows of width C (chunk) into all tp * rows rows
 * (full), in rank order. */
static tp_req tp_igather(tr_model *m, const tr_buf *chunk, tr_buf *full, int rows, int C) {
    return tp_op(m, TR_COMM_OP_ALL_GATHER, chunk, full, (size_t)rows * (size_t)C, 0);
}
static void tp_gather(tr_model *m, const tr_buf *chunk, tr_buf *full, int rows, int C) {
    tp_wait(m, tp_igather(m, chunk, full, rows, C));
}

/* Sequence parallelism: the sum over the group of every rank's partial (tp * rows, C) full,
 * this rank's rows of it into chunk. */
static tp_req tp_iscatter(tr_model *m, const tr_buf *full, tr_buf *chunk, int rows, int C) {
    return tp_op(m, TR_COMM_OP_REDUCE_SCATTER, full, chunk, (size_t)rows * (size_t)C, 0);
}
static void tp_scatter(tr_model *m, const tr_buf *full, tr_buf *chunk, int rows, int C) {
    tp_wait(m, tp_iscatter(m, full, chunk, rows, C));
}

/* The partial sums of a split product's output (N, C) in `part` become the stream: summed
 * over the group in place (part is the stream), or with sequence parallelism reduce-scattered
 * from part (a full buffer) into the stream's rows. */
static void tp_reduce_out(tr_model *m, tr_buf *part, tr_buf *out, int N, int C) {
    if (m->tp == 1) return;
    if (m->sp_now)
        tp_scatter(m, part, out, N / m->tp, C);
    else
        tp_sum(m, part, (size_t)N * (size_t)C);
}

/* The whole (N, C) input of a split layer: the stream itself, or with sequence parallelism
 * its rows from every rank gathered into `full`. */
static const tr_buf *tp_full_input(tr_model *m, const tr_buf *x, tr_buf *full, int N, int C) {
    if (!m->sp_now) return x;
    tp_gather(m, x, full, N / m->tp, C);
    return full;
}

/* Where a split product writes its partial sums: the stream (summed in place) or, with
 * sequence parallelism, the full buffer that is reduce-scattered into it. */
static tr_buf *tp_partial_dst(const tr_model *m, tr_buf *out) {
    return m->sp_now ? m->gfull : out;
}

/* The backward of a column-parallel product y = x W^T (+ b) whose input x is the stream:
 * dinp = dy W is partial over the group, reduced into `next` (summed, or reduce-scattered with
 * sequence parallelism) while dW (and db) are computed from `x` (the full input). */
static void tp_linear_backward(tr_model *m, tr_buf *next, tr_buf *dw, tr_buf *db,
                               const tr_buf *dy, const tr_buf *x, const tr_buf *w, int N, int IC,
                               int OC, tp_req xgather) {
    const tr_backend *be = m->be;
    if (m->tp == 1) {
        be->linear_backward(next, dw, db, dy, x, w, N, IC, OC);
        return;
    }
    tr_buf *part = tp_partial_dst(m, next);
    be->linear_backward(part, NULL, NULL, dy, x, w, N, IC, OC);
    tp_req r = m->sp_now ? tp_iscatter(m, part, next, N / m->tp, IC)
                         : tp_isum(m, part, (size_t)N * (size_t)IC);
    tp_wait(m, xgather); /* the re-gathered input, if it is still in flight */
    if (dw || db) be->linear_backward(NULL, dw, db, dy, x, w, N, IC, OC); /* not split */
    tp_wait(m, r);
}

/* Learned positions over the stream's rows: rows [r0, r0 + rows) of B*T tokens hold positions
 * (r0 + r) % T, in up to three runs (the end of one sequence, whole sequences, the start of
 * another). */
static void positions_rows(tr_model *m, tr_buf *x, tr_buf *wpe, int r0, int rows, int T,
                           int backward) {
    const tr_backend *be = m->be;
    const int C = m->desc.dim;
    for (int r = 0; r < rows;) {
        int t = (r0 + r) % T, len = T - t;
        if (t == 0 && rows - r >= T) len = (rows - r) / T * T; /* whole sequences */
        if (len > rows - r) len = rows - r;
        tr_buf *xr = ROW(m, x, (size_t)r, (size_t)C), *pr = ROW(m, wpe, (size_t)t, (size_t)C);
        int nb = t == 0 && len % T == 0 ? len / T : 1, nt = nb > 1 || len == T ? T : len;
        if (backward)
            be->positions_backward(pr, xr, nb, nt, C);
        else
            be->positions_forward(xr, pr, nb, nt, C);
        r += len;
    }
}

/* This rank's token ids (tensor parallelism): rows of its part of the vocabulary, -1 for the
 * others' (a row of zeros), into ltokens. With one rank, the ids themselves. */
static void local_tokens(tr_model *m, const int *tokens, int N) {
    if (m->tp == 1) return;
    for (int n = 0; n < N; n++) {
        int t = tokens[n] - m->vlo;
        m->host_ltokens[n] = t >= 0 && t < m->vn ? t : -1;
    }
    m->be->upload(m->ltokens, m->host_ltokens, (size_t)N * sizeof(int));
}

/* The ids the embedding reads: this rank's (local_tokens) or, with one rank, the uploaded ones. */
static const int *embed_tokens(const tr_model *m) {
    return m->tp > 1 ? m->ltokens : m->tokens;
}

/* ---- forward ---------------------------------------------------------------------------- */

static void attention_forward(tr_model *m, const op_t *op, int B, int T) {
    const tr_backend *be = m->be;
    const tr_node *n = op->node;
    const int N = B * T, C = m->desc.dim, H = op->H, KV = op->KV, hd = C / n->heads;
    const tr_buf *x = tp_full_input(m, ACT(m, op->in), m->xfull, N, C);
    be->linear_forward(ACT(m, op->s[0]), x, P(m, op->p[0]), P(m, op->p[1]), N, C,
                       (H + 2 * KV) * hd);
    if (n->rope_theta > 0) be->rope_forward(ACT(m, op->s[0]), B, T, H, KV, hd, n->rope_theta);
    be->attention_forward(ACT(m, op->s[1]), STAT(m, op->s[2]), ACT(m, op->s[0]), B, T, H, KV, hd);
    /* row-parallel: partial sums over the ranks' heads; the bias is added once (rank 0) */
    tr_buf *part = tp_partial_dst(m, ACT(m, op->out));
    be->linear_forward(part, ACT(m, op->s[1]), P(m, op->p[2]), m->tpr ? NULL : P(m, op->p[3]), N,
                       H * hd, C);
    tp_reduce_out(m, part, ACT(m, op->out), N, C);
}

static void mlp_forward(tr_model *m, const op_t *op, int B, int T) {
    const tr_backend *be = m->be;
    const tr_node *n = op->node;
    const int N = B * T, C = m->desc.dim, h = op->hid, swiglu = n->activation == TR_ACT_SWIGLU;
    const tr_buf *x = tp_full_input(m, ACT(m, op->in), m->xfull, N, C);
    /* the GELU in the product's epilogue; not under selective recompute, whose backward
       recomputes the activation with gelu_forward and must get the same bits */
    int fuse = !swiglu && be->linear_gelu_forward && m->recompute != TR_RECOMPUTE_SELECTIVE;
    if (fuse)
        be->linear_gelu_forward(ACT(m, op->s[1]), ACT(m, op->s[0]), x, P(m, op->p[0]),
                                P(m, op->p[1]), N, C, h);
    else
        be->linear_forward(ACT(m, op->s[0]), x, P(m, op->p[0]), P(m, op->p[1]), N, C,
                           swiglu ? 2 * h : h);
    if (swiglu)
        be->swiglu_forward(ACT(m, op->s[1]), ACT(m, op->s[0]), N, h);
    else if (!fuse)
        be->gelu_forward(ACT(m, op->s[1]), ACT(m, op->s[0]), (size_t)N * (size_t)h);
    tr_buf *part = tp_partial_dst(m, ACT(m, op->out));
    be->linear_forward(part, ACT(m, op->s[1]), P(m, op->p[2]), m->tpr ? NULL : P(m, op->p[3]), N,
                       h, C);
    tp_reduce_out(m, part, ACT(m, op->out), N, C);
}

/* One op forward over B sequences of T tokens (the head is not run here). */
static void forward_op(tr_model *m, const op_t *op, int B, int T) {
    const tr_backend *be = m->be;
    const int N = B * T, C = m->desc.dim, R = stream_rows(m, N);
    const tr_node *n = op->node;
    switch (op->kind) {
    case OP_EMBED: { /* a split vocabulary: each rank's rows, the others' zero, summed */
        tr_buf *part = tp_partial_dst(m, ACT(m, op->out));
        be->embedding_forward(part, embed_tokens(m), P(m, op->p[0]), N, C);
        tp_reduce_out(m, part, ACT(m, op->out), N, C);
        break;
    }
    case OP_POS:
        positions_rows(m, ACT(m, op->out), P(m, op->p[0]), stream_row0(m, N), R, T, 0);
        break;
    case OP_LAYERNORM:
        be->layernorm_forward(ACT(m, op->out), STAT(m, op->s[0]), STAT(m, op->s[1]), ACT(m, op->in),
                              P(m, op->p[0]), P(m, op->p[1]), R, C, n->eps);
        break;
    case OP_RMSNORM:
        be->rmsnorm_forward(ACT(m, op->out), STAT(m, op->s[1]), ACT(m, op->in), P(m, op->p[0]), R,
                            C, n->eps);
        break;
    case OP_ATTENTION:
        attention_forward(m, op, B, T);
        break;
    case OP_MLP:
        mlp_forward(m, op, B, T);
        break;
    case OP_RES_BEGIN:
        break;
    case OP_RES_END:
        be->add(ACT(m, op->out), ACT(m, op->s[0]), ACT(m, op->in), (size_t)R * (size_t)C);
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
                                         P(m, nm->p[1]), stream_rows(m, B * T), m->desc.dim,
                                         nm->node->eps, rms);
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

/* Start a pass over B sequences of T tokens: the tokens in place, the stream's layout chosen
 * (sequence parallelism needs whole rows per rank; a pass that cannot have them, such as a
 * few tokens of a tool, keeps the whole stream on every rank, which fits when N <= N / tp of
 * the largest micro-batch). Returns 0, or -1 when this pass does not fit the model. */
static int pass_begin(tr_model *m, const int *tokens, int B, int T, int allow_sp) {
    size_t N = (size_t)B * (size_t)T, maxN = (size_t)m->maxB * (size_t)m->maxT;
    m->sp_now = m->sp && allow_sp && N % (size_t)m->tp == 0;
    m->pass_n = (int)N;
    if (N > maxN || (m->sp && !m->sp_now && N * (size_t)m->tp > maxN)) return -1;
    if (!tokens) return 0; /* a pipeline chunk without the embedding */
    m->be->upload(m->tokens, tokens, N * sizeof(int));
    local_tokens(m, tokens, (int)N);
    return 0;
}

/* Run every op but the head; returns the head op (build() checked there is one). */
static const op_t *forward_body(tr_model *m, int B, int T) {
    return forward_range(m, 0, m->n_ops, B, T);
}

/* The head over rows [r, r + n) of x (the whole input): logits of this rank's classes in
 * m->logits, losses, and with want the gradient of the logits (softmax_xent's contract). */
static void head_loss(tr_model *m, const op_t *head, const tr_buf *x, int r, int n,
                      float dscale, int want) {
    const tr_backend *be = m->be;
    const int C = m->desc.dim;
    be->linear_forward(m->logits, ROW(m, x, (size_t)r, (size_t)C), P(m, head->p[0]), NULL, n, C,
                       m->Vl);
    if (m->tp == 1) {
        be->softmax_xent(m->logits, m->losses + r, m->targets + r, n, m->desc.vocab, m->Vl,
                         dscale, want);
        return;
    }
    float *mine = m->xstats + (size_t)m->tp * m->head_rows * 3, *all = m->xstats;
    be->xent_stats(mine, m->logits, m->targets + r, m->vlo, n, m->vn, m->Vl);
    tp_wait(m, tp_op(m, TR_COMM_OP_ALL_GATHER, mine, all, (size_t)n * 3, 1));
    be->xent_finish(m->logits, m->losses + r, all, m->tp, m->targets + r, m->vlo, n, m->vn,
                    m->Vl, dscale, want);
}

/* The head over its input (the stream, in the slot in use): the mean cross entropy of the
 * N rows against targets; with grad_scale > 0 also the gradient of the stream, into gbuf[0],
 * and the head's weight gradient, chunk by chunk of rows (the logits never exist whole). */
static float head_pass(tr_model *m, const op_t *head, const int *targets, int B, int T,
                       float grad_scale) {
    const tr_backend *be = m->be;
    const int N = B * T, C = m->desc.dim;
    be->upload(m->targets, targets, (size_t)N * sizeof(int));
    int hi = (int)(head - m->ops);
    op_begin(m, hi, +1);
    const tr_buf *x = tp_full_input(m, ACT(m, head->in), m->xfull, N, C);
    int want = grad_scale > 0;
    if (want && m->pre_hook) m->pre_hook(m->pre_ctx, head->p[0]);
    /* the stream's gradient: this rank's part of it, summed over the ranks after the loop */
    tr_buf *dw = G(m, head->p[0]), *dx = tp_partial_dst(m, m->gbuf[0]);
    float dscale = grad_scale / (float)N;
    for (int r = 0; r < N; r += (int)m->head_rows) {
        int n = N - r < (int)m->head_rows ? N - r : (int)m->head_rows;
        head_loss(m, head, x, r, n, dscale, want);
        if (want)
            be->linear_backward(ROW(m, dx, (size_t)r, (size_t)C), dw, NULL, m->logits,
                                ROW(m, x, (size_t)r, (size_t)C), P(m, head->p[0]), n, C, m->Vl);
    }
    if (want) tp_reduce_out(m, dx, m->gbuf[0], N, C);
    op_end(m, hi, +1);
    /* a tied embedding: the head's part of its gradient is done; its backward adds the rest
       (on this rank: a pipeline's last stage holds a copy, complete after the head's) */
    if (want && m->partial_hook && head->p[0] == m->embed_param &&
        !m->params[m->embed_param].pp_copy)
        m->partial_hook(m->partial_ctx, head->p[0]);
    be->download(m->host_losses, m->losses, (size_t)N * sizeof(float));
    double sum = 0;
    for (int i = 0; i < N; i++)
        sum += m->host_losses[i];
    return (float)(sum / N);
}

/* The start of a pass the model cannot fit is a caller's bug (they size batches within the
 * model's): said, then abort. */
static void begin_or_die(tr_model *m, const int *tokens, int B, int T, const char *what) {
    if (!pass_begin(m, tokens, B, T, 1)) return;
    fprintf(stderr, "trainer: model: %s of %d x %d tokens does not fit its buffers\n", what, B, T);
    abort();
}

float tr_model_forward(tr_model *m, const int *tokens, const int *targets, int B, int T,
                       float grad_scale) {
    double b0 = tr_comm_bytes_sent(m->tp_comm);
    begin_or_die(m, tokens, B, T, "a forward");
    const op_t *head = forward_body(m, B, T);
    m->lastB = B;
    m->lastT = T;
    m->last_scale = targets ? grad_scale : 0;
    float loss = targets ? head_pass(m, head, targets, B, T, grad_scale) : 0;
    m->tps.bytes += tr_comm_bytes_sent(m->tp_comm) - b0;
    return loss;
}

/* ---- backward --------------------------------------------------------------------------- */

/* Sequence parallelism: start gathering a split layer's input again (its weight gradient needs
 * all rows), to overlap what comes before that product in the backward. */
static tp_req regather_input(tr_model *m, const op_t *op, int N) {
    if (!m->sp_now) return (tp_req){0};
    return tp_igather(m, ACT(m, op->in), m->xfull, N / m->tp, m->desc.dim);
}

/* The gradient g of the op's output (the stream's rows) as a whole (N, C) gradient. */
static const tr_buf *full_grad(tr_model *m, const tr_buf *g, int N) {
    return tp_full_input(m, g, m->gfull, N, m->desc.dim);
}

/* dst = src, n elements of backend memory (through the table: zero, then add). */
static void copy_buf(const tr_model *m, tr_buf *dst, const tr_buf *src, size_t n) {
    m->be->zero(dst, n * m->es);
    m->be->add(dst, dst, src, n);
}

/* The backward of an attention or MLP op: with `split` only the input part (the weight
 * gradients are left to weights_backward, from the output gradients kept in op->dy). */
static void attention_backward(tr_model *m, const op_t *op, const tr_buf *g, tr_buf *next, int B,
                               int T, int split) {
    const tr_backend *be = m->be;
    const tr_node *n = op->node;
    const int N = B * T, C = m->desc.dim, H = op->H, KV = op->KV, hd = C / n->heads;
    tp_req xg = split ? (tp_req){0} : regather_input(m, op, N);
    const tr_buf *gf = full_grad(m, g, N);
    if (split) copy_buf(m, ACT(m, op->dy[0]), gf, (size_t)N * (size_t)C);
    be->linear_backward(m->scratch1, split ? NULL : G(m, op->p[2]), split ? NULL : G(m, op->p[3]),
                        gf, ACT(m, op->s[1]), P(m, op->p[2]), N, H * hd, C);
    tr_buf *dqkv = m->scratch2;
    be->attention_backward(dqkv, m->scratch1, ACT(m, op->s[0]), ACT(m, op->s[1]), STAT(m, op->s[2]),
                           B, T, H, KV, hd);
    if (n->rope_theta > 0) be->rope_backward(dqkv, B, T, H, KV, hd, n->rope_theta);
    /* kept for the weight part, over q, k, v once read (model.c: place_output_grads) */
    if (split) copy_buf(m, ACT(m, op->dy[1]), dqkv, (size_t)N * (size_t)((H + 2 * KV) * hd));
    tp_linear_backward(m, next, split ? NULL : G(m, op->p[0]), split ? NULL : G(m, op->p[1]), dqkv,
                       m->sp_now ? m->xfull : ACT(m, op->in), P(m, op->p[0]), N, C,
                       (H + 2 * KV) * hd, xg);
}

/* Selective recompute: the MLP's activation again, from its pre-activation (the shared buffer
 * holds another layer's). */
static void mlp_activation(tr_model *m, const op_t *op, int N) {
    const tr_backend *be = m->be;
    if (m->recompute != TR_RECOMPUTE_SELECTIVE) return;
    if (op->node->activation == TR_ACT_SWIGLU)
        be->swiglu_forward(ACT(m, op->s[1]), ACT(m, op->s[0]), N, op->hid);
    else
        be->gelu_forward(ACT(m, op->s[1]), ACT(m, op->s[0]), (size_t)N * (size_t)op->hid);
}

static void mlp_backward(tr_model *m, const op_t *op, const tr_buf *g, tr_buf *next, int B, int T,
                         int split) {
    const tr_backend *be = m->be;
    const tr_node *n = op->node;
    const int N = B * T, C = m->desc.dim, h = op->hid, swiglu = n->activation == TR_ACT_SWIGLU;
    tp_req xg = split ? (tp_req){0} : regather_input(m, op, N);
    const tr_buf *gf = full_grad(m, g, N);
    tr_buf *dpre = m->scratch2;
    if (split) copy_buf(m, ACT(m, op->dy[0]), gf, (size_t)N * (size_t)C);
    mlp_activation(m, op, N);
    if (!swiglu && be->linear_backward_gelu && !split) { /* through the GELU in one call */
        be->linear_backward_gelu(dpre, G(m, op->p[2]), G(m, op->p[3]), gf, ACT(m, op->s[1]),
                                 P(m, op->p[2]), ACT(m, op->s[0]), N, h, C);
    } else {
        be->linear_backward(m->scratch1, split ? NULL : G(m, op->p[2]),
                            split ? NULL : G(m, op->p[3]), gf, ACT(m, op->s[1]), P(m, op->p[2]), N,
                            h, C);
        if (swiglu)
            be->swiglu_backward(dpre, m->scratch1, ACT(m, op->s[0]), N, h);
        else
            be->gelu_backward(dpre, m->scratch1, ACT(m, op->s[0]), (size_t)N * (size_t)h);
    }
    /* kept for the weight part, over the pre-activation once read (place_output_grads) */
    if (split) copy_buf(m, ACT(m, op->dy[1]), dpre, (size_t)N * (size_t)(swiglu ? 2 * h : h));
    tp_linear_backward(m, next, split ? NULL : G(m, op->p[0]), split ? NULL : G(m, op->p[1]), dpre,
                       m->sp_now ? m->xfull : ACT(m, op->in), P(m, op->p[0]), N, C,
                       swiglu ? 2 * h : h, xg);
}

/* The weight part of a split backward of an attention or MLP op: both products' weight (and
 * bias) gradients from their inputs and the output gradients the input part kept. */
static void weights_backward(tr_model *m, const op_t *op, int B, int T) {
    const tr_backend *be = m->be;
    const int N = B * T, C = m->desc.dim, attn = op->kind == OP_ATTENTION;
    int hd = attn ? C / op->node->heads : 0;
    int mid = attn ? op->H * hd : op->hid; /* the second product's input width */
    int wide = attn ? (op->H + 2 * op->KV) * hd
                    : (op->node->activation == TR_ACT_SWIGLU ? 2 : 1) * op->hid;
    if (!attn) mlp_activation(m, op, N);
    be->linear_backward(NULL, G(m, op->p[2]), G(m, op->p[3]), ACT(m, op->dy[0]), ACT(m, op->s[1]),
                        P(m, op->p[2]), N, mid, C);
    const tr_buf *x = tp_full_input(m, ACT(m, op->in), m->xfull, N, C);
    be->linear_backward(NULL, G(m, op->p[0]), G(m, op->p[1]), ACT(m, op->dy[1]), x, P(m, op->p[0]),
                        N, C, wide);
}

/* Whether op's parameters get their gradients in the weight part of a split backward. */
static int deferred(const tr_model *m, const op_t *op) {
    return m->split && (op->kind == OP_ATTENTION || op->kind == OP_MLP);
}

int tr_model_grad_phase(const tr_model *m, int i) {
    int r = m->ready_op[i];
    if (r >= m->n_ops) return 0; /* read by no op: final at once */
    return 2 * m->ops[r].chunk + deferred(m, &m->ops[r]);
}

/* The hooks around an op's gradients in a backward part: the pre-gradient hook before the
 * first write (after = 0), the gradient hook for the tensors this op completes (after = 1). */
static void grad_hooks(tr_model *m, int i, int after) {
    const op_t *op = &m->ops[i];
    tr_grad_hook fn = after ? (m->hooks_held ? NULL : m->hook) : m->pre_hook;
    void *ctx = after ? m->hook_ctx : m->pre_ctx;
    if (!fn || (!after && op->kind == OP_HEAD)) return; /* the head's: placed in forward */
    for (int k = 0; k < 4; k++)
        if (op->p[k] >= 0 && (!after || m->ready_op[op->p[k]] == i)) fn(ctx, op->p[k]);
}

/* One op's backward (input part, or all of it), from the gradient of its output stream `g`;
 * returns the gradient of its input stream. skip: each residual level's skip gradient. */
static tr_buf *backward_op(tr_model *m, int i, tr_buf *g, tr_buf **skip, int split, int B, int T) {
    const tr_backend *be = m->be;
    const op_t *op = &m->ops[i];
    const int N = B * T, C = m->desc.dim, R = stream_rows(m, N);
    /* level d of residual nesting ping-pongs between gbuf[2d] and gbuf[2d+1]; a residual's
       skip gradient stays in the enclosing level's buffer, so the branch never overwrites it */
    tr_buf *a = m->gbuf[2 * op->depth], *b = m->gbuf[2 * op->depth + 1];
    tr_buf *next = g == a ? b : a;
    switch (op->kind) {
    case OP_HEAD:
        return g;
    case OP_RES_END:
        skip[op->depth] = g;
        /* full recompute: the branch's tensors were overwritten by later branches; run its
           forward again from its input (kept) before going back through it */
        if (m->recompute == TR_RECOMPUTE_FULL && op->depth == 0 && i != m->last_branch_end) {
            m->recompute_to = i;
            forward_range(m, op->match + 1, i, B, T);
            m->recompute_to = 0;
        }
        return g;
    case OP_RES_BEGIN:
        be->add(skip[op->depth], skip[op->depth], g, (size_t)R * (size_t)C);
        return skip[op->depth];
    case OP_LAYERNORM:
        be->layernorm_backward(next, G(m, op->p[0]), G(m, op->p[1]), g, ACT(m, op->in),
                               P(m, op->p[0]), STAT(m, op->s[0]), STAT(m, op->s[1]), R, C);
        return next;
    case OP_RMSNORM:
        be->rmsnorm_backward(next, G(m, op->p[0]), g, ACT(m, op->in), P(m, op->p[0]),
                             STAT(m, op->s[1]), R, C);
        return next;
    case OP_ATTENTION:
        attention_backward(m, op, g, next, B, T, split);
        return next;
    case OP_MLP:
        mlp_backward(m, op, g, next, B, T, split);
        return next;
    case OP_POS:
        positions_rows(m, g, G(m, op->p[0]), stream_row0(m, N), R, T, 1);
        return g;
    case OP_EMBED:
        be->embedding_backward(G(m, op->p[0]), full_grad(m, g, N), embed_tokens(m), N, C);
        return g;
    }
    return g;
}

/* Back through ops [lo, hi) of the last pass (B x T tokens, the slot in use) from the gradient
 * g of the stream leaving op hi - 1: everything, or one part of a split backward. Returns the
 * gradient of the stream entering op lo (the input part; NULL for the weight part). */
static tr_buf *backward_range(tr_model *m, int lo, int hi, tr_buf *g, tr_bwd_part part, int B,
                              int T) {
    tr_buf *skip[64];
    double b0 = tr_comm_bytes_sent(m->tp_comm);
    for (int i = hi - 1; i >= lo; i--) {
        const op_t *op = &m->ops[i];
        int later = deferred(m, op); /* its gradients come in the weight part */
        if (part == TR_BWD_WEIGHT && !later) continue;
        op_begin(m, i, -1);
        int hooks = part == TR_BWD_ALL || (part == TR_BWD_WEIGHT) == later;
        if (hooks) grad_hooks(m, i, 0);
        if (part == TR_BWD_WEIGHT)
            weights_backward(m, op, B, T);
        else
            g = backward_op(m, i, g, skip, part == TR_BWD_INPUT, B, T);
        if (hooks) grad_hooks(m, i, 1);
        op_end(m, i, -1);
    }
    m->tps.bytes += tr_comm_bytes_sent(m->tp_comm) - b0;
    return part == TR_BWD_WEIGHT ? NULL : g;
}

void tr_model_backward(tr_model *m) {
    backward_range(m, 0, m->n_ops, m->gbuf[0], TR_BWD_ALL, m->lastB, m->lastT);
}

/* ---- pipeline chunks -------------------------------------------------------------------- */

int tr_model_num_chunks(const tr_model *m) {
    return m->n_chunks;
}
int tr_model_chunk_held(const tr_model *m, int c) {
    return c >= 0 && c < m->n_chunks && m->chunks[c].held;
}
size_t tr_model_stream_elems(const tr_model *m, int B, int T) {
    int N = B * T;
    return (size_t)(m->sp && N % m->tp == 0 ? N / m->tp : N) * (size_t)m->desc.dim;
}
tr_comm *tr_model_stream_replicas(const tr_model *m, int B, int T) {
    int N = B * T;
    return m->tp > 1 && m->tp_comm && !(m->sp && N % m->tp == 0) ? m->tp_comm : NULL;
}
tr_buf *tr_model_chunk_input(tr_model *m, int c, int slot) {
    use_slot(m, c, slot);
    return ACT(m, m->chunks[c].in);
}
tr_buf *tr_model_chunk_output(tr_model *m, int c, int slot) {
    use_slot(m, c, slot);
    return ACT(m, m->chunks[c].out);
}
tr_buf *tr_model_chunk_grad_output(tr_model *m, int c, int slot) {
    return m->gio[m->chunks[c].gslot + slot];
}
tr_buf *tr_model_chunk_grad_input(tr_model *m, int c, int slot) {
    return m->gio[m->chunks[c].gslot + m->chunks[c].nrecv + slot];
}
void tr_model_hold_grad_hooks(tr_model *m, int hold) {
    m->hooks_held = hold;
}
tr_comm *tr_model_pp_group(const tr_model *m) {
    return m->pp_comm;
}

/* The head, when chunk c ends with it. */
static const op_t *chunk_head(const tr_model *m, int c) {
    const chunk_t *k = &m->chunks[c];
    return k->hi > k->lo && m->ops[k->hi - 1].kind == OP_HEAD ? &m->ops[k->hi - 1] : NULL;
}

float tr_model_chunk_forward(tr_model *m, int c, int slot, const int *tokens, const int *targets,
                             int B, int T) {
    const chunk_t *k = &m->chunks[c];
    double b0 = tr_comm_bytes_sent(m->tp_comm);
    begin_or_die(m, tokens, B, T, "a chunk's forward");
    use_slot(m, c, slot);
    const op_t *head = forward_range(m, k->lo, k->hi, B, T);
    float loss = head && targets ? head_pass(m, head, targets, B, T, 0) : 0;
    m->tps.bytes += tr_comm_bytes_sent(m->tp_comm) - b0;
    return loss;
}

float tr_model_chunk_backward(tr_model *m, int c, int slot, const int *tokens, const int *targets,
                              int B, int T, float grad_scale, tr_bwd_part part) {
    return tr_model_chunk_backward_bufs(m, c, slot, slot, slot, tokens, targets, B, T, grad_scale,
                                        part);
}

void tr_model_copy_stream(tr_model *m, tr_buf *dst, const tr_buf *src, size_t n) {
    copy_buf(m, dst, src, n);
}

float tr_model_chunk_backward_bufs(tr_model *m, int c, int slot, int grecv, int gsend,
                                   const int *tokens, const int *targets, int B, int T,
                                   float grad_scale, tr_bwd_part part) {
    const chunk_t *k = &m->chunks[c];
    begin_or_die(m, tokens, B, T, "a chunk's backward");
    use_slot(m, c, slot);
    const op_t *head = chunk_head(m, c);
    float loss = 0;
    tr_buf *g = NULL;
    if (part != TR_BWD_WEIGHT) {
        double b0 = tr_comm_bytes_sent(m->tp_comm);
        if (head) loss = head_pass(m, head, targets, B, T, grad_scale);
        m->tps.bytes += tr_comm_bytes_sent(m->tp_comm) - b0;
        g = head ? m->gbuf[0] : tr_model_chunk_grad_output(m, c, grecv);
    }
    g = backward_range(m, k->lo, k->hi, g, part, B, T);
    if (g && c > 0) /* the gradient of the chunk's input, for the previous chunk */
        copy_buf(m, tr_model_chunk_grad_input(m, c, gsend), g, tr_model_stream_elems(m, B, T));
    return loss;
}

/* ---- logits for tools ------------------------------------------------------------------- */

/* Row r of x (the whole input of the head) to the V logits of every class, into host memory:
 * with a split vocabulary each rank's part is gathered from every rank. */
static void row_logits(tr_model *m, const op_t *head, const tr_buf *x, int r, float *out) {
    const tr_backend *be = m->be;
    const int C = m->desc.dim;
    be->linear_forward(m->logits, ROW(m, x, (size_t)r, (size_t)C), P(m, head->p[0]), NULL, 1, C,
                       m->Vl);
    if (m->tp == 1) {
        be->from_storage(out, m->logits, (size_t)m->desc.vocab);
        return;
    }
    tp_wait(m, tp_op(m, TR_COMM_OP_ALL_GATHER, m->logits, m->vgather, (size_t)m->Vl, 0));
    be->from_storage(out, m->vgather, (size_t)m->desc.vocab);
}

/* Forward over B x T tokens for the logits of rows[0..n) (NULL: every row) into host memory. */
static void logits_of(tr_model *m, const int *tokens, int B, int T, const int *rows, int n,
                      float *logits) {
    const int N = B * T, C = m->desc.dim, V = m->desc.vocab;
    if (pass_begin(m, tokens, B, T, 1)) {
        fprintf(stderr, "trainer: model: logits of %d x %d tokens do not fit its buffers (at "
                "most %d x %d%s)\n", B, T, m->maxB, m->maxT,
                m->sp ? " tokens, a multiple of tp, or 1/tp of that" : "");
        abort(); /* tools size their calls within the model's */
    }
    const op_t *head = forward_body(m, B, T);
    op_begin(m, (int)(head - m->ops), +1);
    const tr_buf *x = tp_full_input(m, ACT(m, head->in), m->xfull, N, C);
    if (m->tp == 1 && !rows) { /* chunks of rows at once */
        const tr_backend *be = m->be;
        for (int r = 0; r < N; r += (int)m->head_rows) {
            int k = N - r < (int)m->head_rows ? N - r : (int)m->head_rows;
            be->linear_forward(m->logits, ROW(m, x, (size_t)r, (size_t)C), P(m, head->p[0]),
                               NULL, k, C, m->Vl);
            for (int i = 0; i < k; i++) /* the V real columns of each row */
                be->from_storage(logits + (size_t)(r + i) * V,
                                 tr_buf_at(be, m->logits, (size_t)i * (size_t)m->Vl), (size_t)V);
        }
    } else {
        for (int i = 0; i < (rows ? n : N); i++)
            row_logits(m, head, x, rows ? rows[i] : i, logits + (size_t)i * V);
    }
    op_end(m, (int)(head - m->ops), +1);
}

void tr_model_last_logits(tr_model *m, const int *tokens, int B, int T, float *logits) {
    int *rows = malloc((size_t)B * sizeof(int));
    if (!rows) abort();
    for (int b = 0; b < B; b++) rows[b] = b * T + T - 1;
    logits_of(m, tokens, B, T, rows, B, logits);
    free(rows);
}

void tr_model_all_logits(tr_model *m, const int *tokens, int B, int T, float *logits) {
    logits_of(m, tokens, B, T, NULL, 0, logits);
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
        const op_t *op = &m->ops[i];
        if (op->kind != OP_ATTENTION || !m->chunks[op->chunk].held) continue;
        size_t bytes = (size_t)m->desc.seq_len * (size_t)(op->KV * (m->desc.dim / op->node->heads)) *
                       m->es; /* this rank's key/value heads */
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

/* One token through ops [lo, hi) at position pos (the slot in use); the head, when reached,
 * writes the logits. */
static void decode_range(tr_model *m, tr_kv_cache *c, int lo, int hi, int pos, float *logits) {
    const tr_backend *be = m->be;
    const int C = m->desc.dim;
    for (int i = lo; i < hi; i++) {
        const op_t *op = &m->ops[i];
        const tr_node *n = op->node;
        op_begin(m, i, +1);
        if (op->kind == OP_POS) { /* row `pos` of the position table */
            be->positions_forward(ACT(m, op->out), ROW(m, P(m, op->p[0]), (size_t)pos, (size_t)C),
                                  1, 1, C);
        } else if (op->kind == OP_ATTENTION) {
            int H = op->H, KV = op->KV, hd = C / n->heads;
            be->linear_forward(ACT(m, op->s[0]), ACT(m, op->in), P(m, op->p[0]), P(m, op->p[1]),
                               1, C, (H + 2 * KV) * hd);
            be->decode_attention(ACT(m, op->s[1]), ACT(m, op->s[0]), c->k[i], c->v[i], pos, H, KV,
                                 hd, n->rope_theta);
            be->linear_forward(ACT(m, op->out), ACT(m, op->s[1]), P(m, op->p[2]),
                               m->tpr ? NULL : P(m, op->p[3]), 1, H * hd, C);
            tp_reduce_out(m, ACT(m, op->out), ACT(m, op->out), 1, C);
        } else if (op->kind == OP_HEAD) {
            row_logits(m, op, ACT(m, op->in), 0, logits);
            op_end(m, i, +1);
            return;
        } else {
            forward_op(m, op, 1, 1);
        }
        op_end(m, i, +1);
    }
}

void tr_model_decode(tr_model *m, tr_kv_cache *c, int token, int pos, float *logits) {
    pass_begin(m, &token, 1, 1, 0); /* one row: the whole stream on every rank */
    decode_range(m, c, 0, m->n_ops, pos, logits);
}

void tr_model_decode_chunk(tr_model *m, tr_kv_cache *c, int ch, int token, int pos, float *logits) {
    pass_begin(m, &token, 1, 1, 0);
    use_slot(m, ch, 0);
    decode_range(m, c, m->chunks[ch].lo, m->chunks[ch].hi, pos, logits);
}
