/* The resolved layout (layout.h): the recipe's parallel { } and train.micro_batch, the flags and
 * the number of processes become one tr_layout, checked here once with one line per mistake;
 * the model options and the memory of a process follow from it, for `run` and `show` alike. */
#include "parallel/layout.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "parallel/dp.h"

#define DEFAULT_BUCKET_KB 4096

#ifdef __GNUC__
#define PRINTF_LIKE(a, b) __attribute__((format(printf, a, b)))
#else
#define PRINTF_LIKE(a, b)
#endif

/* One line into err: `recipe.lua:LINE: ` first when line > 0 (the mistake is in the recipe). */
PRINTF_LIKE(5, 6)
static int fail(char *err, size_t errlen, const tr_recipe *r, int line, const char *fmt, ...) {
    int n = line > 0 ? snprintf(err, errlen, "%s:%d: ", r->path, line) : 0;
    if (n < 0 || (size_t)n >= errlen) n = 0;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err + n, errlen - (size_t)n, fmt, ap);
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
    if (l->pp != 1)
        return fail(err, errlen, r, pl,
                    "parallel: pp %d: pipeline parallelism is not implemented yet (pp must be 1)",
                    l->pp);
    if (l->tp < 1)
        return fail(err, errlen, r, f->tp >= 0 ? 0 : pl, "%s must be 1 or more, got %d",
                    f->tp >= 0 ? "--tp" : "parallel: tp", l->tp);
    if (!l->sequence_parallel) return 0;
    if (l->tp == 1)
        return f->sequence_parallel
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
    if (dp > 0) {
        if ((long)dp * group != world)
            return fail(err, errlen, r, line,
                        "%sdp %d x tp %d = %ld processes, but %d started (mpirun -np %ld)", where,
                        dp, l->tp, dp * group, world, dp * group);
        l->dp = dp;
        return 0;
    }
    if (world % group) {
        long want = (world + group - 1) / group * group;
        return fail(err, errlen, r, line,
                    "%stp %d needs a multiple of %ld processes, but %d started (mpirun -np %ld)",
                    where, l->tp, group, world, want);
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

/* The micro-batch: given (flag, else recipe), it must divide the sequences each data-parallel
 * rank gets per step; "auto", the largest divisor whose activations and scratch, measured with
 * this layout's model options (tensor and sequence parallelism shrink them), fit the budget. */
static int fit_micro_batch(tr_layout *l, const tr_recipe *r, int flag, tr_dtype dtype,
                           double budget, char *err, size_t errlen) {
    long seqs = r->train.batch_tokens / r->model.seq_len;
    int tl = r->train_line;
    char would[160];
    int upto = seqs < 1000000 ? (int)seqs : 1000000; /* where "would" lists stop looking */
    if (seqs % l->dp)
        return fail(err, errlen, r, tl,
                    "train: the %ld sequences of a step (batch_tokens %ld / seq_len %d) do not "
                    "split over dp %d (dp %s would)",
                    seqs, r->train.batch_tokens, r->model.seq_len, l->dp,
                    values(would, sizeof would, 1, upto, divides, &seqs));
    long per = seqs / l->dp;
    int micro = flag > 0 ? flag : r->train.micro_batch;
    if (micro > 0) {
        if (per % micro)
            return fail(
                err, errlen, r, flag > 0 ? 0 : tl,
                "%s %d does not divide the %ld sequences per data-parallel rank of a step "
                "(batch_tokens %ld / seq_len %d / dp %d; %s would)",
                flag > 0 ? "--micro-batch" : "train: micro_batch", micro, per,
                r->train.batch_tokens, r->model.seq_len, l->dp,
                values(would, sizeof would, 1, per < upto ? (int)per : upto, divides, &per));
        l->micro_batch = micro;
        l->accum = (int)(per / micro);
        return 0;
    }
    if (budget <= 0) budget = default_budget();
    l->micro_auto = 1;
    for (long b = per; b >= 1; b--) {
        if (per % b) continue;
        l->micro_batch = (int)b;
        tr_model_opts mo = tr_layout_model_opts(l, 0);
        tr_memory mem;
        char why[512];
        if (tr_model_measure(&r->model, dtype, &mo, &mem, why, sizeof why))
            return fail(err, errlen, r, 0, "%s: %s", r->path, why);
        if ((double)(mem.activations + mem.scratch) <= budget || b == 1) {
            l->accum = (int)(per / b);
            return 0;
        }
    }
    return fail(err, errlen, r, 0, "%s: no micro-batch fits", r->path); /* per >= 1: unreached */
}

int tr_layout_resolve(tr_layout *l, const tr_recipe *r, const tr_layout_flags *f, int world,
                      tr_dtype dtype, double budget, char *err, size_t errlen) {
    const tr_parallel_desc *p = &r->parallel;
    int dp_flag, tp_flag, zero_flag, pp_flag;
    memset(l, 0, sizeof(*l));
    l->world = world;
    l->seq_len = r->model.seq_len;
    l->recompute = (tr_recompute)r->train.recompute;
    l->pad_vocab = f->pad_vocab;
    l->bucket_kb = p->bucket_kb > 0 ? p->bucket_kb : DEFAULT_BUCKET_KB;
    int dp = pick(f->dp, p->dp, 0, &dp_flag); /* 0: what the world leaves */
    l->tp = pick(f->tp, p->tp, 1, &tp_flag);
    l->pp = pick(-1, p->pp, 1, &pp_flag);
    l->zero = pick(f->zero, p->zero, 0, &zero_flag);
    l->sequence_parallel = f->sequence_parallel ? 1 : p->sequence_parallel > 0;
    if (world < 1) return fail(err, errlen, r, 0, "%d processes", world);
    if (check_settings(l, r, f, zero_flag, err, errlen)) return -1;
    if (check_layers(r, &r->model.root, l->tp, err, errlen)) return -1;
    if (fit_world(l, r, dp, world, !dp_flag && !tp_flag, err, errlen)) return -1;
    return fit_micro_batch(l, r, f->micro_batch, dtype, budget, err, errlen);
}

tr_layout_coord tr_layout_coord_of(const tr_layout *l, int world_rank) {
    /* world rank = (d * pp + p) * tp + t: tp innermost (parallel/comm.h, tr_comm_mesh) */
    return (tr_layout_coord){.d = world_rank / (l->tp * l->pp),
                             .p = world_rank / l->tp % l->pp,
                             .t = world_rank % l->tp};
}

tr_model_opts tr_layout_model_opts(const tr_layout *l, int rank) {
    tr_layout_coord c = tr_layout_coord_of(l, rank);
    /* ZeRO over the dp group (parallel/dp.h): this process's shard is its dp coordinate */
    return (tr_model_opts){.B = l->micro_batch,
                           .T = l->seq_len,
                           .recompute = l->recompute,
                           .shards = l->zero == 1 ? l->dp : 1,
                           .shard = c.d,
                           .external_grads = l->zero == 2,
                           .external_params = l->zero == 3,
                           .pad_vocab = l->pad_vocab,
                           .tp = l->tp,
                           .tp_rank = c.t,
                           .sequence_parallel = l->sequence_parallel};
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

void tr_layout_describe(const tr_layout *l, char *buf, size_t len) {
    const char *kind = l->dp > 1 && l->tp > 1 ? "data and tensor parallel"
                       : l->dp > 1            ? "data parallel"
                       : l->tp > 1            ? "tensor parallel"
                                              : "not parallel";
    char pp[32] = "";
    if (l->pp > 1) snprintf(pp, sizeof(pp), " x pp %d", l->pp);
    snprintf(buf, len, "dp %d x tp %d%s: %s%s, ZeRO-%d, micro-batch %d%s, %d accumulation step%s",
             l->dp, l->tp, pp, kind, l->sequence_parallel ? ", sequence parallel" : "", l->zero,
             l->micro_batch, l->micro_auto ? " (auto)" : "", l->accum, l->accum == 1 ? "" : "s");
}

void tr_layout_to_recipe(const tr_layout *l, tr_recipe *r) {
    r->parallel = (tr_parallel_desc){.is_auto = 0,
                                     .dp = l->dp,
                                     .tp = l->tp,
                                     .pp = l->pp,
                                     .zero = l->zero,
                                     .sequence_parallel = l->sequence_parallel,
                                     .bucket_kb = l->bucket_kb};
    r->train.micro_batch = l->micro_batch;
}
