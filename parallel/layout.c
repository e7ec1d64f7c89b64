/* The resolved layout (layout.h): the recipe's parallel { } and train.micro_batch, the flags and
 * the number of processes become one tr_layout, checked here once with one line per mistake;
 * the model options and the memory of a process follow from it, for `run` and `show` alike. */
#include "parallel/layout.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "parallel/comm/base.h"
#include "parallel/dp.h"
#include "parallel/schedule.h"

_Static_assert(TR_MAX_STAGES == TR_MAX_CHUNKS, "the recipe's stages are the model's chunks");

#define DEFAULT_BUCKET_KB 4096
#define MAX_CUT_BLOCKS 4096 /* the most blocks tr_layout_partition cuts for a pipeline */

/* One line into err: `recipe.lua:LINE: ` first when line > 0 (the mistake is in the recipe). */
TR_PRINTF(5, 6)
static int fail(char *err, size_t errlen, const tr_recipe *r, int line, const char *fmt, ...) {
    int n = line > 0 ? snprintf(err, errlen, "%s:%d: ", r->path, line) : 0;
    if (n < 0 || (size_t)n >= errlen) n = 0;
    va_list ap;
    va_start(ap, fmt);
    tr_verrf(err + n, errlen - (size_t)n, fmt, ap);
    va_end(ap);
    return -1;
}

/* "1, 2, 3 or 6": the values t in [lo, hi] for which ok(arg, t), the first 12 of them (then
 * ", ..."); "none" when there is none. */
typedef int (*tp_test)(const void *arg, int t);
static const char *values(char *buf, size_t len, int lo, int hi, tp_test ok, const void *arg) {
    int v[13], n = 0;
    for (int t = lo; t <= hi && n < 13; t++)
        if (ok(arg, t)) v[n++] = t;
    size_t used = 0;
    buf[0] = 0;
    for (int i = 0; i < n && i < 12 && used < len; i++)
        used += (size_t)snprintf(buf + used, len - used, "%s%d",
                                 i == 0                  ? ""
                                 : i == n - 1 && n <= 12 ? " or "
                                                         : ", ",
                                 v[i]);
    if (n > 12 && used < len) snprintf(buf + used, len - used, ", ...");
    if (n == 0) snprintf(buf, len, "none");
    return buf;
}

static int divides(const void *arg, int t) { /* t divides *(const long *)arg */
    return *(const long *)arg % t == 0;
}

static int fits_kv(const void *arg, int t) { /* t divides the heads and fits the kv heads */
    const tr_node *n = arg;
    return n->heads % t == 0 && (n->kv_heads % t == 0 || t % n->kv_heads == 0);
}

/* tp against every attention and MLP under n (a stack's layers once: they repeat). */
static int check_layers(const tr_recipe *r, const tr_node *n, int tp, char *err, size_t errlen) {
    char would[160];
    long heads = n->heads, hidden = n->hidden;
    if (n->kind == TR_NODE_ATTENTION) {
        if (n->heads % tp)
            return fail(err, errlen, r, n->line,
                        "attention: tp %d does not divide heads %d (tp %s would)", tp, n->heads,
                        values(would, sizeof would, 1, n->heads, divides, &heads));
        if (n->kv_heads % tp && tp % n->kv_heads)
            return fail(err, errlen, r, n->line,
                        "attention: tp %d and kv_heads %d: tp must divide kv_heads or be a "
                        "multiple of it (tp %s would)",
                        tp, n->kv_heads, values(would, sizeof would, 1, n->heads, fits_kv, n));
    }
    if (n->kind == TR_NODE_MLP && n->hidden % tp)
        return fail(err, errlen, r, n->line, "mlp: tp %d does not divide hidden %d (tp %s would)",
                    tp, n->hidden, values(would, sizeof would, 1, n->hidden, divides, &hidden));
    for (int i = 0; i < n->n_children; i++)
        if (check_layers(r, &n->children[i], tp, err, errlen)) return -1;
    return 0;
}

/* A flag when given (>= 0), else the recipe's value when set (>= 0), else dflt. */
static int pick(int flag, int recipe, int dflt, int *from_flag) {
    *from_flag = flag >= 0;
    return flag >= 0 ? flag : recipe >= 0 ? recipe : dflt;
}

/* ZeRO, pipeline and sequence parallelism: the settings that need no model or world. */
static int check_settings(const tr_layout *l, const tr_recipe *r, const tr_layout_flags *f,
                          int zero_flag, char *err, size_t errlen) {
    int pl = r->parallel_line;
    if (l->zero < 0 || l->zero > 3)
        return zero_flag ? fail(err, errlen, r, 0, "--zero must be 0, 1, 2 or 3, got %d", l->zero)
                         : fail(err, errlen, r, pl, "parallel: zero must be 0, 1, 2 or 3, got %d",
                                l->zero);
    if (l->pp < 1 || l->pp > TR_PP_MAX_RANKS)
        return fail(err, errlen, r, f->pp > 0 ? 0 : pl, "%s must be from 1 to %d, got %d",
                    f->pp > 0 ? "--pp" : "parallel: pp", TR_PP_MAX_RANKS, l->pp);
    if (l->tp < 1)
        return fail(err, errlen, r, f->tp >= 0 ? 0 : pl, "%s must be 1 or more, got %d",
                    f->tp >= 0 ? "--tp" : "parallel: tp", l->tp);
    if (!l->sequence_parallel) return 0;
    if (l->tp == 1)
        return f->sequence_parallel > 0
                   ? fail(err, errlen, r, 0,
                          "--sequence-parallel needs tensor parallelism: give --tp 2 or more")
                   : fail(err, errlen, r, pl, "parallel: sequence_parallel needs tp > 1 (tp is 1)");
    long T = r->model.seq_len;
    char would[160];
    if (T % l->tp)
        return fail(err, errlen, r, r->model.root.line,
                    "model: sequence parallelism needs tp to divide seq_len: tp %d does not divide "
                    "%ld (tp %s would)",
                    l->tp, T, values(would, sizeof would, 2, (int)T, divides, &T));
    return 0;
}

/* dp x tp x pp against the processes started: dp given must fit exactly, dp "auto" is what
 * is left of the world. `from_recipe`: every setting involved came from the recipe. */
static int fit_world(tr_layout *l, const tr_recipe *r, int dp, int world, int from_recipe,
                     char *err, size_t errlen) {
    int line = from_recipe ? r->parallel_line : 0;
    const char *where = from_recipe ? "parallel: " : "";
    long group = (long)l->tp * l->pp;
    char pp[32] = "", grp[64];
    if (l->pp > 1) snprintf(pp, sizeof(pp), " x pp %d", l->pp);
    if (dp > 0) {
        if ((long)dp * group != world)
            return fail(err, errlen, r, line,
                        "%sdp %d x tp %d%s = %ld processes, but %d started (mpirun -np %ld)", where,
                        dp, l->tp, pp, dp * group, world, dp * group);
        l->dp = dp;
        return 0;
    }
    if (world % group) {
        long want = (world + group - 1) / group * group;
        if (l->pp > 1 && l->tp > 1)
            snprintf(grp, sizeof(grp), "tp %d x pp %d", l->tp, l->pp);
        else
            snprintf(grp, sizeof(grp), "%s %d", l->pp > 1 ? "pp" : "tp", l->pp > 1 ? l->pp : l->tp);
        return fail(err, errlen, r, line,
                    "%s%s needs a multiple of %ld processes, but %d started (mpirun -np %ld)",
                    where, grp, group, world, want);
    }
    l->dp = (int)(world / group);
    return 0;
}

static double default_budget(void) {
    long pages = sysconf(_SC_PHYS_PAGES), size = sysconf(_SC_PAGE_SIZE);
    double phys = pages > 0 && size > 0 ? (double)pages * (double)size : 8.0 * (1 << 30);
    double b = 0.25 * phys;
    return b < 8.0 * (1 << 30) ? b : 8.0 * (1 << 30);
}

/* The micro-batch's sequences per forward (`what` is "--micro-batch", "train: micro_batch",
 * ...) or the micro-batches of a step: v must divide the `per` sequences per rank. */
static int divides_per(const tr_layout *l, const tr_recipe *r, long per, const char *what, int v,
                       int line, char *err, size_t errlen) {
    if (per % v == 0) return 0;
    char would[160];
    int upto = per < 1000000 ? (int)per : 1000000; /* where "would" lists stop looking */
    return fail(err, errlen, r, line,
                "%s %d does not divide the %ld sequences per data-parallel rank of a step "
                "(batch_tokens %ld / seq_len %d / dp %d; %s would)",
                what, v, per, r->train.batch_tokens, r->model.seq_len, l->dp,
                values(would, sizeof would, 1, upto, divides, &per));
}

/* The largest micro-batch b dividing `per` whose activations and scratch, measured with this
 * layout's model options on every pipeline rank (tensor and sequence parallelism shrink
 * them), fit the budget, else 1. With pp > 1 only those that give the pipeline pp micro-batches
 * at least (when there are as many sequences: fewer leave most ranks idle, a bubble of
 * (pp-1)/(M+pp-1)) and that the schedule runs (tr_pp_check; else 1, and the check says why). */
static int auto_micro_batch(tr_layout *l, const tr_recipe *r, long per, tr_dtype dtype,
                            double budget, char *err, size_t errlen) {
    char why[512];
    if (budget <= 0) budget = default_budget();
    l->micro_auto = 1;
    for (long b = per; b >= 1; b--) {
        if (per % b) continue;
        int M = (int)(per / b);
        if (l->pp > 1 && b > 1 &&
            ((M < l->pp && per >= l->pp) ||
             tr_pp_check((tr_pp_kind)l->schedule, l->pp, l->virtual_stages, M, why, sizeof why)))
            continue;
        l->micro_batch = (int)b;
        l->accum = l->microbatches = M;
        double most = 0;
        for (int p = 0; p < l->pp; p++) { /* pipeline ranks differ: (d 0, p, t 0) of each */
            tr_model_opts mo = tr_layout_model_opts(l, p * l->tp);
            tr_memory mem;
            if (tr_model_measure(&r->model, dtype, &mo, &mem, why, sizeof why))
                return fail(err, errlen, r, 0, "%s: %s", r->path, why);
            double need = (double)(mem.activations + mem.scratch);
            if (need > most) most = need;
        }
        if (most <= budget || b == 1) return 0;
    }
    return fail(err, errlen, r, 0, "%s: no micro-batch fits", r->path); /* per >= 1: unreached */
}

/* parallel { dp_shares = { a, b, ... } }: replica d runs dp_shares[d] micro-batches a step,
 * the step's sequences cut into their sum (so the global batch stays the recipe's, and a
 * faster replica can take more); the micro-batch follows (a given one must agree). Uneven
 * shares need ZeRO 0 or 1 (ZeRO-2 and 3 reduce every micro-batch, so the replicas' counts
 * must match) and pp 1 (a pipeline's micro-batches are its schedule's). */
static int fit_shares(tr_layout *l, const tr_recipe *r, const tr_layout_flags *f, char *err,
                      size_t errlen) {
    const tr_parallel_desc *p = &r->parallel;
    long seqs = r->train.batch_tokens / r->model.seq_len, sum = 0;
    int pl = r->parallel_line, most = 0;
    if (p->n_dp_shares != l->dp)
        return fail(err, errlen, r, pl,
                    "parallel: dp_shares gives %d share%s, one per data-parallel replica, but dp "
                    "is %d",
                    p->n_dp_shares, p->n_dp_shares == 1 ? "" : "s", l->dp);
    for (int d = 0; d < l->dp; d++) {
        sum += p->dp_shares[d];
        if (p->dp_shares[d] > most) most = p->dp_shares[d];
        l->shares_uneven |= p->dp_shares[d] != p->dp_shares[0];
    }
    if (seqs % sum)
        return fail(err, errlen, r, pl,
                    "parallel: dp_shares sum to %ld micro-batches, which do not divide the %ld "
                    "sequences of a step (batch_tokens %ld / seq_len %d)",
                    sum, seqs, r->train.batch_tokens, r->model.seq_len);
    int micro = f->micro_batch > 0 ? f->micro_batch : r->train.micro_batch;
    if (micro > 0 && micro != seqs / sum)
        return fail(err, errlen, r, f->micro_batch > 0 ? 0 : r->train_line,
                    "%s %d disagrees with parallel: dp_shares, whose %ld micro-batches cut the "
                    "%ld sequences of a step into %ld each; give one of them",
                    f->micro_batch > 0 ? "--micro-batch" : "train: micro_batch", micro, sum, seqs,
                    seqs / sum);
    if (l->shares_uneven && (l->zero >= 2 || l->pp > 1))
        return fail(err, errlen, r, pl,
                    "parallel: uneven dp_shares run with %s (%s), not %s %d",
                    l->pp > 1 ? "pp 1" : "ZeRO 0 or 1",
                    l->pp > 1 ? "a pipeline's micro-batches are its schedule's"
                              : "ZeRO-2 and 3 reduce every micro-batch, so the replicas' counts "
                                "must match",
                    l->pp > 1 ? "pp" : "ZeRO", l->pp > 1 ? l->pp : l->zero);
    l->micro_batch = (int)(seqs / sum);
    l->accum = l->microbatches = most;
    memcpy(l->dp_shares, p->dp_shares, (size_t)l->dp * sizeof(int));
    return 0;
}

int tr_layout_accum_of(const tr_layout *l, int d) {
    return l->shares_uneven && d >= 0 && d < l->dp ? l->dp_shares[d] : l->accum;
}

void tr_layout_shares_name(const tr_layout *l, char *buf, size_t n) {
    size_t used = 0;
    buf[0] = 0;
    for (int d = 0; d < l->dp && used < n; d++)
        used += (size_t)snprintf(buf + used, n - used, "%s%d", d ? "/" : "",
                                 tr_layout_accum_of(l, d));
}

int tr_layout_step_micro_batches(const tr_layout *l) {
    int sum = 0;
    for (int d = 0; d < l->dp; d++) sum += tr_layout_accum_of(l, d);
    return sum;
}

/* The micro-batching: the sequences each data-parallel rank gets per step, in micro-batches of
 * micro_batch sequences (given: it must divide them) or in `microbatches` micro-batches
 * (given: it must divide them too, and sets the micro-batch); "auto": auto_micro_batch. A
 * flag overrides both of the recipe's: --microbatches its micro_batch, --micro-batch its
 * microbatches. */
static int fit_micro_batch(tr_layout *l, const tr_recipe *r, const tr_layout_flags *f,
                           tr_dtype dtype, double budget, char *err, size_t errlen) {
    if (r->parallel.n_dp_shares > 0) return fit_shares(l, r, f, err, errlen);
    long seqs = r->train.batch_tokens / r->model.seq_len;
    int tl = r->train_line, pl = r->parallel_line;
    char would[160];
    int upto = seqs < 1000000 ? (int)seqs : 1000000;
    if (seqs % l->dp)
        return fail(err, errlen, r, tl,
                    "train: the %ld sequences of a step (batch_tokens %ld / seq_len %d) do not "
                    "split over dp %d (dp %s would)",
                    seqs, r->train.batch_tokens, r->model.seq_len, l->dp,
                    values(would, sizeof would, 1, upto, divides, &seqs));
    long per = seqs / l->dp;
    int mflag = f->microbatches > 0, uflag = f->micro_batch > 0;
    int M = mflag ? f->microbatches : uflag ? 0 : r->parallel.microbatches;
    int micro = uflag ? f->micro_batch : mflag ? 0 : r->train.micro_batch;
    if (M > 0 && divides_per(l, r, per, mflag ? "--microbatches" : "parallel: microbatches", M,
                             mflag ? 0 : pl, err, errlen))
        return -1;
    if (micro > 0 && divides_per(l, r, per, uflag ? "--micro-batch" : "train: micro_batch", micro,
                                 uflag ? 0 : tl, err, errlen))
        return -1;
    if (M > 0 && micro > 0 && (long)M * micro != per) /* both flags, or both the recipe's */
        return fail(err, errlen, r, mflag ? 0 : pl,
                    "%s %d and %s %d disagree: %d micro-batches of %d sequences are %ld, but "
                    "each data-parallel rank has %ld a step (batch_tokens %ld / seq_len %d / dp "
                    "%d); give one of them",
                    mflag ? "--microbatches" : "parallel: microbatches", M,
                    mflag ? "--micro-batch" : "train.micro_batch", micro, M, micro, (long)M * micro,
                    per, r->train.batch_tokens, r->model.seq_len, l->dp);
    if (M > 0) micro = (int)(per / M);
    if (micro <= 0) return auto_micro_batch(l, r, per, dtype, budget, err, errlen);
    l->micro_batch = micro;
    l->accum = l->microbatches = (int)(per / micro);
    return 0;
}

/* The schedule against pp x V x M (tr_pp_check's line), prefixed by the flag that set one of
 * them, else located at the recipe's parallel { }. */
static int check_schedule(const tr_layout *l, const tr_recipe *r, const tr_layout_flags *f,
                          char *err, size_t errlen) {
    char why[512], flag[64] = "";
    tr_pp_kind k = (tr_pp_kind)l->schedule;
    if (l->pp <= 1 || !tr_pp_check(k, l->pp, l->virtual_stages, l->microbatches, why, sizeof why))
        return 0;
    if (f->microbatches > 0)
        snprintf(flag, sizeof(flag), "--microbatches %d", f->microbatches);
    else if (f->micro_batch > 0)
        snprintf(flag, sizeof(flag), "--micro-batch %d", f->micro_batch);
    else if (f->virtual_stages > 0)
        snprintf(flag, sizeof(flag), "--virtual-stages %d", f->virtual_stages);
    else if (f->schedule >= 0)
        snprintf(flag, sizeof(flag), "--schedule %s", tr_pp_kind_name(k));
    else if (f->pp > 0)
        snprintf(flag, sizeof(flag), "--pp %d", f->pp);
    if (flag[0]) return fail(err, errlen, r, 0, "%s: %s", flag, why);
    return fail(err, errlen, r, r->parallel_line, "parallel: %s", why);
}

static int fits_blocks(const void *arg, int pp) { /* pp x V chunks of at least one block */
    const tr_layout *l = arg;
    return (long)pp * l->virtual_stages <= l->n_blocks;
}
static int fits_virtual(const void *arg, int v) { /* this pp x v chunks fit the blocks */
    const tr_layout *l = arg;
    return (long)l->pp * v <= l->n_blocks;
}

/* The pipeline's shape against the model (pp x V chunks, one block at least each) and the
 * combinations the executor does not run (parallel/pipeline.c): every schedule runs with every
 * ZeRO stage, a tied head or not (parallel/dp.c). Needs no world. */
static int check_pipeline(const tr_layout *l, const tr_recipe *r, const tr_layout_flags *f,
                          char *err, size_t errlen) {
    int V = l->virtual_stages, K = l->pp * V;
    int rec = f->pp <= 0 && f->virtual_stages <= 0, pl = rec ? r->parallel_line : 0;
    const char *where = rec ? "parallel: " : "";
    char would[160];
    if (V > 1 && l->pp == 1)
        return fail(err, errlen, r, pl, "%svirtual_stages %d needs pp 2 or more (pp is 1)", where,
                    V);
    if (K > TR_MAX_CHUNKS)
        return fail(err, errlen, r, pl, "%spp %d x virtual_stages %d = %d chunks: at most %d",
                    where, l->pp, V, K, TR_MAX_CHUNKS);
    if (K > l->n_blocks) { /* say which pp would do, or else which virtual_stages */
        int by_pp = (long)(V > 1 ? 2 : 1) * V <= l->n_blocks;
        return fail(err, errlen, r, pl,
                    "%spp %d x virtual_stages %d = %d stages, but the model has %d block%s (%s "
                    "%s would)",
                    where, l->pp, V, K, l->n_blocks, l->n_blocks == 1 ? "" : "s",
                    by_pp ? "pp" : "virtual_stages",
                    by_pp ? values(would, sizeof would, V > 1 ? 2 : 1, l->n_blocks, fits_blocks, l)
                          : values(would, sizeof would, 2, l->n_blocks, fits_virtual, l));
    }
    if (l->pp == 1) return 0;
    if ((l->schedule == TR_PP_ZBH1 || l->schedule == TR_PP_ZBV) &&
        l->recompute == TR_RECOMPUTE_FULL)
        return fail(err, errlen, r, r->train_line,
                    "train: recompute \"full\" does not go with schedule %s, which keeps the "
                    "inputs of every product for its deferred weight gradients: use recompute "
                    "\"none\" or \"selective\"",
                    tr_pp_kind_name((tr_pp_kind)l->schedule));
    return 0;
}

/* The recipe's stages = { ... } for K chunks of n blocks: stages[1] = 0, each start after the
 * one before, and one block at least left for every chunk (stages[k] at most n - K + k - 1). */
static int check_stages(tr_layout *l, const tr_recipe *r, int K, char *err, size_t errlen) {
    const tr_parallel_desc *p = &r->parallel;
    int n = l->n_blocks, pl = r->parallel_line;
    if (p->n_stages != K)
        return fail(err, errlen, r, pl,
                    "parallel: stages has %d entr%s, but pp %d x virtual_stages %d = %d chunk%s "
                    "(give %d start%s, the first 0, or stages = \"auto\")",
                    p->n_stages, p->n_stages == 1 ? "y" : "ies", l->pp, l->virtual_stages, K,
                    K == 1 ? "" : "s", K, K == 1 ? "" : "s");
    if (p->stages[0] != 0)
        return fail(err, errlen, r, pl,
                    "parallel: stages[1] = %d, but the first chunk starts at block 0 (stages[1] = "
                    "0 would)",
                    p->stages[0]);
    for (int k = 2; k <= K; k++) { /* k: the entry as the recipe numbers it */
        int v = p->stages[k - 1], prev = p->stages[k - 2], lo = prev + 1, hi = n - K + k - 1;
        char what[160];
        if (v >= lo && v <= hi) continue;
        if (v == prev)
            snprintf(what, sizeof what,
                     "repeats stages[%d]: the chunk starting there would be empty", k - 1);
        else if (v < prev)
            snprintf(what, sizeof what, "comes before stages[%d] = %d: the starts must increase",
                     k - 1, prev);
        else if (v >= n)
            snprintf(what, sizeof what, "starts an empty chunk: the model has %d blocks (0 to %d)",
                     n, n - 1);
        else
            snprintf(what, sizeof what, "leaves %d block%s for the %d chunks from it on", n - v,
                     n - v == 1 ? "" : "s", K - k + 1);
        if (lo == hi)
            return fail(err, errlen, r, pl, "parallel: stages[%d] = %d %s (stages[%d] = %d would)",
                        k, v, what, k, lo);
        return fail(err, errlen, r, pl,
                    "parallel: stages[%d] = %d %s (stages[%d] from %d to %d would)", k, v, what, k,
                    lo, hi);
    }
    memcpy(l->chunk_start, p->stages, (size_t)K * sizeof(int));
    l->chunk_start[K] = n;
    l->stages_given = 1;
    return 0;
}

/* Where the pp x V chunks start: the recipe's stages (unless a flag changed pp or V and they
 * no longer fit: then, like without them, balanced by forward FLOPs, tr_layout_partition). */
static int fit_stages(tr_layout *l, const tr_recipe *r, const tr_layout_flags *f, char *err,
                      size_t errlen) {
    int K = l->pp * l->virtual_stages, n = l->n_blocks;
    int flagged = f->pp > 0 || f->virtual_stages > 0;
    if (r->parallel.n_stages > 0 && (!flagged || r->parallel.n_stages == K))
        return check_stages(l, r, K, err, errlen);
    l->chunk_start[0] = 0;
    l->chunk_start[K] = n;
    if (K == 1) return 0;
    if (n > MAX_CUT_BLOCKS) /* the balanced cut takes O(K n^2) steps */
        return fail(err, errlen, r, r->model.root.line,
                    "model: %d blocks (stack repeats): a pipeline cuts at most %d (group layers "
                    "into fewer, larger repeats, or give parallel.stages)",
                    n, MAX_CUT_BLOCKS);
    tr_cost *blocks = calloc((size_t)n, sizeof(tr_cost));
    double *cost = calloc((size_t)n, sizeof(double));
    int bad = !blocks || !cost;
    if (!bad) {
        tr_cost_blocks(&r->model, r->model.seq_len, blocks, n);
        for (int i = 0; i < n; i++)
            cost[i] = blocks[i].fwd_flops;
        bad = tr_layout_partition(cost, n, K, l->chunk_start);
    }
    free(blocks);
    free(cost);
    return bad ? fail(err, errlen, r, 0, "%s: out of memory cutting %d blocks into %d chunks",
                      r->path, n, K)
               : 0;
}

/* The recipe's recompute = { ... }: one level per pipeline rank, so as many as pp; the
 * layout's own level is the most of them. */
static int fit_recompute(tr_layout *l, const tr_recipe *r, char *err, size_t errlen) {
    int n = r->train.n_stage_recompute;
    if (!n) return 0;
    if (n != l->pp)
        return fail(err, errlen, r, r->train_line,
                    "train: recompute gives %d level%s, one per pipeline rank, but pp is %d", n,
                    n == 1 ? "" : "s", l->pp);
    l->recompute = TR_RECOMPUTE_NONE;
    for (int k = 0; k < n; k++) {
        l->stage_recompute[k] = r->train.stage_recompute[k];
        if (l->stage_recompute[k] > (int)l->recompute) l->recompute = l->stage_recompute[k];
        l->recompute_per_stage |= l->stage_recompute[k] != l->stage_recompute[0];
    }
    return 0;
}

int tr_layout_resolve(tr_layout *l, const tr_recipe *r, const tr_layout_flags *f, int world,
                      tr_dtype dtype, double budget, char *err, size_t errlen) {
    const tr_parallel_desc *p = &r->parallel;
    int dp_flag, tp_flag, zero_flag, pp_flag, unused;
    memset(l, 0, sizeof(*l));
    l->world = world;
    l->seq_len = r->model.seq_len;
    l->recompute = r->train.recompute > 0 ? (tr_recompute)r->train.recompute : TR_RECOMPUTE_NONE;
    l->pad_vocab = f->pad_vocab;
    l->bucket_kb = p->bucket_kb > 0 ? p->bucket_kb : DEFAULT_BUCKET_KB;
    int dp = pick(f->dp, p->dp, 0, &dp_flag); /* 0: what the world leaves */
    l->tp = pick(f->tp, p->tp, 1, &tp_flag);
    l->pp = pick(f->pp > 0 ? f->pp : -1, p->pp, 1, &pp_flag);
    l->zero = pick(f->zero, p->zero, 0, &zero_flag);
    l->sequence_parallel = f->sequence_parallel ? f->sequence_parallel > 0 : p->sequence_parallel > 0;
    l->private_gradients = tr_private_asked(f, p);
    /* with pp 1 there is no schedule to run: 1f1b, so that every pp-1 layout is the same */
    l->schedule = l->pp > 1 ? pick(f->schedule, p->schedule, TR_PP_1F1B, &unused) : TR_PP_1F1B;
    /* V "auto": 2 for the interleaved schedule (which needs 2 or more) and zb-v (its V), else 1 */
    l->virtual_stages =
        pick(f->virtual_stages > 0 ? f->virtual_stages : -1,
             p->virtual_stages > 0 ? p->virtual_stages : -1,
             l->schedule == TR_PP_INTERLEAVED || l->schedule == TR_PP_ZBV ? 2 : 1, &unused);
    l->n_blocks = tr_cost_blocks(&r->model, r->model.seq_len, NULL, 0);
    if (world < 1) return fail(err, errlen, r, 0, "%d processes", world);
    if (check_settings(l, r, f, zero_flag, err, errlen)) return -1;
    if (check_layers(r, &r->model.root, l->tp, err, errlen)) return -1;
    if (check_pipeline(l, r, f, err, errlen)) return -1;
    if (fit_world(l, r, dp, world, !dp_flag && !tp_flag && !pp_flag, err, errlen)) return -1;
    if (fit_recompute(l, r, err, errlen)) return -1;
    if (fit_stages(l, r, f, err, errlen)) return -1;
    if (fit_micro_batch(l, r, f, dtype, budget, err, errlen)) return -1;
    return check_schedule(l, r, f, err, errlen);
}

tr_layout_coord tr_layout_coord_of(const tr_layout *l, int world_rank) {
    /* world rank = (d * pp + p) * tp + t: tp innermost (parallel/comm/comm.h, tr_comm_mesh) */
    return (tr_layout_coord){.d = world_rank / (l->tp * l->pp),
                             .p = world_rank / l->tp % l->pp,
                             .t = world_rank % l->tp};
}

/* With pp > 1: the chunks, those of this process's pipeline rank, and how many micro-batches
 * of each are in flight at once in the schedule (its activation slots). */
static void pipeline_opts(const tr_layout *l, int p, tr_model_opts *mo) {
    int K = l->pp * l->virtual_stages;
    tr_pp_kind k = (tr_pp_kind)l->schedule;
    char why[256];
    tr_pp_schedule s;
    int have = !tr_pp_check(k, l->pp, l->virtual_stages, l->microbatches, why, sizeof why) &&
               !tr_pp_generate(&s, k, l->pp, l->virtual_stages, l->microbatches);
    mo->n_chunks = K;
    memcpy(mo->chunk_start, l->chunk_start, (size_t)(K + 1) * sizeof(int));
    for (int c = 0; c < K; c++) {
        mo->held[c] = tr_pp_rank_of_kind(k, l->pp, c) == p;
        /* a schedule that cannot run here (refused by the layout) keeps every micro-batch */
        mo->slots[c] = !mo->held[c] ? 1 : have ? tr_pp_chunk_slots(&s, c) : l->microbatches;
        if (mo->slots[c] < 1) mo->slots[c] = 1;
        if (have) tr_pp_grad_bufs(&s, c, &mo->grad_recv[c], &mo->grad_send[c]);
    }
    mo->split_backward = k == TR_PP_ZBH1 || k == TR_PP_ZBV;
    if (have) tr_pp_free(&s);
}

tr_recompute tr_layout_recompute_at(const tr_layout *l, int p) {
    return l->recompute_per_stage && p >= 0 && p < l->pp ? (tr_recompute)l->stage_recompute[p]
                                                         : l->recompute;
}

void tr_layout_recompute_name(const tr_layout *l, char *buf, size_t n) {
    size_t used = 0;
    buf[0] = 0;
    for (int p = 0; p < (l->recompute_per_stage ? l->pp : 1) && used < n; p++) {
        int k = tr_layout_recompute_at(l, l->recompute_per_stage ? p : -1);
        used += (size_t)snprintf(buf + used, n - used, "%s%s", p ? "/" : "",
                                 tr_recompute_name(k));
    }
}

void tr_layout_recompute_to_recipe(const tr_layout *l, tr_train_desc *t) {
    t->recompute = (int)l->recompute;
    t->n_stage_recompute = l->recompute_per_stage ? l->pp : 0;
    for (int k = 0; k < t->n_stage_recompute; k++) t->stage_recompute[k] = l->stage_recompute[k];
}

tr_model_opts tr_layout_model_opts(const tr_layout *l, int rank) {
    tr_layout_coord c = tr_layout_coord_of(l, rank);
    tr_zero sh = tr_zero_of(l->zero);
    /* ZeRO over the dp group (parallel/dp.h): this process's shard is its dp coordinate */
    tr_model_opts mo = {.B = l->micro_batch,
                        .T = l->seq_len,
                        .recompute = tr_layout_recompute_at(l, c.p),
                        .shards = sh.optimizer && !sh.grads ? l->dp : 1, /* ZeRO-1 */
                        .shard = c.d,
                        .external_grads = sh.grads,
                        .external_params = sh.params,
                        .pad_vocab = l->pad_vocab,
                        .tp = l->tp,
                        .tp_rank = c.t,
                        .sequence_parallel = l->sequence_parallel};
    if (l->pp > 1) pipeline_opts(l, c.p, &mo);
    return mo;
}

int tr_layout_memory(const tr_layout *l, const tr_model_desc *d, tr_dtype dtype, int rank,
                     tr_memory *mem, char *err, size_t errlen) {
    tr_model_opts mo = tr_layout_model_opts(l, rank);
    tr_model *m;
    if (tr_model_plan(&m, d, dtype, &mo, err, errlen)) return -1;
    tr_dp_measure(m, l->zero, l->dp, (size_t)l->bucket_kb << 10, mem);
    tr_model_free(m);
    return 0;
}

int tr_layout_memory_most(const tr_layout *l, const tr_model_desc *d, tr_dtype dtype, int device,
                          double *bytes, char *err, size_t errlen) {
    *bytes = 0;
    for (int p = 0; p < l->pp; p++) { /* (d 0, p, t 0) of each pipeline rank */
        tr_memory m;
        if (tr_layout_memory(l, d, dtype, p * l->tp, &m, err, errlen)) return -1;
        double t = (double)(m.params + m.grads + m.optimizer + m.activations + m.scratch +
                            (device ? m.workspace + m.buffers : 0));
        if (t > *bytes) *bytes = t;
    }
    return 0;
}

void tr_layout_describe(const tr_layout *l, char *buf, size_t len) {
    const char *kind = l->dp > 1 && l->tp > 1 ? "data and tensor parallel"
                       : l->dp > 1            ? "data parallel"
                       : l->tp > 1            ? "tensor parallel"
                                              : "not parallel";
    char pp[32] = "", pipe[160] = "", chunks[48] = "";
    if (l->pp > 1) {
        snprintf(pp, sizeof(pp), " x pp %d", l->pp);
        if (l->virtual_stages > 1)
            snprintf(chunks, sizeof(chunks), " (%d chunks per rank)", l->virtual_stages);
        snprintf(pipe, sizeof(pipe), "%spipeline %s%s over %d micro-batches",
                 l->dp > 1 || l->tp > 1 ? ", " : "", tr_pp_kind_name((tr_pp_kind)l->schedule),
                 chunks, l->microbatches);
        if (l->dp == 1 && l->tp == 1) kind = "";
    }
    int n = snprintf(buf, len, "dp %d x tp %d%s: %s%s%s, ZeRO-%d, micro-batch %d%s", l->dp, l->tp,
                     pp, kind, pipe, l->sequence_parallel ? ", sequence parallel" : "", l->zero,
                     l->micro_batch, l->micro_auto ? " (auto)" : "");
    char shares[4 * TR_MAX_DP_SHARES];
    tr_layout_shares_name(l, shares, sizeof shares);
    if (l->shares_uneven && n >= 0 && (size_t)n < len) {
        snprintf(buf + n, len - (size_t)n, ", micro-batches %s by dp replica", shares);
    } else if (l->pp == 1 && n >= 0 && (size_t)n < len) { /* with pp > 1: the micro-batches above */
        snprintf(buf + n, len - (size_t)n, ", %d accumulation step%s", l->accum,
                 l->accum == 1 ? "" : "s");
    }
}

void tr_layout_to_recipe(const tr_layout *l, tr_recipe *r) {
    tr_parallel_desc *p = &r->parallel;
    *p = (tr_parallel_desc){.is_auto = 0,
                            .dp = l->dp,
                            .tp = l->tp,
                            .pp = l->pp,
                            .zero = l->zero,
                            .sequence_parallel = l->sequence_parallel,
                            .bucket_kb = l->bucket_kb,
                            .schedule = -1};
    r->train.micro_batch = l->micro_batch;
    tr_layout_recompute_to_recipe(l, &r->train);
    if (l->shares_uneven) {
        p->n_dp_shares = l->dp;
        memcpy(p->dp_shares, l->dp_shares, (size_t)l->dp * sizeof(int));
    }
    if (l->pp == 1) return; /* no pipeline: its fields stay "auto" */
    int K = l->pp * l->virtual_stages;
    p->schedule = l->schedule;
    p->virtual_stages = l->virtual_stages;
    /* an "auto" micro-batch is each host's (agreed apart, trainer/run/setup.c): so are these */
    p->microbatches = l->micro_auto ? 0 : l->microbatches;
    p->n_stages = K;
    memcpy(p->stages, l->chunk_start, (size_t)K * sizeof(int));
}

int tr_layout_flags_given(const tr_layout_flags *f) {
    return f->dp >= 0 || f->tp >= 0 || f->pp > 0 || f->zero >= 0 || f->schedule >= 0 ||
           f->microbatches > 0 || f->virtual_stages > 0 || f->sequence_parallel ||
           f->micro_batch > 0;
}

tr_layout_flags tr_layout_pin(const tr_layout *l) {
    return (tr_layout_flags){.dp = l->dp,
                             .tp = l->tp,
                             .pp = l->pp,
                             .zero = l->zero,
                             .schedule = l->schedule,
                             .microbatches = l->microbatches,
                             .virtual_stages = l->virtual_stages,
                             .sequence_parallel = l->sequence_parallel ? 1 : -1,
                             .micro_batch = 0,
                             .private_gradients = l->private_gradients,
                             .pad_vocab = l->pad_vocab};
}
