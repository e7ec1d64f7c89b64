/* Data parallelism: gradient buckets, overlapped reductions, ZeRO stages 1, 2 and 3.
 *
 * Buckets are runs of consecutive parameter tensors, taken from the last one backwards (the
 * order in which the backward completes them), of at least bucket_bytes each; because the
 * slab holds tensors back to back in index order, a bucket is one contiguous range. The
 * model's gradient hook tells when each tensor is final; the bucket whose lowest tensor that
 * was starts its reduction at once, and every hook call also tests the buckets in flight so
 * that MPI makes progress while the backward computes. ZeRO-2 and 3 split every bucket into
 * one piece per rank: the unit of the gradient reduce-scatters, of the optimizer state and,
 * at ZeRO-3, of the parameters (gathered per op: dp_params.c, with ZeRO-1/2's refresh of the
 * parameters after the update). Every buffer of those stages
 * (pieces, ring, gathers) is the backend's memory in its storage dtype, moved by the
 * backend's table and by device collectives (tr_comm_start with the model's dtype and memory):
 * one code path for the CPU and a GPU. On a GPU, waits order the compute stream and return at
 * once, so a buffer is never read on the host, only by work enqueued after the wait. */
#include "parallel/dp_private.h"
#include "model/mutant.h"

#include <assert.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* n storage elements of backend memory (zeroed when asked; fresh memory always is). On a GPU
 * a buffer given back after a stream-ordered wait is reused only by work enqueued later on
 * the compute stream, so no host synchronisation is needed. */
tr_buf *dp_pool_take(tr_dp *d, size_t n, int zero) {
    int best = -1;
    for (int k = 0; k < d->n_pool; k++)
        if (d->pool[k].n >= n && (best < 0 || d->pool[k].n < d->pool[best].n)) best = k;
    if (best < 0) return d->be->alloc((n ? n : 1) * d->es);
    tr_buf *p = d->pool[best].p;
    d->pool_bytes -= d->pool[best].n * d->es;
    d->pool[best] = d->pool[--d->n_pool];
    if (zero) d->be->zero(p, n * d->es);
    return p;
}

/* n: the size it was taken with (the in-use counters already exclude it) */
void dp_pool_give(tr_dp *d, tr_buf *p, size_t n) {
    if (p && d->n_pool < (int)(sizeof(d->pool) / sizeof(d->pool[0]))) {
        d->pool[d->n_pool].p = p;
        d->pool[d->n_pool++].n = n;
        d->pool_bytes += n * d->es;
    } else {
        d->be->free(p);
    }
}

/* A collective on the model's buffers: its storage dtype, its memory. */
tr_comm_req *dp_coll(tr_dp *d, tr_comm_op op, const tr_buf *send, tr_buf *recv, size_t n,
                     int root) {
    return tr_comm_start(d->c, op, send, recv, n, tr_model_comm_dtype(d->m), root, 0,
                         tr_model_comm_mem(d->m));
}

#define SHIFT_NONFINITE (-1000) /* bucket.shift: a rank's gradient was not finite */

/* Private gradients: the scale of n floats at x (from the sum over the group of each rank's
 * largest magnitude: blocking, one number) and x masked into q[0..n] (masked.h); the scale's
 * exponent, or SHIFT_NONFINITE when a rank's values were not finite (then sent as zeros).
 * The masking's seconds go to st.mask_s, the sum's to the communicator's waits. */
static int mask_bucket(tr_dp *d, float *x, size_t n, uint32_t *q) {
    double t0 = tr_now(), a = 0;
    for (size_t i = 0; i < n && isfinite(a); i++) {
        float v = fabsf(x[i]);
        a = !isfinite(v) ? HUGE_VAL : v > a ? v : a;
    }
    double t1 = tr_now();
    tr_comm_all_reduce(d->c, &a, 1, TR_COMM_F64);
    double t2 = tr_now();
    int shift = isfinite(a) ? tr_masked_shift(a, d->world) : SHIFT_NONFINITE;
    if (shift == SHIFT_NONFINITE) memset(x, 0, n * sizeof(float));
    if (tr_masked_mask(d->mask, x, n, shift == SHIFT_NONFINITE ? 0 : shift, d->mseq++, q)) {
        fprintf(stderr, "trainer: private gradients: out of memory for a mask of %zu "
                        "elements\n", n);
        abort();
    }
    d->st.mask_s += (t1 - t0) + (tr_now() - t2);
    return shift;
}

static void poll_buckets(tr_dp *d) {
    for (int i = 0; i < d->n_buckets; i++)
        if (d->b[i].started && !d->b[i].done && tr_comm_test(d->b[i].req)) {
            d->b[i].done = 1;
            d->last_done = tr_now();
        }
}

/* A new step: every bucket waits for all its tensors again. */
static void reset_pending(tr_dp *d) {
    for (int i = 0; i < d->n_buckets; i++) {
        d->b[i].pending = d->b[i].hi_param - d->b[i].lo_param + 1;
        d->b[i].started = 0;
    }
}

/* TR_DUMP_LOCAL_GRAD=P: `bytes` at p to P`what`.RANK (a test's hook: said, never fatal). */
static void dump_bytes(const tr_dp *d, const char *what, const void *p, size_t bytes) {
    char path[4096];
    snprintf(path, sizeof path, "%s%s.%d", d->dump_local ? d->dump_local : d->dump_sent, what,
             d->rank);
    FILE *f = p ? fopen(path, "wb") : NULL;
    if (!f || fwrite(p, 1, bytes, f) != bytes)
        fprintf(stderr, "trainer: TR_DUMP_LOCAL_GRAD: cannot write %s\n", path);
    if (f) fclose(f);
}

/* TR_DUMP_LOCAL_GRAD: this rank's own gradient of bucket b, before the sum (float32); a
 * masked one's message follows (start_masked). */
static void dump_local(tr_dp *d, const bucket *b, const tr_buf *g) {
    size_t n = b->hi - b->lo;
    float *x = malloc(n * sizeof *x);
    if (x) d->be->download(x, g, n * sizeof *x);
    dump_bytes(d, "", x, n * sizeof *x);
    free(x);
    if (d->mask) d->dump_sent = d->dump_local;
    d->dump_local = NULL;
}

/* Private gradients: the sum over the group of each rank's largest magnitude in the bucket
 * (blocking: one number, in the clear), then the bucket in fixed point with this rank's masks
 * and a canary, summed as int32 (masked.h). A gradient that is not finite is sent as zeros
 * and comes back as NaN everywhere, for the guard to judge. */
static tr_comm_req *start_masked(tr_dp *d, bucket *b, const tr_buf *g) {
    size_t n = b->hi - b->lo;
    float *x = d->mx + b->lo;
    uint32_t *q = d->mq + b->qoff;
    double t0 = tr_now();
    d->be->download(x, g, n * sizeof(float));
    d->st.mask_s += tr_now() - t0;
    b->shift = mask_bucket(d, x, n, q);
    if (d->dump_sent) {
        dump_bytes(d, ".sent", q, (n + 1) * sizeof *q);
        d->dump_sent = NULL;
    }
    return tr_comm_iall_reduce(d->c, q, n + 1, TR_COMM_I32);
}

/* The bucket's masked sum back into the gradient; -1 when its masks did not cancel. */
static int finish_masked(tr_dp *d, bucket *b) {
    size_t n = b->hi - b->lo;
    float *x = d->mx + b->lo;
    double t0 = tr_now();
    int bad = tr_masked_unmask(d->mq + b->qoff, n, b->shift == SHIFT_NONFINITE ? 0 : b->shift, x);
    d->st.mask_s += tr_now() - t0;
    if (bad) return -1;
    if (b->shift == SHIFT_NONFINITE)
        for (size_t i = 0; i < n; i++) x[i] = NAN;
    d->be->upload(tr_buf_at(d->be, tr_model_grad_slab(d->m), b->lo), x, n * sizeof(float));
    return 0;
}

static void start_allreduce(tr_dp *d, bucket *b) {
    if (!d->first_start) d->first_start = tr_now();
    if (d->dump_local)
        dump_local(d, b, tr_buf_at(d->be, tr_model_grad_slab(d->m), b->lo));
    b->started = 1;
    b->done = 0;
    tr_buf *g = tr_buf_at(d->be, tr_model_grad_slab(d->m), b->lo);
    b->req = d->mask ? start_masked(d, b, g)
                     : dp_coll(d, TR_COMM_OP_ALL_REDUCE, NULL, g, b->hi - b->lo, -1);
    d->st.buckets++;
    if (d->sync_reduce) { /* the baseline: completed here, nothing beside the compute */
        double t0 = tr_now();
        TR_WAIT("dp.allreduce", tr_comm_wait(b->req));
        d->st.exposed_s += tr_now() - t0;
        b->req = NULL;
        b->done = 1;
        d->last_done = tr_now();
    }
}


/* ---- ZeRO-2 ------------------------------------------------------------------------------
 * No full gradient exists: while a micro-step computes, each bucket's gradient lives in a
 * slot of a small ring, placed by the model's pre-gradient hook and zeroed then; as soon as
 * the bucket is complete its reduce-scatter starts, and when that finishes this rank's piece
 * is added into sgrad and the slot is free again. Every micro-step communicates (the full
 * gradient is never kept to accumulate into). */

/* Private gradients at ZeRO-2 and 3: slot s's bucket (world pieces of `piece`) as world
 * pieces of piece + 1, each ending in a zero that must come back zero (its canary), masked as
 * one vector (masked.h) and reduce-scattered as int32 into this rank's piece + 1. */
static tr_comm_req *z2_start_masked(tr_dp *d, ring_slot *s, size_t piece) {
    size_t w = (size_t)d->world, n = w * (piece + 1);
    if (s->mcap < piece) {
        free(s->mx), free(s->mq), free(s->mqr);
        s->mx = malloc(n * sizeof *s->mx);
        s->mq = malloc(n * sizeof *s->mq);
        s->mqr = malloc((piece + 1) * sizeof *s->mqr);
        s->mcap = s->mx && s->mq && s->mqr ? piece : 0;
        if (!s->mcap) {
            fprintf(stderr, "trainer: private gradients: out of memory for a bucket of %zu "
                            "elements\n", n);
            abort();
        }
    }
    double t0 = tr_now();
    for (size_t k = 0; k < w; k++) {
        float *x = s->mx + k * (piece + 1);
        d->be->download(x, tr_buf_at(d->be, s->buf, k * piece), piece * sizeof(float));
        x[piece] = 0;
    }
    d->st.mask_s += tr_now() - t0;
    s->shift = mask_bucket(d, s->mx, n - 1, s->mq); /* the last piece's canary: q[n - 1] */
    return tr_comm_ireduce_scatter(d->c, s->mq, s->mqr, piece + 1, TR_COMM_I32);
}

/* This rank's masked piece back into s->recv; -1 when its canary did not come back zero. */
static int z2_unmask(tr_dp *d, ring_slot *s, size_t piece) {
    double t0 = tr_now();
    int bad = tr_masked_unmask(s->mqr, piece, s->shift == SHIFT_NONFINITE ? 0 : s->shift, s->mx);
    d->st.mask_s += tr_now() - t0;
    if (bad) return -1;
    if (s->shift == SHIFT_NONFINITE)
        for (size_t i = 0; i < piece; i++) s->mx[i] = NAN;
    d->be->upload(s->recv, s->mx, piece * sizeof(float));
    return 0;
}

/* The wait is exposed wherever it falls: after the backward (dp_sync), and within it where
 * more than TR_DP_IN_FLIGHT reductions are in flight or a slot is needed (z2_start,
 * z2_acquire, z2_place): the compute stops for it there too. */
static void z2_finish(tr_dp *d, int k) {
    ring_slot *s = &d->ring[k];
    double t0 = tr_now();
    TR_WAIT("dp.z2_finish", tr_comm_wait(s->req));
    d->st.exposed_s += tr_now() - t0;
    s->req = NULL;
    bucket *b = &d->b[s->bucket];
    if (d->mask && z2_unmask(d, s, b->piece)) d->mask_failed = 1;
    tr_buf *acc = tr_buf_at(d->be, d->sgrad, b->state);
    d->be->add(acc, acc, s->recv, b->piece); /* after the wait, on the compute stream */
    d->ring_bytes -= ((size_t)d->world + 1) * b->piece * d->es;
    s->buf = s->recv = NULL; /* the slot's own buffers: kept for its next bucket */
    b->slot = -1;
    s->bucket = -1;
    d->last_done = tr_now();
}

static void z2_poll(tr_dp *d) {
    for (int k = 0; k < RING; k++)
        if (d->ring[k].req && tr_comm_test(d->ring[k].req)) z2_finish(d, k);
}

/* A free ring slot for a bucket of `piece`: the smallest that holds it (the slots are sized
 * at the start for the RING largest pieces: plan_buffers), finishing the oldest reductions
 * until one is. When every slot left is too small and none is in flight, a free one grows
 * (device memory the plan did not count: the run's line shows it). */
static int z2_acquire(tr_dp *d, size_t piece) {
    for (;;) {
        int best = -1, any = -1, oldest = -1;
        for (int k = 0; k < RING; k++) {
            ring_slot *s = &d->ring[k];
            if (s->bucket < 0) {
                any = k;
                if (s->cap >= piece && (best < 0 || s->cap < d->ring[best].cap)) best = k;
            } else if (s->req && (oldest < 0 || s->seq < d->ring[oldest].seq)) {
                oldest = k;
            }
        }
        if (best >= 0) return best;
        if (oldest >= 0) {
            z2_finish(d, oldest);
            continue;
        }
        if (any < 0) { /* every slot holds a bucket still being computed: cannot happen */
            fprintf(stderr, "trainer: ZeRO-2: more than %d gradient buckets open at once\n",
                    RING);
            abort();
        }
        ring_slot *s = &d->ring[any];
        d->be->free(s->gbuf);
        d->be->free(s->grecv);
        s->gbuf = d->be->alloc((size_t)d->world * piece * d->es);
        s->grecv = d->be->alloc(piece * d->es);
        if (!s->gbuf || !s->grecv) {
            fprintf(stderr, "trainer: ZeRO-2: out of memory for a gradient bucket of %zu "
                    "elements on the %s backend\n", (size_t)d->world * piece, d->be->name);
            abort();
        }
        d->ring_high += (piece - s->cap) * ((size_t)d->world + 1) * d->es;
        s->cap = piece;
        return any;
    }
}

static void z2_place(void *ctx, int param) {
    tr_dp *d = ctx;
    bucket *b = &d->b[d->bucket_of[param]];
    if (b->slot >= 0) {
        if (!d->ring[b->slot].req) return; /* placed in this micro-step already */
        z2_finish(d, b->slot); /* last micro-step's reduction of it: finish, then start anew */
    }
    int k = z2_acquire(d, b->piece);
    ring_slot *s = &d->ring[k];
    s->bucket = d->bucket_of[param];
    b->slot = k;
    s->buf = s->gbuf, s->recv = s->grecv; /* allocated at the start, for the largest piece */
    d->be->zero(s->buf, (size_t)d->world * b->piece * d->es);
    d->ring_bytes += ((size_t)d->world + 1) * b->piece * d->es;
    for (int i = b->lo_param; i <= b->hi_param; i++)
        tr_model_set_grad_addr(d->m, i,
                               tr_buf_at(d->be, s->buf, tr_model_param(d->m, i)->offset - b->lo));
}

static void z2_start(tr_dp *d, bucket *b) {
    assert(b->slot >= 0 && !d->ring[b->slot].req); /* placed, not reduced yet */
    ring_slot *s = &d->ring[b->slot];
    b->started = 1;
    if (!d->first_start) d->first_start = tr_now();
    s->seq = d->seq++;
    s->req = d->mask ? z2_start_masked(d, s, b->piece)
                     : dp_coll(d, TR_COMM_OP_REDUCE_SCATTER, s->buf, s->recv, b->piece, -1);
    d->st.buckets++;
    if (d->sync_reduce) { /* the baseline: completed here, nothing beside the compute */
        z2_finish(d, b->slot);
        return;
    }
    for (;;) {
        int n = 0, oldest = -1;
        for (int k = 0; k < RING; k++)
            if (d->ring[k].req) {
                n++;
                if (oldest < 0 || d->ring[k].seq < d->ring[oldest].seq) oldest = k;
            }
        if (n <= TR_DP_IN_FLIGHT) break;
        z2_finish(d, oldest);
    }
}

/* The head's part of a tied embedding's gradient is complete: reduce-scatter its bucket now
 * (into the same pieces) and free the buffer; the embedding's backward places the bucket
 * anew, and it is reduced again when complete. One more reduction of that bucket per
 * micro-step, instead of holding it through the whole backward. */
static void z2_partial(void *ctx, int param) {
    tr_dp *d = ctx;
    bucket *b = &d->b[d->bucket_of[param]];
    if (d->armed && b->slot >= 0 && !d->ring[b->slot].req) z2_start(d, b);
}

/* A tensor's gradient is final: its bucket starts when all of its tensors are. Every rank
 * runs the same backward, so buckets start in the same order everywhere. A bucket's tensors
 * complete in one action of a pipeline's schedule (cut_buckets), so once they all have, the
 * next ones to complete are of another micro-batch: it waits for all of them again. */
static void on_grad_ready(void *ctx, int param) {
    tr_dp *d = ctx;
    if (!d->armed) return;
    bucket *b = &d->b[d->bucket_of[param]];
    if (--b->pending == 0) {
        b->pending = b->hi_param - b->lo_param + 1;
        if (d->sh.grads)
            z2_start(d, b);
        else
            start_allreduce(d, b);
    }
    if (d->sh.grads)
        z2_poll(d);
    else
        poll_buckets(d);
}

/* Whether tensor i, below the open bucket whose highest tensor is hi, must start a new one.
 * A bucket never mixes tensors that complete in different actions of a pipeline's schedule
 * (tr_model_grad_phase: another chunk, or a split backward's other part), between which other
 * micro-batches' backwards may run: so each bucket completes, and is reduced, within one
 * action, for one micro-batch, whatever the schedule. And a tied embedding's pair of stages
 * (tr_param.pp_tied) each keep it in a bucket of its own, cut into the same pieces on both:
 * the sum over the pair (tp_sum_partial_grads) then meets piece with piece, whether a rank
 * holds the whole gradient (ZeRO 0, 1) or its pieces (2, 3). */
static int apart(const tr_model *m, int i, int hi) {
    return i >= 0 && (tr_model_grad_phase(m, i) != tr_model_grad_phase(m, hi) ||
                      tr_model_param(m, i)->pp_tied || tr_model_param(m, hi)->pp_tied);
}

/* Buckets of at least bucket_bytes (0: 4 MiB) in the storage dtype, from the last tensor
 * backwards (cut earlier where apart() says), into b (room for one per tensor) and each
 * tensor's bucket into bucket_of; each bucket splits into `world` pieces (ZeRO-2, 3), whose
 * elements are summed into *pieces. Returns how many buckets. */
static int cut_buckets(const tr_model *m, size_t bucket_bytes, int world, bucket *b,
                       int *bucket_of, size_t *pieces) {
    if (!bucket_bytes) bucket_bytes = (size_t)4 << 20;
    int np = tr_model_num_params(m), n = 0;
    size_t elems = 0, hi_el = 0, W = (size_t)world;
    int hi_param = 0;
    *pieces = 0;
    for (int i = np - 1; i >= 0; i--) {
        const tr_param *p = tr_model_param(m, i);
        if (elems == 0) {
            hi_el = p->offset + p->extent; /* with a padded vocabulary's rows */
            hi_param = i;
        }
        elems += p->extent;
        if (bucket_of) bucket_of[i] = n;
        if (elems * tr_model_storage_bytes(m) >= bucket_bytes || i == 0 ||
            apart(m, i - 1, hi_param)) {
            size_t piece = (hi_el - p->offset + W - 1) / W;
            b[n++] = (bucket){.lo_param = i, .hi_param = hi_param, .lo = p->offset, .hi = hi_el,
                              .slot = -1, .piece = piece, .state = *pieces};
            *pieces += piece;
            elems = 0;
        }
    }
    return n;
}

_Static_assert(GATHERS <= RING, "the gathers take the ring's sizes (plan_buffers)");

static int by_size_down(const void *a, const void *b) {
    size_t x = *(const size_t *)a, y = *(const size_t *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

/* ZeRO-2 and 3's bucket buffers, sized once from the cut: tr_dp_measure predicts them and
 * tr_dp_init allocates them, before the first step (no device allocation follows it). The
 * ring's RING slots, slot k sized for the k-th largest piece (cap[k]): its bucket's gradient
 * (world x cap) and its reduced piece; ZeRO-2's refresh buffer of every bucket that does not
 * split exactly into pieces (all in flight at once after the update), placed at b[k].roff;
 * ZeRO-3's gathered buckets, the GATHERS largest. Elements: the ring's, the refresh's and the
 * gathers'. A model whose largest tensor is one huge bucket (an embedding) holds it once. */
static void plan_buffers(bucket *b, int n, int world, tr_zero sh, size_t out[3],
                         size_t cap[RING]) {
    size_t W = (size_t)world;
    out[0] = out[1] = out[2] = 0;
    for (int k = 0; k < RING; k++) cap[k] = 0;
    if (!sh.grads || n <= 0) return;
    size_t *p = malloc((size_t)n * sizeof(size_t));
    if (!p) return;
    for (int k = 0; k < n; k++) {
        p[k] = b[k].piece;
        b[k].roff = out[1];
        if (!sh.params && world > 1 && W * b[k].piece != b[k].hi - b[k].lo)
            out[1] += W * b[k].piece;
    }
    qsort(p, (size_t)n, sizeof(size_t), by_size_down);
    for (int k = 0; k < RING && k < n; k++) {
        cap[k] = p[k];
        out[0] += (W + 1) * p[k];
    }
    for (int k = 0; sh.params && k < GATHERS && k < n; k++) out[2] += W * p[k];
    free(p);
}

void tr_dp_measure(tr_model *m, int zero, int size, size_t bucket_bytes, tr_memory *mem) {
    size_t pieces = 0, buf[3] = {0, 0, 0};
    if (tr_zero_of(zero).grads) { /* the optimizer state (and parameters) of its pieces */
        int np = tr_model_num_params(m);
        bucket *b = calloc((size_t)(np ? np : 1), sizeof(bucket));
        size_t cap[RING];
        if (b) plan_buffers(b, cut_buckets(m, bucket_bytes, size, b, NULL, &pieces), size,
                            tr_zero_of(zero), buf, cap);
        free(b);
        tr_model_alloc_optim(m, pieces); /* a planned model records the sizes only */
    }
    *mem = tr_model_memory(m);
    mem->grads += pieces * tr_model_storage_bytes(m); /* the summed gradient of the pieces */
    mem->buffers = (buf[0] + buf[1] + buf[2]) * tr_model_storage_bytes(m);
}

int tr_dp_init(tr_dp **out, tr_model *m, tr_comm *c, int zero, size_t bucket_bytes, char *err,
               size_t errlen) {
    *out = NULL;
    assert(zero >= 0 && zero <= 3); /* the resolved layout checked the stage (layout.c) */
    tr_zero sh = tr_zero_of(zero);
    const tr_backend *be = tr_model_backend(m);
    size_t lo, hi;
    tr_model_optim_range(m, &lo, &hi);
    if (sh.optimizer && !sh.grads && tr_comm_size(c) > 1 &&
        hi - lo != tr_model_slab_elements(m) / (size_t)tr_comm_size(c)) {
        snprintf(err, errlen, "ZeRO-1: the model was not built with %d optimizer shards",
                 tr_comm_size(c));
        return -1;
    }
    if (sh.grads != (tr_model_memory(m).grads == 0)) {
        snprintf(err, errlen, "ZeRO-%d: the model was %sbuilt with external gradients", zero,
                 sh.grads ? "not " : "");
        return -1;
    }
    if (sh.params != (tr_model_param_slab(m) == NULL)) {
        snprintf(err, errlen, "ZeRO-%d: the model was %sbuilt with external parameters", zero,
                 sh.params ? "not " : "");
        return -1;
    }
    tr_dp *d = calloc(1, sizeof(*d));
    d->m = m;
    d->be = be;
    d->es = tr_dtype_size(be->dtype);
    d->c = c;
    d->zero = zero;
    d->sh = sh;
    d->world = tr_comm_size(c);
    d->rank = tr_comm_rank(c);
    d->dump_local = getenv("TR_DUMP_LOCAL_GRAD"); /* a test's hook */
    d->refresh = sh.optimizer && !sh.params && d->world > 1;
    int np = tr_model_num_params(m);
    d->b = calloc((size_t)(np ? np : 1), sizeof(bucket));
    d->bucket_of = calloc((size_t)(np ? np : 1), sizeof(int));
    d->n_buckets = cut_buckets(m, bucket_bytes, d->world, d->b, d->bucket_of, &d->sgrad_elems);
    if (sh.grads) {
        size_t maxp = 0; /* the largest piece */
        for (int k = 0; k < d->n_buckets; k++)
            if (d->b[k].piece > maxp) maxp = d->b[k].piece;
        d->ring_elems = (size_t)d->world * maxp;
        size_t buf[3], cap[RING];
        plan_buffers(d->b, d->n_buckets, d->world, sh, buf, cap);
        int ok = (d->sgrad = be->alloc((d->sgrad_elems ? d->sgrad_elems : 1) * d->es)) &&
                 (d->pieces = calloc((size_t)d->n_buckets, sizeof(tr_piece))) &&
                 tr_model_alloc_optim(m, d->sgrad_elems) == 0;
        for (int k = 0; k < RING; k++) {
            ring_slot *r = &d->ring[k];
            r->bucket = -1;
            r->cap = cap[k];
            if (ok && cap[k])
                ok = (r->gbuf = be->alloc((size_t)d->world * cap[k] * d->es)) &&
                     (r->grecv = be->alloc(cap[k] * d->es));
        }
        if (ok && buf[1]) ok = (d->rbuf = be->alloc(buf[1] * d->es)) != NULL;
        for (int k = 0; ok && sh.params && k < GATHERS && cap[k]; k++) { /* GATHERS <= RING */
            size_t n = (size_t)d->world * cap[k];
            ok = (d->pool[k].p = be->alloc(n * d->es)) != NULL;
            d->pool[k].n = n;
            d->n_pool += ok;
        }
        d->ring_high = buf[0] * d->es; /* what is held: the ring, the parameter buffers */
        d->pbuf_high = (buf[1] + buf[2]) * d->es;
        d->pool_bytes = buf[2] * d->es;
        if (!ok) {
            snprintf(err, errlen, "ZeRO-2: out of memory for the gradient buffers");
            tr_dp_free(d);
            return -2;
        }
        /* this rank's pieces, whose state (ZeRO-3: and parameters) the model keeps */
        int n = 0;
        for (int k = 0; k < d->n_buckets; k++) {
            size_t at, len = dp_piece(d, &d->b[k], &at);
            if (len) d->pieces[n++] = (tr_piece){at, at + len, NULL, d->b[k].state};
        }
        tr_model_set_pieces(m, d->pieces, n);
        tr_model_set_pre_grad_hook(m, z2_place, d);
        tr_model_set_partial_hook(m, z2_partial, d);
        d->armed = 1; /* every micro-step reduces */
        reset_pending(d);
    }
    if (dp_params_init(d)) {
        snprintf(err, errlen, "ZeRO-%d: out of memory for the parameters' bookkeeping", zero);
        tr_dp_free(d);
        return -2;
    }
    if (d->world > 1 || sh.grads) tr_model_set_grad_hook(m, on_grad_ready, d);
    *out = d;
    return 0;
}

tr_zero tr_dp_zero(const tr_dp *d) {
    return d->sh;
}

void tr_dp_free(tr_dp *d) {
    if (!d) return;
    tr_model_set_grad_hook(d->m, NULL, NULL);
    tr_model_set_pre_grad_hook(d->m, NULL, NULL);
    tr_model_set_partial_hook(d->m, NULL, NULL);
    dp_params_free(d);
    for (int k = 0; k < RING; k++) {
        d->be->free(d->ring[k].gbuf);
        d->be->free(d->ring[k].grecv);
        free(d->ring[k].mx), free(d->ring[k].mq), free(d->ring[k].mqr);
    }
    for (int k = 0; k < d->n_pool; k++) d->be->free(d->pool[k].p);
    d->be->free(d->rbuf);
    d->be->free(d->sgrad);
    free(d->pieces);
    free(d->bucket_of);
    free(d->b);
    tr_masked_close(d->mask);
    free(d->mq), free(d->mx);
    free(d);
}

int tr_dp_set_private(tr_dp *d, const char *org, int *orgs, int *peers, char *err,
                      size_t errlen) {
    /* the same answer on every rank: the layout and the model are the group's */
    /* a device's buckets go through host memory (the backend's download and upload) */
    if (tr_model_comm_dtype(d->m) != TR_COMM_F32)
        return snprintf(err, errlen, "private gradients: masked sums need fp32 gradients, and "
                                     "this run's are bf16 (--precision fp32 on the %s backend)",
                        d->be->name),
               -1;
    size_t n = 0, q = 0; /* the slab's extent; the masked buckets back to back */
    for (int k = 0; k < d->n_buckets; k++) {
        n = d->b[k].hi > n ? d->b[k].hi : n;
        d->b[k].qoff = q;
        q += d->b[k].hi - d->b[k].lo + 1;
    }
    d->mq = malloc((q + 1) * sizeof *d->mq);
    d->mx = malloc((n + 1) * sizeof *d->mx);
    int oom = !d->mq || !d->mx;
    tr_comm_all_reduce(d->c, &oom, 1, TR_COMM_I32);
    if (!oom) d->mask = tr_masked_open(d->c, org, err, errlen);
    else snprintf(err, errlen, "private gradients: out of memory for the masked buckets");
    if (d->mask) {
        *orgs = tr_masked_orgs(d->mask), *peers = tr_masked_peers(d->mask);
        return 0;
    }
    free(d->mq), free(d->mx);
    d->mq = NULL, d->mx = NULL;
    return -1;
}

size_t tr_dp_grad_bytes(const tr_dp *d) {
    if (!d->sh.grads) return 0;
    return d->sgrad_elems * d->es + d->ring_high; /* the ring: high-water mark */
}

size_t tr_dp_grad_buffer_bytes(const tr_dp *d) {
    return d->sh.grads ? d->ring_high : 0;
}

void tr_dp_arm(tr_dp *d) {
    if (d->world <= 1 && !d->sh.grads) return;
    d->armed = 1;
    d->first_start = d->last_done = 0;
    reset_pending(d);
}

/* Every bucket this backward wrote has started its reduction as it completed (on_grad_ready):
 * a pipeline's backwards of one micro-batch (chunks, parts) interleave with others', so
 * nothing here may assume that the whole model's gradient is complete. */
void tr_dp_micro_end(tr_dp *d) {
    if (d->sh.params) dp_z3_release_all(d);
}

static void dp_sync(tr_dp *d);

/* Where this rank keeps the final gradient of slab elements: the slab (ZeRO 0, 1), or its
 * pieces (ZeRO-2, 3): calls fn for each stretch [lo, hi) held, with its first element. */
typedef void (*held_fn)(void *ctx, size_t lo, size_t hi, tr_buf *at);
static void each_held(tr_dp *d, held_fn fn, void *ctx) {
    if (!d->sh.grads) {
        fn(ctx, 0, tr_model_slab_elements(d->m), tr_model_grad_slab(d->m));
        return;
    }
    for (int k = 0; k < d->n_buckets; k++) {
        size_t lo, len = dp_piece(d, &d->b[k], &lo);
        if (len) fn(ctx, lo, lo + len, tr_buf_at(d->be, d->sgrad, d->b[k].state));
    }
}

/* Tensor parallelism: a gradient that each of a group of tp ranks computed only in part
 * (tr_model_grad_group: replicated norms under sequence parallelism, key/value heads shared by
 * several ranks) is summed over that group where this rank keeps it, one all-reduce per
 * group. After the data-parallel reduction: sums commute. Every rank of such a group has the
 * same tensors and the same dp coordinate, so the same stretches, in the same order. */
typedef struct {
    tr_dp *d;
    tr_comm *group;
    char *buf;    /* packed stretches in host memory (NULL: count only) */
    size_t n;     /* elements packed so far */
    size_t es;    /* bytes of a storage element */
    int unpack;
} tp_pack;

/* The held gradient, the model's slab (ZeRO 0, 1) or this rank's pieces (ZeRO-2, 3), is the
 * backend's memory in its storage dtype. */
static void pack_held(void *ctx, size_t lo, size_t hi, tr_buf *at_) {
    tp_pack *k = ctx;
    tr_model *m = k->d->m;
    const tr_backend *be = tr_model_backend(m);
    char *at = (char *)at_;
    for (int i = 0; i < tr_model_num_params(m); i++) {
        const tr_param *p = tr_model_param(m, i);
        for (int s = 0; s < p->n_seg; s++) {
            if (tr_model_grad_group(m, i, s) != k->group) continue;
            size_t C = (size_t)p->shape[1], a = p->offset + (size_t)p->seg[s].row * C,
                   b = a + (size_t)p->seg[s].rows * C;
            if (a < lo) a = lo;
            if (b > hi) b = hi;
            if (a >= b) continue;
            char *h = k->buf + k->n * k->es, *g = at + (a - lo) * k->es;
            size_t bytes = (b - a) * k->es;
            if (k->buf && !k->unpack) be->download(h, g, bytes);
            if (k->buf && k->unpack) be->upload(g, h, bytes);
            k->n += b - a;
        }
    }
}

static void tp_sum_partial_grads(tr_dp *d) {
    tr_model *m = d->m;
    tr_comm *done[8];
    int n_done = 0;
    /* the tp groups first, then the pipeline's tied embedding (its pair of stages differ in
       which tp groups they have: one order for every rank) */
    for (int last = 0; last < 2; last++)
        for (int i = 0; i < tr_model_num_params(m); i++)
            for (int s = 0; s < tr_model_param(m, i)->n_seg; s++) {
                tr_comm *g = tr_model_grad_group(m, i, s);
                if (g && tr_model_param(m, i)->pp_tied != last) continue;
                int seen = !g;
                for (int k = 0; k < n_done && !seen; k++)
                    seen = done[k] == g;
                if (seen || n_done == 8) continue; /* the model makes at most 5 groups */
                done[n_done++] = g;
                tp_pack k = {.d = d, .group = g, .es = d->es};
                each_held(d, pack_held, &k); /* count */
                if (!k.n) continue;
                k.buf = malloc(k.n * k.es);
                if (!k.buf) {
                    fprintf(stderr, "trainer: out of memory summing tensor-parallel gradients\n");
                    abort();
                }
                k.n = 0;
                each_held(d, pack_held, &k);
                tr_comm_all_reduce(g, k.buf, k.n, tr_model_comm_dtype(m)); /* host memory */
                k.n = 0;
                k.unpack = 1;
                each_held(d, pack_held, &k);
                free(k.buf);
            }
}

/* The global gradient norm's square: what this rank keeps, a tensor replicated over the tp
 * group counted once (tr_model_grad_sumsq). */
typedef struct {
    tr_dp *d;
    double ss;
} sumsq_acc;

static void sumsq_held(void *ctx, size_t lo, size_t hi, tr_buf *at) {
    sumsq_acc *a = ctx;
    a->ss += tr_model_grad_sumsq(a->d->m, at, lo, hi);
}

double tr_dp_grad_norm(tr_dp *d) {
    tr_comm *tp = tr_model_tp_group(d->m), *pp = tr_model_pp_group(d->m);
    double ss = 0;
    if (!tp && !pp && !d->sh.grads) return tr_model_grad_norm(d->m);
    if (!tp && !pp && d->be->device_memory) { /* this rank's pieces (padding is zero) */
        ss = d->be->sumsq(d->sgrad, d->sgrad_elems);
    } else if (!tp && !pp) { /* host memory: the same, in one order (the CPU's figures stay
                                those of earlier runs, bit for bit) */
        const float *g = d->sgrad;
        for (size_t i = 0; i < d->sgrad_elems; i++) ss += (double)g[i] * g[i];
    } else {
        sumsq_acc acc = {d, 0.0};
        each_held(d, sumsq_held, &acc);
        ss = acc.ss;
    }
    if (d->sh.grads && d->world > 1) tr_comm_all_reduce(d->c, &ss, 1, TR_COMM_F64);
    if (tp) tr_comm_all_reduce(tp, &ss, 1, TR_COMM_F64);
    if (pp) tr_comm_all_reduce(pp, &ss, 1, TR_COMM_F64); /* every stage's tensors */
    return sqrt(ss);
}

int tr_dp_sync_grads(tr_dp *d) {
    dp_sync(d);
    tp_sum_partial_grads(d);
    if (!d->mask) return 0;
    int failed = d->mask_failed; /* ZeRO-2, 3: each rank checked its own pieces */
    tr_comm_all_reduce(d->c, &failed, 1, TR_COMM_I32);
    if (!failed) return 0;
    d->mask_failed = 0;
    if (d->rank == 0)
        fprintf(stderr, "trainer: private gradients: a masked gradient sum over the dp group "
                        "did not cancel (a peer's mask or key differs, or a message was altered "
                        "or replayed): stopping\n");
    return -1;
}

static void dp_sync(tr_dp *d) {
    if (d->sh.grads) { /* the waits are exposed time: z2_finish counts them */
        /* a bucket written but not complete (a model whose tensors complete out of order):
           reduced now, correctness first; every rank has the same ones */
        for (int i = 0; i < d->n_buckets; i++)
            if (d->b[i].slot >= 0 && !d->ring[d->b[i].slot].req) z2_start(d, &d->b[i]);
        for (int k = 0; k < RING; k++)
            if (d->ring[k].req) z2_finish(d, k);
        reset_pending(d);
        d->st.steps++;
        if (d->first_start > 0) d->st.span_s += d->last_done - d->first_start;
        return;
    }
    if (d->world <= 1) return;
    double t0 = tr_now();
    /* the hook starts every bucket as its tensors complete; should one not have started
       (a model whose tensors complete out of order), start it now: correctness first */
    for (int i = 0; i < d->n_buckets; i++)
        if (!d->b[i].started) start_allreduce(d, &d->b[i]);
    for (int i = 0; i < d->n_buckets; i++) {
        if (!d->b[i].done) {
            TR_WAIT("dp.allreduce", tr_comm_wait(d->b[i].req));
            d->b[i].done = 1;
            d->last_done = tr_now();
        } else if (d->b[i].req) {
            tr_comm_wait(d->b[i].req); /* completed earlier: frees the handle */
        }
        if (d->mask && finish_masked(d, &d->b[i])) d->mask_failed = 1;
    }
    double t1 = tr_now();
    d->armed = 0;
    d->st.steps++;
    d->st.exposed_s += t1 - t0;
    d->st.span_s += d->last_done - d->first_start;
    /* the next step starts every bucket anew, armed or not (a pipeline does not arm: its
       chunks' last backwards interleave) */
    for (int i = 0; i < d->n_buckets; i++)
        d->b[i].started = 0, d->b[i].req = NULL;
    d->first_start = d->last_done = 0;
}

void tr_dp_step(tr_dp *d, const tr_adamw *opt) {
    tr_dp_settle(d); /* the last refresh reads what the update writes */
    if (!d->sh.grads) {
        tr_model_adamw_step(d->m, opt); /* the shard only, when the model was built sharded */
    } else {
        int n = 0;
        for (int k = 0; k < d->n_buckets; k++) {
            const bucket *b = &d->b[k];
            size_t lo, len = dp_piece(d, b, &lo);
            if (len)
                d->pieces[n++] =
                    (tr_piece){lo, lo + len, tr_buf_at(d->be, d->sgrad, b->state), b->state};
        }
        tr_model_adamw_pieces(d->m, opt, d->pieces, n);
        d->be->zero(d->sgrad, d->sgrad_elems * d->es);
    }
    /* ZeRO-1, 2: the other ranks' parts come back during the next forward; ZeRO-3 keeps the
       parameters in pieces until an op needs them */
    if (d->refresh) {
        dp_refresh_start(d);
        if (d->sync_refresh) tr_dp_settle(d);
    }
}

void tr_dp_set_sync(tr_dp *d, int refresh, int reduce) {
    d->sync_refresh = refresh;
    d->sync_reduce = reduce;
}

void tr_dp_drop_grads(tr_dp *d) {
    if (d->sh.grads) d->be->zero(d->sgrad, d->sgrad_elems * d->es);
}

int tr_dp_gather_state(tr_dp *d, tr_dp_state *out) {
    tr_dp_settle(d);
    size_t n = tr_model_slab_elements(d->m), lo, hi;
    tr_model_optim_range(d->m, &lo, &hi);
    *out = (tr_dp_state){.dp = d, .m = malloc(n * sizeof(float)), .v = malloc(n * sizeof(float)),
                         .p = d->sh.optimizer ? malloc(n * sizeof(float)) : NULL};
    if (!out->m || !out->v || (d->sh.optimizer && !out->p)) {
        tr_dp_state_free(out);
        return -1;
    }
    const tr_backend *be = tr_model_backend(d->m);
    float *full[3] = {out->m, out->v, out->p};
    /* the master weights: ZeRO-3's in its pieces (indexed like the state), else the slab's,
       current only where this rank updated them */
    const float *master = tr_model_master_pieces(d->m);
    if (d->sh.grads) { /* bucket by bucket: every rank's piece, then the bucket's range */
        /* the moments and master weights are fp32 in any storage dtype: gathered on the host */
        float *h = malloc((d->ring_elems ? d->ring_elems : 1) * sizeof(float));
        if (!h) {
            tr_dp_state_free(out);
            return -1;
        }
        for (int k = 0; k < 3; k++) {
            const float *st = k < 2 ? tr_model_optim_state(d->m, (tr_state_kind)k) : master;
            for (int i = 0; i < d->n_buckets; i++) {
                const bucket *b = &d->b[i];
                size_t mine = (size_t)d->rank * b->piece, len = b->hi - b->lo;
                if (k < 2 || d->sh.params) {
                    be->download(h + mine, st + b->state, b->piece * sizeof(float));
                } else { /* ZeRO-2's master: its piece of the slab, clipped at the bucket */
                    size_t at, cnt = dp_piece(d, b, &at);
                    memset(h + mine, 0, b->piece * sizeof(float));
                    be->download(h + mine, st + at, cnt * sizeof(float));
                }
                if (d->world > 1)
                    tr_comm_all_gather(d->c, h + mine, h, b->piece, TR_COMM_F32);
                memcpy(full[k] + b->lo, h, len * sizeof(float));
            }
        }
        free(h);
        return 0;
    }
    for (int k = 0; k < (d->sh.optimizer ? 3 : 2); k++) { /* k = 2: ZeRO-1's master, its shard */
        const float *shard = k < 2 ? tr_model_optim_state(d->m, (tr_state_kind)k) : master + lo;
        be->download(full[k] + lo, shard, (hi - lo) * sizeof(float));
        if (hi - lo < n) /* sharded: every rank's part, in rank order, in place */
            tr_comm_all_gather(d->c, full[k] + lo, full[k], hi - lo, TR_COMM_F32);
    }
    return 0;
}

int tr_dp_gather_grads(tr_dp *d, float *out) {
    const tr_backend *be = d->be;
    if (!d->sh.grads) {
        be->from_storage(out, tr_model_grad_slab(d->m), tr_model_slab_elements(d->m));
        return 0;
    }
    /* bucket by bucket, as tr_dp_gather_state: every rank's piece into its place, gathered
       in the slab's layout through the bucket's padded length (the ring's largest) */
    float *h = malloc((d->ring_elems ? d->ring_elems : 1) * sizeof(float));
    int ok = h != NULL;
    tr_comm_all_reduce(d->c, &ok, 1, TR_COMM_I32); /* all ranks gather, or none */
    if (ok < d->world) {
        free(h);
        return -1;
    }
    for (int i = 0; i < d->n_buckets; i++) {
        const bucket *b = &d->b[i];
        size_t mine = (size_t)d->rank * b->piece;
        be->from_storage(h + mine, tr_buf_at(be, d->sgrad, b->state), b->piece);
        if (d->world > 1) tr_comm_all_gather(d->c, h + mine, h, b->piece, TR_COMM_F32);
        memcpy(out + b->lo, h, (b->hi - b->lo) * sizeof(float));
    }
    free(h);
    return 0;
}

void tr_dp_state_free(tr_dp_state *s) {
    free(s->m);
    free(s->v);
    free(s->p);
    s->m = s->v = s->p = NULL;
}

void tr_dp_param_source(void *ctx, int param, float *dst) {
    const tr_dp_state *s = ctx;
    const tr_param *p = tr_model_param(s->dp->m, param);
    memcpy(dst, s->p + p->offset, p->numel * sizeof(float));
}

size_t tr_dp_param_buffer_bytes(const tr_dp *d) {
    return d->pbuf_high;
}

void tr_dp_hold_params(tr_dp *d, int hold) {
    if (!d->sh.params) return;
    d->hold = hold;
    if (!hold) dp_z3_release_all(d);
}

int tr_dp_ckpt_ranges(const tr_dp *d, size_t **out) {
    size_t n = tr_model_slab_elements(d->m), lo, hi;
    if (d->sh.grads) { /* the pieces */
        *out = malloc((size_t)(d->n_buckets ? d->n_buckets : 1) * 2 * sizeof(size_t));
        int k = 0;
        for (int i = 0; i < d->n_buckets; i++) {
            size_t len = dp_piece(d, &d->b[i], &lo);
            if (!len) continue;
            (*out)[2 * k] = lo;
            (*out)[2 * k + 1] = lo + len;
            k++;
        }
        return k;
    }
    /* ZeRO-1: the optimizer shard; ZeRO-0: everything is everywhere, each writes 1/N */
    size_t per = (n + (size_t)d->world - 1) / (size_t)d->world;
    lo = (size_t)d->rank * per;
    hi = lo + per < n ? lo + per : n;
    if (d->sh.optimizer) tr_model_optim_range(d->m, &lo, &hi);
    *out = malloc(2 * sizeof(size_t));
    (*out)[0] = lo < hi ? lo : hi;
    (*out)[1] = hi;
    return 1;
}

double tr_dp_sum(tr_dp *d, double x) {
    if (d->world > 1) tr_comm_all_reduce(d->c, &x, 1, TR_COMM_F64);
    return x;
}

tr_dp_stats tr_dp_get_stats(const tr_dp *d) {
    return d->st;
}

double tr_dp_hidden_fraction(const tr_dp *d) {
    if (d->st.span_s <= 0) return 1.0;
    double h = 1.0 - d->st.exposed_s / d->st.span_s;
    return h < 0 ? 0 : h > 1 ? 1 : h;
}
