/* The model's parameters and optimizer state: access by tensor (whole, held parts, slab
 * ranges, the global tensor of a tensor-parallel shard), deterministic initialisation, the
 * gradient's norm and AdamW over the slab or over ZeRO's pieces. */
#include "model/model_private.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
    const tr_param_seg *g = &m->params[i].seg[s];
    if (m->params[i].pp_tied) return m->tie_comm; /* the first and last pipeline stages */
    if (!g->partial || g->copies < 2) return NULL;
    if (g->copies == m->tp) return m->tp_comm;
    for (int k = 0; k < m->n_kvg; k++)
        if (m->kvg[k].copies == g->copies) return m->kvg[k].comm;
    return NULL; /* a planned model: no groups */
}

tr_comm *tr_model_tp_group(const tr_model *m) {
    return m->tp > 1 ? m->tp_comm : NULL;
}

double tr_model_grad_sumsq(const tr_model *m, const tr_buf *grad, size_t lo, size_t hi) {
    if (hi <= lo) return 0.0;
    if (m->tp == 1 && !m->has_copies) /* padding is never written: one pass over the range */
        return m->be->sumsq(grad, hi - lo);
    double ss = 0;
    for (int i = 0; i < m->n_params; i++) { /* tensor by tensor, segment by segment */
        const tr_param *p = &m->params[i];
        size_t C = (size_t)p->shape[1];
        for (int s = 0; s < p->n_seg; s++) {
            size_t a = p->offset + (size_t)p->seg[s].row * C,
                   b = a + (size_t)p->seg[s].rows * C;
            if (a < lo) a = lo;
            if (b > hi) b = hi;
            if (a < b && !p->pp_copy) /* a pipeline replica: counted on the first stage */
                ss += m->be->sumsq(tr_buf_at(m->be, grad, a - lo), b - a) / p->seg[s].copies;
        }
    }
    return ss;
}

tr_comm_mem tr_model_comm_mem(const tr_model *m) {
    return m->be->device_memory ? TR_COMM_DEVICE : TR_COMM_HOST;
}
tr_comm_dtype tr_model_comm_dtype(const tr_model *m) {
    return m->be->dtype == TR_DTYPE_BF16 ? TR_COMM_BF16 : TR_COMM_F32;
}

tr_tp_stats tr_model_tp_stats(const tr_model *m) {
    return m->tps;
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
    float *host = malloc((maxn ? maxn : 1) * sizeof(float));
    tr_run *runs = NULL;
    int cap = 0;
    for (int i = 0; i < m->n_params; i++) {
        const tr_param *p = &m->params[i];
        uint64_t key = mix64(seed ^ hash_name(p->name));
        /* element by its index in the global tensor: a tensor-parallel shard starts as the
           slice of the single-process tensor */
        int n = tr_param_runs(p, 0, p->numel, runs, cap);
        if (n > cap) {
            runs = realloc(runs, (size_t)n * sizeof(tr_run));
            if (!runs) abort();
            cap = n;
            tr_param_runs(p, 0, p->numel, runs, cap);
        }
        for (int k = 0; k < n; k++)
            for (size_t j = 0; j < runs[k].n; j++)
                host[runs[k].local + j] =
                    p->init_one     ? 1.0f
                    : p->init_std > 0 ? p->init_std * normal_at(key, runs[k].global + j)
                                      : 0;
        tr_model_set_param(m, i, host);
    }
    free(runs);
    free(host);
    if (m->grad) m->be->zero(m->grad, m->n_pad * m->es);
    m->be->zero(m->adam_m, (m->opt_hi - m->opt_lo) * sizeof(float));
    m->be->zero(m->adam_v, (m->opt_hi - m->opt_lo) * sizeof(float));
    m->adam_t = 0;
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
