/* Data parallelism's parameters: ZeRO-1 and 2 bring back, during the next forward, the parts
 * of the parameters other ranks updated; ZeRO-3 gathers each op's parameters as it runs. Both
 * are driven by the model's op hook: before an op computes, the buckets it reads must be
 * whole. */
#include <stdio.h>
#include <stdlib.h>

#include "parallel/dp_private.h"
#include "model/mutant.h"

/* Does op `op` in direction dir (0 forward, 1 backward) read bucket k? */
static int needs(const tr_dp *d, int dir, int op, int k) {
    for (int j = 0; j < d->need_n[dir][op]; j++)
        if (d->need[dir][4 * op + j] == k) return 1;
    return 0;
}

/* ---- ZeRO-3 ------------------------------------------------------------------------------
 * Parameters live in the same pieces as the gradients and the optimizer state: rank r keeps
 * piece r of every bucket (fp32 master and working copy). Before an op runs, the buckets it
 * reads are all-gathered into whole buffers (waiting for them if the previous op's prefetch is
 * still in flight) and the model is pointed at them; then the buckets of the next op that reads
 * parameters in the same direction start gathering, overlapping this op's compute; after the
 * op, every bucket the next op does not read is freed. Every rank runs the same ops, so the
 * gathers start in the same order everywhere. */

static void z3_start(tr_dp *d, int k) {
    bucket *b = &d->b[k];
    if (b->full) return; /* gathered or in flight */
    size_t n = (size_t)d->world * b->piece;
    b->full = dp_pool_take(d, n, 0);
    if (!b->full) {
        fprintf(stderr, "trainer: ZeRO-3: out of memory gathering %zu parameters on the %s "
                "backend\n", n, d->be->name);
        abort();
    }
    d->pbuf_bytes += n * d->es;
    if (d->pbuf_bytes > d->pbuf_high) d->pbuf_high = d->pbuf_bytes;
    const tr_buf *mine = tr_buf_at(d->be, tr_model_param_pieces(d->m), b->state);
    b->preq = dp_coll(d, TR_COMM_OP_ALL_GATHER, mine, b->full, b->piece, -1);
    d->st.param_gathers++;
}

static void z3_ready(tr_dp *d, int k) {
    bucket *b = &d->b[k];
    z3_start(d, k);
    if (!b->preq) return;
    double t0 = tr_now();
    TR_WAIT("dp.z3_gather", tr_comm_wait(b->preq));
    d->st.gather_s += tr_now() - t0;
    b->preq = NULL;
    for (int i = b->lo_param; i <= b->hi_param; i++)
        tr_model_set_param_addr(d->m, i,
                                tr_buf_at(d->be, b->full, tr_model_param(d->m, i)->offset - b->lo));
}

static void z3_release(tr_dp *d, int k) {
    bucket *b = &d->b[k];
    if (!b->full) return;
    if (b->preq) TR_WAIT("dp.z3_release", tr_comm_wait(b->preq)); /* a prefetch nobody used: complete it first */
    b->preq = NULL;
    for (int i = b->lo_param; i <= b->hi_param; i++) tr_model_set_param_addr(d->m, i, NULL);
    d->pbuf_bytes -= (size_t)d->world * b->piece * d->es;
    dp_pool_give(d, b->full, (size_t)d->world * b->piece);
    b->full = NULL;
}

void dp_z3_release_all(tr_dp *d) {
    for (int k = 0; k < d->n_buckets; k++) z3_release(d, k);
}

static void z3_op(tr_dp *d, int op, int dir, int after) {
    int di = dir > 0 ? 0 : 1, n = d->need_n[di][op], nx = d->next_user[di][op];
    const int *need = d->need[di] + 4 * op;
    /* full recompute's forward (dir 2): its ops' backward comes right after it, so their
       buckets stay gathered until then, and nothing past the repeated ops is prefetched */
    if (dir == 2 && nx >= tr_model_recompute_end(d->m)) nx = -1;
    if (!after) {
        for (int j = 0; j < n; j++) z3_ready(d, need[j]);
        if (n && nx >= 0) /* prefetch what the next op reads while this one computes */
            for (int j = 0; j < d->need_n[di][nx]; j++) z3_start(d, d->need[di][4 * nx + j]);
    } else if (!d->hold && dir != 2) {
        for (int j = 0; j < n; j++)
            if (nx < 0 || !needs(d, di, nx, need[j])) z3_release(d, need[j]);
    }
    for (int k = 0; k < d->n_buckets; k++) /* let MPI progress the gathers in flight */
        if (d->b[k].preq) tr_comm_test(d->b[k].preq);
}


/* ---- ZeRO-1 and 2: the refresh after the update ------------------------------------------
 * Each rank updated its part of the parameters only: ZeRO-1 its shard of the slab, ZeRO-2 its
 * piece of every bucket. Right after the update every bucket's refresh starts, in the order
 * the forward reads the buckets (the slab's, from its first tensor), and each op waits for the
 * buckets it reads only: the transfers overlap the forward's compute. ZeRO-1: a broadcast,
 * in place, from each rank whose shard the bucket overlaps. ZeRO-2: an all-gather of the
 * pieces, in place when the bucket splits exactly into them, else through a buffer copied into
 * place at the wait (an in-place gather of the clipped last piece would write into the next
 * bucket). Every refresh is started at once, so a later wait never starts a collective: a rank
 * that computes alone (rank 0 sampling) only waits for what is in flight. */

void dp_refresh_start(tr_dp *d) {
    const tr_backend *be = d->be;
    tr_buf *slab = tr_model_param_slab(d->m);
    size_t lo, hi;
    tr_model_optim_range(d->m, &lo, &hi); /* ZeRO-1: rank r's shard is [r, r + 1) x per */
    size_t per = hi - lo;
    for (int k = d->n_buckets - 1; k >= 0; k--) { /* the forward's order */
        bucket *b = &d->b[k];
        tr_comm_req **rq = d->rreq + (size_t)k * d->world;
        if (!d->sh.grads) { /* ZeRO-1 */
            for (int r = (int)(b->lo / per); r < d->world && (size_t)r * per < b->hi; r++) {
                size_t a = b->lo > r * per ? b->lo : r * per;
                size_t e = b->hi < (r + 1) * per ? b->hi : (r + 1) * per;
                rq[b->nreq++] =
                    dp_coll(d, TR_COMM_OP_BROADCAST, NULL, tr_buf_at(be, slab, a), e - a, r);
            }
        } else {
            size_t len = b->hi - b->lo, n = (size_t)d->world * b->piece, at,
                   cnt = dp_piece(d, b, &at), mine = at - b->lo;
            tr_buf *whole = tr_buf_at(be, slab, b->lo);
            if (n != len) { /* its buffer, allocated at the start (dp.c: plan_buffers) */
                b->full = tr_buf_at(be, d->rbuf, b->roff);
                d->pbuf_bytes += n * d->es;
                be->copy(tr_buf_at(be, b->full, mine), tr_buf_at(be, whole, mine), cnt * d->es);
                if (cnt < b->piece) /* the clipped piece's tail: sent, never read */
                    be->zero(tr_buf_at(be, b->full, mine + cnt), (b->piece - cnt) * d->es);
                whole = b->full;
            }
            rq[b->nreq++] =
                dp_coll(d, TR_COMM_OP_ALL_GATHER, tr_buf_at(be, whole, mine), whole, b->piece, -1);
        }
        d->st.param_gathers += b->nreq;
    }
    d->rnext = d->n_buckets - 1, d->rnext_j = 0;
}

/* Bucket k's refresh completes (by_op: waited for by the op that reads it). */
static void refresh_wait(tr_dp *d, int k, int by_op) {
    bucket *b = &d->b[k];
    if (!b->nreq) return;
    double t0 = tr_now();
    for (int j = 0; j < b->nreq; j++) TR_WAIT("dp.refresh", tr_comm_wait(d->rreq[(size_t)k * d->world + j]));
    b->nreq = 0;
    if (b->full) { /* the buffered gather, copied into place on the compute stream */
        size_t n = (size_t)d->world * b->piece;
        d->be->copy(tr_buf_at(d->be, tr_model_param_slab(d->m), b->lo), b->full,
                    (b->hi - b->lo) * d->es);
        d->pbuf_bytes -= n * d->es;
        b->full = NULL;
    }
    d->st.gather_s += tr_now() - t0;
    d->st.refreshed++;
    if (by_op) d->st.refreshed_by_op++;
}

static void refresh_op(tr_dp *d, int op, int dir, int after) {
    if (after) return;
    int di = dir > 0 ? 0 : 1;
    for (int j = 0; j < d->need_n[di][op]; j++) refresh_wait(d, d->need[di][4 * op + j], 1);
    /* let MPI progress the rest: a test that reaches MPI runs its progress engine for every
       request in flight, so one test of the oldest request still pending does. The cursor
       walks the requests in the order they started and never goes back: each is found done
       once, and an op costs about one test, not one per request in flight. */
    while (d->rnext >= 0) {
        bucket *b = &d->b[d->rnext];
        if (d->rnext_j >= b->nreq) { /* waited for, or every request found done */
            d->rnext--, d->rnext_j = 0;
        } else if (tr_comm_test(d->rreq[(size_t)d->rnext * d->world + d->rnext_j])) {
            d->rnext_j++;
        } else {
            return;
        }
    }
}

void tr_dp_settle(tr_dp *d) {
    if (d->rreq)
        for (int k = d->n_buckets - 1; k >= 0; k--) refresh_wait(d, k, 0);
}

/* ---- the op hook -------------------------------------------------------------------------- */

static void dp_op(void *ctx, int op, int dir, int after) {
    tr_dp *d = ctx;
    if (d->sh.params)
        z3_op(d, op, dir, after);
    else
        refresh_op(d, op, dir, after);
}

int dp_params_init(tr_dp *d) {
    if (!d->refresh && !d->sh.params) return 0;
    tr_model *m = d->m;
    int nops = tr_model_num_ops(m);
    if (d->refresh) {
        d->rreq = calloc((size_t)d->n_buckets * (size_t)d->world, sizeof(tr_comm_req *));
        if (!d->rreq) return -1;
        d->rnext = -1;
    }
    for (int di = 0; di < 2; di++) {
        d->need[di] = calloc((size_t)(4 * nops + 4), sizeof(int));
        d->need_n[di] = calloc((size_t)(nops + 1), sizeof(int));
        d->next_user[di] = calloc((size_t)(nops + 1), sizeof(int));
        if (!d->need[di] || !d->need_n[di] || !d->next_user[di]) return -1;
        for (int op = 0; op < nops; op++) {
            int p[4], np = tr_model_op_params(m, op, di ? -1 : +1, p);
            for (int j = 0; j < np; j++) {
                int k = d->bucket_of[p[j]];
                if (!needs(d, di, op, k)) d->need[di][4 * op + d->need_n[di][op]++] = k;
            }
        }
        int next = -1; /* walking against the direction: the next op that reads parameters */
        for (int step = 0; step < nops; step++) {
            int op = di ? step : nops - 1 - step;
            d->next_user[di][op] = next;
            if (d->need_n[di][op]) next = op;
        }
    }
    tr_model_set_op_hook(m, dp_op, d);
    return 0;
}

void dp_params_free(tr_dp *d) {
    if (d->sh.params) dp_z3_release_all(d);
    tr_dp_settle(d);
    if (d->need[0]) tr_model_set_op_hook(d->m, NULL, NULL);
    for (int k = 0; k < 2; k++) {
        free(d->need[k]);
        free(d->need_n[k]);
        free(d->next_user[k]);
    }
    free(d->rreq);
}
