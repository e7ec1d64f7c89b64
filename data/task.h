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

#endif
