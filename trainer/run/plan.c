/* `trainer run`'s plan: the topology of the job (parallel/topology.h, the same on every rank),
 * then, when the recipe and the flags leave anything open (parallel "auto", a field "auto",
 * recompute "auto", ...), the planner's choice for it (parallel/plan.h), written into the
 * flags so that tr_layout_resolve makes the layout from it like from a layout given by hand;
 * and in any case the cost model's prediction of the layout that runs, which the run's
 * metrics set beside what it measures. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "parallel/topology.h"
#include "trainer/run/run.h"

static tr_plan_opts plan_opts(const run_ctx *x) {
    const tr_options *o = &x->o;
    tr_plan_opts po = {.objective = TR_PLAN_TIME,
                       .all_devices = 1,
                       .recompute = -1,
                       .dtype = x->be->dtype,
                       .alternatives = 5}; /* trainer plan's default, for OUT/plan.json */
    po.fixed = tr_options_layout(o, x->be->pad_vocab);
    return po;
}

/* The plan's choices into the flags (those the user gave are the plan's already). */
static void apply(run_ctx *x, const tr_plan *p) {
    tr_options *o = &x->o;
    tr_layout_flags f = {.pad_vocab = o->layout.pad_vocab};
    tr_plan_pin(&p->l, &f, &x->r);
    if (!(x->cluster.g[0].mem_bytes.v > 0)) { /* a device of unknown memory: the resolver's rule */
        f.microbatches = o->layout.microbatches;
        f.micro_batch = o->layout.micro_batch;
    }
    o->layout = f;
}

static int count_nodes(const tr_node *n) {
    int k = 1;
    for (int i = 0; i < n->n_children; i++)
        k += count_nodes(&n->children[i]);
    return k;
}

static void shrink_into(const tr_node *src, tr_node *dst, tr_node **next, int mlp_hidden) {
    *dst = *src;
    if (dst->kind == TR_NODE_STACK) dst->repeat = 1;
    if (dst->kind == TR_NODE_MLP && mlp_hidden) dst->hidden = mlp_hidden;
    if (!src->n_children) return;
    dst->children = *next;
    *next += src->n_children;
    for (int i = 0; i < src->n_children; i++)
        shrink_into(&src->children[i], &dst->children[i], next, mlp_hidden);
}

/* The recipe's model with one block per stack, and MLPs of mlp_hidden when not 0, into *d:
 * what the probes below time. Returns the copy's nodes (the caller frees them), NULL when
 * memory runs out. */
static tr_node *shrunk_model(const tr_recipe *r, int mlp_hidden, tr_model_desc *d) {
    *d = r->model;
    tr_node *nodes = malloc((size_t)count_nodes(&r->model.root) * sizeof *nodes), *next = nodes;
    if (nodes) shrink_into(&r->model.root, &d->root, &next, mlp_hidden);
    return nodes;
}

/* The seconds one call of run(ctx) takes with every rank calling it at once (ranks sharing
 * cores see each other): after one untimed (unless `warm`: the caller's last call was one),
 * from a barrier to the last rank's end of n more,
 * over n. Each rank's own median of its calls mixed the turns the scheduler gives ranks that
 * share cores (one that finishes first leaves the others its core): on 4 ranks of 2 cores the
 * slowest rank's median read tp_gpt's step at 1.1-1.8x, a different figure each run. *noise:
 * the larger of itself and the largest tr_topology_spread of a rank's calls. -1 when a
 * collective fails. */
enum { TIMED_MAX = 8 };
static double time_together(tr_comm *w, void (*run)(void *), void *ctx, int n, int warm,
                            double *noise) {
    double t[TIMED_MAX], mine[2];
    if (!warm) run(ctx);
    if (n > TIMED_MAX || tr_comm_barrier(w)) return -1;
    double start = tr_now();
    for (int i = 0; i < n; i++) {
        double t0 = tr_now();
        run(ctx);
        t[i] = tr_now() - t0;
    }
    mine[0] = tr_now() - start;
    mine[1] = tr_topology_spread(t, n);
    int size = tr_comm_size(w);
    double *all = calloc(2 * (size_t)size, sizeof *all), last = -1;
    if (all && !tr_comm_all_gather(w, mine, all, 2, TR_COMM_F64))
        for (int i = 0; i < size; i++) {
            last = all[2 * i] > last ? all[2 * i] : last;
            *noise = all[2 * i + 1] > *noise ? all[2 * i + 1] : *noise;
        }
    free(all);
    return last < 0 ? -1 : last / n;
}

typedef struct {
    tr_model *m;
    const int *tok;
    int B, T;
} model_step;

static void run_model(void *ctx) {
    model_step *s = ctx;
    tr_model_zero_grad(s->m);
    tr_model_forward(s->m, s->tok, s->tok, s->B, s->T, 1.0f);
    tr_model_backward(s->m);
}

/* Seconds of a forward and backward of m over B sequences, every rank at once
 * (time_together, PROBE_REPS of them). */
enum { PROBE_REPS = 3 };
static double time_model(tr_comm *w, tr_model *m, int B, int T, const int *tok, double *noise) {
    model_step s = {m, tok, B, T};
    return time_together(w, run_model, &s, PROBE_REPS, 0, noise);
}

/* The CPU: the share of the measured sgemm rate the recipe's own model reaches at
 * micro-batches of 1, 2, 4, ... sequences (c->model_eff), timed on a copy with one block
 * per stack, so that the plan prices attention, norms, activations and each op's overhead as
 * this machine runs them instead of assuming them; the timings' spread joins the probes'
 * noise (c->noise), which the plan's tie follows. Sizes stop at the global batch, at
 * TR_CLUSTER_EFF, or once one forward and backward would take over PROBE_BUDGET s at the
 * sgemm rate, one sequence only over PROBE_FIRST (under PROBE_BUDGET alone, tp_gpt's one
 * sequence, 0.1 s on 4 ranks of 2 cores, was measured in 1 run of 4 and priced at the
 * assumed costs, 1.5x slower, in the others). A rank that cannot build the copy (memory) leaves the
 * figures unmeasured on every rank. */
#define PROBE_BUDGET 0.1
#define PROBE_FIRST 2.0 /* one sequence: always, unless it would take longer than this */

/* The slowest group's measured sgemm rate: what the model's probe divides by. */
static double slowest_rate(const tr_cluster *c) {
    double rate = c->g[0].peak_flops.v;
    for (int i = 1; i < c->n_groups; i++)
        rate = c->g[i].peak_flops.v < rate ? c->g[i].peak_flops.v : rate;
    return rate;
}

/* The share of `rate` a forward and backward of d (the shrunk model, built when ok) over B
 * sequences reaches, every rank at once: > 0, 0 when a rank could not build it (memory), -1
 * when a collective fails. The timings' spread joins *noise. */
static double eff_at(tr_comm *w, const tr_backend *be, const tr_model_desc *d, int ok, int B,
                     double rate, double *noise) {
    int T = d->seq_len;
    tr_model *m = NULL;
    int *tok = malloc((size_t)B * (size_t)T * sizeof *tok);
    char e[256];
    int failed = !ok || !tok || tr_model_init(&m, d, be, B, T, e, sizeof e);
    double eff = 0;
    if (tr_comm_all_reduce(w, &failed, 1, TR_COMM_I32)) {
        eff = -1;
    } else if (!failed) {
        for (long k = 0; k < (long)B * T; k++)
            tok[k] = (int)(k % d->vocab);
        tr_model_init_params(m, 1);
        double t = time_model(w, m, B, T, tok, noise);
        eff = t < 0 ? -1 : tr_cost_train_flops_per_token(d, T) * B * T / (t * rate);
    }
    if (m) tr_model_free(m);
    free(tok);
    return eff;
}

static int probe_model(tr_comm *w, const tr_backend *be, const tr_recipe *r, tr_cluster *c) {
    tr_model_desc d;
    tr_node *kids = shrunk_model(r, 0, &d);
    int T = d.seq_len, ok = kids != NULL;
    double rate = slowest_rate(c), ftok = ok ? tr_cost_train_flops_per_token(&d, T) : 0;
    long seqs = r->train.batch_tokens / T;
    int rc = 0;
    for (int i = 0; i < TR_CLUSTER_EFF && (1L << i) <= seqs && rate > 0; i++) {
        int B = 1 << i;
        if (ftok * B * T / rate > (i ? PROBE_BUDGET : PROBE_FIRST)) break;
        double eff = eff_at(w, be, &d, ok, B, rate, &c->noise.v);
        if (eff < 0) rc = -1;
        if (!(eff > 0)) break;
        c->model_eff[i] = eff;
    }
    free(kids);
    return rc;
}

/* The CPU: the model's probe looks again at its largest size once the other probes are done,
 * and the faster look sets the level (tr_topology_faster_look). A machine that ran slow for a
 * second (about one start-up in twenty to thirty on 1 rank here, priced 1.5-1.7x slow while
 * its run measured an ordinary step) ran the whole first look slow, sgemm rate included, and
 * the second look 1.24-1.54x faster: in 60 start-ups held out (bench/startups.sh 30 1, twice),
 * the faster of two looks priced 1 beyond 25% against 6 with the first look alone (README,
 * "One start-up's price"). -1 when a collective fails. */
static int look_again(tr_comm *w, const tr_backend *be, const tr_recipe *r, tr_cluster *c) {
    int top = -1;
    for (int i = 0; i < TR_CLUSTER_EFF; i++)
        if (c->model_eff[i] > 0) top = i;
    if (top < 0) return 0;
    tr_model_desc d;
    tr_node *kids = shrunk_model(r, 0, &d);
    double eff = eff_at(w, be, &d, kids != NULL, 1 << top, slowest_rate(c), &c->noise.v);
    free(kids);
    if (eff > 0) tr_topology_faster_look(c, top, eff);
    return eff < 0 ? -1 : 0;
}

static int gcd(int a, int b) {
    while (b) {
        int t = a % b;
        a = b, b = t;
    }
    return a;
}

/* The least common multiple of every attention's heads: it divides the recipe's width (each
 * attention's heads do, as the recipe's checks ask), so twice it is a width that every
 * attention splits into heads of an even size, rotary or not. */
static int heads_lcm(const tr_node *n) {
    int h = n->kind == TR_NODE_ATTENTION ? n->heads : 1;
    for (int i = 0; i < n->n_children; i++) {
        int k = heads_lcm(&n->children[i]);
        h = h / gcd(h, k) * k;
    }
    return h;
}

typedef struct {
    model_step s;
    int reps;
} ops_step;

static void run_ops(void *ctx) {
    ops_step *o = ctx;
    for (int i = 0; i < o->reps; i++)
        run_model(&o->s);
}

/* The CPU: seconds per matrix product that do not shrink with its size (c->op_cost): the
 * call, the threads' fork and join of every operation around it, which the cost model
 * charges once per product and micro-batch. Timed on the recipe's model shrunk until its
 * products cost nothing beside their call (one block per stack, a width of twice the least
 * common multiple of the attentions' heads, MLPs of 8, a vocabulary of 16, 4 positions), every rank
 * at once, over the passes' 3 x its products (a backward runs two per forward's one). A call runs
 * as many forward and backward passes as fill OPS_SECONDS on the slowest rank (one pass timed
 * first, every rank at once), at most OPS_PRODUCTS products' worth: shorter calls let ranks
 * that share cores take turns unseen, which read 4 ranks on 2 cores at 1 rank's figure. A
 * fixed 10,000 products a call took 12 s instead of 0.1 s on a machine whose cores another
 * process kept busy (each fork and join then waits for the scheduler), and one CI run's
 * `trainer run`s past a test's 300 s. What the copy's products still compute at the sgemm
 * rate is taken off. Its spread joins the probes' noise. Unmeasured (0) where the copy
 * cannot be built (memory): the assumed figure stays. */
#define OPS_SECONDS 0.03
enum { OPS_PRODUCTS = 10000 };
static int probe_ops(tr_comm *w, const tr_backend *be, const tr_recipe *r, tr_cluster *c) {
    tr_model_desc d;
    tr_node *nodes = shrunk_model(r, 8, &d);
    d.dim = 2 * heads_lcm(&r->model.root), d.vocab = 16, d.seq_len = 4;
    int ok = nodes != NULL;
    int T = d.seq_len;
    tr_cost blk[TR_MAX_CHUNKS];
    int nb = ok ? tr_cost_blocks(&d, T, blk, TR_MAX_CHUNKS) : 0;
    double ops = 0;
    for (int i = 0; i < nb && i < TR_MAX_CHUNKS; i++)
        ops += blk[i].matrix_ops;
    int tok[4] = {1, 2, 3, 4};
    tr_model *m = NULL;
    char e[256];
    int failed = !ok || !(ops > 0) || tr_model_init(&m, &d, be, 1, T, e, sizeof e);
    if (tr_comm_all_reduce(w, &failed, 1, TR_COMM_I32)) failed = -1;
    double t = -1;
    if (!failed) {
        tr_model_init_params(m, 1);
        ops_step o = {{m, tok, 1, T}, 1};
        double unused = 0, one = time_together(w, run_ops, &o, 1, 0, &unused);
        double most = OPS_PRODUCTS / ops + 1, fill = one > 0 ? OPS_SECONDS / one : -1;
        o.reps = fill < 1 ? 1 : (int)(fill < most ? fill : most);
        /* warm from the sizing call */
        t = one < 0 ? -1 : time_together(w, run_ops, &o, PROBE_REPS, 1, &c->noise.v);
        double rate = c->g[0].peak_flops.v;
        if (t > 0) {
            double each =
                t / o.reps - (rate > 0 ? tr_cost_train_flops_per_token(&d, T) * T / rate : 0);
            c->op_cost = each > 0 ? each / (3 * ops) : 0;
        }
    }
    if (m) tr_model_free(m);
    free(nodes);
    return failed < 0 || (!failed && t < 0) ? -1 : 0;
}

/* The CPU: parameters the backend's own AdamW updates per second on a rank (c->optim_rate),
 * over as many as the recipe's model has, at most OPTIM_PROBE_N (master weights, gradient and
 * moments: 64 MiB, beyond the caches, as a large model's are; without a recipe, that many),
 * every rank at once (ranks sharing a machine share its memory: time_together, OPTIM_REPS
 * calls). A call updates them as often as makes OPTIM_CALL parameters, so that a small
 * model's calls last a few ms, not a few us that one descheduling would dwarf. A memcpy's
 * rate (mem_bw) had priced the scalar update 3.4x too fast; the probe follows whatever the
 * kernel is. The full 64 MiB for every recipe was a third of a start-up's probes on 4 ranks
 * (0.29 of 0.89 s), and each test run pays them. Its spread joins the probes' noise.
 * Unmeasured (0) when a rank lacks the memory. -1 when a collective fails. */
enum { OPTIM_PROBE_N = 1 << 22, OPTIM_CALL = 1 << 20, OPTIM_REPS = 7 };
typedef struct {
    const tr_backend *be;
    float *p, *g, *m, *v;
    size_t n;
    int times;
} optim_step;

static void run_optimizer(void *ctx) {
    optim_step *s = ctx;
    for (int i = 0; i < s->times; i++)
        s->be->adamw(s->p, s->p, s->g, s->m, s->v, s->n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.1f,
                     0.05f, 1.0f);
}

static int probe_optimizer(tr_comm *w, const tr_backend *be, const tr_recipe *r, tr_cluster *c) {
    size_t n = OPTIM_PROBE_N;
    if (r) {
        tr_cost all;
        tr_cost_model(&r->model, r->model.seq_len, &all);
        if (all.params >= 1 && all.params < (double)n) n = (size_t)all.params;
    }
    float *buf = calloc(4 * n, sizeof *buf); /* master, gradient, m, v */
    int failed = !buf || !be->adamw;
    if (tr_comm_all_reduce(w, &failed, 1, TR_COMM_I32)) {
        free(buf);
        return -1;
    }
    if (failed) {
        free(buf);
        return 0;
    }
    float *p = buf, *g = buf + n, *m = buf + 2 * n, *v = buf + 3 * n;
    for (size_t i = 0; i < n; i++)
        p[i] = 1e-3f * (float)(i % 1000), g[i] = 1e-4f * (float)(i % 7);
    optim_step st = {be, p, g, m, v, n, (int)((OPTIM_CALL + n - 1) / n)};
    double worst = time_together(w, run_optimizer, &st, OPTIM_REPS, 0, &c->noise.v);
    free(buf);
    if (worst > 0) c->optim_rate = (double)n * st.times / worst;
    return worst < 0 ? -1 : 0;
}

int tr_detect_cluster(tr_comm *world, const tr_backend *be, double peak, double mem,
                      const tr_recipe *r, tr_cluster *out, char *err, size_t errlen) {
    int cpu = be == tr_backend_cpu();
    char name[128] = "cpu";
    if (!cpu) tr_backend_cuda_peak(be->dtype, name, sizeof name);
    const tr_device_info *known = cpu ? NULL : tr_device_find(name);
    char host[TR_HOST_LEN]; /* the run's records' name for it (TR_HOSTNAME) */
    tr_hostname(host, sizeof host);
    /* a GPU's links are not MPI's over host memory: the table's (assumed) */
    tr_topology_opts to = {.cpu = cpu,
                           .host = host,
                           .device = name,
                           .device_mem = known ? known->mem_bytes : 0,
                           .mem_given = mem,
                           .peak_flops = cpu ? 0 : peak,
                           .measure_links = cpu && tr_comm_size(world) > 1,
                           .threads = cpu ? tr_backend_cpu_threads() : 0};
    if (tr_topology_detect(world, &to, out, err, errlen)) return -1;
    for (int i = 0; !cpu && i < out->n_groups; i++) /* the table's, or assumed */
        tr_group_fill_efficiency(&out->g[i], known);
    if (cpu && r && out->g[0].peak_flops.from == TR_ORIGIN_MEASURED &&
        probe_model(world, be, r, out)) {
        snprintf(err, errlen, "topology: a collective of the model's probe failed");
        return -1;
    }
    if (cpu && r && probe_ops(world, be, r, out)) {
        snprintf(err, errlen, "topology: a collective of the operations' probe failed");
        return -1;
    }
    if (cpu && probe_optimizer(world, be, r, out)) {
        snprintf(err, errlen, "topology: a collective of the optimizer's probe failed");
        return -1;
    }
    if (cpu && r && look_again(world, be, r, out)) {
        snprintf(err, errlen, "topology: a collective of the model's second look failed");
        return -1;
    }
    return 0;
}

/* --resume with no layout flag, on as many processes as the run folder's last attempt: that
 * attempt's resolved layout (OUT/recipe.lua) fixes what the recipe leaves to "auto", as flags
 * would. The planner measures the machine, and under another load it can choose another
 * micro-batch or ZeRO stage: the resumed run would then sum in another order and not be
 * bitwise the run it continues. On another number of processes the layout is planned anew. */
static void keep_layout(run_ctx *x) {
    tr_options *o = &x->o;
    const tr_layout_flags *g = &o->layout;
    int flags = tr_layout_flags_given(g);
    char path[TR_PATH_MAX + 16], err[256];
    snprintf(path, sizeof path, "%s/recipe.lua", x->r.train.out);
    tr_recipe s;
    /* no resolved recipe yet (killed before writing it), or not readable: planned as new */
    if (!o->resume || flags || tr_recipe_load(&s, path, NULL, 0, err, sizeof err)) return;
    const tr_parallel_desc *p = &s.parallel;
    if (p->dp > 0 && p->tp > 0 && p->pp > 0 && p->dp * p->tp * p->pp == x->nranks) {
        tr_layout_flags *f = &o->layout;
        f->dp = p->dp, f->tp = p->tp, f->pp = p->pp, f->zero = p->zero;
        f->sequence_parallel = p->sequence_parallel > 0 ? 1 : -1;
        f->schedule = p->schedule, f->virtual_stages = p->virtual_stages;
        f->microbatches = p->microbatches, f->micro_batch = s.train.micro_batch;
        x->r.train.recompute = s.train.recompute; /* and its level per stage, if any */
        x->r.train.n_stage_recompute = s.train.n_stage_recompute;
        memcpy(x->r.train.stage_recompute, s.train.stage_recompute,
               sizeof s.train.stage_recompute);
        if (x->r.parallel.n_stages == 0 && p->n_stages > 0) {
            x->r.parallel.n_stages = p->n_stages;
            memcpy(x->r.parallel.stages, p->stages, sizeof p->stages);
        }
        if (x->r.parallel.n_dp_shares == 0 && p->n_dp_shares > 0) {
            x->r.parallel.n_dp_shares = p->n_dp_shares;
            memcpy(x->r.parallel.dp_shares, p->dp_shares, sizeof p->dp_shares);
        }
        snprintf(x->plan_line[0], sizeof x->plan_line[0],
                 "plan: the layout of %.900s, which --resume continues (not planned again)", path);
    } else if (p->dp > 0 && p->tp > 0 && p->pp > 0) {
        int n = p->dp * p->tp * p->pp;
        snprintf(x->replanned, sizeof x->replanned,
                 "; planned anew: the run it resumes had dp %d x tp %d x pp %d on %d process%s, "
                 "this one has %d",
                 p->dp, p->tp, p->pp, n, n == 1 ? "" : "es", x->nranks);
    }
    tr_recipe_free(&s);
}

/* The search for the plan, the plan memory's text (mem, on: tr_plan_memory_read) kept when
 * `want` and it still ties, and the plan applied; OUT/plan.json and the banner's line. */
static int search(run_ctx *x, const tr_plan_opts *po, int want, const char *mem, int on) {
    tr_plan_result *res = calloc(1, sizeof(*res));
    if (!res) {
        snprintf(x->msg, sizeof x->msg, "trainer run: out of memory");
        return -1;
    }
    if (tr_plan_search(&x->r, &x->cluster, po, res, x->err, sizeof x->err)) {
        free(res); /* the fixed fields cannot run here: tr_layout_resolve says why */
        return 0;
    }
    if (!res->fits) {
        char need[32];
        tr_fmt_bytes(res->best.mem_bytes, need, sizeof need);
        snprintf(x->msg, sizeof x->msg,
                 "trainer run: no layout of %s fits %d process%s: the least memory one needs is "
                 "%s per process; %s (see trainer plan %s --help)",
                 x->r.path, x->nranks, x->nranks == 1 ? "" : "es", need, res->need, x->r.path);
        free(res);
        return -1;
    }
    if (want) tr_plan_memory_keep(mem, on, x->memory, &x->r, &x->cluster, po, res);
    x->plan = res->best;
    x->planned = 1;
    size_t len = 0; /* OUT/plan.json: written with the run's other files (open_outputs) */
    FILE *js = open_memstream(&x->plan_json, &len);
    if (js) tr_plan_write_json(res, &x->cluster, js);
    if (!js || fclose(js)) {
        free(res);
        snprintf(x->msg, sizeof x->msg, "trainer run: out of memory");
        return -1;
    }
    apply(x, &x->plan);
    char d[256];
    tr_plan_describe(&x->plan, d, sizeof d);
    snprintf(x->plan_line[0], sizeof x->plan_line[0],
             "plan: %s (chosen from %ld layouts in %.2f s for %s; ties within %.0f%%, or "
             "the probes' %.0f%% (compute) and %.0f%% (links)%s%s%s)",
             d, res->evaluated, res->seconds, x->cluster.source, 100 * res->tie.band,
             100 * res->tie.compute, 100 * res->tie.links, x->replanned,
             res->memory[0] ? "; plan memory: " : "", res->memory);
    free(res);
    return 0;
}

int run_plan(run_ctx *x) {
    keep_layout(x);
    if (tr_detect_cluster(x->world, x->be, x->peak * 1e9, x->o.memory_mib * 1048576.0, &x->r,
                          &x->cluster, x->err, sizeof x->err)) {
        snprintf(x->msg, sizeof x->msg, "trainer run: %s", x->err);
        return -1;
    }
    run_private_cluster(x, &x->cluster); /* the organisations the plan keeps tp x pp inside */
    tr_plan_opts po = plan_opts(x);
    /* the plan memory: read on every rank here, before anything a rank's own flags decide (a
       rank launched with other flags is refused later, by the setup's agreement) */
    int want = tr_plan_memory_wanted(&po, 1, x->o.resume), on;
    x->memory[0] = 0;
    if (want)
        tr_plan_memory_path(x->memory_dir, &x->r, &x->cluster, x->o.memory_mib, x->memory,
                            sizeof x->memory);
    char *mem = tr_plan_memory_read(x->world, x->memory, &on);
    /* a layout the flags and recipe fix whole is priced once resolved (run_price) */
    int rc = tr_plan_open(&x->r, &po) ? search(x, &po, want, mem, on) : 0;
    free(mem);
    return rc;
}

int run_price(run_ctx *x) {
    tr_plan p;
    tr_plan_price(&x->r, &x->cluster, &x->lay, x->be->dtype, &p);
    /* the memory: the layout's own measuring pass, the fullest rank (as the plan's); the
       layout was measured already (setup_layout), so this does not fail */
    char err[256];
    if (tr_layout_memory_most(&x->lay, &x->r.model, x->be->dtype, x->be->device_memory,
                              &p.mem_bytes, err, sizeof err))
        p.mem_bytes = 0;
    p.mem_exact = 1;
    x->plan_step_s = p.step_s;
    x->plan_mem = p.mem_bytes;
    x->plan_hidden = p.dp_hidden;
    char d[256] = "", m[32];
    if (!x->planned) tr_plan_describe(&p, d, sizeof d);
    tr_fmt_bytes(p.mem_bytes, m, sizeof m);
    char sh[64] = ""; /* ranks sharing cores: what waiting pipeline ranks yield (plan.h) */
    if (p.shared_s < 0) snprintf(sh, sizeof sh, ", less %.3g for shared cores", -p.shared_s);
    snprintf(x->plan_line[1], sizeof x->plan_line[1],
             "plan: %s%spredicted %.4g s per step (compute %.3g, bubble %.3g%s, tp %.3g, pp "
             "%.3g, dp %.3g, optimizer %.3g), %s on the fullest process",
             d, !d[0] ? "" : x->plan_line[0][0] ? " (continued): " : " (given): ", p.step_s,
             p.compute_s, p.bubble_s, sh, p.tp_s, p.pp_s, p.dp_s, p.optim_s, m);
    double cap = x->o.memory_mib * 1048576.0; /* a plan keeps within it; a pinned layout may not */
    if (cap > 0 && p.mem_bytes > cap) {
        tr_plan_describe(&p, d, sizeof d);
        snprintf(x->msg, sizeof x->msg,
                 "trainer run: %s needs %s on its fullest process, more than --memory-mib %g "
                 "gives; leave the layout to the planner, or shard more (ZeRO, tp, pp, "
                 "recompute)", d, m, x->o.memory_mib);
        return -1;
    }
    return 0;
}
