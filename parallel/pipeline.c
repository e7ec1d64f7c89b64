/* The pipeline executor (pipeline.h). Before a step, each action of this rank's list gets the
 * slot its micro-batch uses in its chunk (the lowest free one at its forward, freed by its
 * backward, or by the weight part of a split one), and each receive the action after which
 * its buffer is free: a forward's input once the slot's previous micro-batch is done with it,
 * a backward's output gradient once its own forward ran (zb-v: gradients in pools of their
 * own, tr_pp_grad_bufs, smaller than the slots: once the input part of the micro-batch the
 * buffer held before ran, so a rank keeps one buffer each way instead of one per slot; at the
 * V's turn, where one rank holds chunks c and c + 1, nothing is sent: the forward copies c's
 * output into c + 1's input, and c + 1's input part writes its gradient straight into c's
 * buffer, which the model shares). Receives are posted as soon as that action has run; sends start
 * when their data is ready and are completed before the buffer is written again. Messages carry
 * (direction, receiving chunk) as their tag: each (sender, tag) is one channel of comm.h, opened at
 * init on every rank, whose messages match in the order they are posted (NCCL has no tags). That
 * order is the micro-batches': every chunk runs its forwards, and its backwards' input parts,
 * oldest micro-batch first (checked at init), so the sender sends them in that order, and the
 * receiver posts a channel's receives in it too: no receive's post point comes before the previous
 * receive's of its channel. */
#include "parallel/pipeline.h"
#include "model/mutant.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct tr_pipe {
    tr_model *m;
    tr_comm *c;
    int P, p, nch, maxs; /* stages, this one, chunks, most slots of a chunk */
    tr_pp_schedule s;
    const tr_pp_action *a; /* this rank's list */
    int n;
    int *slot;        /* per action: the slot of its micro-batch in its chunk */
    int *gr, *gs;     /* per backward: its gradient buffers, received and sent (tr_pp_grad_bufs:
                         zb-v's pools, else the slot's); per forward at zb-v's turn gr is the
                         previous chunk's slot its input is copied from (-1: received) */
    int maxg;         /* most gradient buffers of a chunk (send_grad's stride) */
    int *post_after;  /* per action: its receive may be posted after this action (-1: at
                         the start), -2: it receives nothing */
    tr_comm_req **rq; /* per action: its receive in flight */
    tr_comm_req **send_act, **send_grad; /* per chunk x slot: the send reading that buffer */
    void (*hook)(void *);
    void *hook_ctx;
    tr_trace *trace; /* --trace: the spans of each action and wait (NULL: none) */
    unsigned char *final; /* per action: its chunk's last backward (part) of the step */
    int gate;             /* gradient hooks in final actions only (tr_pipe_final_hooks) */
    tr_pipe_stats st;
    double last_idle, last_idle_s;
    double busy; /* this step: seconds computing */
    int warm;    /* steps run */
};

static int rank_of(const tr_pipe *p, int chunk) {
    return tr_pp_rank_of_kind(p->s.kind, p->P, chunk);
}

/* Whether chunk c's neighbour at c + d is on this rank too (zb-v's turn: nothing is sent). */
static int local(const tr_pipe *p, int c, int d) {
    return c + d >= 0 && c + d < p->nch && rank_of(p, c + d) == rank_of(p, c);
}

/* The channel into `chunk` (forward activations, or gradients when grad = 1). */
static int tag_of(int grad, int chunk) {
    return grad * 256 + chunk; /* chunk < 256 (TR_PP_MAX_CHUNKS) */
}

/* A message of n elements of the model's buffers (host or device memory, storage dtype). */
static tr_comm_req *isend(tr_pipe *p, const tr_buf *buf, size_t n, int peer, int tag) {
    return tr_comm_start(p->c, TR_COMM_OP_SEND, buf, NULL, n, tr_model_comm_dtype(p->m), peer,
                         tag, tr_model_comm_mem(p->m));
}
static tr_comm_req *irecv(tr_pipe *p, tr_buf *buf, size_t n, int peer, int tag) {
    return tr_comm_start(p->c, TR_COMM_OP_RECV, NULL, buf, n, tr_model_comm_dtype(p->m), peer,
                         tag, tr_model_comm_mem(p->m));
}

/* Slots and receive points of every action (see the top of the file). -1 when the model's
 * chunks do not match the schedule's. */
static int assign_slots(tr_pipe *p, char *err, size_t errlen) {
    int *busy = calloc((size_t)(p->nch * p->maxs), sizeof(int));
    int *freed_at = malloc((size_t)(p->nch * p->maxs) * sizeof(int));
    int *fwd_at = malloc((size_t)(p->nch * p->s.M) * sizeof(int)); /* (chunk, mb) */
    int *bin_at = malloc((size_t)(p->nch * p->s.M) * sizeof(int)); /* input parts: (chunk, mb) */
    /* per (direction, chunk): the last micro-batch run, and its receive's post point */
    int *last_mb = malloc((size_t)(2 * p->nch) * sizeof(int));
    int *last_post = malloc((size_t)(2 * p->nch) * sizeof(int));
    if (!busy || !freed_at || !fwd_at || !bin_at || !last_mb || !last_post) {
        free(busy), free(freed_at), free(fwd_at), free(bin_at), free(last_mb), free(last_post);
        snprintf(err, errlen, "pipeline: out of memory");
        return -1;
    }
    for (int k = 0; k < p->nch * p->maxs; k++)
        freed_at[k] = -1;
    for (int k = 0; k < 2 * p->nch; k++)
        last_mb[k] = last_post[k] = -1;
    int rc = 0, last = p->nch - 1;
    for (int i = 0; i < p->n && !rc; i++) {
        const tr_pp_action *a = &p->a[i];
        int c = a->chunk, *b = busy + c * p->maxs;
        p->post_after[i] = -2;
        if (!tr_model_chunk_held(p->m, c)) {
            snprintf(err, errlen,
                     "pipeline: the schedule runs chunk %d on stage %d, whose "
                     "model does not hold it",
                     c, p->p);
            rc = -1;
            break;
        }
        /* a channel's messages match in posting order: each chunk's forwards and input
           gradients go oldest micro-batch first, on the sending and the receiving side */
        int dir = a->op != TR_ACT_FWD;
        if (a->op != TR_ACT_BWD_W) {
            if (a->mb <= last_mb[dir * p->nch + c]) {
                snprintf(err, errlen,
                         "pipeline: the schedule runs the %s of micro-batch %d of chunk %d "
                         "after micro-batch %d's (each chunk takes them in order)",
                         dir ? "backward" : "forward", a->mb, c, last_mb[dir * p->nch + c]);
                rc = -1;
                break;
            }
            last_mb[dir * p->nch + c] = a->mb;
        }
        if (a->op == TR_ACT_FWD) {
            int k = 0;
            while (k < p->maxs && b[k])
                k++;
            if (k == p->maxs || k >= tr_pp_chunk_slots(&p->s, c)) {
                snprintf(err, errlen, "pipeline: chunk %d needs more slots than it has", c);
                rc = -1;
                break;
            }
            b[k] = 1;
            p->slot[i] = k;
            fwd_at[c * p->s.M + a->mb] = i;
            p->gr[i] = local(p, c, -1) ? p->slot[fwd_at[(c - 1) * p->s.M + a->mb]] : -1;
            if (c > 0 && p->gr[i] < 0) p->post_after[i] = freed_at[c * p->maxs + k];
            continue;
        }
        int f = fwd_at[c * p->s.M + a->mb], nr, ns;
        p->slot[i] = p->slot[f];
        tr_pp_grad_bufs(&p->s, c, &nr, &ns);
        p->gr[i] = nr ? a->mb % nr : p->slot[i];
        p->gs[i] = ns ? a->mb % ns : p->slot[i];
        if (a->op != TR_ACT_BWD_W) bin_at[c * p->s.M + a->mb] = i;
        if (a->op != TR_ACT_BWD_W && c < last && !local(p, c, 1))
            /* zb-v: when the buffer is free, after the input part that used it before */
            p->post_after[i] = !nr ? f : a->mb < nr ? -1 : bin_at[c * p->s.M + a->mb - nr];
        if (a->op != TR_ACT_BWD_IN) { /* the micro-batch is done with the slot */
            b[p->slot[i]] = 0;
            freed_at[c * p->maxs + p->slot[i]] = i;
        }
    }
    /* a channel's receives posted in its order: none before the previous one of its channel
       (still before its own action, as the previous one's point is before the previous
       action); receives with one post point are posted in the list's order */
    for (int i = 0; i < p->n && !rc; i++) {
        if (p->post_after[i] == -2) continue;
        int *lp = &last_post[(p->a[i].op != TR_ACT_FWD) * p->nch + p->a[i].chunk];
        if (p->post_after[i] < *lp) p->post_after[i] = *lp;
        *lp = p->post_after[i];
    }
    free(busy), free(freed_at), free(fwd_at), free(bin_at), free(last_mb), free(last_post);
    /* each chunk's last backward of each kind (whole, input part, weight part) */
    for (int i = p->n - 1; i >= 0 && !rc; i--) {
        const tr_pp_action *a = &p->a[i];
        int later = 0;
        for (int j = i + 1; j < p->n && !later; j++)
            later = p->a[j].chunk == a->chunk && p->a[j].op == a->op;
        p->final[i] = a->op != TR_ACT_FWD && !later;
    }
    return rc;
}

/* The stages agree that each set up its executor: one that failed would otherwise leave the
 * others waiting for it (in the channels' setup on device memory, in their first step on host
 * memory), while it waits for them in its caller's own agreement. Every rank of pp calls it,
 * whatever failed before: -1 on every rank when one failed. */
static int stages_agree(tr_comm *pp, int failed, char *err, size_t errlen) {
    int any = failed;
    tr_comm_all_reduce(pp, &any, 1, TR_COMM_I32);
    if (any && !failed)
        snprintf(err, errlen, "pipeline: another stage failed to set up its executor");
    return any ? -1 : 0;
}

/* Every channel of the pipeline, the same list on every rank (comm.h): activations into each
 * chunk but the first, gradients into each chunk but the last (evaluation and decoding use the
 * forward ones), between chunks on different ranks. */
static int open_channels(tr_pipe *p, char *err, size_t errlen) {
    tr_comm_channel *list = malloc((size_t)(2 * p->nch) * sizeof *list);
    if (!list) { /* every rank got through stages_agree: a failure here is the job's end */
        snprintf(err, errlen, "pipeline: out of memory");
        return -1;
    }
    int n = 0;
    for (int grad = 0; grad < 2; grad++)
        for (int c = 0; c < p->nch; c++) {
            int from = grad ? c + 1 : c - 1;
            if (from < 0 || from >= p->nch || rank_of(p, from) == rank_of(p, c)) continue;
            list[n++] = (tr_comm_channel){rank_of(p, from), rank_of(p, c), tag_of(grad, c)};
        }
    int rc = tr_comm_open_channels(p->c, list, n, tr_model_comm_mem(p->m), err, errlen);
    free(list);
    return rc;
}

/* This rank's executor: its schedule, the slots and post points of its actions. 0, or -1 with
 * the line in err. */
static int build(tr_pipe *p, tr_pp_kind kind, int V, int M, char *err, size_t errlen) {
    if (p->nch != p->P * V) {
        snprintf(err, errlen, "pipeline: the model has %d chunks, not pp %d x %d", p->nch, p->P,
                 V);
        return -1;
    }
    if (tr_pp_check(kind, p->P, V, M, err, errlen)) return -1;
    if (tr_pp_generate(&p->s, kind, p->P, V, M)) {
        snprintf(err, errlen, "pipeline: out of memory for the schedule");
        return -1;
    }
    p->a = p->s.list[p->p];
    p->n = p->s.n[p->p];
    for (int c = 0; c < p->nch; c++)
        if (tr_pp_chunk_slots(&p->s, c) > p->maxs) p->maxs = tr_pp_chunk_slots(&p->s, c);
    p->maxg = p->maxs;
    for (int c = 0; c < p->nch; c++) {
        int nr, ns;
        tr_pp_grad_bufs(&p->s, c, &nr, &ns);
        if (ns > p->maxg) p->maxg = ns;
    }
    size_t na = (size_t)(p->n ? p->n : 1), ns = (size_t)(p->nch * (p->maxs ? p->maxs : 1));
    size_t ng = (size_t)(p->nch * (p->maxg ? p->maxg : 1));
    p->slot = calloc(na, sizeof(int));
    p->gr = calloc(na, sizeof(int));
    p->gs = calloc(na, sizeof(int));
    p->post_after = calloc(na, sizeof(int));
    p->rq = calloc(na, sizeof(tr_comm_req *));
    p->send_act = calloc(ns, sizeof(tr_comm_req *));
    p->send_grad = calloc(ng, sizeof(tr_comm_req *));
    p->final = calloc(na, 1);
    if (!p->slot || !p->gr || !p->gs || !p->post_after || !p->rq || !p->send_act || !p->send_grad ||
        !p->final) {
        snprintf(err, errlen, "pipeline: out of memory");
        return -1;
    }
    return assign_slots(p, err, errlen);
}

int tr_pipe_init(tr_pipe **out, tr_model *m, tr_comm *pp, tr_pp_kind kind, int V, int M, char *err,
                 size_t errlen) {
    *out = NULL;
    tr_pipe *p = calloc(1, sizeof(*p));
    if (p) {
        p->m = m;
        p->c = pp;
        p->P = tr_comm_size(pp);
        p->p = tr_comm_rank(pp);
        p->nch = tr_model_num_chunks(m);
    } else {
        snprintf(err, errlen, "pipeline: out of memory");
    }
    /* every failure above and in build reaches the agreement */
    if (stages_agree(pp, !p || build(p, kind, V, M, err, errlen), err, errlen) ||
        open_channels(p, err, errlen)) {
        tr_pipe_free(p);
        return -1;
    }
    *out = p;
    return 0;
}

void tr_pipe_free(tr_pipe *p) {
    if (!p) return;
    tr_pp_free(&p->s);
    free(p->slot);
    free(p->gr);
    free(p->gs);
    free(p->post_after);
    free(p->rq);
    free(p->send_act);
    free(p->send_grad);
    free(p->final);
    free(p);
}

void tr_pipe_final_hooks(tr_pipe *p, int on) {
    p->gate = on;
}

void tr_pipe_set_backward_hook(tr_pipe *p, void (*fn)(void *ctx), void *ctx) {
    p->hook = fn;
    p->hook_ctx = ctx;
}

void tr_pipe_set_trace(tr_pipe *p, tr_trace *t) {
    p->trace = t;
}

/* ---- one step -------------------------------------------------------------------------- */

/* Wait for a request (NULL: none), counted as time waiting on a neighbour; traced as a span
 * of `kind` for action a (NULL: of none). */
static void wait_on(tr_pipe *p, tr_comm_req **r, double *idle, tr_span_kind kind,
                    const tr_pp_action *a) {
    if (!*r) return;
    double t0 = tr_now();
    *idle += tr_comm_wait(*r);
    *r = NULL;
    tr_trace_span(p->trace, kind, t0, tr_now(), a ? a->mb : -1, a ? a->chunk : -1);
}

/* Compute of action a since t0: the rank's busy time, and its span. */
static void busy_since(tr_pipe *p, double t0, const tr_pp_action *a) {
    double t1 = tr_now();
    p->busy += t1 - t0;
    static const tr_span_kind kind[] = {[TR_ACT_FWD] = TR_SPAN_FWD, [TR_ACT_BWD] = TR_SPAN_BWD,
                                        [TR_ACT_BWD_IN] = TR_SPAN_BWD_IN,
                                        [TR_ACT_BWD_W] = TR_SPAN_BWD_W};
    tr_trace_span(p->trace, kind[a->op], t0, t1, a->mb, a->chunk);
}

/* What of a stream of n elements goes between two stages: all of it, or, where every rank of
 * a tensor-parallel group holds the same stream (tp without sequence parallelism), this
 * rank's 1/tp slice, [*off, *off + len): each tp rank sends its slice to its peer of the next
 * stage (the same tp rank), which all-gathers the slices over its group on arrival
 * (gather_slices), so a stage boundary carries the stream once instead of tp times, as
 * Megatron-LM's scatter-gather does. Returns the tp group, or NULL for the whole stream. */
static tr_comm *slice_of(const tr_pipe *p, size_t n, int B, int T, size_t *off, size_t *len) {
    tr_comm *g = tr_model_stream_replicas(p->m, B, T);
    int k = g ? tr_comm_size(g) : 1;
    if (k <= 1 || n % (size_t)k) g = NULL, k = 1;
    *len = n / (size_t)k;
    *off = g ? (size_t)tr_comm_rank(g) * *len : 0;
    return g;
}

/* The buffer action j receives into: a forward's input, a backward's output gradient. */
static tr_buf *recv_buf(tr_pipe *p, int j) {
    const tr_pp_action *a = &p->a[j];
    return a->op != TR_ACT_FWD ? tr_model_chunk_grad_output(p->m, a->chunk, p->gr[j])
                               : tr_model_chunk_input(p->m, a->chunk, p->slot[j]);
}

/* A message of stream buf (n elements) to or from `peer`: its slice (slice_of). */
static tr_comm_req *move(tr_pipe *p, int send, tr_buf *buf, size_t n, int B, int T, int peer,
                         int tag) {
    size_t off, len;
    slice_of(p, n, B, T, &off, &len);
    tr_buf *at = tr_buf_at(tr_model_backend(p->m), buf, off);
    return send ? isend(p, at, len, peer, tag) : irecv(p, at, len, peer, tag);
}

/* After a sliced receive into buf: the tp group's slices all-gathered into the whole stream
 * (in place; every rank of the group runs the same action here). 1 when there were slices. */
static int gather_slices(tr_pipe *p, tr_buf *buf, size_t n, int B, int T) {
    size_t off, len;
    tr_comm *g = slice_of(p, n, B, T, &off, &len);
    if (!g) return 0;
    tr_buf *mine = tr_buf_at(tr_model_backend(p->m), buf, off);
    tr_comm_req *r = tr_comm_start(g, TR_COMM_OP_ALL_GATHER, mine, buf, len,
                                   tr_model_comm_dtype(p->m), -1, 0, tr_model_comm_mem(p->m));
    TR_WAIT("pp.gather_slices", tr_comm_wait(r));
    return 1;
}

/* Post the receive of action j: a forward's input, a backward's output gradient. */
static void post_recv(tr_pipe *p, int j, int B, int T) {
    const tr_pp_action *a = &p->a[j];
    size_t n = tr_model_stream_elems(p->m, B, T);
    int grad = a->op != TR_ACT_FWD, from = a->chunk + (grad ? 1 : -1);
    p->rq[j] = move(p, 0, recv_buf(p, j), n, B, T, rank_of(p, from), tag_of(grad, a->chunk));
}

/* The receives that may start once action i has run (i = -1: at the start of the step). */
static void post_after(tr_pipe *p, int i, int B, int T) {
    for (int j = i + 1; j < p->n; j++)
        if (p->post_after[j] == i) post_recv(p, j, B, T);
}

/* Run action i; returns the loss it computed (the last chunk's backward), else 0. */
static double run_action(tr_pipe *p, int i, const int *const *tokens, const int *const *targets,
                         int B, int T, float scale, double *idle) {
    const tr_pp_action *a = &p->a[i];
    int c = a->chunk, k = p->slot[i], last = p->nch - 1, at = c * p->maxs + k;
    int gat = c * p->maxg + p->gs[i]; /* the send buffer of a backward */
    size_t n = tr_model_stream_elems(p->m, B, T);
    const int *tok = c == 0 ? tokens[a->mb] : NULL;
    double loss = 0, t0;
    if (p->rq[i]) {
        TR_WAIT("pp.recv", wait_on(p, &p->rq[i], idle, TR_SPAN_WAIT_IN, a));
        t0 = tr_now();
        if (gather_slices(p, recv_buf(p, i), n, B, T))
            tr_trace_span(p->trace, TR_SPAN_GATHER, t0, tr_now(), a->mb, a->chunk);
        *idle += tr_now() - t0;
    }
    if (a->op == TR_ACT_FWD) {
        /* the slot's output is about to be rewritten */
        TR_WAIT("pp.send_act", wait_on(p, &p->send_act[at], idle, TR_SPAN_WAIT_OUT, a));
        t0 = tr_now();
        if (p->gr[i] >= 0) /* zb-v's turn: the previous chunk's output, on this rank */
            tr_model_copy_stream(p->m, tr_model_chunk_input(p->m, c, k),
                                 tr_model_chunk_output(p->m, c - 1, p->gr[i]), n);
        tr_model_chunk_forward(p->m, c, k, tok, NULL, B, T);
        busy_since(p, t0, a);
        if (c < last && !local(p, c, 1))
            p->send_act[at] = move(p, 1, tr_model_chunk_output(p->m, c, k), n, B, T,
                                   rank_of(p, c + 1), tag_of(0, c + 1));
        return 0;
    }
    tr_bwd_part part = a->op == TR_ACT_BWD      ? TR_BWD_ALL
                       : a->op == TR_ACT_BWD_IN ? TR_BWD_INPUT
                                                : TR_BWD_WEIGHT;
    if (part != TR_BWD_WEIGHT) TR_WAIT("pp.send_grad", wait_on(p, &p->send_grad[gat], idle, TR_SPAN_WAIT_OUT, a));
    if (p->gate) tr_model_hold_grad_hooks(p->m, !p->final[i]);
    t0 = tr_now();
    loss = tr_model_chunk_backward_bufs(p->m, c, k, p->gr[i], p->gs[i], tok,
                                        c == last ? targets[a->mb] : NULL, B, T, scale, part);
    busy_since(p, t0, a);
    /* at zb-v's turn the input's gradient is already in the previous chunk's buffer */
    if (part != TR_BWD_WEIGHT && c > 0 && !local(p, c, -1))
        p->send_grad[gat] = move(p, 1, tr_model_chunk_grad_input(p->m, c, p->gs[i]), n, B, T,
                                 rank_of(p, c - 1), tag_of(1, c - 1));
    if (part != TR_BWD_INPUT && p->hook) p->hook(p->hook_ctx);
    return loss;
}

double tr_pipe_step(tr_pipe *p, const int *const *tokens, const int *const *targets, int B, int T,
                    float grad_scale) {
    double t0 = tr_now(), idle = 0, loss = 0, b0 = tr_comm_bytes_sent(p->c);
    p->busy = 0;
    post_after(p, -1, B, T);
    for (int i = 0; i < p->n; i++) {
        loss += run_action(p, i, tokens, targets, B, T, grad_scale, &idle);
        post_after(p, i, B, T);
    }
    for (int k = 0; k < p->nch * p->maxs; k++)
        wait_on(p, &p->send_act[k], &idle, TR_SPAN_WAIT_OUT, NULL);
    for (int k = 0; k < p->nch * p->maxg; k++)
        wait_on(p, &p->send_grad[k], &idle, TR_SPAN_WAIT_OUT, NULL);
    tr_model_hold_grad_hooks(p->m, 0);
    /* the loss is the last stage's; its sum also ends the step together on every stage, so
       that what each one did not compute of the span is its bubble */
    double e0 = tr_now();
    tr_comm_all_reduce(p->c, &loss, 1, TR_COMM_F64);
    tr_trace_span(p->trace, TR_SPAN_STEP_END, e0, tr_now(), -1, -1);
    double span = tr_now() - t0;
    p->last_idle = span > 0 ? 1.0 - p->busy / span : 0;
    p->last_idle_s = span > p->busy ? span - p->busy : 0;
    if (p->warm++) { /* the first step warms up (page faults, MPI's connections): left out */
        p->st.steps++;
        p->st.step_s += span;
        p->st.idle_s += span - p->busy;
        p->st.bytes += tr_comm_bytes_sent(p->c) - b0;
    }
    return loss;
}

/* ---- evaluation and decoding ---------------------------------------------------------- */

double tr_pipe_eval(tr_pipe *p, const int *tokens, const int *targets, int B, int T) {
    size_t n = tr_model_stream_elems(p->m, B, T);
    double loss = 0;
    tr_comm_req *sent = NULL;
    for (int c = 0; c < p->nch; c++) { /* each stage its chunks, in model order */
        if (!tr_model_chunk_held(p->m, c)) continue;
        if (local(p, c, -1))
            tr_model_copy_stream(p->m, tr_model_chunk_input(p->m, c, 0),
                                 tr_model_chunk_output(p->m, c - 1, 0), n);
        else if (c > 0)
            tr_comm_wait(
                irecv(p, tr_model_chunk_input(p->m, c, 0), n, rank_of(p, c - 1), tag_of(0, c)));
        tr_comm_wait(sent); /* slot 0's output, sent from the chunk before */
        sent = NULL;
        loss += tr_model_chunk_forward(p->m, c, 0, c == 0 ? tokens : NULL,
                                       c == p->nch - 1 ? targets : NULL, B, T);
        if (c < p->nch - 1 && !local(p, c, 1))
            sent =
                isend(p, tr_model_chunk_output(p->m, c, 0), n, rank_of(p, c + 1), tag_of(0, c + 1));
    }
    tr_comm_wait(sent);
    tr_comm_all_reduce(p->c, &loss, 1, TR_COMM_F64);
    return loss;
}

void tr_pipe_decode(tr_pipe *p, tr_kv_cache *cache, int token, int pos, float *logits) {
    size_t C = (size_t)tr_model_desc_of(p->m)->dim;
    for (int c = 0; c < p->nch; c++) {
        if (!tr_model_chunk_held(p->m, c)) continue;
        if (local(p, c, -1))
            tr_model_copy_stream(p->m, tr_model_chunk_input(p->m, c, 0),
                                 tr_model_chunk_output(p->m, c - 1, 0), C);
        else if (c > 0)
            tr_comm_wait(
                irecv(p, tr_model_chunk_input(p->m, c, 0), C, rank_of(p, c - 1), tag_of(0, c)));
        tr_model_decode_chunk(p->m, cache, c, token, pos, logits);
        if (c < p->nch - 1 && !local(p, c, 1)) /* one row: its receiver is waiting for it */
            tr_comm_wait(isend(p, tr_model_chunk_output(p->m, c, 0), C, rank_of(p, c + 1),
                               tag_of(0, c + 1)));
    }
    tr_comm_broadcast(p->c, logits, (size_t)tr_model_desc_of(p->m)->vocab, TR_COMM_F32,
                      rank_of(p, p->nch - 1));
}

tr_pipe_stats tr_pipe_get_stats(const tr_pipe *p) {
    return p->st;
}
double tr_pipe_last_idle(const tr_pipe *p) {
    return p->last_idle;
}

double tr_pipe_last_idle_seconds(const tr_pipe *p) {
    return p->last_idle_s;
}
const tr_pp_schedule *tr_pipe_schedule(const tr_pipe *p) {
    return &p->s;
}
