/* `trainer plan RECIPE`: the planner (parallel/plan.h) for a cluster described by a file
 * (--cluster), by a device count and type (--gpus N --gpus-per-node K --gpu NAME) or, without
 * either, this machine (one process of the CPU backend per core). Prints the chosen layout
 * with its predictions, the runners-up and why each lost, what the model assumed; --json the
 * same for scripts. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "data/json.h"
#include "parallel/plan.h"
#include "parallel/schedule.h"
#include "trainer/trainer.h"

static const char *plan_help =
    "usage: trainer plan RECIPE [--cluster FILE | --gpus N [--gpus-per-node K] --gpu NAME]\n"
    "                           [--objective time|cost] [--deadline HOURS] [--json]\n"
    "                           [--alternatives N] [run's --set, --steps and layout flags]\n"
    "\n"
    "Choose how to lay out a run of RECIPE on a cluster: data, tensor and pipeline\n"
    "parallelism, ZeRO stage, micro-batch and count, schedule, sequence parallelism and\n"
    "recompute. Prints the chosen plan with its predicted memory per device, step time,\n"
    "tokens/s, MFU and cost, the next plans with why each lost, and where each figure came\n"
    "from. Layout fields the recipe or the flags fix (--tp 2, --zero 1, ...) are kept.\n"
    "\n"
    "  --cluster FILE     a cluster file (YAML; examples in recipes/clusters/)\n"
    "  --gpus N           N devices of type --gpu, --gpus-per-node K per server (default:\n"
    "                     the type's usual server)\n"
    "  --gpu NAME         a known device: A100-40GB, A100-80GB, H100-80GB, H200, B200,\n"
    "                     L40S, ...\n"
    "  --objective O      time (default): the shortest step; cost: the least money for the\n"
    "                     recipe's steps (may use fewer devices)\n"
    "  --deadline H       the cheapest plan that runs the recipe's steps within H hours\n"
    "                     (the cost objective: not with --objective time)\n"
    "  --alternatives N   runners-up to show (default 5, at most 64)\n"
    "  --json             the chosen plan under the recipe's names, its predictions, the\n"
    "                     cluster (its groups; for this job its hosts with their ranks; the\n"
    "                     links with latency, bandwidth and whether measured) and the\n"
    "                     alternatives, as JSON\n"
    "Without --cluster or --gpus: this job, as `trainer run` would see it (one process, or\n"
    "`mpirun -np N trainer plan ...` for N), on the device run would choose (--device,\n"
    "--precision, --peak-gflops, --memory-mib and --timeout apply to this job only). Run's\n"
    "output flags (--out, --resume, ...) are refused: plan writes no run folder. This job's\n"
    "plan, as run's, keeps the layout the recipe got here before while it ties with the best,\n"
    "and remembers the one chosen (the plan memory: TR_PLAN_MEMORY=off for none).\n";

typedef struct {
    const char *cluster, *gpu;
    long gpus;
    int per_node, json, alternatives;
    tr_plan_objective objective;
    int objective_given; /* --objective was on the command line */
    double deadline;
} plan_args;

static int bad(const char *flag, const char *what, const char *got) {
    fprintf(stderr, "trainer plan: %s needs %s, got '%s'\n", flag, what, got);
    return -1;
}

/* Take plan's own flags out of argv (the rest are run's, parsed by tr_parse_options). */
static int take_flags(plan_args *a, int *argc, char **argv) {
    int n = 2;
    for (int i = 2; i < *argc; i++) {
        const char *f = argv[i], *v = i + 1 < *argc ? argv[i + 1] : NULL;
        char *end = NULL;
        int takes = !strcmp(f, "--cluster") || !strcmp(f, "--gpus") ||
                    !strcmp(f, "--gpus-per-node") || !strcmp(f, "--gpu") ||
                    !strcmp(f, "--objective") || !strcmp(f, "--deadline") ||
                    !strcmp(f, "--alternatives");
        if (!strcmp(f, "--json")) {
            a->json = 1;
            continue;
        }
        if (!takes) {
            argv[n++] = argv[i];
            continue;
        }
        if (!v) return bad(f, "a value", "");
        i++;
        if (!strcmp(f, "--cluster")) {
            a->cluster = v;
        } else if (!strcmp(f, "--gpu")) {
            a->gpu = v;
        } else if (!strcmp(f, "--objective")) {
            if (strcmp(v, "time") && strcmp(v, "cost")) return bad(f, "time or cost", v);
            a->objective = strcmp(v, "cost") ? TR_PLAN_TIME : TR_PLAN_COST;
            a->objective_given = 1;
        } else if (!strcmp(f, "--deadline")) {
            a->deadline = strtod(v, &end);
            if (*end || !(a->deadline > 0 && a->deadline < 1e7)) return bad(f, "hours > 0", v);
        } else {
            long x = strtol(v, &end, 10);
            if (*end || x < (strcmp(f, "--alternatives") ? 1 : 0) || x > 10000000)
                return bad(f, "a positive whole number", v);
            if (!strcmp(f, "--gpus")) a->gpus = x;
            if (!strcmp(f, "--gpus-per-node")) a->per_node = (int)x;
            if (!strcmp(f, "--alternatives")) a->alternatives = (int)x;
        }
    }
    *argc = n;
    if (a->cluster && (a->gpus || a->gpu))
        return fprintf(stderr, "trainer plan: give --cluster or --gpus/--gpu, not both\n"), -1;
    if ((a->gpus > 0) != (a->gpu != NULL))
        return fprintf(stderr, "trainer plan: --gpus and --gpu go together (--gpus 8 --gpu "
                               "H100-80GB)\n"),
               -1;
    if (a->per_node && !a->gpus)
        return fprintf(stderr, "trainer plan: --gpus-per-node needs --gpus and --gpu\n"), -1;
    if (a->deadline > 0 && a->objective_given && a->objective == TR_PLAN_TIME)
        return fprintf(stderr, "trainer plan: --deadline asks for the cheapest plan within the "
                               "deadline (the cost objective); it cannot go with --objective "
                               "time\n"),
               -1;
    if (a->deadline > 0) a->objective = TR_PLAN_COST;
    return 0;
}

/* The first of run's flags that plan would take and not use: those of a run's outputs, and
 * the device flags, which describe this job only (not a --cluster or --gpus one); NULL. */
static const char *unused_flag(const tr_options *o, const plan_args *a) {
    const char *outputs = o->out                ? "--out"
                          : o->resume           ? "--resume"
                          : o->overwrite        ? "--overwrite"
                          : o->progress         ? "--progress"
                          : o->eval_every >= 0  ? "--eval-every"
                          : o->sample_tokens >= 0 ? "--sample-tokens"
                                                : NULL;
    if (outputs || !(a->cluster || a->gpu)) return outputs;
    return o->device ? "--device" : o->precision ? "--precision"
           : o->peak_gflops > 0 ? "--peak-gflops" : o->timeout > 0 ? "--timeout"
           : o->memory_mib > 0  ? "--memory-mib"
                                : NULL;
}

/* Without --cluster or --gpus: the job this command runs in (one process, or those mpirun
 * started: the cluster `trainer run` would plan for), on the backend run would choose. Rank 0
 * prints; the others are silent. */
static int this_job(const tr_options *o, const tr_recipe *r, tr_comm **world, tr_cluster *c,
                    int *cpu, char *err, size_t errlen) {
    int argc = 0;
    char **argv = NULL;
    if (tr_comm_init(world, &argc, &argv, o->timeout, err, errlen)) return -1;
    if (tr_comm_rank(*world) > 0 && !freopen("/dev/null", "w", stdout)) return -1;
    double peak;
    char desc[512];
    const tr_backend *be = tr_choose_backend(o, r, &peak, desc, sizeof desc, err, errlen);
    if (!be) return -1;
    *cpu = be == tr_backend_cpu();
    return tr_detect_cluster(*world, be, *cpu ? 0 : peak, o->memory_mib * 1048576.0, r, c, err,
                             errlen);
}

static void print_plan_line(const tr_plan *p, FILE *f) {
    char d[200];
    tr_plan_describe(p, d, sizeof d);
    fprintf(f, "%s", d);
}

/* One line: the least memory any layout needs, what there is, and what would fit. */
static void nothing_fits(const tr_plan_result *res, const tr_cluster *c, FILE *f) {
    char mem[32], cap[32];
    tr_fmt_bytes(res->best.mem_bytes, mem, sizeof mem);
    tr_fmt_bytes(res->best.mem_cap, cap, sizeof cap);
    fprintf(f, "trainer plan: nothing fits on %s: the least memory any layout needs is %s per "
               "device (%s here); %s\n",
            c->source, mem, cap, res->need);
}

/* The model's own rate, where it was measured (tr_cluster.model_eff). */
static void print_model_eff(const tr_cluster *c, FILE *f) {
    int any = 0;
    for (int i = 0; i < TR_CLUSTER_EFF; i++) {
        if (!(c->model_eff[i] > 0)) continue;
        fprintf(f, "%s%d: %.0f%%", any ? ", " : "compute: the recipe's model reaches, of the sgemm "
                                               "rate, at micro-batches of ",
                1 << i, 100 * c->model_eff[i]);
        any = 1;
    }
    if (!any) return;
    fprintf(f, " (measured: one block forward and backward, on every rank at once");
    if (c->model_look > 0)
        fprintf(f, "; the largest timed twice, the second look at %.3fx the first's rate%s",
                c->model_look, c->model_look > 1 ? ", which sets the level" : "");
    fprintf(f, ")\n");
}

/* The tie rule, with the figure that set it. */
static void print_tie(const tr_plan_result *res, const tr_cluster *c, FILE *f) {
    fprintf(f, "ties: plans within %.0f%% of the best (the cost model's own margin)",
            100 * res->tie.band);
    if (c->noise.from == TR_ORIGIN_MEASURED)
        fprintf(f,
                ", or that the probes' noise could reorder (the compute probes varied %.0f%%, "
                "%.0f%% taken; the links' %.0f%%, %.0f%% taken; at most 25%% each): each "
                "part moved by its figures' noise, compute against links, would turn the "
                "difference around",
                100 * c->noise.v, 100 * res->tie.compute, 100 * c->link_noise.v,
                100 * res->tie.links);
    else
        fprintf(f, " (no probe was timed)");
    fprintf(f, "; the simplest of them wins\n");
    if (res->memory[0]) fprintf(f, "plan memory: %s\n", res->memory);
}

/* The groups plan p's devices come from (the first l.world from group_first on): n of them,
 * idx[i] the group, cnt[i] its devices used. */
static int groups_used(const tr_cluster *c, const tr_plan *p, int *idx, long *cnt) {
    long left = p->l.world;
    int n = 0;
    for (int g = p->group_first; g < c->n_groups && left > 0; g++) {
        long have = (long)c->g[g].nodes * c->g[g].per_node, use = have < left ? have : left;
        idx[n] = g, cnt[n++] = use;
        left -= use;
    }
    return n;
}

static void print_text(const tr_plan_result *res, const tr_recipe *r, const tr_cluster *c,
                       const plan_args *a, FILE *f) {
    const tr_plan *b = &res->best;
    char mem[32], cap[32], toks[32];
    fprintf(f, "plan for %s on %s\n", r->path, c->source);
    fprintf(f, "objective %s%s; searched %ld layouts (%ld fit) in %.3f s\n\n",
            a->objective == TR_PLAN_COST || a->deadline > 0 ? "cost" : "time",
            a->deadline > 0 ? " within the deadline" : "", res->evaluated, res->feasible,
            res->seconds);
    fprintf(f, "chosen  ");
    print_plan_line(b, f);
    tr_fmt_bytes(b->mem_bytes, mem, sizeof mem);
    tr_fmt_bytes(b->mem_cap, cap, sizeof cap);
    tr_fmt_count(b->tokens_s, toks, sizeof toks);
    int idx[TR_CLUSTER_MAX_GROUPS];
    long cnt[TR_CLUSTER_MAX_GROUPS];
    int n = groups_used(c, b, idx, cnt);
    fprintf(f, "\n  devices     %d", b->l.world);
    for (int i = 0; i < n && (n > 1 || c->n_groups > 1); i++)
        fprintf(f, "%s%s x %ld", i ? ", " : ": ", c->g[idx[i]].name, cnt[i]);
    fputc('\n', f);
    fprintf(f, "  memory      %s of %s on the fullest device (%s)\n", mem, cap,
            b->mem_exact ? "the model's sizing pass, as run allocates" : "estimate");
    fprintf(f, "  step        %.4g s: compute %.3g, bubble %.3g, tp %.3g, pp %.3g, dp exposed "
               "%.3g, optimizer %.3g\n",
            b->step_s, b->compute_s, b->bubble_s, b->tp_s, b->pp_s, b->dp_s, b->optim_s);
    if (b->shared_s < 0)
        fprintf(f, "              less %.3g s: %d ranks x %d thread%s share %d core%s a node, "
                   "and a waiting pipeline rank yields its core to the others\n",
                -b->shared_s, c->g[b->group_first].per_node, c->g[b->group_first].threads,
                c->g[b->group_first].threads == 1 ? "" : "s", c->g[b->group_first].cores,
                c->g[b->group_first].cores == 1 ? "" : "s");
    fprintf(f, "  throughput  %s tokens/s, MFU %.1f%%\n", toks, 100 * b->mfu);
    if (b->l.private_gradients) {
        int named, orgs = tr_cluster_orgs(c, b->group_first, b->l.world, &named);
        fprintf(f, "  private     the data-parallel gradient sums are masked between %d "
                   "organisation%s (%s)%s; each tensor x pipeline group (%d consecutive ranks) "
                   "was kept inside one, only data parallelism crosses them\n",
                orgs, orgs == 1 ? "" : "s",
                named ? "the cluster's organisation fields" : "every node its own",
                orgs == 1 ? ": one, nothing to mask" : "", b->l.tp * b->l.pp);
    }
    fprintf(f, "  run         %ld steps in %.3g h", (long)r->train.steps, b->hours);
    if (b->cost > 0)
        fprintf(f, ", $%.2f ($%.4g per million tokens)", b->cost, b->cost_per_mtok);
    fprintf(f, "\n");
    if (a->deadline > 0 && !res->deadline_met)
        fprintf(f, "  deadline    missed: no plan runs the %ld steps within %.3g h; this is the "
                   "cheapest of the fastest\n",
                (long)r->train.steps, a->deadline);
    if (res->n_alts) fprintf(f, "\nnext best:\n");
    for (int i = 0; i < res->n_alts; i++) {
        const tr_plan *p = &res->alts[i];
        tr_fmt_bytes(p->mem_bytes, mem, sizeof mem);
        fprintf(f, "  %d. ", i + 1);
        print_plan_line(p, f);
        fprintf(f, "\n     step %.4g s, %s: %s\n", p->step_s, mem, p->why);
    }
    fprintf(f, "\nfigures: %s\n", res->figures);
    print_model_eff(c, f);
    print_tie(res, c, f);
    fprintf(f, "to fix it in the recipe: parallel { dp = %d, tp = %d, pp = %d, zero = %d, "
               "sequence_parallel = %s, schedule = \"%s\", microbatches = %d",
            b->l.dp, b->l.tp, b->l.pp, b->l.zero, b->l.sequence_parallel ? "true" : "false",
            tr_pp_kind_name((tr_pp_kind)b->l.schedule), b->l.microbatches);
    if (b->l.virtual_stages > 1) fprintf(f, ", virtual_stages = %d", b->l.virtual_stages);
    if (b->l.shares_uneven) { /* each replica's micro-batches by its speed */
        fprintf(f, ", dp_shares = {");
        for (int d = 0; d < b->l.dp; d++) fprintf(f, "%s%d", d ? ", " : " ", b->l.dp_shares[d]);
        fprintf(f, " }");
    }
    if (b->l.recompute_per_stage) { /* a level per pipeline rank */
        fprintf(f, " } and train { recompute = {");
        for (int k = 0; k < b->l.pp; k++)
            fprintf(f, "%s\"%s\"", k ? ", " : " ", tr_recompute_name(b->l.stage_recompute[k]));
        fprintf(f, " } }\n");
    } else {
        fprintf(f, " } and train { recompute = \"%s\" }\n", tr_recompute_name(b->l.recompute));
    }
}

static void json_plan(const tr_plan *p, const tr_cluster *c, FILE *f) {
    fprintf(f, "{\"world\": %d, \"dp\": %d, \"tp\": %d, \"pp\": %d, \"zero\": %d, "
               "\"sequence_parallel\": %s, \"micro_batch\": %d, \"microbatches\": %d, "
               "\"schedule\": \"%s\", \"virtual_stages\": %d, \"recompute\": \"%s\", "
               "\"stages\": [",
            p->l.world, p->l.dp, p->l.tp, p->l.pp, p->l.zero, p->l.sequence_parallel ? "true" : "false",
            p->l.micro_batch, p->l.microbatches, tr_pp_kind_name((tr_pp_kind)p->l.schedule),
            p->l.virtual_stages, tr_recompute_name(p->l.recompute));
    for (int k = 0; k < p->l.pp * p->l.virtual_stages; k++)
        fprintf(f, "%s%d", k ? ", " : "", p->l.chunk_start[k]);
    fprintf(f, "], \"dp_shares\": [");
    for (int d = 0; d < p->l.dp && d < TR_MAX_DP_SHARES; d++) /* each replica's micro-batches */
        fprintf(f, "%s%d", d ? ", " : "", p->l.shares_uneven ? p->l.dp_shares[d] : p->l.microbatches);
    if (p->l.recompute_per_stage) { /* "recompute" is the most of these */
        fprintf(f, "], \"stage_recompute\": [");
        for (int k = 0; k < p->l.pp; k++)
            fprintf(f, "%s\"%s\"", k ? ", " : "", tr_recompute_name(p->l.stage_recompute[k]));
    }
    int idx[TR_CLUSTER_MAX_GROUPS];
    long cnt[TR_CLUSTER_MAX_GROUPS];
    int n = groups_used(c, p, idx, cnt);
    fprintf(f, "], \"devices\": [");
    for (int i = 0; i < n; i++) {
        fprintf(f, "%s{\"group\": ", i ? ", " : "");
        tr_json_write_string(f, c->g[idx[i]].name);
        fprintf(f, ", \"count\": %ld}", cnt[i]);
    }
    /* a price or a rate at the edge of a double (a huge price: cost inf) is null, never inf */
    const struct {
        const char *key;
        double v;
        int digits;
    } num[] = {{"memory_bytes", p->mem_bytes, 0},
               {"memory_capacity", p->mem_cap, 0},
               {"step_s", p->step_s, 6},
               {"compute_s", p->compute_s, 6},
               {"bubble_s", p->bubble_s, 6},
               {"shared_cores_s", p->shared_s, 6},
               {"tp_s", p->tp_s, 6},
               {"pp_s", p->pp_s, 6},
               {"dp_s", p->dp_s, 6},
               {"dp_comm_s", p->dp_comm_s, 6},
               {"optimizer_s", p->optim_s, 6},
               {"tokens_per_s", p->tokens_s, 6},
               {"mfu", p->mfu, -4},
               {"hours", p->hours, 6},
               {"cost_usd", p->cost, 6},
               {"cost_per_million_tokens", p->cost_per_mtok, 6},
               {"egress_gb_per_step", p->egress_gb, 6}};
    fprintf(f, "], \"predicted\": {\"memory_exact\": %s", p->mem_exact ? "true" : "false");
    for (size_t i = 0; i < sizeof num / sizeof *num; i++) {
        fprintf(f, ", \"%s\": ", num[i].key);
        tr_json_write_num(f, num[i].v, num[i].digits);
    }
    fprintf(f, "}");
    if (p->why[0]) {
        fprintf(f, ", \"why\": ");
        tr_json_write_string(f, p->why);
    }
    fprintf(f, "}");
}

static void json_link(FILE *f, const char *name, const tr_link *l) {
    fprintf(f, "\"%s\": {\"latency\": ", name);
    tr_json_write_num(f, l->lat.v, 0);
    fprintf(f, ", \"bw\": ");
    tr_json_write_num(f, l->bw.v, 0);
    fprintf(f, ", \"origin\": \"%s\"", tr_origin_name(l->bw.from));
    if (l->lat.from != l->bw.from)
        fprintf(f, ", \"latency_origin\": \"%s\"", tr_origin_name(l->lat.from));
    if (l->p2p.v > 0) { /* measured: a job's own links */
        fprintf(f, ", \"p2p_bw\": ");
        tr_json_write_num(f, l->p2p.v, 0);
    }
    if (l->ring.v > 0) { /* measured: a ring through every rank of nodes of several */
        fprintf(f, ", \"ring_bw\": ");
        tr_json_write_num(f, l->ring.v, 0);
    }
    fprintf(f, "}");
}

/* The cluster planned for: where it came from, its groups, a running job's hosts with their
 * ranks, and the links of the first group (latency s, bandwidth bytes/s, measured or not). */
static void json_cluster(const tr_cluster *c, FILE *f) {
    fprintf(f, "{\"source\": ");
    tr_json_write_string(f, c->source);
    fprintf(f, ",\n  \"groups\": [");
    for (int i = 0; i < c->n_groups; i++) {
        const tr_node_group *g = &c->g[i];
        fprintf(f, "%s{\"name\": ", i ? ", " : "");
        tr_json_write_string(f, g->name);
        fprintf(f, ", \"device\": ");
        tr_json_write_string(f, g->device);
        fprintf(f, ", \"nodes\": %d, \"per_node\": %d, \"pool\": %d}", g->nodes, g->per_node,
                g->pool);
    }
    fprintf(f, "],\n  \"nodes\": [");
    const tr_cluster_hosts *h = &c->hosts;
    for (int k = 0; k < h->n_hosts; k++) {
        fprintf(f, "%s{\"host\": ", k ? ",\n    " : "");
        tr_json_write_string(f, h->name[k]);
        fprintf(f, ", \"ranks\": [");
        for (int r = 0, n = 0; r < h->n_ranks; r++)
            if (h->host_of[r] == k) fprintf(f, "%s%d", n++ ? ", " : "", r);
        fprintf(f, "]}");
    }
    fprintf(f, "],\n  \"links\": {");
    json_link(f, "intra", &c->g[0].intra);
    fprintf(f, ", ");
    json_link(f, "inter", &c->g[0].inter);
    fprintf(f, "}}");
}

void tr_plan_write_json(const tr_plan_result *res, const tr_cluster *c, FILE *f) {
    fprintf(f, "{\"fits\": %s, \"plan\": ", res->fits ? "true" : "false");
    json_plan(&res->best, c, f);
    fprintf(f, ",\n \"need\": ");
    tr_json_write_string(f, res->need);
    fprintf(f, ", \"cluster\": ");
    json_cluster(c, f);
    fprintf(f, ", \"figures\": ");
    tr_json_write_string(f, res->figures);
    fprintf(f, ",\n \"tie\": {\"band\": ");
    tr_json_write_num(f, res->tie.band, -4);
    fprintf(f, ", \"noise\": ");
    tr_json_write_num(f, c->noise.v, -4);
    fprintf(f, ", \"reorder\": ");
    tr_json_write_num(f, res->tie.compute, -4);
    fprintf(f, ", \"link_noise\": ");
    tr_json_write_num(f, c->link_noise.v, -4);
    fprintf(f, ", \"link_reorder\": ");
    tr_json_write_num(f, res->tie.links, -4);
    fprintf(f, ", \"noise_origin\": \"%s\"}", tr_origin_name(c->noise.from));
    fprintf(f, ",\n \"memory\": ");
    tr_json_write_string(f, res->memory);
    fprintf(f, ",\n \"model_eff\": {");
    for (int i = 0, any = 0; i < TR_CLUSTER_EFF; i++)
        if (c->model_eff[i] > 0) {
            fprintf(f, "%s\"%d\": ", any++ ? ", " : "", 1 << i);
            tr_json_write_num(f, c->model_eff[i], -4);
        }
    fprintf(f, "}");
    fprintf(f, ",\n \"model_look\": ");
    tr_json_write_num(f, c->model_look, -4);
    fprintf(f, ",\n \"optim_rate\": ");
    tr_json_write_num(f, c->optim_rate, -4);
    fprintf(f, ",\n \"op_cost\": ");
    tr_json_write_num(f, c->op_cost, 4);
    fprintf(f, ",\n \"search\": {\"evaluated\": %ld, \"feasible\": %ld, \"seconds\": ",
            res->evaluated, res->feasible);
    tr_json_write_num(f, res->seconds, -4);
    fprintf(f, "},\n \"alternatives\": [");
    for (int i = 0; i < res->n_alts; i++) {
        fprintf(f, "%s\n  ", i ? "," : "");
        json_plan(&res->alts[i], c, f);
    }
    fprintf(f, "]}\n");
}

/* A job's plan of its time (no deadline, no field a flag fixes) through the plan memory: mem
 * (tr_plan_memory_read's, read at path) kept when the layout chosen before still ties with
 * the fastest, and the plan remembered (by rank 0; a memory that cannot be written is said on
 * stderr and ends nothing). */
static void remember(tr_comm *world, const char *path, const char *mem, int on, const tr_recipe *r,
                     const tr_cluster *c, const tr_plan_opts *po, tr_plan_result *res) {
    char err[TR_PATH_MAX + 128];
    tr_plan_memory_keep(mem, on, path, r, c, po, res);
    if (res->fits && tr_comm_rank(world) == 0 && path[0] &&
        tr_plan_memory_save(path, &res->best, err, sizeof err))
        fprintf(stderr, "trainer plan: plan memory not kept: %s\n", err);
}

int tr_cmd_plan(int argc, char **argv) {
    for (int i = 2; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fputs(plan_help, stdout);
            return 0;
        }
    plan_args a = {.alternatives = 5};
    if (take_flags(&a, &argc, argv)) return 2;
    tr_options o;
    if (tr_parse_options(&o, "plan", argc, argv, 2)) return 2;
    const char *unused = unused_flag(&o, &a);
    if (unused) {
        fprintf(stderr, "trainer plan: %s is a flag of `trainer run` that plan does not use%s\n",
                unused, a.cluster || a.gpu ? " for a --cluster or --gpus plan" : "");
        return 2;
    }
    char dir[TR_PATH_MAX], err[TR_PATH_MAX + 200] = "";
    if (tr_plan_memory_dir(dir, sizeof dir, err, sizeof err)) {
        fprintf(stderr, "trainer plan: %s\n", err);
        return 2;
    }
    tr_recipe r;
    if (tr_load_recipe(&r, &o, "plan")) return 1;
    tr_cluster *c = calloc(1, sizeof(*c));
    int rc = 0, cpu = 0; /* this job's backend is the CPU's */
    tr_comm *world = NULL;
    if (!c) return 1;
    if (a.cluster)
        rc = tr_cluster_load(c, a.cluster, err, sizeof err);
    else if (a.gpu)
        rc = tr_cluster_from_gpus(c, a.gpus, a.per_node, a.gpu, err, sizeof err);
    else
        rc = this_job(&o, &r, &world, c, &cpu, err, sizeof err);
    if (rc) {
        fprintf(stderr, "trainer plan: %s\n", err);
        free(c);
        tr_recipe_free(&r);
        tr_comm_free(world);
        return 2;
    }
    tr_plan_opts po = {.objective = a.objective,
                       .deadline_h = a.deadline,
                       .recompute = -1,
                       .dtype = c->cpu ? TR_DTYPE_F32 : TR_DTYPE_BF16,
                       .alternatives = a.alternatives,
                       .all_devices = world != NULL}; /* a job plans for its processes */
    po.fixed = tr_options_layout(&o, c->cpu ? 0 : TR_CUDA_PAD_VOCAB); /* the cluster's backend */
    /* this job's plan memory, read on every rank whatever each plans */
    char path[TR_PATH_MAX] = "", *mem = NULL;
    int on = 0, want = tr_plan_memory_wanted(&po, world != NULL, 0);
    if (want) tr_plan_memory_path(dir, &r, c, o.memory_mib, path, sizeof path);
    if (world) mem = tr_plan_memory_read(world, path, &on);
    tr_plan_result *res = calloc(1, sizeof(*res));
    rc = !res || tr_plan_search(&r, c, &po, res, err, sizeof err);
    if (!rc && want) remember(world, path, mem, on, &r, c, &po, res);
    free(mem);
    if (rc)
        fprintf(stderr, "trainer plan: %s\n", res ? err : "out of memory");
    else if (!res->fits && !a.json)
        nothing_fits(res, c, stderr);
    else if (a.json)
        tr_plan_write_json(res, c, stdout);
    else
        print_text(res, &r, c, &a, stdout);
    int status = rc ? 1 : res->fits ? 0 : 3;
    free(res);
    free(c);
    tr_recipe_free(&r);
    tr_comm_free(world);
    return status;
}
