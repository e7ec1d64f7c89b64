/* The plan memory: the layout a recipe last got on a detected cluster, kept by the next
 * `trainer run` or `trainer plan` of that recipe on that cluster while it stays tied with the
 * best on the new start-up's probes (parallel/plan.h: tr_plan_tied, the cost model's 5% and
 * what the probes' noise could reorder). Each start-up measures the machine again, and the
 * simplest plan within the tie is chosen: a plan priced near the tie's edge (3.5-4.9% behind
 * the best in five plans of bench/tp_gpt.lua on 4 ranks sharing 2 cores) fell inside it in some
 * start-ups and outside in others, so the same recipe ran different layouts from run to run
 * with no measured difference between them. With the memory, the layout changes only when
 * the new probes put the one chosen before outside the tie: a difference larger than they can
 * reorder. As FFTW's wisdom or cuDNN's autotuning cache, it is a file per recipe and cluster:
 * TR_PLAN_MEMORY names its folder ("off": none), else $XDG_CACHE_HOME/trainer/plans, else
 * $HOME/.cache/trainer/plans. */
#include "trainer/trainer.h"

#include "parallel/comm/base.h"
#include "parallel/comm/env.h"
#include "trainer/report/provenance.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

enum { MEMORY_MAX = 1 << 14 };

int tr_plan_memory_dir(char *dir, size_t n, char *msg, size_t msglen) {
    const char *env = getenv("TR_PLAN_MEMORY"), *xdg = getenv("XDG_CACHE_HOME"),
               *home = getenv("HOME");
    struct stat st;
    dir[0] = 0;
    if (env && !strcmp(env, "off")) return 0;
    if (env && env[0]) {
        int is_dir = !stat(env, &st) ? S_ISDIR(st.st_mode) : errno != ENOTDIR; /* or to be */
        if (strlen(env) >= n - 64 || strchr(env, '\n') || !is_dir)
            return tr_env_bad("TR_PLAN_MEMORY", "off or a folder", env, msg, msglen);
        snprintf(dir, n, "%s", env);
    } else if (xdg && xdg[0] && strlen(xdg) < n - 96) {
        snprintf(dir, n, "%s/trainer/plans", xdg);
    } else if (home && home[0] && strlen(home) < n - 96) {
        snprintf(dir, n, "%s/.cache/trainer/plans", home);
    }
    return 0;
}

/* What the planner reads of the recipe, as text: the recipe without what does not change a
 * plan's step (its file, knobs, output folder, optimizer's numbers, schedule, steps, seed,
 * evaluation, logging, checkpoints, guard), so that a sweep's points share one memory. */
static unsigned long long recipe_hash(const tr_recipe *r) {
    tr_recipe *c = malloc(sizeof *c);
    if (!c) return 0;
    *c = *r; /* a shallow copy: only written out */
    c->path[0] = 0;
    c->n_knobs = 0;
    c->train.out[0] = 0;
    c->optim = (tr_optim_desc){0};
    c->schedule = (tr_schedule_desc){0};
    c->train.steps = c->train.eval_every = c->train.sample_tokens = c->train.log_every = 0;
    c->train.checkpoint_every = c->train.keep_checkpoints = 0;
    c->train.eval_tokens = 0;
    c->train.seed = 0;
    c->train.guard = (tr_guard_desc){0};
    c->eval = (tr_eval_desc){0};
    size_t len = 0;
    char *text = tr_recipe_text(c, &len);
    unsigned long long h = tr_fnv1a(TR_FNV1A_START, text, text ? len : 0);
    free(text);
    free(c);
    return h;
}

int tr_plan_memory_wanted(const tr_plan_opts *po, int job, int resume) {
    return job && !resume && po->objective == TR_PLAN_TIME && !(po->deadline_h > 0) &&
           !tr_layout_flags_given(&po->fixed);
}

int tr_plan_memory_path(const char *dir, const tr_recipe *r, const tr_cluster *c, double mem_mib,
                        char *path, size_t n) {
    path[0] = 0;
    if (!dir[0] || c->hosts.n_hosts < 1) return 0; /* a cluster file's plan does not move */
    unsigned long long h = recipe_hash(r);
    char cl[160];
    int k = snprintf(cl, sizeof cl, "%d ranks, %d groups, %.17g MiB", c->hosts.n_ranks, c->n_groups,
                     mem_mib);
    h = tr_fnv1a(h, cl, (size_t)k);
    for (int i = 0; i < c->hosts.n_hosts; i++) /* each host and how many ranks it runs */
        h = tr_fnv1a(h, c->hosts.name[i], strlen(c->hosts.name[i]) + 1);
    h = tr_fnv1a(h, c->hosts.host_of, (size_t)c->hosts.n_ranks * sizeof c->hosts.host_of[0]);
    for (int g = 0; g < c->n_groups; g++) { /* and what they compute on */
        h = tr_fnv1a(h, c->g[g].name, strlen(c->g[g].name) + 1);
        h = tr_fnv1a(h, c->g[g].device, strlen(c->g[g].device) + 1);
    }
    const char *base = strrchr(r->path, '/');
    base = base ? base + 1 : r->path;
    int stem = (int)strcspn(base, ".");
    snprintf(path, n, "%s/%.*s-%016llx.plan", dir, stem > 64 ? 64 : stem, base, h);
    return 1;
}

/* The layout's choices as one line of text (what tr_layout_pin and the recipe's recompute,
 * dp_shares and stages keep of it), and back: 0, or -1 when the line is not one. */
static void layout_text(const tr_layout *l, char *buf, size_t n) {
    size_t k = (size_t)snprintf(buf, n, "layout %d %d %d %d %d %d %d %d %d %d %d %d %d", l->world,
                                l->dp, l->tp, l->pp, l->zero, l->sequence_parallel, l->schedule,
                                l->microbatches, l->virtual_stages, l->private_gradients,
                                (int)l->recompute, l->recompute_per_stage, l->shares_uneven);
    for (int p = 0; l->recompute_per_stage && p < l->pp && k < n; p++)
        k += (size_t)snprintf(buf + k, n - k, " %d", l->stage_recompute[p]);
    for (int d = 0; l->shares_uneven && d < l->dp && k < n; d++)
        k += (size_t)snprintf(buf + k, n - k, " %d", l->dp_shares[d]);
    int chunks = l->stages_given ? l->pp * l->virtual_stages : 0;
    if (k < n) k += (size_t)snprintf(buf + k, n - k, " stages %d", chunks);
    for (int i = 0; i < chunks && k < n; i++)
        k += (size_t)snprintf(buf + k, n - k, " %d", l->chunk_start[i]);
}

static int next_int(const char **s, int lo, int hi, int *v) {
    char *end;
    long x = strtol(*s, &end, 10);
    if (end == *s || x < lo || x > hi) return -1;
    *s = end;
    *v = (int)x;
    return 0;
}

static int layout_parse(const char *s, tr_layout *l) {
    memset(l, 0, sizeof *l);
    if (strncmp(s, "layout ", 7)) return -1;
    s += 7;
    int *f[] = {&l->world,
                &l->dp,
                &l->tp,
                &l->pp,
                &l->zero,
                &l->sequence_parallel,
                &l->schedule,
                &l->microbatches,
                &l->virtual_stages,
                &l->private_gradients};
    for (size_t i = 0; i < sizeof f / sizeof *f; i++)
        if (next_int(&s, 0, 1 << 20, f[i])) return -1;
    int rc, per, uneven, chunks;
    if (next_int(&s, 0, 2, &rc) || next_int(&s, 0, 1, &per) || next_int(&s, 0, 1, &uneven))
        return -1;
    l->recompute = (tr_recompute)rc, l->recompute_per_stage = per, l->shares_uneven = uneven;
    if (l->dp < 1 || l->tp < 1 || l->pp < 1 || l->virtual_stages < 1 ||
        l->dp * l->tp * l->pp != l->world || l->pp * l->virtual_stages > TR_MAX_CHUNKS ||
        l->dp > TR_MAX_DP_SHARES)
        return -1;
    for (int p = 0; per && p < l->pp; p++) {
        int v;
        if (next_int(&s, 0, 2, &v)) return -1;
        l->stage_recompute[p] = (signed char)v;
    }
    for (int d = 0; uneven && d < l->dp; d++)
        if (next_int(&s, 1, 1 << 20, &l->dp_shares[d])) return -1;
    while (*s == ' ')
        s++;
    if (strncmp(s, "stages ", 7)) return -1;
    s += 7;
    if (next_int(&s, 0, TR_MAX_CHUNKS, &chunks) || (chunks && chunks != l->pp * l->virtual_stages))
        return -1;
    l->stages_given = chunks > 0;
    for (int i = 0; i < chunks; i++)
        if (next_int(&s, 0, 1 << 20, &l->chunk_start[i])) return -1;
    while (*s == ' ')
        s++;
    return *s && *s != '\n' ? -1 : 0;
}

void tr_plan_pin(const tr_layout *l, tr_layout_flags *f, tr_recipe *r) {
    int pad = f->pad_vocab;
    *f = tr_layout_pin(l);
    f->pad_vocab = pad;
    tr_layout_recompute_to_recipe(l, &r->train);
    if (l->shares_uneven && r->parallel.n_dp_shares == 0) { /* shares by the replicas' speeds */
        r->parallel.n_dp_shares = l->dp;
        memcpy(r->parallel.dp_shares, l->dp_shares, (size_t)l->dp * sizeof(int));
    }
    if (l->stages_given && r->parallel.n_stages == 0) { /* cut by the stages' speeds */
        int K = l->pp * l->virtual_stages;
        r->parallel.n_stages = K;
        memcpy(r->parallel.stages, l->chunk_start, (size_t)K * sizeof(int));
    }
}

int tr_plan_memory_save(const char *path, const tr_plan *p, char *err, size_t errlen) {
    char dir[TR_PATH_MAX], line[4096], d[256];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash) *slash = 0;
    if (slash && tr_mkdirs(dir, err, errlen)) return -1;
    tr_atomic a;
    if (tr_atomic_open(&a, path, err, errlen)) return -1;
    layout_text(&p->l, line, sizeof line);
    tr_plan_describe(p, d, sizeof d);
    fprintf(a.f, "%s\n# chosen %lld: %s, %.4g s a step predicted\n", line, (long long)time(NULL), d,
            p->step_s);
    return tr_atomic_commit(&a, err, errlen);
}

char *tr_plan_memory_read(tr_comm *w, const char *path, int *on) {
    long long say = path[0] != 0; /* rank 0's: another rank's environment or flags may differ */
    if (w && tr_comm_size(w) > 1) tr_comm_broadcast(w, &say, 1, TR_COMM_I64, 0);
    *on = (int)say;
    char *text = NULL;
    size_t len = 0;
    return *on && !tr_comm_read_file(w, 0, path, MEMORY_MAX, &text, &len) ? text : NULL;
}

/* The kept plan first, the best of the search next with why it is not the one run; the kept
 * layout's own place in the runners-up (when it had one) dropped. */
static void put_first(tr_plan_result *res, const tr_plan *kept, const tr_cluster *c,
                      const tr_plan_opts *po) {
    tr_plan best = res->best;
    char line[4096], kept_line[4096];
    layout_text(&kept->l, kept_line, sizeof kept_line);
    int n = 0;
    for (int i = 0; i < res->n_alts; i++) {
        tr_plan *a = &res->alts[i];
        layout_text(&a->l, line, sizeof line);
        if (!strcmp(line, kept_line)) continue;
        /* the others against the kept layout: those that fit and ran the price */
        if (a->mem_bytes <= a->mem_cap && strncmp(a->why, "refused", 7)) {
            if (a->step_s < kept->step_s)
                snprintf(a->why, sizeof a->why,
                         "step %.2fx, ties with the layout chosen before, which the plan "
                         "memory keeps",
                         a->step_s / kept->step_s);
            else
                tr_plan_why(c, po, res, kept, a);
        }
        if (n != i) res->alts[n] = *a;
        n++;
    }
    if (n == TR_PLAN_MAX_ALTS) n--;
    memmove(&res->alts[1], &res->alts[0], (size_t)n * sizeof best);
    snprintf(best.why, sizeof best.why,
             "step %.2fx, the search's choice on these probes; the layout chosen before ties "
             "with the fastest, and the plan memory keeps it",
             kept->step_s > 0 ? best.step_s / kept->step_s : 0);
    res->alts[0] = best;
    res->n_alts = n + 1;
    res->best = *kept;
    res->best.why[0] = 0;
}

int tr_plan_memory_keep(const char *text, int on, const char *path, const tr_recipe *r,
                        const tr_cluster *c, const tr_plan_opts *po, tr_plan_result *res) {
    res->memory[0] = 0;
    if (!on || !res->fits) return 0;
    if (!text) {
        snprintf(res->memory, sizeof res->memory, "nothing remembered yet (%s)", path);
        return 0;
    }
    tr_layout l;
    char kept_line[4096], best_line[4096], d[256];
    int bad = layout_parse(text, &l);
    /* private gradients are what the run asks for (the search's best has them as asked), never
       the memory's to drop or add */
    if (bad || l.world != res->best.l.world ||
        l.private_gradients != res->best.l.private_gradients) {
        snprintf(res->memory, sizeof res->memory, "planned anew: %s is %s", path,
                 bad                            ? "not a plan memory (it is replaced)"
                 : l.world != res->best.l.world ? "for another number of processes"
                                                : "for another setting of private gradients");
        return 0;
    }
    layout_text(&l, kept_line, sizeof kept_line);
    layout_text(&res->best.l, best_line, sizeof best_line);
    if (!strcmp(kept_line, best_line)) {
        snprintf(res->memory, sizeof res->memory, "the layout chosen before (%s), chosen again",
                 path);
        return 0;
    }
    tr_recipe *pinned = malloc(sizeof *pinned);
    tr_plan_result *again = calloc(1, sizeof *again);
    if (!pinned || !again) {
        free(pinned);
        free(again);
        snprintf(res->memory, sizeof res->memory, "planned anew: out of memory to price %s", path);
        return 0;
    }
    int rc = -1;
    {
        *pinned = *r; /* a shallow copy: only read by the search */
        tr_plan_opts o = *po;
        o.alternatives = 0;
        tr_plan_pin(&l, &o.fixed, pinned);
        char err[512];
        rc = tr_plan_search(pinned, c, &o, again, err, sizeof err);
    }
    /* the tie is measured from the fastest plan, as the search's own (the plan it chose is the
       simplest within it, and a tie with that one could be past the fastest's) */
    const tr_plan *k = &again->best, *b = res->fastest.step_s > 0 ? &res->fastest : &res->best;
    if (!rc && again->fits) layout_text(&k->l, kept_line, sizeof kept_line); /* as resolved */
    int same = !rc && again->fits && !strcmp(kept_line, best_line);
    int keep = !same && !rc && again->fits && tr_plan_tied(b, k, b->step_s, k->step_s, &res->tie);
    if (same) {
        snprintf(res->memory, sizeof res->memory, "the layout chosen before (%s), chosen again",
                 path);
    } else if (keep) {
        tr_plan_describe(b, d, sizeof d);
        snprintf(res->memory, sizeof res->memory,
                 "kept the layout chosen before (%s): the fastest on these probes, %.200s, is "
                 "%.2fx its step, a tie",
                 path, d, k->step_s > 0 ? b->step_s / k->step_s : 0);
        put_first(res, k, c, po);
    } else if (!rc && again->fits) {
        tr_plan_describe(k, d, sizeof d);
        snprintf(res->memory, sizeof res->memory,
                 "planned anew: the layout chosen before (%s), %.200s, is %.2fx the fastest "
                 "on these probes, more than the tie",
                 path, d, b->step_s > 0 ? k->step_s / b->step_s : 0);
    } else {
        snprintf(res->memory, sizeof res->memory, "planned anew: the layout chosen before (%s) %s",
                 path, rc ? "no longer resolves" : "no longer fits");
    }
    free(pinned);
    free(again);
    return keep;
}
