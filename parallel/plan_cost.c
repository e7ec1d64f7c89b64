/* The planner's cost model (plan.h): memory and step time of one layout, from the model's
 * per-block costs (model/cost.c) and the cluster's figures, in a few microseconds, so that the
 * search can price every layout. The memory estimate is calibrated once per recipe against the
 * model's measuring pass (pl_model_init); the plans shown are then measured exactly. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "parallel/dp.h"
#include "parallel/plan_private.h"
#include "parallel/schedule.h"

static double maxd(double a, double b) { return a > b ? a : b; }
static double mind(double a, double b) { return a < b ? a : b; }

/* The widest product output under n (attention's q, k and v; the MLP's first product). */
static double widest(const tr_node *n, double C) {
    double w = 0;
    if (n->kind == TR_NODE_ATTENTION) w = (n->heads + 2.0 * n->kv_heads) * (C / n->heads);
    if (n->kind == TR_NODE_MLP) w = n->activation == TR_ACT_SWIGLU ? 2.0 * n->hidden : n->hidden;
    for (int i = 0; i < n->n_children; i++) w = maxd(w, widest(&n->children[i], C));
    return w;
}

int pl_model_init(pl_model *m, const tr_recipe *r, tr_dtype dtype, char *err, size_t errlen) {
    const tr_model_desc *d = &r->model;
    memset(m, 0, sizeof(*m));
    m->T = d->seq_len;
    m->C = d->dim;
    m->V = d->vocab;
    m->Vpad = d->vocab;
    m->n = tr_cost_blocks(d, d->seq_len, NULL, 0);
    m->blk = calloc((size_t)m->n, sizeof(tr_cost));
    m->pre_flops = calloc((size_t)m->n + 1, sizeof(double));
    if (!m->blk || !m->pre_flops) {
        pl_model_free(m);
        snprintf(err, errlen, "planner: out of memory");
        return -1;
    }
    tr_cost_blocks(d, d->seq_len, m->blk, m->n);
    for (int i = 0; i < m->n; i++) m->pre_flops[i + 1] = m->pre_flops[i] + m->blk[i].fwd_flops;
    tr_cost all;
    tr_cost_model(d, d->seq_len, &all);
    m->train_flops_tok = 3.0 * all.fwd_flops;
    m->seqs = (double)(r->train.batch_tokens / d->seq_len);
    m->steps = r->train.steps;
    m->es = (double)tr_dtype_size(dtype);
    m->bucket = (r->parallel.bucket_kb > 0 ? r->parallel.bucket_kb : 4096) * 1024.0;
    /* bytes per parameter and per activation byte of this dtype: the measuring pass of the
       whole model on one process, one sequence */
    tr_model_opts mo = {.B = 1, .T = d->seq_len};
    tr_memory mem;
    if (tr_model_measure(d, dtype, &mo, &mem, err, errlen)) {
        pl_model_free(m);
        return -1;
    }
    double P = all.params > 0 ? all.params : 1;
    m->p_bytes = (double)mem.params / P;
    m->g_bytes = (double)mem.grads / P;
    m->o_bytes = (double)mem.optimizer / P;
    m->a_scale = all.act_bytes > 0 ? (double)mem.activations / (all.act_bytes * m->T) : 1;
    m->wmax = widest(&d->root, m->C);
    m->tied = 0; /* a tied head: with pp > 1 the last stage keeps a copy of the embedding */
    for (int i = 0; i < d->root.n_children; i++)
        if (d->root.children[i].kind == TR_NODE_LM_HEAD) m->tied = d->root.children[i].tied;
    return 0;
}

void pl_model_free(pl_model *m) {
    free(m->blk);
    free(m->pre_flops);
    memset(m, 0, sizeof(*m));
}

/* ---- the devices and links of the first `world` ranks -------------------------------- */

static void link_min(tr_link *a, const tr_link *b) {
    if (b->bw.v < a->bw.v) a->bw = b->bw;
    if (b->lat.v > a->lat.v) a->lat = b->lat;
    if (b->p2p.v > 0 && (!(a->p2p.v > 0) || b->p2p.v < a->p2p.v)) a->p2p = b->p2p;
    if (b->ring.v > 0 && (!(a->ring.v > 0) || b->ring.v < a->ring.v)) a->ring = b->ring;
}

void pl_devices_of(const tr_cluster *c, long world, pl_devices *d) {
    memset(d, 0, sizeof(*d));
    d->mem_cap = d->rate = d->mem_bw = HUGE_VAL;
    d->per_node = 1 << 30;
    tr_link slow = {.bw = {HUGE_VAL, TR_ORIGIN_ASSUMED}, .lat = {0, TR_ORIGIN_ASSUMED}};
    d->intra = d->inter = d->between = slow;
    long left = world;
    int first = -1, last = -1;
    double egress = 0;
    for (int i = 0; i < c->n_groups && left > 0; i++) {
        const tr_node_group *g = &c->g[i];
        long have = (long)g->nodes * g->per_node, use = have < left ? have : left;
        left -= use;
        if (first < 0) first = i;
        last = i;
        tr_node_group own = *g; /* a group nobody filled: an unknown device's figure */
        if (!c->cpu && !(own.efficiency.v > 0)) tr_group_fill_efficiency(&own, NULL);
        double eff = c->cpu ? 1.0 : own.efficiency.v;
        double peak = g->peak_flops.v > 0 ? g->peak_flops.v : PL_UNKNOWN_PEAK;
        if (peak * eff < d->rate) {
            d->rate = peak * eff;
            d->peak = peak;
        }
        d->g_rate[d->groups] = peak * eff;
        d->g_end[d->groups] = world - left;
        if (d->groups > 0 && d->g_rate[d->groups] != d->g_rate[0]) d->mixed = 1;
        d->mem_bw = mind(d->mem_bw, g->mem_bw.v > 0 ? g->mem_bw.v : PL_UNKNOWN_MEM_BW);
        /* a device of unknown memory (0): not checked (run then leaves the micro-batch to the
           resolver's memory rule) */
        if (g->mem_bytes.v > 0) d->mem_cap = mind(d->mem_cap, g->mem_bytes.v);
        d->per_node = g->per_node < d->per_node ? g->per_node : d->per_node;
        if (use < d->per_node) d->per_node = (int)use;
        d->price_s += (double)use * g->price_hour.v / 3600.0;
        if (g->per_node > 1) link_min(&d->intra, &g->intra);
        if (use > g->per_node) link_min(&d->inter, &g->inter);
        egress = maxd(egress, g->egress_per_gb.v / 1e9);
        d->groups++;
    }
    for (int i = first; i >= 0 && i <= last; i++)
        for (int j = i + 1; j <= last; j++) link_min(&d->between, &c->between[i][j]);
    if (d->groups > 1) {
        d->egress_per_byte = egress;
        link_min(&d->inter, &d->between);
    }
    if (!isfinite(d->intra.bw.v)) d->intra = d->inter;
    if (!isfinite(d->inter.bw.v)) d->inter = d->intra;
    if (!isfinite(d->between.bw.v)) d->between = d->inter;
    d->node_link = d->inter.bw.from == TR_ORIGIN_MEASURED;
    memcpy(d->eff, c->model_eff, sizeof d->eff);
    d->optim_rate = c->optim_rate;
    d->beside = !c->cpu;
    d->mpi_coll = c->cpu;
    d->reserve = 0;
    d->share = 1;
    d->per_pool = d->per_node;
    for (int i = first; c->cpu && i >= 0 && i <= last; i++) {
        const tr_node_group *g = &c->g[i];
        double want = (double)g->per_node * g->threads; /* threads its ranks ask for */
        if (g->cores > 0 && want > g->cores) d->share = mind(d->share, g->cores / want);
        if (g->pool > d->per_pool) d->per_pool = g->pool < world ? g->pool : (int)world;
    }
    /* an operation's own cost is work on the cores, as the products' is: ranks that share
       them pay it at their share. The probe's figure was timed with every rank at once, so
       it has paid that already, as the rate has */
    d->op_cost = !c->cpu ? PL_GPU_OP_COST : c->op_cost > 0 ? c->op_cost : PL_CPU_OP_COST / d->share;
    d->weight_passes = c->cpu ? PL_CPU_WEIGHT_PASSES : 0;
    for (int i = first; !c->cpu && i >= 0 && i <= last; i++) /* the largest of those used */
        d->reserve = fmax(d->reserve, tr_plan_runtime_reserve(c->g[i].device, NULL));
}

/* The runtime's own device memory, per device family.
 * CUDA context: 287 MB, what PyTorch measured for its context with lazy module loading
 * (pytorch/pytorch#86509; lazy loading is CUDA's default on Linux since 12.2, per the CUDA
 * programming guide): published, for one program on one device; ours loads fewer kernels.
 * NCCL: each channel of a communicator holds, per connection, the receive buffers of its three
 * protocols, at NCCL's defaults (its source, src/init.cc and src/include/device.h): Simple
 * NCCL_BUFFSIZE 4 MiB (1 MiB on Arm hosts), LL 8 lines x 512 threads x 8 steps x 16 B =
 * 512 KiB, LL128 120 x 640 x 8 steps x 8 B = 4.7 MiB; two connections per channel (the ring's
 * and the tree's). The channels NCCL opens depend on the topology it finds: the counts below
 * are assumed (NVLink/NVSwitch machines up to NCCL's 32 of older releases; PCIe ones few).
 * One communicator: tp and pp groups each add about as much again. */
#define PL_CONTEXT_BYTES 287047680.0
#define PL_NCCL_CONN_BYTES (4194304.0 + 524288.0 + 4915200.0)
static const struct {
    const char *family; /* a prefix of tr_device_info's name */
    int channels;       /* NCCL channels of a communicator (assumed) */
    double simple;      /* the Simple protocol's buffer (NCCL_BUFFSIZE default) */
} reserves[] = {
    {"A100", 32, 4194304.0}, {"H100-PCIe", 8, 4194304.0}, {"H100", 32, 4194304.0},
    {"H200", 32, 4194304.0}, {"B200", 32, 4194304.0},     {"L40S", 8, 4194304.0},
    {"MI300X", 32, 4194304.0}, /* RCCL: taken as NCCL's (assumed) */
};

double tr_plan_runtime_reserve(const char *device, const char **origin) {
    int ch = 32; /* an unknown device: as the NVLink machines (assumed) */
    double simple = 4194304.0;
    const tr_device_info *info = tr_device_find(device);
    for (size_t i = 0; info && i < sizeof reserves / sizeof reserves[0]; i++)
        if (!strncmp(info->name, reserves[i].family, strlen(reserves[i].family))) {
            ch = reserves[i].channels, simple = reserves[i].simple;
            break;
        }
    if (origin)
        *origin = info ? "table: context published, NCCL's buffer sizes from its source, its "
                         "channel count assumed"
                       : "assumed";
    return PL_CONTEXT_BYTES + 2.0 * ch * (PL_NCCL_CONN_BYTES - 4194304.0 + simple);
}

double pl_stage_rate(const pl_devices *dv, const tr_layout *l, int p) {
    if (!dv->mixed) return dv->rate;
    double r = HUGE_VAL;
    for (long d = 0; d < l->dp; d++) { /* the stage's tp blocks: groups are rank ranges */
        long first = (d * l->pp + p) * l->tp, last = first + l->tp - 1;
        for (int g = 0; g < dv->groups; g++)
            if (first < dv->g_end[g] && last >= (g ? dv->g_end[g - 1] : 0))
                r = mind(r, dv->g_rate[g]);
    }
    return isfinite(r) ? r : dv->rate;
}

double pl_replica_rate(const pl_devices *dv, const tr_layout *l, int d) {
    if (!dv->mixed) return dv->rate;
    double r = HUGE_VAL;
    long first = (long)d * l->pp * l->tp, last = first + (long)l->pp * l->tp - 1;
    for (int g = 0; g < dv->groups; g++)
        if (first < dv->g_end[g] && last >= (g ? dv->g_end[g - 1] : 0))
            r = mind(r, dv->g_rate[g]);
    return isfinite(r) ? r : dv->rate;
}

/* ---- one layout --------------------------------------------------------------------------- */

/* The link a group of `size` ranks, `stride` apart, crosses: inside a node when they all sit
 * on one, else between nodes (between providers' groups when the world spans them). */
static const tr_link *link_of(const pl_devices *dv, long stride, long size) {
    if (size <= 1) return &dv->intra;
    if (stride * size <= dv->per_node) return &dv->intra;
    return &dv->inter; /* with groups of several providers, the slowest between them too */
}

/* The link between pipeline ranks ra and rb of layout l: inside a node when, in every
 * data-parallel replica, their first tensor-parallel ranks ((d pp + r) tp) sit on one node of
 * per_node ranks, else between nodes. Only the boundaries that cross pay the slow link (pp 4
 * over 2 nodes of 2: the middle one). Replicas repeat the pattern every per_node of them at
 * most, so those are the ones checked. */
static const tr_link *pp_link(const pl_devices *dv, const tr_layout *l, int ra, int rb) {
    long per = dv->per_node > 0 ? dv->per_node : l->world, span = (long)l->tp * l->pp;
    if (per % span == 0) return &dv->intra; /* whole replicas in a node */
    long reps = span % per == 0 ? 1 : l->dp < per ? l->dp : per;
    for (long d = 0; d < reps; d++)
        if (((d * l->pp + ra) * l->tp) / per != ((d * l->pp + rb) * l->tp) / per)
            return &dv->inter;
    return &dv->intra;
}

/* What each of `flows` transfers that leave a node at once gets of link l, for a group with
 * k of its ranks on each node. A detected job's network is a node's link, timed with one flow
 * between node leaders (parallel/topology.c): the ranks of a node that cross together share
 * it (dp 2 x tp 2 over 2 nodes of 2: both dp groups' rings leave each node at once, each at
 * half the link). Where k > 1 every rank of the group works while the link carries its
 * bytes, as in the job's ring through all of its ranks, whose figure it takes where one was
 * measured (tr_link's ring; the leaders timed theirs with the other ranks idle). A table's or
 * a file's figure is each device's own share of its server's network (dsl/cluster.c: a GPU
 * server's NICs, one per device), which its flows do not divide. */
static tr_link crossing(const pl_devices *dv, const tr_link *l, long flows, long k) {
    tr_link s = *l;
    if (l != &dv->inter) return s;
    if (k > 1 && l->ring.v > 0) s.bw = l->ring;
    if (dv->node_link && flows > 1) {
        s.bw.v /= (double)flows;
        s.p2p.v /= (double)flows;
    }
    return s;
}

/* The members of a group of `size` ranks `stride` apart (in world rank order) that share a
 * node: a tensor-parallel group's stride is 1, a data-parallel one's tp x pp. */
static int members_on_node(const pl_devices *dv, long stride, long size) {
    long fit = stride < dv->per_node ? dv->per_node / stride : 1;
    return (int)(size < fit ? size : fit);
}

/* The link such a group crosses, as crossing() prices it: a node holds ranks of `stride`
 * such groups, at most its own ranks, and all of them leave it at once. */
static tr_link group_link(const pl_devices *dv, long stride, long size) {
    long flows = stride < dv->per_node ? stride : dv->per_node;
    return crossing(dv, link_of(dv, stride, size), flows, members_on_node(dv, stride, size));
}

/* One transfer of S bytes over link l, one direction: at the link's own rate where a job
 * measured it (p2p: an MPI all-reduce also pays its sums and both directions at once, and
 * between two hosts of the box at 1 Gbit/s reads 85-90 MB/s against p2p's 108, 2026-12-06),
 * else at the collective's figure (a table's or a file's: NCCL's bus bandwidth is the link's
 * rate). */
static double t_send(const tr_link *l, double S) {
    return S / (l->p2p.v > 0 ? l->p2p.v : l->bw.v) + l->lat.v;
}

/* An all-reduce of S bytes over p ranks: a ring's 2(p-1)/p S on the wire, and the latency of
 * a tree's 2 log2(p) steps (NCCL picks the faster per size; this takes the better of each). */
static double t_allreduce(const tr_link *l, double S, int p) {
    if (p <= 1) return 0;
    return 2.0 * (p - 1) / p * S / l->bw.v + 2.0 * log2((double)p) * l->lat.v;
}

enum { COLL_AR, COLL_RS, COLL_AG }; /* all-reduce, reduce-scatter, all-gather */

/* S bytes of a collective's step at the link's all-reduce bus bandwidth: a 2-rank all-reduce
 * moves S through each rank and sums half of it, about what a tree's round (S one way,
 * summed) does. Between hosts that is the link's one-way rate (p2p); inside one, where the
 * copies and sums share the cores and their caches, about a fifth of it here, which a
 * collective's steps pay and a pipeline's lone send does not. */
static double t_moved(const tr_link *l, double S) {
    return S / l->bw.v + l->lat.v;
}

/* How much faster a step runs inside a node where one rank in `n` works (the others wait,
 * yielding their cores: comm/mpi.c) than with every rank at once, at which the node's link
 * was measured: ranks that share cores (dv->share < 1) get up to a core each, 1 / share. */
static double idle_cores(const pl_devices *dv, double n) {
    return mind(n, 1 / dv->share);
}

/* One collective of S bytes (the whole buffer: an all-gather's result, a reduce-scatter's
 * input) over p ranks, k of them on each node (k = p: all on one, over `in`; else the nodes'
 * link l, already shared by the groups that cross at once). NCCL (the GPU): rings, a
 * reduce-scatter or all-gather half an all-reduce. Open MPI's libnbc (the CPU backend, as
 * its source schedules them): all-reduce, the ring comm/mpi.c asks for; reduce-scatter, the
 * whole buffer reduced to rank 0 down a binomial tree (each round's transfer over the link
 * its pair crosses: members 2^(r-1) apart, one pair of the group per node once they are k or
 * more apart) and then sent out from rank 0 in pieces; all-gather, each rank's piece sent
 * to every other, the k of a node sending theirs over its link at once. */
static double t_coll(const pl_devices *dv, int kind, const tr_link *l, double S, int p, int k) {
    if (p <= 1) return 0;
    if (!dv->mpi_coll || kind == COLL_AR) return (kind == COLL_AR ? 1 : 0.5) * t_allreduce(l, S, p);
    const tr_link *in = &dv->intra;
    if (k >= p) l = in;
    if (kind == COLL_AG) return maxd(t_moved(l, k * (p - k) * S / p), t_moved(in, (k - 1) * S / p));
    double t = 0;
    for (int d = 1; d < p; d *= 2) /* round d: one member of d on each node works */
        t += d < k ? t_moved(in, S) / idle_cores(dv, d) : t_moved(l, S);
    return t + maxd(t_moved(l, (p - k) * S / p), t_moved(in, (k - 1) * S / p) / idle_cores(dv, k));
}

/* How many buckets of at most bk bytes hold S bytes (t_bucketed's count). */
static double bucket_count(double S, double bk) {
    double n = ceil(S / bk);
    return n < 1 ? 1 : n;
}

/* t_coll in collectives of `bucket` bytes at most (each pays the latency). */
static double t_bucketed(const pl_devices *dv, int kind, const tr_link *l, double S, int p, int k,
                         double bucket) {
    double n = bucket_count(S, bucket);
    return n * t_coll(dv, kind, l, S / n, p, k);
}

/* Of the communication of one pass beside its window seconds of compute, run in turn on a
 * link of its own, what is left: gathers of ga seconds in na buckets, needed by the pass's ops one
 * every c = window / n, and reductions of re seconds in nr buckets, which its ops make ready
 * one every c (n: the buckets of both). Reductions alone, w = re / nr each: bucket j (from 1)
 * is done at the latest of c + j w and j c + w, the last at the latest of c + re and
 * window + w, so what stays after the window is the larger of one bucket and
 * re - (n - 1) c. Gathers alone wait the same: bucket j is done at j w and needed at
 * (j - 1) c. Both: at least the first gather and the last reduction, and what the link
 * carries beyond the window but one bucket's share of it. */
static double link_left(double ga, double na, double re, double nr, double window) {
    double n = (ga > 0 ? na : 0) + (re > 0 ? nr : 0);
    if (!(n > 0)) return 0;
    return maxd((ga > 0 ? ga / na : 0) + (re > 0 ? re / nr : 0), ga + re - (n - 1) * window / n);
}

double pl_exposed(const pl_devices *dv, double ga, double na, double re, double nr, double window) {
    return dv->beside ? link_left(ga, na, re, nr, window) : ga + re; /* the cores' own */
}

/* ZeRO-2's reduce-scatters beside the compute (a GPU's, or the CPU backend's over the
 * network), in the seconds they add to a step of M micro-batches of forward f and backward b:
 * in n buckets of rs / n each, which the backward makes ready one every b / n and the link
 * takes in turn. dp.c holds at most k = TR_DP_IN_FLIGHT (2) reductions in
 * flight: bucket j must be done when bucket j + k starts (the next micro-batch's first k
 * start b / n, 2 b / n, ... into its backward, after its forward), and when the next
 * micro-batch places its own bucket j, (j - 1) b / n into that backward. A micro-batch but
 * the last waits for the latest of those (for j below n - k it is never later than at
 * n - k), and at least for
 * what the link carries beyond its compute; the last waits for what the link has left after
 * its backward (link_left). One bucket hides behind the next forward only;
 * many behind most of both passes. */
static double wire_reduce_scatters(double rs, double n, double f, double b, double M) {
    double w = rs / n, cb = b / n, stall = maxd(0, rs - f - b), k = TR_DP_IN_FLIGHT;
    for (double j = maxd(1, n - k); j <= n; j++) {
        double done = maxd(cb + j * w, j * cb + w); /* the link's, from the first bucket on */
        double next_k = j + k <= n ? (j + k) * cb : b + f + (j + k - n) * cb;
        stall = maxd(stall, done - mind(next_k, b + f + (j - 1) * cb));
    }
    return link_left(0, 0, rs, n, b) + (M - 1) * stall;
}

/* The activations a micro-batch of B sequences leaves on a rank for its blocks [a, b), per
 * micro-batch in flight, in bytes. */
static double stage_act(const pl_model *m, const tr_plan *p, int a, int b, tr_recompute rc) {
    double split = 0, stream = 0, sel = 0, resid = 0, most = 0;
    for (int i = a; i < b; i++) {
        const tr_cost *k = &m->blk[i];
        split += k->act_split_bytes;
        stream += k->act_bytes - k->act_split_bytes;
        sel += k->act_sel_bytes;
        resid += k->residuals;
        most = maxd(most, k->act_bytes);
    }
    double tp = p->l.tp, sp = p->l.sequence_parallel ? tp : 1, tok = (double)p->l.micro_batch * m->T;
    double per_tok;
    if (rc == TR_RECOMPUTE_FULL) /* the stream between branches, one block again */
        per_tok = resid * 4.0 * m->C / sp + most / tp;
    else
        per_tok = (split - (rc == TR_RECOMPUTE_SELECTIVE ? sel : 0)) / tp + stream / sp;
    /* zb-h1's output gradients, kept for the deferred weight part, lie over tensors only the
       input part reads (model.c: place_output_grads), but for the (N, C) ones with sequence
       parallelism (the stream there has N / tp rows) and the MLPs' input-product ones with
       selective recompute (as large as the activation it recomputes; exact for GELU) */
    if ((p->l.schedule == TR_PP_ZBH1 || p->l.schedule == TR_PP_ZBV) && p->l.pp > 1)
        per_tok += (sp > 1 ? resid * 4.0 * m->C : 0) +
                   (rc == TR_RECOMPUTE_SELECTIVE ? sel / tp : 0);
    return per_tok * tok * m->a_scale;
}

/* zb-v's lists for (P, M): their bubble ratio and each chunk's slots. Where P divides M, the
 * paper's (P-1)/(6M+P-1), which the lists reach (tests/test_schedule.c), and the caps (P a
 * chunk, P-1 on rank 0's second: an upper bound for this quick estimate; the plans shown are
 * measured on the lists themselves); otherwise by generating the lists (schedule.c: no closed
 * form there; up to 8 variants of a greedy, tens of ms at M 1024, so each (P, M) is kept), their
 * tr_pp_bubble's ratio (1f1b's if they cannot run). */
enum { ZBV_MEMO = 512 };
typedef struct {
    int P, M;
    double ratio;
    int slots[TR_PP_MAX_RANKS * 2];
} zbv_lists_t;
static zbv_lists_t zbv_memo[ZBV_MEMO];

static const zbv_lists_t *zbv_lists(int P, int M) {
    zbv_lists_t *z = &zbv_memo[((unsigned)P * 2654435761u ^ (unsigned)M * 40503u) % ZBV_MEMO];
    if (P == z->P && M == z->M) return z;
    tr_pp_schedule s;
    double f = -1;
    memset(z->slots, 0, sizeof z->slots);
    if (M % P == 0 && P <= TR_PP_MAX_RANKS) {
        f = (P - 1.0) / (6.0 * M + P - 1.0);
        for (int c = 0; c < 2 * P; c++)
            z->slots[c] = c == 2 * P - 1 ? P - 1 : P;
    } else if (P <= TR_PP_MAX_RANKS && !tr_pp_generate(&s, TR_PP_ZBV, P, 2, M)) {
        f = tr_pp_bubble(&s);
        for (int c = 0; c < 2 * P; c++)
            z->slots[c] = tr_pp_chunk_slots(&s, c);
        tr_pp_free(&s);
    }
    z->P = P, z->M = M;
    z->ratio = f >= 0 && f < 1 ? f / (1 - f) : (P - 1.0) / M;
    return z;
}

/* The pipeline rank that holds chunk c (schedule.h: c % pp, or zb-v's V). */
static int rank_of(const tr_plan *p, int c) {
    return tr_pp_rank_of_kind((tr_pp_kind)p->l.schedule, p->l.pp, c);
}

/* Parameters held by pipeline rank `r` (its chunks), per tensor-parallel rank. */
static double stage_params(const pl_model *m, const tr_plan *p, int r) {
    double n = 0;
    int K = p->l.pp * p->l.virtual_stages;
    for (int c = 0; c < K; c++)
        for (int i = p->l.chunk_start[c]; i < p->l.chunk_start[c + 1] && rank_of(p, c) == r; i++)
            n += m->blk[i].matrix_params / p->l.tp + (m->blk[i].params - m->blk[i].matrix_params);
    if (m->tied && p->l.pp > 1 && r == rank_of(p, K - 1) && r != rank_of(p, 0))
        n += m->V * m->C / p->l.tp; /* the copy (none where one rank holds both ends: zb-v) */
    return n;
}

/* Micro-batches of each of rank r's chunks in flight at once (chunk c; zb-v: its lists',
 * at most P, and P-1 on rank 0's second chunk, schedule.c). */
static double inflight(const tr_plan *p, int r, int c) {
    int P = p->l.pp, M = p->l.microbatches, V = p->l.virtual_stages;
    if (P == 1) return 1;
    switch ((tr_pp_kind)p->l.schedule) {
    case TR_PP_ZBV: {
        int k = zbv_lists(P, M)->slots[c];
        return k > 0 ? k : mind(P, M);
    }
    case TR_PP_GPIPE: return M;
    case TR_PP_INTERLEAVED: /* warm-up forwards over all V chunks, per chunk */
        return mind((double)M, ((V - 1.0) * P + 2.0 * (P - r - 1) + 1) / V + 1);
    default: return mind(P - r, M); /* 1f1b, and zb-h1 whose weight parts keep within it */
    }
}

/* One micro-batch's scratch (model_memory.c's memory_of): the widest layer's two buffers, the
 * stream's at each residual depth, the head's chunk of logits (on its stage), the per-token
 * buffers, and tensor and sequence parallelism's gathers. */
static double scratch(const pl_model *m, const tr_plan *p, int head) {
    double N = (double)p->l.micro_batch * m->T, tp = p->l.tp, sp = p->l.sequence_parallel ? tp : 1;
    double Vl = ceil(m->V / tp), rows = floor(8388608.0 / Vl);
    if (rows < 1) rows = 1;
    if (rows > N) rows = N;
    double s = 2 * N * m->wmax / tp + (head ? rows * Vl : 16) + 2 * 2 * N / sp * m->C;
    s *= m->es;
    s += N * 4 + 2 * N * 4;
    if (p->l.sequence_parallel) s += 2 * N * m->C * m->es;
    if (p->l.tp > 1) s += Vl * tp * 4 + (tp + 1) * rows * 12 + N * 4;
    return s;
}

double pl_stage_memory(const pl_model *m, const pl_devices *dv, const tr_plan *p, int r) {
    int K = p->l.pp * p->l.virtual_stages;
    tr_recompute rc = tr_layout_recompute_at(&p->l, r);
    double n = stage_params(m, p, r), dp = p->l.dp;
    double pb = m->p_bytes * n, gb = m->g_bytes * n, ob = m->o_bytes * n;
    tr_zero sh = tr_zero_of(p->l.zero);
    if (sh.optimizer) ob /= dp;
    if (sh.grads) gb /= dp; /* the pieces (the bucket buffers: the exact pass's) */
    if (sh.params) pb /= dp;
    double act = 0;
    for (int c = 0; c < K; c++)
        if (rank_of(p, c) == r)
            act += inflight(p, r, c) *
                   stage_act(m, p, p->l.chunk_start[c], p->l.chunk_start[c + 1], rc);
    double ws = dv->reserve > 0 ? (double)TR_WS_CUBLASLT_BYTES : 0; /* the workspaces' most */
    return pb + gb + ob + act + scratch(m, p, rank_of(p, K - 1) == r) + ws + dv->reserve;
}

static void price_memory(const pl_model *m, const pl_devices *dv, tr_plan *p) {
    double worst = 0;
    for (int r = 0; r < p->l.pp; r++) worst = maxd(worst, pl_stage_memory(m, dv, p, r));
    p->mem_bytes = worst;
    p->mem_cap = dv->mem_cap;
    p->mem_exact = 0;
}

/* The largest micro-batch (sequences) at which the model's own rate was measured, and that
 * rate as a share of dv->rate; 0 when none was. */
static int measured_at(const pl_devices *dv, double *eff) {
    for (int i = TR_CLUSTER_EFF - 1; i >= 0; i--)
        if (dv->eff[i] > 0) {
            *eff = dv->eff[i];
            return 1 << i;
        }
    return 0;
}

/* The cost model's forward and backward of chunk blocks [a, b) over micro-batches of `tok`
 * tokens: matrix products at the device's rate, PL_CPU/GPU_OP_COST per operation, the
 * activations' passes through memory (elem), and on the CPU the weights' (weights: once a
 * micro-batch, whatever its size; see PL_CPU_WEIGHT_PASSES). */
static void parts(const pl_model *m, const pl_devices *dv, const tr_plan *p, int a, int b,
                  double tok, double rate, double *mm, double *fixed, double *elem,
                  double *weights) {
    double tp = p->l.tp, sp = p->l.sequence_parallel ? tp : 1, ops = 0, act = 0, w = 0;
    for (int i = a; i < b; i++) {
        ops += m->blk[i].matrix_ops;
        act += m->blk[i].act_split_bytes / tp + (m->blk[i].act_bytes - m->blk[i].act_split_bytes) / sp;
        w += m->blk[i].matrix_params / tp;
    }
    *mm = (m->pre_flops[b] - m->pre_flops[a]) * tok / tp / rate;
    *fixed = ops * dv->op_cost;
    *elem = PL_ELEMENTWISE_PASSES * act * tok * m->a_scale / dv->mem_bw;
    *weights = dv->weight_passes * w * m->es / dv->mem_bw;
}

/* Forward and backward seconds of one micro-batch on chunk blocks [a, b), with tp's
 * collectives, on one rank: parts(). Where the model's own rate was measured (the CPU:
 * tr_cluster.model_eff), the measurement sets the level: the cost model's figure times the
 * ratio of measured to modelled at the largest measured micro-batch (its longest and least
 * noisy timing). The level only: how the time moves with the micro-batch stays the model's,
 * as the per-size measurements vary from run to run more than they differ on a small model,
 * and a plan that followed them would not be the same twice. */
static void chunk_time(const pl_model *m, const pl_devices *dv, const tr_plan *p, int a, int b,
                       double rate, tr_recompute rc, double *compute, double *tp_s) {
    double tok = (double)p->l.micro_batch * m->T, mm, fixed, elem, wts, eff;
    parts(m, dv, p, a, b, tok, rate, &mm, &fixed, &elem, &wts);
    /* the weights' passes: the forward's two (packed), the backward's four (packed for the
       input gradient; the weight gradient's accumulation) */
    double f = mm + fixed + elem / 3 + wts / 3, bwd = 2 * (mm + fixed + wts / 3) + 2 * elem / 3;
    int ref = measured_at(dv, &eff);
    double k = 1;
    if (ref) {
        double rm, rf, re, rw;
        parts(m, dv, p, a, b, (double)ref * m->T, rate, &rm, &rf, &re, &rw);
        k = 3 * rm / eff / (3 * (rm + rf) + re + rw);
        f *= k, bwd *= k;
    }
    double resid = 0;
    for (int i = a; i < b; i++)
        resid += m->blk[i].residuals;
    /* full recompute runs each residual branch's forward again, but for the last one's
       without a pipeline (model/exec.c: its tensors are intact at the backward; a pipeline
       rank runs other micro-batches' forwards in between) */
    double again = p->l.pp == 1 && resid > 1 ? (resid - 1) / resid : 1;
    double rec = rc == TR_RECOMPUTE_FULL        ? again * f
                 : rc == TR_RECOMPUTE_SELECTIVE ? k * elem / 6
                                                : 0;
    *compute = f + bwd + rec;
    /* one all-reduce (or reduce-scatter + all-gather) of the stream per residual branch in
       the forward, one in the backward, and the vocabulary-parallel embedding and head */
    double S = tok * m->C * m->es;
    tr_link l = group_link(dv, 1, p->l.tp);
    double n_coll = 2 * resid + (a == 0) + (b == m->n);
    if (rc == TR_RECOMPUTE_FULL) n_coll += resid;
    *tp_s = n_coll * t_allreduce(&l, S, p->l.tp);
}

static double zbv_ratio(int P, int M) {
    return zbv_lists(P, M)->ratio;
}

/* The pipeline's bubble as a share of the compute (tr_pp_bubble's ratios). */
static double bubble_ratio(const tr_plan *p) {
    double P = p->l.pp, M = p->l.microbatches, V = p->l.virtual_stages;
    if (P <= 1) return 0;
    switch ((tr_pp_kind)p->l.schedule) {
    case TR_PP_INTERLEAVED: return (P - 1) / (V * M);
    case TR_PP_ZBH1: return 2 * (P - 1) / (3 * M); /* 1f1b's less the weight parts' third */
    case TR_PP_ZBV:
        return zbv_ratio((int)P, (int)M);
    default: return (P - 1) / M;
    }
}

/* Ranks that share their node's cores (dv->share < 1): the rates were measured with every
 * rank computing at once, but a pipeline rank that waits (its bubble, a receive) yields its
 * core (comm/mpi.c's waits) and the ranks still computing then run faster, up to their own
 * speed. The schedule's lists are simulated with each pool's load (tr_pp_span_shared: the
 * whole timeline slows wherever the ranks busy at once ask for more than the pool's cores;
 * a pool is a node's ranks, or several nodes' where they share one machine's cores),
 * the busiest pool's span over the span at a rank's own speed stretching the pipeline part,
 * `critical` (what of compute, sends and bubble the cores do, priced at the shared rate: share
 * x it at a rank's own speed; not the time on the network between nodes). Returns what that takes
 * off `critical`, 0 or less; the last answer is kept. */
static double shared_cores(const pl_devices *dv, const tr_layout *l, double critical) {
    static tr_layout last;
    static double last_share, last_ratio = -1;
    static int last_per;
    int P = l->pp;
    if (dv->share >= 1 || P <= 1 || P > TR_PP_MAX_RANKS) return 0;
    if (last_ratio < 0 || last_share != dv->share || last_per != dv->per_pool ||
        last.world != l->world || last.tp != l->tp || P != last.pp ||
        last.virtual_stages != l->virtual_stages || last.microbatches != l->microbatches ||
        last.schedule != l->schedule) {
        tr_pp_schedule s;
        double solo = -1, most = -1;
        if (!tr_pp_generate(&s, (tr_pp_kind)l->schedule, P, l->virtual_stages,
                            l->microbatches)) {
            double none[TR_PP_MAX_RANKS] = {0}, load[TR_PP_MAX_RANKS];
            solo = tr_pp_span_shared(&s, none);
            long per = dv->per_pool > 0 ? dv->per_pool : l->world;
            for (long first = 0; solo > 0 && first < l->world; first += per) {
                memset(load, 0, sizeof load); /* each stage's ranks in this pool, per core */
                for (long w = first; w < first + per && w < l->world; w++)
                    load[(w / l->tp) % P] += 1.0 / (per * dv->share);
                most = maxd(most, tr_pp_span_shared(&s, load));
            }
            tr_pp_free(&s);
        }
        last = *l, last_share = dv->share, last_per = dv->per_pool;
        last_ratio = solo > 0 && most > 0 ? most / solo : 1 / dv->share;
    }
    return mind(0, dv->share * last_ratio * critical - critical);
}

static void price_time(const pl_model *m, const pl_devices *dv, tr_plan *p) {
    int K = p->l.pp * p->l.virtual_stages;
    double worst = 0, worst_c = 0, worst_tp = 0, worst_pp = 0, worst_wire = 0, params = 0;
    double tok = (double)p->l.micro_batch * m->T;
    /* a boundary carries 1/tp of the stream per tp rank: its rows (sequence parallelism), or
       its slice, all-gathered over the tp group on arrival (scatter-gather, pipeline.c) */
    double full = tok * m->C * m->es, S = full / p->l.tp;
    tr_link tl = group_link(dv, 1, p->l.tp);
    double gather =
        p->l.tp > 1 && !p->l.sequence_parallel ? 0.5 * t_allreduce(&tl, full, p->l.tp) : 0;
    double bwd_last = 0;
    int tp_wire = link_of(dv, 1, p->l.tp) == &dv->inter;
    for (int r = 0; r < p->l.pp; r++) {
        double c = 0, t = 0, send = 0, wire = 0, rate = pl_stage_rate(dv, &p->l, r);
        for (int k = 0; k < K; k++) {
            if (rank_of(p, k) != r) continue;
            double cc, tt;
            chunk_time(m, dv, p, p->l.chunk_start[k], p->l.chunk_start[k + 1], rate,
                       tr_layout_recompute_at(&p->l, r), &cc, &tt);
            c += cc;
            t += tt;
            /* receive forward, send back (nothing at zb-v's turn, where one rank holds both),
               each over the link that boundary crosses */
            for (int j = k - 1; j <= k + 1; j += 2) {
                if (j < 0 || j >= K || rank_of(p, j) == r) continue;
                /* the stage's tp ranks send their parts at once */
                const tr_link *over = pp_link(dv, &p->l, r, rank_of(p, j));
                tr_link pl = crossing(dv, over, p->l.tp < dv->per_node ? p->l.tp : dv->per_node, 1);
                double ts = t_send(&pl, S);
                send += ts + gather;
                wire += over == &dv->inter ? ts : 0;
            }
        }
        if (c + t + send > worst) {
            worst = c + t + send;
            worst_c = c;
            worst_tp = t;
            worst_pp = send;
            worst_wire = wire + (tp_wire ? t : 0);
            params = stage_params(m, p, r);
            bwd_last = c * 2.0 / 3.0;
        }
    }
    double M = p->l.microbatches;
    if (p->l.shares_uneven) /* pp 1: the replica whose share takes longest at its own rate */
        for (int d = 0, a0 = p->l.chunk_start[0], a1 = p->l.chunk_start[1]; d < p->l.dp; d++) {
            double cc, tt, a = tr_layout_accum_of(&p->l, d);
            chunk_time(m, dv, p, a0, a1, pl_replica_rate(dv, &p->l, d), p->l.recompute, &cc,
                       &tt);
            if (d == 0 || a * (cc + tt) > M * worst)
                worst = cc + tt, worst_c = cc, worst_tp = tt, M = a, bwd_last = cc * 2.0 / 3.0;
        }
    p->compute_s = M * worst_c;
    p->tp_s = M * worst_tp;
    p->pp_s = M * worst_pp;
    p->bubble_s = M * worst * bubble_ratio(p);
    /* what waits on the network between nodes, not on the cores, is not sped up by them */
    double on_cores = worst > 0 ? (worst - worst_wire) / worst : 1;
    p->shared_s =
        p->l.shares_uneven ? 0 : shared_cores(dv, &p->l, (M * worst + p->bubble_s) * on_cores);
    /* data parallelism: gradients and ZeRO's gathers over the dp group */
    int d = p->l.dp;
    long stride = (long)p->l.tp * p->l.pp; /* a node holds ranks of this many dp groups */
    int k = members_on_node(dv, stride, d);
    tr_link dlink = group_link(dv, stride, d);
    const tr_link *dl = &dlink;
    /* the CPU backend's collectives between hosts: their bytes cross the network while the
       cores compute */
    int wire = dv->mpi_coll && link_of(dv, stride, d) == &dv->inter;
    double G = params * m->es, Pb = params * m->es, bk = m->bucket;
    double ng = bucket_count(G, bk), np = bucket_count(Pb, bk);
    /* ZeRO-1/2's refresh of the updated parameters overlaps the next forward (its first
       micro-batch's: a third of its compute) */
    double fwd_first = worst_c / 3.0, after = 0;
    /* each collective as the backend runs it (t_coll) */
    tr_zero sh = tr_zero_of(p->l.zero);
    double ag = t_bucketed(dv, COLL_AG, dl, Pb, d, k, bk);
    if (sh.params) { /* gathers ahead of the ops of every forward and backward */
        double rs = t_bucketed(dv, COLL_RS, dl, G, d, k, bk);
        p->dp_comm_s = M * (rs + 2 * ag);
        p->dp_s = M * (pl_exposed(dv, ag, np, 0, 0, fwd_first) +
                       pl_exposed(dv, ag, np, rs, ng, worst_c - fwd_first));
    } else if (sh.grads && (wire || dv->beside)) { /* each bucket's reduce-scatter beside */
        double rs = t_bucketed(dv, COLL_RS, dl, G, d, k, bk);
        p->dp_comm_s = M * rs;
        p->dp_s = wire_reduce_scatters(rs, ng, PL_CPU_WIRE_OVERLAP * fwd_first,
                                       PL_CPU_WIRE_OVERLAP * bwd_last, M);
        after = ag;
    } else if (sh.grads) { /* a reduce-scatter in every backward, the same refresh as ZeRO-1 */
        p->dp_comm_s = p->dp_s = M * t_bucketed(dv, COLL_RS, dl, G, d, k, bk);
        after = ag;
    } else { /* the gradients' all-reduce in the last backward; ZeRO-1 then gathers the
                updated parameters during the next forward */
        p->dp_comm_s = t_bucketed(dv, COLL_AR, dl, G, d, k, bk);
        p->dp_s = pl_exposed(dv, 0, 0, p->dp_comm_s, ng, bwd_last);
        after = sh.optimizer ? ag : 0;
    }
    p->dp_comm_s += after;
    /* the refresh's buckets all start after the update and each op waits for its own: on a
       GPU NCCL's stream completes them in order, ahead of the forward; on the CPU they are in
       flight at once and share the link, so the first op waits for about all of them, between
       hosts too (bench/wire_overlap.sh: the refresh hid nothing it could measure) */
    p->dp_s += pl_exposed(dv, after, np, 0, 0, fwd_first);
    p->dp_hidden = p->dp_comm_s > 0 ? 1.0 - p->dp_s / p->dp_comm_s : 1.0;
    if (dv->beside) /* what hides slows the compute beside it */
        p->dp_s += PL_GPU_CONTENTION * (p->dp_comm_s - p->dp_s);
    double shards = sh.optimizer ? d : 1;
    /* AdamW reads the master weights, moments and gradient and writes three back: at the
       rate measured for this backend's own update where it was (the CPU: its square roots and
       divisions, not the memory, set the pace), else at the memory bandwidth */
    p->optim_s = dv->optim_rate > 0 ? params / shards / dv->optim_rate
                                    : params / shards * (4.0 * 3 + m->es) * 2 / dv->mem_bw;
    p->step_s = M * worst + p->bubble_s + p->shared_s + p->dp_s + p->optim_s;
    /* egress: a data-parallel ring that crosses providers sends its volume out of each */
    p->egress_gb = 0;
    if (dv->groups > 1 && d > 1)
        p->egress_gb = (double)p->l.tp * p->l.pp * 2.0 * G * (sh.params ? 1.5 * M : 1) / 1e9;
}

void pl_price(const pl_model *m, const pl_devices *dv, tr_plan *p) {
    price_memory(m, dv, p);
    price_time(m, dv, p);
    double tokens = m->seqs * m->T;
    p->tokens_s = tokens / p->step_s;
    p->mfu = m->train_flops_tok * p->tokens_s / ((double)p->l.world * dv->peak);
    p->hours = p->step_s * (double)m->steps / 3600.0;
    double per_step = p->step_s * dv->price_s + p->egress_gb * 1e9 * dv->egress_per_byte;
    p->cost = per_step * (double)m->steps;
    p->cost_per_mtok = per_step / tokens * 1e6;
}
