/* trainer eval: a checkpoint's validation loss and perplexity on token shards, and its scores
 * on multiple-choice tasks (data/task.h) as the published harnesses compute them. Both read
 * the model's per-token cross entropy (the head's output, through the model's tap), so
 * -loss at a position is the log-probability of the token there given the ones before. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "data/json.h"
#include "data/loader.h"
#include "data/task.h"
#include "trainer/trainer.h"

#define EVAL_MAX_TASKS 64

static const char *eval_help =
    "usage: trainer eval CKPT [--task FILE]... [--shards DIR|FILE|none] [--max-examples N]\n"
    "                         [--json] [--details FILE] [--device auto|cpu|cuda]\n"
    "\n"
    "Evaluate a checkpoint (a step folder, or a run folder: the one its `latest` names) on one\n"
    "process: the mean cross entropy (loss) and perplexity exp(loss) over the validation\n"
    "windows of seq_len tokens (non-overlapping, in order, as `trainer run` evaluates them),\n"
    "and for each task, acc (the choice of highest log-likelihood) and acc_norm (of highest\n"
    "log-likelihood per character of the choice, as lm-evaluation-harness normalizes).\n"
    "\n"
    "  --task FILE       a multiple-choice task in JSONL, one example a line: HellaSwag's\n"
    "                    published files ({\"ctx\", \"endings\", \"label\"}: each completion\n"
    "                    is \" \" + the ending) or {\"context\": \"...\", \"choices\":\n"
    "                    [\"...\", ...], \"answer\": K} (each completion is the choice as\n"
    "                    given); repeatable\n"
    "  --shards S        validation token shards (the format `trainer tokenize` writes): a\n"
    "                    folder (its val_*.bin), a file or a glob; none: no validation\n"
    "                    (default: the recipe's validation data, when it has some)\n"
    "  --max-examples N  only the first N validation windows and the first N examples of\n"
    "                    each task\n"
    "  --json            one JSON object on stdout instead of the table: checkpoint, step,\n"
    "                    val {loss, perplexity, tokens} (null without validation data) and\n"
    "                    tasks [{name, format, n, acc, acc_norm}]\n"
    "  --details FILE    also a JSON line per task example into FILE: task, line, answer,\n"
    "                    loglik and length of each choice, pred and pred_norm (the choices\n"
    "                    acc and acc_norm took)\n"
    "  --device D        auto, cpu or cuda (default auto)\n";

typedef struct {
    const char *ckpt, *shards, *device;
    const char *task[EVAL_MAX_TASKS];
    const char *details; /* --details FILE */
    int n_task, json;
    long max; /* 0: all */
} eval_args;

typedef struct {
    tr_loaded L;
    float *loss;   /* the last forward's per-token losses (seq_len) */
    FILE *details; /* --details: a line per example, or NULL */
} evaluator;

typedef struct {
    double loss, tokens; /* NAN loss: no validation */
    long windows;
} val_result;

typedef struct {
    const char *name, *format;
    int n;
    double acc, acc_norm;
} task_result;

/* The head's per-token losses of each forward into e->loss (host). */
static void on_tap(void *ctx, const tr_tap *t) {
    evaluator *e = ctx;
    if (!t->f32) return; /* a stream, not the head */
    e->L.be->download(e->loss + t->row0, t->f32, (size_t)t->rows * sizeof(float));
}

/* Forward one sequence of n + 1 tokens (inputs ids[0..n), targets ids[1..n]); the losses in
 * e->loss[0..n). */
static void forward(evaluator *e, const int *in, const int *tg, int n) {
    tr_model_forward(e->L.model, in, tg, 1, n, 0);
}

/* ---- validation ---------------------------------------------------------------------------- */

/* The data to read into d: --shards (a folder means its val_*.bin), else the recipe's. 0 when
 * there are none (--shards none, or a recipe without validation data), else 1. */
static int val_data(const eval_args *a, const tr_data_desc *recipe, tr_data_desc *d) {
    *d = *recipe;
    if (a->shards && !strcmp(a->shards, "none")) return 0;
    if (!a->shards) return (d->text[0] && d->val_fraction > 0) || d->val_shards[0];
    struct stat st;
    int dir = !stat(a->shards, &st) && S_ISDIR(st.st_mode);
    snprintf(d->val_shards, sizeof(d->val_shards), dir ? "%s/val_*.bin" : "%s", a->shards);
    /* the loader wants training data too: the same shards (never read: no batch is asked) */
    snprintf(d->shards, sizeof(d->shards), "%s", d->val_shards);
    d->text[0] = '\0';
    d->n_mix = 0;
    return 1;
}

/* The loader's validation windows (1 x seq_len each, in order): the mean of every token's
 * cross entropy, in double. */
static int eval_val(evaluator *e, const eval_args *a, val_result *out, char *err, size_t errlen) {
    out->loss = NAN, out->tokens = 0, out->windows = 0;
    const tr_recipe *r = &e->L.recipe;
    tr_data_desc d;
    if (!val_data(a, &r->data, &d)) return 0;
    int T = r->model.seq_len;
    tr_loader *l = NULL;
    if (tr_loader_open(&l, &d, r->model.vocab, 0, 1, 1, T, r->train.seed, err, errlen)) return -1;
    long n = tr_loader_val_batches(l);
    if (a->max > 0 && n > a->max) n = a->max;
    int *in = malloc((size_t)T * sizeof(int)), *tg = malloc((size_t)T * sizeof(int));
    double sum = 0;
    int rc = in && tg ? 0 : tr_errf(err, errlen, "out of memory");
    for (long i = 0; i < n && !rc; i++) {
        if (tr_loader_val_batch(l, i, in, tg) < 0) {
            rc = tr_errf(err, errlen, "%s", tr_loader_error(l));
            break;
        }
        forward(e, in, tg, T);
        for (int t = 0; t < T; t++)
            sum += e->loss[t];
    }
    if (!rc && n < 1)
        rc = tr_errf(err, errlen, "the validation data hold no window of %d tokens", T + 1);
    out->windows = n, out->tokens = (double)n * T;
    out->loss = rc ? NAN : sum / out->tokens;
    free(in), free(tg);
    tr_loader_free(l);
    return rc;
}

/* ---- multiple choice ----------------------------------------------------------------------- */

/* The log-likelihood of a window (data/task.h's tr_task_loglik_fn): one forward, the head's
 * per-token losses of its last `scored` targets. */
static int window_loglik(void *ctx, const int *ids, int len, int scored, double *ll, char *err,
                         size_t errlen) {
    (void)err, (void)errlen;
    evaluator *e = ctx;
    forward(e, ids, ids + 1, len);
    double s = 0;
    for (int t = len - scored; t < len; t++)
        s -= e->loss[t];
    *ll = s;
    return 0;
}

static int eval_task(evaluator *e, const tr_task *t, task_result *out, char *err, size_t errlen) {
    tr_task_result r;
    int rc = tr_task_score(t, e->L.tok, e->L.recipe.model.seq_len, window_loglik, e, e->details,
                           &r, err, errlen);
    *out = (task_result){t->name, tr_task_format_name(t->formats), r.n, r.acc, r.acc_norm};
    return rc;
}

/* ---- output -------------------------------------------------------------------------------- */

static void print_json(const tr_loaded *L, const val_result *v, const task_result *t, int n) {
    printf("{\"checkpoint\": ");
    tr_json_write_string(stdout, L->ckpt.dir);
    printf(", \"step\": %ld, \"val\": ", L->ckpt.step);
    if (isnan(v->loss)) {
        printf("null");
    } else {
        printf("{\"loss\": ");
        tr_json_write_num(stdout, v->loss, 17);
        printf(", \"perplexity\": ");
        tr_json_write_num(stdout, exp(v->loss), 17);
        printf(", \"tokens\": %.17g}", v->tokens);
    }
    printf(", \"tasks\": [");
    for (int i = 0; i < n; i++) {
        printf("%s{\"name\": ", i ? ", " : "");
        tr_json_write_string(stdout, t[i].name);
        printf(", \"format\": \"%s\", \"n\": %d, \"acc\": ", t[i].format, t[i].n);
        tr_json_write_num(stdout, t[i].acc, 17);
        printf(", \"acc_norm\": ");
        tr_json_write_num(stdout, t[i].acc_norm, 17);
        printf("}");
    }
    printf("]}\n");
}

static void print_table(const tr_loaded *L, const val_result *v, const task_result *t, int n) {
    printf("checkpoint %s (step %ld)\n", L->ckpt.dir, L->ckpt.step);
    if (!isnan(v->loss)) {
        char tok[32];
        tr_fmt_count(v->tokens, tok, sizeof(tok));
        printf("validation loss %.4f  perplexity %.4g  (%s tokens in %ld windows of %d)\n", v->loss,
               exp(v->loss), tok, v->windows, L->recipe.model.seq_len);
    }
    if (n) printf("%-24s %-10s %8s %8s %8s\n", "task", "format", "n", "acc", "acc_norm");
    for (int i = 0; i < n; i++)
        printf("%-24s %-10s %8d %8.4f %8.4f\n", t[i].name, t[i].format, t[i].n, t[i].acc,
               t[i].acc_norm);
}

/* ---- the command --------------------------------------------------------------------------- */

/* 0, 1 after --help, 2 after one line on a bad argument. */
static int parse_args(eval_args *a, int argc, char **argv) {
    memset(a, 0, sizeof(*a));
    for (int i = 2; i < argc; i++) {
        const char *s = argv[i];
        if (!strcmp(s, "--help") || !strcmp(s, "-h")) return fputs(eval_help, stdout), 1;
        int valued = !strcmp(s, "--task") || !strcmp(s, "--shards") || !strcmp(s, "--details") ||
                     !strcmp(s, "--max-examples") || !strcmp(s, "--device");
        if (valued && i + 1 >= argc) {
            fprintf(stderr, "trainer eval: %s needs a value (see trainer eval --help)\n", s);
            return 2;
        }
        double max;
        if (!strcmp(s, "--task") && a->n_task == EVAL_MAX_TASKS) {
            fprintf(stderr, "trainer eval: more than %d --task files\n", EVAL_MAX_TASKS);
            return 2;
        } else if (!strcmp(s, "--task")) {
            a->task[a->n_task++] = argv[++i];
        } else if (!strcmp(s, "--details")) {
            a->details = argv[++i];
        } else if (!strcmp(s, "--shards")) {
            a->shards = argv[++i];
        } else if (!strcmp(s, "--device")) {
            a->device = argv[++i];
            if (strcmp(a->device, "auto") && strcmp(a->device, "cpu") &&
                strcmp(a->device, "cuda")) {
                fprintf(stderr, "trainer eval: --device must be auto, cpu or cuda, got '%s'\n",
                        a->device);
                return 2;
            }
        } else if (!strcmp(s, "--max-examples")) {
            if (tr_number_arg("eval", s, argv[++i], 1, 1e15, &max)) return 2;
            a->max = (long)max;
        } else if (!strcmp(s, "--json")) {
            a->json = 1;
        } else if (s[0] == '-') {
            fprintf(stderr, "trainer eval: unknown option '%s' (see trainer eval --help)\n", s);
            return 2;
        } else if (!a->ckpt) {
            a->ckpt = s;
        } else {
            fprintf(stderr, "trainer eval: unexpected argument '%s' (one checkpoint only)\n", s);
            return 2;
        }
    }
    if (!a->ckpt) {
        fprintf(stderr, "trainer eval: no checkpoint given (see trainer eval --help)\n");
        return 2;
    }
    return 0;
}

/* Every task file read before the model runs, so a bad one fails at once. */
static int read_tasks(const eval_args *a, tr_task *tasks, char *err, size_t errlen) {
    for (int i = 0; i < a->n_task; i++)
        if (tr_task_read(&tasks[i], a->task[i], a->max, err, errlen)) return -1;
    return 0;
}

int tr_cmd_eval(int argc, char **argv) {
    eval_args a;
    int rc = parse_args(&a, argc, argv);
    if (rc) return rc == 1 ? 0 : 2;
    char err[1536];
    tr_task tasks[EVAL_MAX_TASKS];
    task_result res[EVAL_MAX_TASKS];
    memset(tasks, 0, sizeof(tasks));
    evaluator e;
    memset(&e, 0, sizeof(e));
    val_result v = {NAN, 0, 0};
    rc = read_tasks(&a, tasks, err, sizeof(err)) ||
         tr_load_checkpoint(&e.L, a.ckpt, a.device, err, sizeof(err));
    if (!rc && !(e.loss = malloc((size_t)e.L.recipe.model.seq_len * sizeof(float))))
        rc = tr_errf(err, sizeof(err), "out of memory");
    if (!rc && a.details && !(e.details = fopen(a.details, "w")))
        rc = tr_errf(err, sizeof(err), "cannot write '%s': %s", a.details, strerror(errno));
    if (!rc) tr_model_set_tap(e.L.model, on_tap, &e);
    if (!rc) rc = eval_val(&e, &a, &v, err, sizeof(err));
    for (int i = 0; i < a.n_task && !rc; i++)
        rc = eval_task(&e, &tasks[i], &res[i], err, sizeof(err));
    if (e.details && fclose(e.details) && !rc)
        rc = tr_errf(err, sizeof(err), "cannot write '%s': %s", a.details, strerror(errno));
    if (rc)
        fprintf(stderr, "trainer eval: %s\n", err);
    else if (a.json)
        print_json(&e.L, &v, res, a.n_task);
    else
        print_table(&e.L, &v, res, a.n_task);
    for (int i = 0; i < a.n_task; i++)
        tr_task_free(&tasks[i]);
    free(e.loss);
    tr_loaded_free(&e.L);
    return rc ? 1 : 0;
}
