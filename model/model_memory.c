/* The model's lifetime and memory: where the held pipeline chunks lie in the arenas, the
 * memory figures (tr_model_memory, tr_model_measure: the plan's, before anything is
 * allocated), and the allocation and release of every backend buffer. The program and its
 * measuring pass are model.c. */
#include "model/model_private.h"

#include <stdio.h>
#include <stdlib.h>

/* Where each held chunk's slots lie in the arenas, and its gradient buffers (gin for every
 * chunk but the last, whose head seeds the gradient; gout for every chunk but the first). */
void model_arena_layout(tr_model *m) {
    size_t a = 0, s = 0;
    int g = 0;
    for (int c = 0; c < m->n_chunks; c++) {
        chunk_t *k = &m->chunks[c];
        if (!k->held) continue;
        k->aoff = a;
        k->soff = s;
        a += (size_t)k->slots * (k->aend - k->abase);
        s += (size_t)k->slots * (k->send - k->sbase);
        k->gslot = g;
        k->gshared =
            m->pipelined && c > 0 && m->chunks[c - 1].held && k->nsend == m->chunks[c - 1].nrecv;
        if (m->pipelined) g += k->nrecv + k->nsend;
    }
    m->act_floats = a;
    m->stat_floats = s;
    m->n_gio = g;
}

/* Whether gradient buffer j of chunk c (receive ones first, then send ones) needs memory of
 * its own: the receive ones but the last chunk's (its head seeds the gradient), the send ones
 * but the first chunk's and those shared with the chunk before (chunk_t.gshared). */
static int gio_needed(const tr_model *m, int c, int j) {
    const chunk_t *k = &m->chunks[c];
    return j < k->nrecv ? c + 1 < m->n_chunks : c > 0 && !k->gshared;
}

/* The head's chunk of logits (rows x this rank's vocabulary); a pipeline stage without the
 * head keeps a token buffer. */
static size_t logits_elems(const tr_model *m) {
    return m->head_here ? m->head_rows * (size_t)m->Vl : 16;
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
    mem.activations = (m->act_floats + (m->tact_floats ? m->tact_floats : 16)) * es +
                      (m->stat_floats + (m->tstat_floats ? m->tstat_floats : 16)) * F;
    size_t Ns = m->sp ? N / (size_t)m->tp : N; /* rows of the residual stream */
    mem.scratch = (2 * model_align16(m->width_scratch * N) + logits_elems(m) +
                   2 * (size_t)(m->max_depth + 1) * model_align16(Ns * C)) *
                      es +
                  model_align16(N) * F + 2 * N * sizeof(int);
    if (m->sp) mem.scratch += 2 * model_align16(N * C) * es; /* xfull, gfull */
    for (int c = 0; c < m->n_chunks; c++)              /* pipeline: the gradients between stages */
        for (int j = 0;
             m->chunks[c].held && j < (m->pipelined ? m->chunks[c].nrecv + m->chunks[c].nsend : 0);
             j++)
            if (gio_needed(m, c, j)) mem.activations += model_align16(Ns * C) * es;
    if (m->tp > 1) /* vgather, xstats, ltokens */
        mem.scratch += (size_t)m->Vp * F + ((size_t)m->tp + 1) * m->head_rows * 3 * F +
                       N * sizeof(int);
    tr_workspace ws;
    tr_workspace_of(m, &ws);
    mem.workspace = tr_workspace_bytes(&ws);
    mem.buffers = 0;
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
    if (model_build(m, desc, o, err, errlen)) {
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

/* The groups of ranks sharing a key/value head (tp a multiple of an attention's kv_heads),
 * one per sharing factor: made before anything is allocated, identically on every rank. */
static int kv_groups(tr_model *m, char *err, size_t errlen) {
    for (int i = 0; i < m->n_params; i++) {
        const tr_param_seg *g = &m->params[i].seg[1];
        if (m->params[i].n_seg < 3 || g->copies < 2) continue;
        int k = 0;
        while (k < m->n_kvg && m->kvg[k].copies != g->copies) k++;
        if (k < m->n_kvg) continue;
        if (k == (int)(sizeof(m->kvg) / sizeof(m->kvg[0]))) {
            snprintf(err, errlen, "model: more than %d different kv_heads across attentions", k);
            return -1;
        }
        m->kvg[k].copies = g->copies;
        if (tr_comm_split(m->tp_comm, m->tpr / g->copies, m->tpr, "kv", &m->kvg[k].comm, err,
                          errlen))
            return -1;
        m->n_kvg++;
    }
    return 0;
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
    if (model_build(m, desc, o, err, errlen)) {
        tr_model_free(m);
        return -1;
    }
    if (m->tp > 1 && (!be->xent_stats || !be->xent_finish)) {
        snprintf(err, errlen, "tensor parallelism on the %s backend needs its split-vocabulary "
                 "cross entropy (xent_stats), which it lacks (run with --device cpu)", be->name);
        tr_model_free(m);
        return -1;
    }
    if (m->tp > 1 && (!o->tp_comm || tr_comm_size(o->tp_comm) != m->tp ||
                      tr_comm_rank(o->tp_comm) != m->tpr)) {
        snprintf(err, errlen, "model: tensor parallelism over %d ranks needs their group (rank "
                 "%d of it)", m->tp, m->tpr);
        tr_model_free(m);
        return -1;
    }
    if (kv_groups(m, err, errlen)) {
        tr_model_free(m);
        return -1;
    }
    size_t N = (size_t)B * (size_t)T, C = (size_t)desc->dim, F = sizeof(float), es = m->es;
    size_t Ns = m->sp ? N / (size_t)m->tp : N;
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
    m->scratch1 = be->alloc(model_align16(m->width_scratch * N) * es);
    m->scratch2 = be->alloc(model_align16(m->width_scratch * N) * es);
    m->logits = be->alloc(logits_elems(m) * es);
    m->losses = be->alloc(model_align16(N) * F);
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
        ok = (m->gbuf[i] = be->alloc(model_align16(Ns * C) * es)) != NULL;
    if (ok && m->sp)
        ok = (m->xfull = be->alloc(model_align16(N * C) * es)) &&
             (m->gfull = be->alloc(model_align16(N * C) * es));
    if (ok && m->n_gio) ok = (m->gio = calloc((size_t)m->n_gio, sizeof(tr_buf *))) != NULL;
    for (int c = 0; ok && c < m->n_chunks; c++)
        for (int j = 0; ok && m->chunks[c].held && j < m->chunks[c].nrecv + m->chunks[c].nsend;
             j++) {
            const chunk_t *k = &m->chunks[c];
            if (gio_needed(m, c, j))
                ok = (m->gio[k->gslot + j] = be->alloc(model_align16(Ns * C) * es)) != NULL;
            else if (j >= k->nrecv && k->gshared) /* chunk c - 1's receive buffer */
                m->gio[k->gslot + j] = m->gio[m->chunks[c - 1].gslot + j - k->nrecv];
        }
    if (ok && m->tp > 1)
        ok = (m->vgather = be->alloc((size_t)m->Vp * F)) &&
             (m->xstats = be->alloc(((size_t)m->tp + 1) * m->head_rows * 3 * F)) &&
             (m->ltokens = be->alloc(N * sizeof(int))) &&
             (m->host_ltokens = malloc(N * sizeof(int)));
    tr_workspace ws; /* the device's workspaces: held from the start, as the plan counts them */
    tr_workspace_of(m, &ws);
    if (ok && be->reserve) ok = be->reserve(&ws) == 0;
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
    for (int k = 0; k < m->n_kvg; k++) tr_comm_free(m->kvg[k].comm);
    const tr_backend *be = m->be;
    if (be) {
        if (m->master != m->param) be->free(m->master);
        be->free(m->param);
        if (m->wpar != m->master) be->free(m->wpar);
        be->free(m->grad);
        be->free(m->adam_m);
        be->free(m->adam_v);
        be->free(m->act);
        be->free(m->xfull);
        be->free(m->gfull);
        be->free(m->vgather);
        be->free(m->xstats);
        be->free(m->ltokens);
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
    for (int c = 0; be && m->gio && c < m->n_chunks; c++) /* a shared buffer once */
        for (int j = 0; m->chunks[c].held && j < m->chunks[c].nrecv + m->chunks[c].nsend; j++)
            if (gio_needed(m, c, j)) be->free(m->gio[m->chunks[c].gslot + j]);
    free(m->gio);
    free(m->chunks);
    free(m->gbuf);
    free(m->host_losses);
    free(m->host_ltokens);
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

