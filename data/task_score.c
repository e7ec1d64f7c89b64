/* Scoring a multiple-choice task (data/task.h) as lm-evaluation-harness does: each choice's
 * tokens after its context, their log-likelihood through the caller's forward (`trainer
 * eval`'s on one process, a training run's through its layout), acc and acc_norm. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/json.h"
#include "data/task.h"
#include "data/tokenizer.h"
#include "parallel/comm/base.h"

/* Trailing whitespace of a context belongs to the completion (lm-evaluation-harness's
 * _encode_pair), so "Answer: " + "yes" and "Answer:" + " yes" tokenize alike. */
static size_t context_end(const char *ctx) {
    size_t n = strlen(ctx);
    while (n > 0 && strchr(" \t\n\r\v\f", ctx[n - 1]))
        n--;
    return n;
}

/* Choice k's log-likelihood: its window of ids (room for every byte of the text, + 2) and the
 * completion tokens in it, through f. */
static int choice_loglik(const tr_task *task, const tr_task_example *x, int k,
                         const tr_tokenizer *tok, int L, tr_task_loglik_fn f, void *ctx, int *ids,
                         double *ll, char *err, size_t errlen) {
    size_t cend = context_end(x->context), clen = strlen(x->context);
    size_t plen = strlen(x->completion[k]);
    char *whole = malloc(clen + plen + 1);
    if (!whole) return tr_errf(err, errlen, "out of memory");
    memcpy(whole, x->context, clen), memcpy(whole + clen, x->completion[k], plen + 1);
    /* ids[0] is left for <|endoftext|>: the harness's context when the context is empty */
    int nctx = (int)tr_tokenizer_encode(tok, whole, cend, ids + 1);
    int n = (int)tr_tokenizer_encode(tok, whole, clen + plen, ids + 1);
    free(whole);
    int first = nctx == 0 && tr_tokenizer_eot(tok) >= 0, ncomp = n - nctx;
    int *seq = ids + 1 - first, total = n + first;
    ids[0] = tr_tokenizer_eot(tok);
    if (nctx + first == 0)
        return tr_errf(err, errlen,
                       "%s:%d: the context is empty: a byte-level model has no token to "
                       "condition on",
                       task->path, x->line);
    if (ncomp < 1)
        return tr_errf(err, errlen, "%s:%d: choice %d adds no token to the context", task->path,
                       x->line, k);
    int start = total > L + 1 ? total - (L + 1) : 0, len = total - start - 1;
    return f(ctx, seq + start, len, ncomp < len ? ncomp : len, ll, err, errlen);
}

/* The index of the largest of v[0..n) divided by div (NULL: 1); the first on ties. */
static int argmax(const double *v, const double *div, int n) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (v[i] / (div ? div[i] : 1) > v[best] / (div ? div[best] : 1)) best = i;
    return best;
}

/* details: what an example's scores came from, one JSON line. */
static void write_details(FILE *f, const tr_task *t, const tr_task_example *x, const double *ll) {
    fprintf(f, "{\"task\": ");
    tr_json_write_string(f, t->name);
    fprintf(f, ", \"line\": %d, \"answer\": %d, \"loglik\": [", x->line, x->answer);
    for (int k = 0; k < x->n_choices; k++) {
        fprintf(f, "%s", k ? ", " : "");
        tr_json_write_num(f, ll[k], 17);
    }
    fprintf(f, "], \"length\": [");
    for (int k = 0; k < x->n_choices; k++)
        fprintf(f, "%s%.17g", k ? ", " : "", x->norm_len[k]);
    fprintf(f, "], \"pred\": %d, \"pred_norm\": %d}\n", argmax(ll, NULL, x->n_choices),
            argmax(ll, x->norm_len, x->n_choices));
}

int tr_task_score(const tr_task *t, const tr_tokenizer *tok, int seq_len, tr_task_loglik_fn f,
                  void *ctx, FILE *details, tr_task_result *out, char *err, size_t errlen) {
    size_t longest = 0;
    int most = 0;
    for (int i = 0; i < t->n; i++) {
        const tr_task_example *x = &t->ex[i];
        most = x->n_choices > most ? x->n_choices : most;
        for (int k = 0; k < x->n_choices; k++) {
            size_t l = strlen(x->context) + strlen(x->completion[k]);
            longest = l > longest ? l : longest;
        }
    }
    int *ids = malloc((longest + 2) * sizeof(int)); /* no tokenizer makes more ids than bytes */
    double *ll = malloc((size_t)most * sizeof(double));
    int rc = ids && ll ? 0 : tr_errf(err, errlen, "out of memory");
    long acc = 0, acc_norm = 0;
    double answer = 0;
    for (int i = 0; i < t->n && !rc; i++) {
        const tr_task_example *x = &t->ex[i];
        for (int k = 0; k < x->n_choices && !rc; k++)
            rc = choice_loglik(t, x, k, tok, seq_len, f, ctx, ids, &ll[k], err, errlen);
        if (!rc && details) write_details(details, t, x, ll);
        acc += !rc && argmax(ll, NULL, x->n_choices) == x->answer;
        acc_norm += !rc && argmax(ll, x->norm_len, x->n_choices) == x->answer;
        answer += rc ? 0 : ll[x->answer];
    }
    *out = (tr_task_result){t->n, (double)acc / t->n, (double)acc_norm / t->n, answer / t->n};
    free(ids), free(ll);
    return rc;
}
