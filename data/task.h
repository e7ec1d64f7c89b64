/* Multiple-choice evaluation tasks read from JSONL files (`trainer eval --task`): each line one
 * example, in one of two formats, told apart line by line:
 *  - HellaSwag's published JSONL: "ctx" (or "ctx_a" and "ctx_b", joined by a space),
 *    "endings" (strings), "label" (an integer, or a string of one); each choice's completion
 *    is " " + the ending, as llm.c and lm-evaluation-harness render it;
 *  - the simple format: {"context": "...", "choices": ["...", ...], "answer": K}; the
 *    completion is the choice as given.
 * Every mistake is one line "FILE:LINE: what is wrong". */
#ifndef TR_TASK_H
#define TR_TASK_H

#include <stddef.h>
#include <stdio.h>

typedef enum { TR_TASK_HELLASWAG = 1, TR_TASK_SIMPLE = 2 } tr_task_format;

typedef struct {
    int line; /* in the file, from 1 */
    tr_task_format format;
    char *context; /* the text the choices continue */
    int n_choices;
    char **completion; /* per choice: the text scored after the context */
    double *norm_len;  /* per choice: its length in characters (acc_norm divides by it) */
    int answer;        /* the correct choice, 0 .. n_choices - 1 */
} tr_task_example;

typedef struct {
    char path[1024];
    char name[256]; /* the file's name without its folder and extension */
    int formats;    /* the formats seen (tr_task_format bits) */
    int n;
    tr_task_example *ex;
} tr_task;

/* Read the first max examples of a JSONL file (max <= 0: all; blank lines are skipped):
 * 0, or -1 with one line in err (the file cannot be read, a line is not a JSON object, a
 * field is missing or of the wrong type, no choices, an empty choice, the answer out of
 * range, no example at all). tr_task_free on a failed read is fine. */
int tr_task_read(tr_task *t, const char *path, long max, char *err, size_t errlen);
void tr_task_free(tr_task *t);
/* "hellaswag", "simple" or "mixed", from t->formats. */
const char *tr_task_format_name(int formats);

/* ---- scoring (data/task_score.c) ---------------------------------------------------------- */

struct tr_tokenizer;

/* The log-likelihood of a window of len + 1 tokens ids[0..len] (inputs ids[0..len), targets
 * ids[1..len]): the sum of log p(target) over its last `scored` targets. 0, or -1 with err. */
typedef int (*tr_task_loglik_fn)(void *ctx, const int *ids, int len, int scored, double *ll,
                                 char *err, size_t errlen);

typedef struct {
    int n;
    double acc, acc_norm;
    double answer_loglik; /* the mean over the examples of the answer's log-likelihood */
} tr_task_result;

/* Every example of t scored as the published harnesses score them, each choice's
 * log-likelihood through f: acc (the choice of highest log-likelihood is the answer) and
 * acc_norm (of highest log-likelihood per character of the choice). The context/completion
 * boundary is lm-evaluation-harness's: trailing whitespace of the context goes to the
 * completion; the whole text and the context are encoded with tok, the completion's tokens
 * being what the whole has beyond the context's; an empty context is <|endoftext|> (GPT-2;
 * with bytes it is an error). A window longer than seq_len + 1 tokens keeps its last seq_len
 * + 1 (the context cut on the left, as the harness does). details (may be NULL): a JSON line
 * per example (task, line, answer, loglik and length of each choice, pred, pred_norm). 0, or
 * -1 with one line in err. */
int tr_task_score(const tr_task *t, const struct tr_tokenizer *tok, int seq_len,
                  tr_task_loglik_fn f, void *ctx, FILE *details, tr_task_result *out, char *err,
                  size_t errlen);

#endif
