/* eval { }: the recipe's multiple-choice tasks (data/task.h) scored during training through the
 * run's own layout, with the scorer `trainer eval` uses. Each choice is one forward of a
 * micro-batch whose first row holds its window and whose other targets are ignored; the loss
 * the pass returns is the mean over the micro-batch's B x T positions, so the choice's
 * log-likelihood is -loss x B x T. Every rank forwards every choice, as every rank evaluates
 * the validation loss: data, tensor and pipeline parallelism and every ZeRO stage take part
 * in each pass as they do there, and every rank gets the same scores. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/json.h"
#include "data/task.h"
#include "data/tokenizer.h"
#include "trainer/run/run.h"

int run_tasks_open(run_ctx *x) {
    const tr_eval_desc *e = &x->r.eval;
    if (!e->n_tasks) return 0;
    const tr_data_desc *d = &x->r.data;
    x->tasks = calloc((size_t)e->n_tasks, sizeof *x->tasks);
    int bad = !x->tasks;
    snprintf(x->msg, sizeof x->msg, "trainer run: out of memory");
    if (!bad && tr_tokenizer_open(&x->task_tok, d->tokenizer, d->encoder, d->merges, x->err,
                                  sizeof x->err)) {
        snprintf(x->msg, sizeof x->msg, "%s: eval: %s", x->r.path, x->err);
        bad = 1;
    }
    for (int i = 0; i < e->n_tasks && !bad; i++, x->n_tasks = i) {
        bad = tr_task_read(&x->tasks[i], e->tasks[i], e->max_examples, x->err, sizeof x->err);
        if (bad) snprintf(x->msg, sizeof x->msg, "%s:%d: eval: %s", x->r.path, e->line, x->err);
    }
    return bad ? -1 : 0;
}

void run_tasks_free(run_ctx *x) {
    for (int i = 0; i < x->n_tasks; i++) tr_task_free(&x->tasks[i]);
    free(x->tasks);
    if (x->task_tok) tr_tokenizer_free(x->task_tok);
}

int run_tasks_due(const run_ctx *x, int step, int last) {
    int every = x->r.eval.every ? x->r.eval.every : x->r.train.eval_every;
    return x->n_tasks && (last || (every > 0 && (step + 1) % every == 0));
}

/* A window through the layout's forward (tr_task_loglik_fn). */
static int window_loglik(void *ctx, const int *ids, int len, int scored, double *ll, char *err,
                         size_t errlen) {
    (void)err, (void)errlen;
    run_ctx *x = ctx;
    size_t n = (size_t)x->B * x->T;
    for (size_t i = 0; i < n; i++) x->inputs[i] = 0, x->targets[i] = -1;
    for (int t = 0; t < len; t++) {
        x->inputs[t] = ids[t];
        if (t >= len - scored) x->targets[t] = ids[t + 1];
    }
    double mean = x->pipe ? tr_pipe_eval(x->pipe, x->inputs, x->targets, x->B, x->T)
                          : tr_model_forward(x->model, x->inputs, x->targets, x->B, x->T, 0);
    *ll = -mean * (double)n;
    return 0;
}

int run_tasks_score(run_ctx *x) {
    for (int i = 0; i < x->n_tasks; i++) {
        if (!tr_task_score(&x->tasks[i], x->task_tok, x->T, window_loglik, x, NULL,
                           &x->task_res[i], x->err, sizeof x->err))
            continue;
        fprintf(stderr, "%s%s: eval: %s\n", x->tty ? "\n" : "", x->r.path, x->err);
        return -1;
    }
    return 0;
}

void run_tasks_write(const run_ctx *x, FILE *m) {
    fprintf(m, ", \"tasks\": {");
    for (int i = 0; i < x->n_tasks; i++) {
        fputs(i ? ", " : "", m);
        tr_json_write_string(m, x->tasks[i].name);
        fprintf(m, ": {\"n\": %d, \"acc\": ", x->task_res[i].n);
        tr_json_write_num(m, x->task_res[i].acc, 0);
        fprintf(m, ", \"acc_norm\": ");
        tr_json_write_num(m, x->task_res[i].acc_norm, 0);
        fprintf(m, ", \"answer_loglik\": ");
        tr_json_write_num(m, x->task_res[i].answer_loglik, 0);
        fputc('}', m);
    }
    fputc('}', m);
}
