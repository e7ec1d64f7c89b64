/* The planner's search (plan.h): every layout the recipe and the flags leave open, priced by
 * the cost model (plan_cost.c), pruned by memory, ranked by the objective; the best few are
 * then resolved like a layout written by hand (tr_layout_resolve) and their memory measured
 * exactly (tr_layout_memory). */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "parallel/comm/base.h"
#include "parallel/dp.h"
#include "parallel/plan_private.h"
#include "parallel/schedule.h"

#define KEEP 128    /* feasible plans kept for the exact check and the alternatives */
#define PER_SHAPE 8 /* of them, variants of one shape at most */

/* What the flags and the recipe fix: -1 where the planner chooses. */
typedef struct {
    int dp, tp, pp, zero, sp, schedule, V, M, micro, recompute;
    int priv; /* private gradients: tp x pp inside an organisation (masked.h) */
} pl_fixed;

typedef struct {
    const tr_recipe *r;
    const tr_plan_opts *o;
    pl_model m;
    pl_fixed fx;
    int *cuts[TR_MAX_CHUNKS + 1]; /* chunk starts for K chunks, made on first use */
    tr_plan keep[KEEP];           /* the best feasible, ranked */
    int n_keep;
    tr_plan low_mem;              /* the plan needing the least memory (nothing fits) */
    tr_plan over[4];              /* the fastest that do not fit, by ZeRO stage */
    int have_over[4];
    long evaluated, feasible;
    tr_plan_tie tie;              /* tr_plan_tie_of the cluster */
    int g0;                       /* the group the devices being searched start at */
} pl_search;

static int flag_or(int flag, int recipe) { return flag >= 0 ? flag : recipe; }

static void fixed_of(const tr_recipe *r, const tr_plan_opts *o, pl_fixed *f) {
    const tr_layout_flags *g = &o->fixed;
    const tr_parallel_desc *p = &r->parallel;
    f->dp = flag_or(g->dp, p->dp > 0 ? p->dp : -1);
    f->tp = flag_or(g->tp, p->tp);
    f->pp = flag_or(g->pp > 0 ? g->pp : -1, p->pp);
    f->zero = flag_or(g->zero, p->zero);
    f->sp = g->sequence_parallel ? g->sequence_parallel > 0 : p->sequence_parallel;
    f->schedule = flag_or(g->schedule, p->schedule);
    f->V = flag_or(g->virtual_stages > 0 ? g->virtual_stages : -1,
                   p->virtual_stages > 0 ? p->virtual_stages : -1);
    int mflag = g->microbatches > 0, uflag = g->micro_batch > 0;
    f->M = mflag ? g->microbatches : uflag ? -1 : p->microbatches > 0 ? p->microbatches : -1;
    f->micro = uflag ? g->micro_batch : mflag ? -1 : r->train.micro_batch > 0 ? r->train.micro_batch : -1;
    f->recompute = o->recompute >= 0 ? o->recompute : r->train.recompute;
    f->priv = tr_private_asked(g, p);
}

static int ok(int fixed, int v) { return fixed < 0 || fixed == v; }

/* tp against every attention and MLP (tr_layout_resolve says why when it refuses) */
static int tp_fits(const tr_node *n, int tp) {
    if (n->kind == TR_NODE_ATTENTION &&
        (n->heads % tp || (n->kv_heads % tp && tp % n->kv_heads)))
        return 0;
    if (n->kind == TR_NODE_MLP && n->hidden % tp) return 0;
    for (int i = 0; i < n->n_children; i++)
        if (!tp_fits(&n->children[i], tp)) return 0;
    return 1;
}

static const int *cuts_for(pl_search *s, int K) {
    if (s->cuts[K]) return s->cuts[K];
    int *c = malloc((size_t)(K + 1) * sizeof(int));
    const tr_parallel_desc *p = &s->r->parallel;
    if (!c) return NULL;
    if (p->n_stages == K && K > 1) { /* the recipe's own cut */
        memcpy(c, p->stages, (size_t)K * sizeof(int));
        c[K] = s->m.n;
    } else {
        double *cost = malloc((size_t)s->m.n * sizeof(double));
        for (int i = 0; cost && i < s->m.n; i++) cost[i] = s->m.blk[i].fwd_flops;
        if (!cost || tr_layout_partition(cost, s->m.n, K, c)) {
            free(cost);
            free(c);
            return NULL;
        }
        free(cost);
    }
    return s->cuts[K] = c;
}

/* On devices of different speeds: the stages of layout l cut by each pipeline rank's speed
 * (its slowest device's rate), so that a faster stage holds more blocks; into l->chunk_start.
 * One chunk per rank only: with virtual stages a rank's time is the sum of its chunks, which
 * a cut that balances each chunk does not balance (those keep the even cut, priced at each
 * rank's own rate). -1 when out of memory. */
static int speed_cut(const pl_search *s, const pl_devices *dv, tr_layout *l, int K) {
    double speed[TR_MAX_CHUNKS], *cost = malloc((size_t)s->m.n * sizeof(double));
    if (!cost) return -1;
    for (int i = 0; i < s->m.n; i++) cost[i] = s->m.blk[i].fwd_flops;
    for (int c = 0; c < K; c++)
        speed[c] =
            pl_stage_rate(dv, l, tr_pp_rank_of_kind((tr_pp_kind)l->schedule, l->pp, c)) / dv->rate;
    int rc = tr_layout_partition_speeds(cost, s->m.n, K, speed, l->chunk_start);
    free(cost);
    l->stages_given = 1; /* run keeps this cut (trainer/run/plan.c) */
    return rc;
}

/* On devices of different speeds without a pipeline: each data-parallel replica's
 * micro-batches of the step by its speed (its slowest device's rate), at least one each, their
 * sum the step's: each next one to the replica that would finish it soonest, which makes the
 * slowest replica's time (micro-batches / rate) the least it can be; or the recipe's
 * dp_shares. 1 when they are uneven (the plan to consider beside the even one). */
static int speed_shares(const pl_search *s, const pl_devices *dv, tr_layout *l) {
    const tr_parallel_desc *rp = &s->r->parallel;
    int A = l->dp * l->microbatches, given = rp->n_dp_shares == l->dp;
    if (l->pp > 1 || l->zero >= 2 || l->dp < 2 || l->dp > TR_MAX_DP_SHARES ||
        (!given && (!dv->mixed || A < l->dp)))
        return 0;
    double rate[TR_MAX_DP_SHARES];
    for (int d = 0; d < l->dp; d++) {
        rate[d] = pl_replica_rate(dv, l, d);
        l->dp_shares[d] = given ? rp->dp_shares[d] : 1;
    }
    for (int left = given ? 0 : A - l->dp; left > 0; left--) {
        int k = 0;
        for (int d = 1; d < l->dp; d++)
            if ((l->dp_shares[d] + 1) / rate[d] < (l->dp_shares[k] + 1) / rate[k]) k = d;
        l->dp_shares[k]++;
    }
    l->shares_uneven = 0;
    for (int d = 1; d < l->dp; d++) l->shares_uneven |= l->dp_shares[d] != l->dp_shares[0];
    if (l->shares_uneven)
        for (int d = 0; d < l->dp; d++)
            if (l->dp_shares[d] > l->accum) l->accum = l->microbatches = l->dp_shares[d];
    return l->shares_uneven;
}

/* The objective's value: lower is better. */
static double score(const pl_search *s, const tr_plan *p) {
    if (s->o->objective == TR_PLAN_COST || s->o->deadline_h > 0) {
        double c = p->cost;
        if (s->o->deadline_h > 0 && p->hours > s->o->deadline_h) c += 1e12 * p->hours;
        return c;
    }
    return p->step_s;
}

static int same_shape(const tr_plan *a, const tr_plan *b) {
    return a->l.world == b->l.world && a->l.dp == b->l.dp && a->l.tp == b->l.tp && a->l.pp == b->l.pp &&
           a->l.zero == b->l.zero && a->l.schedule == b->l.schedule;
}

static void drop(pl_search *s, int i) {
    memmove(&s->keep[i], &s->keep[i + 1], (size_t)(s->n_keep - i - 1) * sizeof(tr_plan));
    s->n_keep--;
}

/* With the list full, the kept plan a new one may replace: the worst-ranked that is not its
 * shape's best (so that every shape keeps its best variant, and the alternatives can show
 * each), else the worst. */
static int victim(const pl_search *s) {
    for (int i = s->n_keep - 1; i > 0; i--)
        for (int j = 0; j < i; j++)
            if (same_shape(&s->keep[j], &s->keep[i])) return i;
    return s->n_keep - 1;
}

/* Keep p among the best KEEP, at most PER_SHAPE per shape (dp, tp, pp, ZeRO, schedule): the
 * estimate ranks the variants of a shape (micro-batch, recompute, sequence parallelism), and
 * when its favourite does not fit once measured, the next one that does is still here. When
 * the list is full, a shape's best variant gives way only to another shape's best. */
static void keep(pl_search *s, const tr_plan *p) {
    double v = score(s, p);
    int same = 0, worst = -1; /* of p's shape: how many kept, the last (worst) of them */
    for (int i = 0; i < s->n_keep; i++)
        if (same_shape(&s->keep[i], p)) same++, worst = i;
    if (same >= PER_SHAPE) {
        if (score(s, &s->keep[worst]) <= v) return;
        drop(s, worst);
    } else if (s->n_keep == KEEP) {
        if (same && score(s, &s->keep[KEEP - 1]) <= v) return; /* it would displace none */
        int i = victim(s), best_of_shape = 1;
        for (int j = 0; j < i && best_of_shape; j++)
            best_of_shape = !same_shape(&s->keep[j], &s->keep[i]);
        /* p, a new shape's best, displaces a best only if it ranks higher */
        if ((same || best_of_shape) && score(s, &s->keep[i]) <= v) return;
        drop(s, i);
    }
    int at = s->n_keep;
    while (at > 0 && score(s, &s->keep[at - 1]) > v) at--;
    memmove(&s->keep[at + 1], &s->keep[at], (size_t)(s->n_keep - at) * sizeof(tr_plan));
    s->keep[at] = *p;
    s->n_keep++;
}

static void consider(pl_search *s, const pl_devices *dv, tr_plan *p) {
    pl_price(&s->m, dv, p);
    s->evaluated++;
    if (p->mem_bytes > p->mem_cap) {
        if (s->low_mem.l.world == 0 || p->mem_bytes < s->low_mem.mem_bytes) s->low_mem = *p;
        int z = p->l.zero;
        if (!s->have_over[z] || p->step_s < s->over[z].step_s) s->over[z] = *p;
        s->have_over[z] = 1;
        return;
    }
    s->feasible++;
    keep(s, p);
}

/* Each pipeline rank at the least recompute that fits its own memory (the first rank, which
 * holds the most micro-batches in 1f1b, may recompute while the others need not), by the quick
 * estimate within `room` of the device's memory, into p; 1 when the levels differ by rank. */
static int least_levels(pl_search *s, const pl_devices *dv, tr_plan *p, double room) {
    int top = p->l.schedule == TR_PP_ZBH1 || p->l.schedule == TR_PP_ZBV
                  ? 1
                  : 2; /* zb-h1 and zb-v keep every product's inputs */
    p->l.recompute_per_stage = 1;
    p->l.recompute = TR_RECOMPUTE_NONE;
    for (int r = 0; r < p->l.pp; r++) {
        int rc = 0;
        p->l.stage_recompute[r] = 0;
        while (rc < top && pl_stage_memory(&s->m, dv, p, r) > room * dv->mem_cap)
            p->l.stage_recompute[r] = (signed char)++rc;
        if (rc > (int)p->l.recompute) p->l.recompute = rc;
    }
    int differ = 0;
    for (int r = 1; r < p->l.pp; r++) differ |= p->l.stage_recompute[r] != p->l.stage_recompute[0];
    return differ;
}

/* Levels per pipeline rank, tried beside the uniform ones: the least that fit by the estimate,
 * and the least that fit with 5% to spare (the estimate is within 4.3% of the exact sizing
 * pass, which then keeps the one that truly fits). */
static void least_per_stage(pl_search *s, const pl_devices *dv, const tr_plan *base) {
    tr_plan p = *base, q = *base;
    if (least_levels(s, dv, &p, 1.0)) consider(s, dv, &p);
    if (least_levels(s, dv, &q, 0.95) &&
        memcmp(p.l.stage_recompute, q.l.stage_recompute, (size_t)p.l.pp))
        consider(s, dv, &q);
}

/* The recipe's recompute = { ... }, a level per pipeline rank, for a plan of as many ranks. */
static void recipe_levels(pl_search *s, const pl_devices *dv, const tr_plan *base) {
    tr_plan p = *base;
    const tr_train_desc *t = &s->r->train;
    p.l.recompute = (tr_recompute)t->recompute;
    p.l.recompute_per_stage = 0;
    for (int r = 0; r < p.l.pp; r++) {
        p.l.stage_recompute[r] = t->stage_recompute[r];
        p.l.recompute_per_stage |= t->stage_recompute[r] != t->stage_recompute[0];
    }
    if ((p.l.schedule == TR_PP_ZBH1 || p.l.schedule == TR_PP_ZBV) &&
        p.l.recompute == TR_RECOMPUTE_FULL)
        return;
    consider(s, dv, &p);
}

/* Every schedule, virtual stages, ZeRO stage, sequence parallelism and recompute level for
 * one mesh and micro-batch. */
static void inner(pl_search *s, const pl_devices *dv, tr_plan base) {
    const pl_fixed *f = &s->fx;
    int P = base.l.pp, M = base.l.microbatches;
    for (int k = 0; k < 5; k++) {
        if (!ok(f->schedule, k) || (P == 1 && k != TR_PP_1F1B)) continue;
        for (int V = 1; V <= 8; V++) {
            if (!ok(f->V, V) || (V > 1 && k != TR_PP_INTERLEAVED && k != TR_PP_ZBV) ||
                (k == TR_PP_ZBV && V != 2) || (k == TR_PP_INTERLEAVED && V < 2) || P * V > s->m.n ||
                P * V > TR_MAX_CHUNKS)
                continue;
            char why[8];
            if (P > 1 && tr_pp_check((tr_pp_kind)k, P, V, M, why, sizeof why)) continue;
            const int *cut = cuts_for(s, P * V);
            if (!cut) continue;
            tr_plan p = base;
            p.l.schedule = k;
            p.l.virtual_stages = V;
            memcpy(p.l.chunk_start, cut, (size_t)(P * V + 1) * sizeof(int));
            p.l.stages_given = P > 1 && s->r->parallel.n_stages == P * V;
            if (dv->mixed && P > 1 && V == 1 && s->r->parallel.n_stages != P &&
                speed_cut(s, dv, &p.l, P))
                continue;
            for (int z = 0; z <= 3; z++) {
                if (!ok(f->zero, z) || (z >= 1 && base.l.dp == 1 && f->zero < 0 && z > 0)) continue;
                for (int sp = 0; sp <= 1; sp++) {
                    if (!ok(f->sp, sp) || (sp && (base.l.tp == 1 || (long)s->m.T % base.l.tp)))
                        continue;
                    p.l.zero = z;
                    p.l.sequence_parallel = sp;
                    if (s->r->train.n_stage_recompute) { /* the recipe's level per stage */
                        if (P == s->r->train.n_stage_recompute) recipe_levels(s, dv, &p);
                        continue;
                    }
                    for (int rc = 0; rc <= 2; rc++) {
                        if (!ok(f->recompute, rc) ||
                            ((k == TR_PP_ZBH1 || k == TR_PP_ZBV) && rc == 2))
                            continue;
                        p.l.recompute = rc;
                        tr_plan q = p; /* and with each replica's share by its speed */
                        int uneven = speed_shares(s, dv, &q.l);
                        if (!uneven || s->r->parallel.n_dp_shares != p.l.dp)
                            consider(s, dv, &p);
                        if (uneven) consider(s, dv, &q);
                    }
                    if (f->recompute < 0 && P > 1) least_per_stage(s, dv, &p);
                }
            }
        }
    }
}

/* Every mesh dp x tp x pp of `world` ranks and micro-batch; tp within a node unless
 * `cross`. */
static void search_world(pl_search *s, const tr_cluster *c, long world, int cross) {
    pl_devices dv;
    pl_devices_of(c, world, &dv);
    const pl_fixed *f = &s->fx;
    long seqs = (long)s->m.seqs;
    for (int tp = 1; tp <= world && tp <= 1024; tp++) {
        if (world % tp || !ok(f->tp, tp) || !tp_fits(&s->r->model.root, tp)) continue;
        if ((tp > dv.per_node || dv.per_node % tp) && !cross && f->tp < 0) continue;
        for (int pp = 1; pp <= TR_PP_MAX_RANKS && pp <= s->m.n; pp++) {
            if ((world / tp) % pp || !ok(f->pp, pp)) continue;
            /* private gradients: only dp's sums are masked, so each tp x pp group stays in
               an organisation (by default a node) */
            if (f->priv && !tr_cluster_blocks_in_orgs(c, world, (long)tp * pp)) continue;
            long dp = world / tp / pp;
            if (!ok(f->dp, (int)dp) || seqs % dp) continue;
            long per = seqs / dp;
            for (long b = 1; b <= per; b++) {
                if (per % b || !ok(f->micro, (int)b) || !ok(f->M, (int)(per / b))) continue;
                tr_plan p = {.l = {.world = (int)world, .dp = (int)dp, .tp = tp, .pp = pp,
                                   .micro_batch = (int)b, .microbatches = (int)(per / b),
                                   .private_gradients = f->priv},
                             .group_first = s->g0};
                inner(s, &dv, p);
            }
        }
    }
}

/* The world sizes to try: all the devices (a running job's, or dp fixed), or also whole
 * nodes of a prefix of the cluster and parts of the first node: the cheapest plan may use
 * fewer, and so may the fastest (where the links to the rest of a pool cost more than its
 * devices give). The search runs this from every group on (the cluster from group g on:
 * from_group), so a plan may use any run of consecutive groups, not only the first. */
static int worlds(const tr_cluster *c, const tr_plan_opts *o, const pl_fixed *f, long *w,
                  int max) {
    long all = tr_cluster_devices(c);
    int n = 0;
    if (o->all_devices || f->dp > 0) {
        w[n++] = all;
        return n;
    }
    int per = c->g[0].per_node;
    for (long k = 1; k < per && n < max; k *= 2) w[n++] = k;
    for (long nodes = 1; nodes * per < all && n < max - 1; nodes *= 2) w[n++] = nodes * per;
    w[n++] = all;
    return n;
}

/* The cluster from group g0 on (the groups before it left out): the devices a plan with
 * group_first g0 uses the first of. */
static void from_group(const tr_cluster *c, int g0, tr_cluster *out) {
    *out = *c;
    if (g0 == 0) return;
    out->n_groups = c->n_groups - g0;
    memset(&out->hosts, 0, sizeof out->hosts);
    for (int i = 0; i < out->n_groups; i++) {
        out->g[i] = c->g[g0 + i];
        for (int j = 0; j < out->n_groups; j++) out->between[i][j] = c->between[g0 + i][g0 + j];
    }
}

/* Every world size from every first group (only group 0 for all the devices), within nodes
 * and, when that leaves nothing, across them. */
static void search_all(pl_search *s, const tr_cluster *c, const tr_plan_opts *o) {
    tr_cluster *sub = malloc(sizeof *sub);
    if (!sub) return;
    int whole = o->all_devices || s->fx.dp > 0;
    for (int cross = 0; cross <= 1 && !s->n_keep; cross++)
        for (int g0 = 0; g0 < (whole ? 1 : c->n_groups); g0++) {
            long w[64];
            from_group(c, g0, sub);
            s->g0 = g0;
            int nw = worlds(sub, o, &s->fx, w, 64);
            for (int i = 0; i < nw; i++) search_world(s, sub, w[i], cross);
        }
    s->g0 = 0;
    free(sub);
}

/* ---- the exact check and the reasons ------------------------------------------------------ */


/* Resolve p as run would and measure each pipeline rank's memory: 0 (p->mem_bytes exact), or
 * -1 and the resolver's reason in p->why. */
static int measure(const pl_search *s, const pl_devices *dv, tr_plan *p) {
    tr_recipe r = *s->r; /* a shallow copy: the layout reads it */
    tr_layout_recompute_to_recipe(&p->l, &r.train);
    r.parallel.n_stages = 0;
    if (p->l.stages_given) { /* the recipe's cut, or one by the stages' speeds */
        r.parallel.n_stages = p->l.pp * p->l.virtual_stages;
        memcpy(r.parallel.stages, p->l.chunk_start, (size_t)r.parallel.n_stages * sizeof(int));
    }
    r.parallel.n_dp_shares = p->l.shares_uneven ? p->l.dp : 0; /* the plan's, or even */
    memcpy(r.parallel.dp_shares, p->l.dp_shares, sizeof p->l.dp_shares);
    tr_layout_flags f = tr_layout_pin(&p->l);
    f.pad_vocab = s->o->fixed.pad_vocab;
    tr_layout l;
    char err[512];
    if (tr_layout_resolve(&l, &r, &f, (int)p->l.world, s->o->dtype, 1, err, sizeof err)) {
        snprintf(p->why, sizeof p->why, "refused: %.300s", err);
        return -1;
    }
    double worst;
    if (tr_layout_memory_most(&l, &r.model, s->o->dtype, dv->reserve > 0, &worst, err,
                              sizeof err)) {
        snprintf(p->why, sizeof p->why, "refused: %.300s", err);
        return -1;
    }
    p->l = l; /* the resolved record, chunks included */
    p->mem_bytes = worst + dv->reserve;
    p->mem_exact = 1;
    return 0;
}

static void gb(double b, char *buf, size_t n) { /* as tr_fmt_bytes: binary units */
    if (b >= 1073741824.0)
        snprintf(buf, n, "%.1f GiB", b / 1073741824.0);
    else
        snprintf(buf, n, "%.1f MiB", b / 1048576.0);
}

/* What a loser's line reads: the objective, the tie and the devices of a node. */
typedef struct {
    tr_plan_objective objective;
    tr_plan_tie tie;
    int per_node;
} pl_why;

/* Why alternative a lost to the best plan b: its largest excess, then the ratio. */
static void why_lost(const pl_why *s, const tr_plan *b, tr_plan *a) {
    char x[64], y[64];
    if (a->why[0]) return;
    if (a->mem_bytes > a->mem_cap) {
        gb(a->mem_bytes, x, sizeof x);
        gb(a->mem_cap, y, sizeof y);
        char rec[96];
        tr_layout_recompute_name(&a->l, rec, sizeof rec);
        snprintf(a->why, sizeof a->why, "ZeRO-%d, recompute %s: %s > %s", a->l.zero, rec, x, y);
        return;
    }
    struct {
        const char *what;
        double a, b;
    } part[] = {{"tensor-parallel collectives", a->tp_s, b->tp_s},
                {"pipeline bubble", a->bubble_s + a->shared_s, b->bubble_s + b->shared_s},
                {"pipeline sends", a->pp_s, b->pp_s},
                {"exposed data-parallel reduction", a->dp_s, b->dp_s},
                {"compute", a->compute_s, b->compute_s},
                {"optimizer", a->optim_s, b->optim_s}};
    int w = 0;
    for (int i = 1; i < 6; i++)
        if (part[i].a - part[i].b > part[w].a - part[w].b) w = i;
    double ratio = s->objective == TR_PLAN_COST ? a->cost / b->cost : a->step_s / b->step_s;
    const char *unit = s->objective == TR_PLAN_COST ? "cost" : "step";
    if (ratio < 1) { /* a tie the simpler plan won (prefer_simple) */
        snprintf(a->why, sizeof a->why,
                 "%s %.2fx, a tie (within %.0f%%, or the probes' %.0f%% and %.0f%% could "
                 "reorder them): the chosen plan has less machinery",
                 unit, ratio, 100 * s->tie.band, 100 * s->tie.compute, 100 * s->tie.links);
        return;
    }
    if (w == 0 && a->l.tp > s->per_node)
        snprintf(a->why, sizeof a->why, "tp %d crosses nodes: %s %.3g s vs %.3g s; %s %.2fx",
                 a->l.tp, part[w].what, part[w].a, part[w].b, unit, ratio);
    else if (part[w].a - part[w].b <= 0)
        snprintf(a->why, sizeof a->why, "%s %.2fx", unit, ratio);
    else
        snprintf(a->why, sizeof a->why, "%s %.3g s vs %.3g s; %s %.2fx", part[w].what, part[w].a,
                 part[w].b, unit, ratio);
}

void tr_plan_why(const tr_cluster *c, const tr_plan_opts *o, const tr_plan_result *res,
                 const tr_plan *b, tr_plan *a) {
    pl_devices dv;
    pl_devices_of(c, b->l.world, &dv);
    pl_why w = {o->objective, res->tie, dv.per_node};
    a->why[0] = 0;
    why_lost(&w, b, a);
}

/* Recompute levels over the pipeline ranks: less is simpler (first rank only, before all). */
static int levels(const tr_layout *l) {
    int n = 0;
    for (int r = 0; r < l->pp; r++) n += tr_layout_recompute_at(l, r);
    return n;
}

/* -1, 0 or 1 as int lists a and b of n compare, the first difference deciding. */
static int lex(const int *a, const int *b, int n) {
    for (int i = 0; i < n; i++)
        if (a[i] != b[i]) return a[i] < b[i] ? -1 : 1;
    return 0;
}

int tr_plan_simpler(const tr_plan *a, const tr_plan *b) {
    const tr_layout *x = &a->l, *y = &b->l;
    int ka[] = {x->tp * x->pp,        x->tp,           x->zero,
                x->sequence_parallel, x->recompute,    levels(x),
                x->virtual_stages,    x->microbatches, x->schedule,
                x->shares_uneven,     x->dp,           x->micro_batch};
    int kb[] = {y->tp * y->pp,        y->tp,           y->zero,
                y->sequence_parallel, y->recompute,    levels(y),
                y->virtual_stages,    y->microbatches, y->schedule,
                y->shares_uneven,     y->dp,           y->micro_batch};
    int c = lex(ka, kb, (int)(sizeof ka / sizeof *ka));
    if (!c && x->shares_uneven) c = lex(x->dp_shares, y->dp_shares, x->dp);
    if (!c) c = lex(x->chunk_start, y->chunk_start, x->pp * x->virtual_stages + 1);
    for (int r = 0; !c && r < x->pp; r++)
        c = tr_layout_recompute_at(x, r) - tr_layout_recompute_at(y, r);
    return c < 0;
}

static double capped(double noise) {
    return noise < PL_TIE_MAX ? noise : PL_TIE_MAX;
}

tr_plan_tie tr_plan_tie_of(const tr_cluster *c) {
    return (tr_plan_tie){PL_TIE, capped(c->noise.v), capped(c->link_noise.v)};
}

int tr_plan_tied(const tr_plan *b, const tr_plan *p, double sb, double sp, const tr_plan_tie *t) {
    if (sp <= sb * (1 + t->band)) return 1;
    double kb = b->step_s > 0 ? sb / b->step_s : 0, kp = p->step_s > 0 ? sp / p->step_s : 0;
    struct {
        double b, p, noise;
    } part[] = {{b->compute_s + b->bubble_s + b->shared_s, p->compute_s + p->bubble_s + p->shared_s,
                 t->compute},
                {b->optim_s, p->optim_s, t->compute},
                {b->tp_s + b->pp_s + b->dp_s, p->tp_s + p->pp_s + p->dp_s, t->links}};
    double moves = 0;
    for (int i = 0; i < 3; i++)
        moves += part[i].noise * fabs(kp * part[i].p - kb * part[i].b);
    return sp - sb <= moves;
}

static int tied(const pl_search *s, const tr_plan *b, const tr_plan *p) {
    return tr_plan_tied(b, p, score(s, b), score(s, p), &s->tie);
}

/* Plans the cost model and the probes cannot tell from the best (tied()) go first, the
 * simplest of them first (bench/plan_vs_run.sh); the others follow in their order. */
static void prefer_simple(pl_search *s) {
    if (s->n_keep < 2) return;
    int n = 1;
    for (int i = 1; i < s->n_keep; i++) { /* a stable partition: the ties to the front */
        if (!tied(s, &s->keep[0], &s->keep[i])) continue;
        tr_plan t = s->keep[i];
        memmove(&s->keep[n + 1], &s->keep[n], (size_t)(i - n) * sizeof t);
        s->keep[n++] = t;
    }
    for (int i = 1; i < n; i++) {
        tr_plan t = s->keep[i];
        int j = i;
        while (j > 0 && tr_plan_simpler(&t, &s->keep[j - 1])) {
            s->keep[j] = s->keep[j - 1];
            j--;
        }
        s->keep[j] = t;
    }
}

/* Whether a plan of p's shape is among the first n of list. */
static int shape_in(const tr_plan *list, int n, const tr_plan *p) {
    for (int i = 0; i < n; i++)
        if (same_shape(&list[i], p)) return 1;
    return 0;
}

/* The best plans that pass the resolver and fit when measured, one per shape: best, then the
 * alternatives; then, while fewer than asked, the shapes none of whose variants fit (the
 * first refused variant of each, with why), and the fastest plans over memory by ZeRO stage
 * below the chosen one. At most o->alternatives in all. */
static void finish(pl_search *s, const pl_devices *dv, tr_plan_result *out) {
    pl_why w = {s->o->objective, s->tie, dv->per_node};
    int want = s->o->alternatives < TR_PLAN_MAX_ALTS ? s->o->alternatives : TR_PLAN_MAX_ALTS;
    tr_plan *good = calloc(KEEP, sizeof *good), *bad = calloc(KEEP, sizeof *bad);
    int n_good = 0, n_bad = 0;
    if (!good || !bad) want = 0, s->n_keep = 0; /* out of memory: nothing fits, said below */
    for (int i = 0; i < s->n_keep && n_good <= want; i++) {
        tr_plan p = s->keep[i];
        if (shape_in(good, n_good, &p)) continue;
        int refused = measure(s, dv, &p);
        if (!refused && p.mem_bytes <= p.mem_cap)
            good[n_good++] = p;
        else if (!shape_in(bad, n_bad, &p))
            bad[n_bad++] = p;
    }
    out->fits = n_good > 0;
    if (out->fits) out->best = good[0];
    for (int i = 1; i < n_good && out->n_alts < want; i++) out->alts[out->n_alts++] = good[i];
    for (int i = 0; i < n_bad && out->n_alts < want; i++) {
        if (shape_in(good, n_good, &bad[i])) continue;
        if (!bad[i].why[0]) why_lost(&w, &bad[i], &bad[i]);
        out->alts[out->n_alts++] = bad[i];
    }
    for (int z = 0; z < 4 && out->n_alts < want; z++)
        if (s->have_over[z] && (!out->fits || z < out->best.l.zero)) {
            tr_plan p = s->over[z];
            p.why[0] = 0;
            why_lost(&w, &p, &p);
            out->alts[out->n_alts++] = p;
        }
    if (out->fits)
        for (int i = 0; i < out->n_alts; i++)
            why_lost(&w, &out->best, &out->alts[i]);
    free(good);
    free(bad);
}

/* Nothing fits: the fewest devices of the cluster's kind that would, and whether full
 * recompute would on these. */
static void what_would(pl_search *s, const tr_cluster *c, tr_plan_result *out) {
    tr_cluster big = *c;
    tr_node_group *g = &big.g[big.n_groups - 1];
    long have = tr_cluster_devices(c);
    char more[160] = "", rec[120] = "";
    pl_fixed saved = s->fx;
    s->fx.dp = -1;
    for (int grow = 1; grow <= 4096 && !more[0]; grow *= 2) {
        g->nodes = c->g[c->n_groups - 1].nodes * (grow + 1);
        long world = tr_cluster_devices(&big);
        s->n_keep = 0;
        search_world(s, &big, world, 0);
        if (s->n_keep)
            snprintf(more, sizeof more, "needs %d devices of %.0f GiB (%ld here)",
                     s->keep[0].l.world, s->keep[0].mem_cap / 1073741824.0, have);
    }
    if (saved.recompute != TR_RECOMPUTE_FULL) {
        s->fx.recompute = TR_RECOMPUTE_FULL;
        s->n_keep = 0;
        search_world(s, c, have, 1);
        if (s->n_keep) snprintf(rec, sizeof rec, "recompute = \"full\" on these %ld", have);
    }
    s->fx = saved;
    s->n_keep = 0;
    snprintf(out->need, sizeof out->need, "%s%s%s", more[0] ? more : "",
             more[0] && rec[0] ? ", or " : "", rec);
    if (!out->need[0])
        snprintf(out->need, sizeof out->need, "no layout of up to %ld devices fits", have * 4097);
}

/* Append to buf (used of n) what fmt makes, ", "-separated, truncated. */
TR_PRINTF(4, 5) static void add(char *buf, size_t n, size_t *used, const char *fmt, ...) {
    if (*used >= n) return;
    if (*used) *used += (size_t)snprintf(buf + *used, n - *used, ", ");
    if (*used >= n) return;
    va_list ap;
    va_start(ap, fmt);
    *used += (size_t)vsnprintf(buf + *used, n - *used, fmt, ap);
    va_end(ap);
}

/* Every figure the cost model uses and where it came from: measured, given, the table's,
 * published (fitted to published runs of that device, or a published measurement), counted (from
 * the layout itself), or assumed. */
static void figures(const tr_cluster *c, char *buf, size_t n) {
    size_t used = 0;
    buf[0] = 0;
    for (int i = 0; !c->cpu && i < c->n_groups; i++) {
        const tr_node_group *g = &c->g[i];
        int dup = 0;
        for (int j = 0; j < i; j++)
            dup |= !strcmp(c->g[j].device, g->device);
        if (dup) continue;
        tr_node_group own = *g;
        if (!(own.efficiency.v > 0)) tr_group_fill_efficiency(&own, NULL);
        add(buf, n, &used, "matrix efficiency%s%s %.2f of peak (%s%s%s)", c->n_groups > 1 ? " " : "",
            c->n_groups > 1 ? g->device : "", own.efficiency.v, tr_origin_name(own.efficiency.from),
            own.efficiency_source[0] ? ": " : "", own.efficiency_source);
    }
    const char *op_from =
        c->op_cost > 0 ? "measured: the recipe's model shrunk to nothing" : "assumed";
    double op = c->op_cost > 0 ? c->op_cost : PL_CPU_OP_COST;
    if (c->cpu && !(c->model_eff[0] > 0))
        add(buf, n, &used,
            "%.1f us per operation (%s), the weights' %.0f passes a "
            "micro-batch (counted) at the memory bandwidth",
            1e6 * op, op_from, PL_CPU_WEIGHT_PASSES);
    else if (c->cpu) /* the level measured; how it moves with the micro-batch, the model's */
        add(buf, n, &used,
            "the model's own rate (measured), its change with the micro-batch "
            "at %.1f us per operation (%s) and the weights' %.0f passes through memory "
            "(counted)",
            1e6 * op, op_from, PL_CPU_WEIGHT_PASSES);
    else
        add(buf, n, &used,
            "%.1f us per matrix product: %.1f kernels each (counted: the CUDA backend's) at "
            "%.1f us a launch (published: cuLaunchKernel on a GB200, tritonbench 2026)",
            1e6 * PL_GPU_OP_COST, PL_GPU_KERNELS_PER_PRODUCT, 1e6 * PL_GPU_LAUNCH_S);
    if (c->optim_rate > 0)
        add(buf, n, &used, "optimizer %.0fM parameters/s a process (measured: the backend's AdamW)",
            c->optim_rate / 1e6);
    const tr_node_group *g = &c->g[0];
    struct {
        const char *name;
        tr_origin o;
    } f[] = {{"peak", g->peak_flops.from},      {"memory", g->mem_bytes.from},
             {"memory bandwidth", g->mem_bw.from}, {"node links", g->intra.bw.from},
             {"network", g->inter.bw.from},     {"price", g->price_hour.from}};
    for (int i = 0; i < 6; i++)
        add(buf, n, &used, "%s (%s)", f[i].name, tr_origin_name(f[i].o));
    if (c->cpu)
        add(buf, n, &used,
            "no communication hidden behind compute on the cores (measured: the CPU backend's "
            "runs, bench/plan_vs_run.md)");
    else
        add(buf, n, &used,
            "communication beside compute bucket by bucket (counted), the compute beside it "
            "%.1f%% slower (published: Lee et al. 2025)",
            100 * PL_GPU_CONTENTION);
    if (c->cpu && c->g[0].nodes * c->n_groups > 1)
        add(buf, n, &used,
            "ZeRO-2's reduce-scatters between hosts behind %.0f%% of the compute "
            "beside them, bucket by bucket, %d in flight (measured: bench/wire_overlap.sh at "
            "100 Mbit/s)",
            100 * PL_CPU_WIRE_OVERLAP, TR_DP_IN_FLIGHT);
    if (!c->cpu) {
        const char *from;
        char rb[32];
        gb(tr_plan_runtime_reserve(g->device, &from), rb, sizeof rb);
        add(buf, n, &used, "runtime reserve %s per device: CUDA context and NCCL's buffers (%s)",
            rb, from);
    }
}

int tr_plan_search(const tr_recipe *r, const tr_cluster *c, const tr_plan_opts *o,
                   tr_plan_result *out, char *err, size_t errlen) {
    double t0 = tr_now();
    memset(out, 0, sizeof(*out));
    if (tr_cluster_devices(c) < 1) {
        snprintf(err, errlen, "planner: the cluster has no devices");
        return -1;
    }
    pl_search *s = calloc(1, sizeof(*s));
    if (!s) {
        snprintf(err, errlen, "planner: out of memory");
        return -1;
    }
    s->r = r;
    s->o = o;
    s->tie = out->tie = tr_plan_tie_of(c);
    fixed_of(r, o, &s->fx);
    if (pl_model_init(&s->m, r, o->dtype, err, errlen)) {
        free(s);
        return -1;
    }
    search_all(s, c, o);
    out->evaluated = s->evaluated;
    out->feasible = s->feasible;
    if (s->n_keep) out->fastest = s->keep[0];
    prefer_simple(s);
    pl_devices dv;
    tr_cluster *sub = malloc(sizeof *sub);
    if (sub) from_group(c, s->n_keep ? s->keep[0].group_first : 0, sub);
    pl_devices_of(sub ? sub : c, s->n_keep ? s->keep[0].l.world : tr_cluster_devices(c), &dv);
    free(sub);
    finish(s, &dv, out);
    if (!out->fits) {
        out->best = s->low_mem;
        if (s->low_mem.l.world == 0 && s->evaluated == 0) {
            tr_layout l; /* no layout to price: the resolver says why */
            tr_layout_resolve(&l, r, &o->fixed, (int)tr_cluster_devices(c), o->dtype, 1, err,
                              errlen);
            int named, orgs = tr_cluster_orgs(c, 0, tr_cluster_devices(c), &named);
            if (!err[0] && s->fx.priv)
                snprintf(err, errlen, "planner: private gradients keep each tensor x pipeline "
                         "group inside one organisation (%d here: %s), and no layout of this "
                         "recipe does that here", orgs,
                         named ? "the cluster's organisation fields" : "every node its own");
            if (!err[0]) snprintf(err, errlen, "planner: no layout runs this recipe here");
            pl_model_free(&s->m);
            for (int k = 0; k <= TR_MAX_CHUNKS; k++) free(s->cuts[k]);
            free(s);
            return -1;
        }
        what_would(s, c, out);
    }
    out->deadline_met = o->deadline_h <= 0 || out->best.hours <= o->deadline_h;
    figures(c, out->figures, sizeof out->figures);
    pl_model_free(&s->m);
    for (int k = 0; k <= TR_MAX_CHUNKS; k++) free(s->cuts[k]);
    free(s);
    out->seconds = tr_now() - t0;
    return 0;
}

void tr_plan_price(const tr_recipe *r, const tr_cluster *c, const tr_layout *l, tr_dtype dtype,
                   tr_plan *p) {
    pl_model m;
    char err[256];
    memset(p, 0, sizeof(*p));
    if (pl_model_init(&m, r, dtype, err, sizeof err)) return;
    pl_devices dv;
    pl_devices_of(c, l->world, &dv);
    p->l = *l;
    pl_price(&m, &dv, p);
    pl_model_free(&m);
}

void tr_plan_describe(const tr_plan *p, char *buf, size_t len) {
    char pipe[96] = "", rec[96];
    tr_layout_recompute_name(&p->l, rec, sizeof rec);
    if (p->l.pp > 1)
        snprintf(pipe, sizeof pipe, " x pp %d, %s%s", p->l.pp,
                 tr_pp_kind_name((tr_pp_kind)p->l.schedule),
                 p->l.virtual_stages > 1 ? " (interleaved chunks)" : "");
    if (p->l.pp > 1 && p->l.virtual_stages > 1 && p->l.schedule == TR_PP_INTERLEAVED)
        snprintf(pipe, sizeof pipe, " x pp %d, interleaved x %d", p->l.pp, p->l.virtual_stages);
    else if (p->l.pp > 1 && p->l.schedule == TR_PP_ZBV) /* its V: 2 chunks per rank, always */
        snprintf(pipe, sizeof pipe, " x pp %d, zb-v", p->l.pp);
    char micro[64 + 4 * TR_MAX_DP_SHARES], shares[4 * TR_MAX_DP_SHARES];
    tr_layout_shares_name(&p->l, shares, sizeof shares);
    if (p->l.shares_uneven)
        snprintf(micro, sizeof micro, "micro-batches %s by dp replica", shares);
    else
        snprintf(micro, sizeof micro, "%d micro-batch%s", p->l.microbatches,
                 p->l.microbatches == 1 ? "" : "es");
    snprintf(buf, len, "dp %d x tp %d%s, %s of %d, ZeRO-%d%s, recompute %s", p->l.dp, p->l.tp,
             pipe, micro, p->l.micro_batch, p->l.zero,
             p->l.sequence_parallel ? ", sequence parallel" : "", rec);
}

int tr_plan_open(const tr_recipe *r, const tr_plan_opts *o) {
    pl_fixed f;
    fixed_of(r, o, &f);
    int pipe = f.pp != 1; /* a pipeline may be chosen: its schedule and stages too */
    return f.tp < 0 || f.pp < 0 || f.zero < 0 || (f.sp < 0 && f.tp != 1) || f.recompute < 0 ||
           (f.micro < 0 && f.M < 0) || (pipe && (f.schedule < 0 || f.V < 0));
}
