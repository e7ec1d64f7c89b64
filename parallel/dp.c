/* Data parallelism: gradient buckets, overlapped all-reduce, ZeRO stage 1.
 *
 * Buckets are runs of consecutive parameter tensors, taken from the last one backwards (the
 * order in which the backward completes them), of at least bucket_bytes each; because the
 * slab holds tensors back to back in index order, a bucket is one contiguous range. The
 * model's gradient hook tells when each tensor is final; the bucket whose lowest tensor that
 * was starts its all-reduce at once, and every hook call also tests the buckets in flight so
 * that MPI makes progress while the backward computes. */
#include "parallel/dp.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct {
    int lo_param;      /* the tensor that completes the bucket (its lowest index) */
    size_t lo, hi;     /* slab element range */
    tr_comm_req *req;
    int done;
} bucket;

struct tr_dp {
    tr_model *m;
    tr_comm *c;
    int zero, world, rank;
    bucket *b;
    int n_buckets, next; /* next bucket to start */
    int armed;
    double first_start, last_done;
    tr_dp_stats st;
};

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void poll_buckets(tr_dp *d) {
    for (int i = 0; i < d->next; i++)
        if (!d->b[i].done && tr_comm_test(d->b[i].req)) {
            d->b[i].done = 1;
            d->last_done = now();
        }
}

static void on_grad_ready(void *ctx, int param) {
    tr_dp *d = ctx;
    if (!d->armed) return;
    while (d->next < d->n_buckets && d->b[d->next].lo_param == param) {
        bucket *b = &d->b[d->next++];
        if (d->next == 1) d->first_start = now();
        b->req = tr_comm_iall_reduce(d->c, tr_buf_at(tr_model_backend(d->m), tr_model_grad_slab(d->m), b->lo),
                                     b->hi - b->lo, TR_COMM_F32);
        b->done = 0;
        d->st.buckets++;
    }
    poll_buckets(d);
}

int tr_dp_init(tr_dp **out, tr_model *m, tr_comm *c, int zero, size_t bucket_bytes, char *err,
               size_t errlen) {
    *out = NULL;
    if (zero < 0 || zero > 1) {
        snprintf(err, errlen, "parallel.zero = %d: ZeRO stages 2 and 3 are not implemented yet "
                 "(use 0 or 1)", zero);
        return -1;
    }
    const tr_backend *be = tr_model_backend(m);
    if (tr_comm_size(c) > 1 && be->dtype != TR_DTYPE_F32) {
        snprintf(err, errlen, "data parallelism on the %s backend needs NCCL, which is not "
                 "implemented yet (run with --device cpu)", be->name);
        return -1;
    }
    size_t lo, hi;
    tr_model_optim_range(m, &lo, &hi);
    if (zero == 1 && tr_comm_size(c) > 1 &&
        hi - lo != tr_model_slab_elements(m) / (size_t)tr_comm_size(c)) {
        snprintf(err, errlen, "ZeRO-1: the model was not built with %d optimizer shards",
                 tr_comm_size(c));
        return -1;
    }
    tr_dp *d = calloc(1, sizeof(*d));
    d->m = m;
    d->c = c;
    d->zero = zero;
    d->world = tr_comm_size(c);
    d->rank = tr_comm_rank(c);
    if (!bucket_bytes) bucket_bytes = (size_t)4 << 20;
    int np = tr_model_num_params(m);
    d->b = calloc((size_t)(np ? np : 1), sizeof(bucket));
    size_t elems = 0, hi_el = 0;
    for (int i = np - 1; i >= 0; i--) {
        const tr_param *p = tr_model_param(m, i);
        if (elems == 0) hi_el = p->offset + p->numel;
        elems += p->numel;
        if (elems * sizeof(float) >= bucket_bytes || i == 0) {
            d->b[d->n_buckets++] = (bucket){.lo_param = i, .lo = p->offset, .hi = hi_el};
            elems = 0;
        }
    }
    if (d->world > 1) tr_model_set_grad_hook(m, on_grad_ready, d);
    *out = d;
    return 0;
}

void tr_dp_free(tr_dp *d) {
    if (!d) return;
    tr_model_set_grad_hook(d->m, NULL, NULL);
    free(d->b);
    free(d);
}

void tr_dp_arm(tr_dp *d) {
    if (d->world <= 1) return;
    d->armed = 1;
    d->next = 0;
    d->first_start = d->last_done = 0;
}

void tr_dp_sync_grads(tr_dp *d) {
    if (d->world <= 1) return;
    double t0 = now();
    /* the hook starts every bucket as its tensors complete; should one not have started
       (a model whose tensors complete out of order), start it now: correctness first */
    while (d->next < d->n_buckets) {
        bucket *b = &d->b[d->next++];
        if (d->next == 1) d->first_start = t0;
        b->req = tr_comm_iall_reduce(d->c, tr_buf_at(tr_model_backend(d->m), tr_model_grad_slab(d->m), b->lo),
                                     b->hi - b->lo, TR_COMM_F32);
        b->done = 0;
        d->st.buckets++;
    }
    for (int i = 0; i < d->next; i++)
        if (!d->b[i].done) {
            tr_comm_wait(d->b[i].req);
            d->b[i].done = 1;
            d->last_done = now();
        } else {
            tr_comm_wait(d->b[i].req); /* completed earlier: frees the handle */
        }
    double t1 = now();
    d->armed = 0;
    d->st.steps++;
    d->st.exposed_s += t1 - t0;
    if (d->next > 0) d->st.span_s += d->last_done - d->first_start;
}

void tr_dp_step(tr_dp *d, const tr_adamw *opt) {
    tr_model_adamw_step(d->m, opt); /* the shard only, when the model was built sharded */
    if (d->zero == 1 && d->world > 1) {
        double t0 = now();
        size_t lo, hi;
        tr_model_optim_range(d->m, &lo, &hi);
        tr_buf *slab = tr_model_param_slab(d->m);
        tr_comm_all_gather(d->c, tr_buf_at(tr_model_backend(d->m), slab, lo), slab, hi - lo,
                           TR_COMM_F32);
        d->st.gather_s += now() - t0;
    }
}

int tr_dp_gather_state(tr_dp *d, tr_dp_state *out) {
    size_t n = tr_model_slab_elements(d->m), lo, hi;
    tr_model_optim_range(d->m, &lo, &hi);
    *out = (tr_dp_state){.dp = d, .m = malloc(n * sizeof(float)), .v = malloc(n * sizeof(float))};
    if (!out->m || !out->v) {
        tr_dp_state_free(out);
        return -1;
    }
    const tr_backend *be = tr_model_backend(d->m);
    float *full[2] = {out->m, out->v};
    for (int k = 0; k < 2; k++) {
        const float *shard = tr_model_optim_state(d->m, (tr_state_kind)k);
        be->download(full[k] + lo, shard, (hi - lo) * sizeof(float));
        if (hi - lo < n) /* sharded: every rank's part, in rank order, in place */
            tr_comm_all_gather(d->c, full[k] + lo, full[k], hi - lo, TR_COMM_F32);
    }
    return 0;
}

void tr_dp_state_free(tr_dp_state *s) {
    free(s->m);
    free(s->v);
    s->m = s->v = NULL;
}

void tr_dp_state_source(void *ctx, int param, tr_state_kind k, float *dst) {
    const tr_dp_state *s = ctx;
    const tr_param *p = tr_model_param(s->dp->m, param);
    memcpy(dst, (k == TR_STATE_ADAM_M ? s->m : s->v) + p->offset, p->numel * sizeof(float));
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
