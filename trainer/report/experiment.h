/* `trainer report EXP` over a sweep's experiment folder (trainer/ops/sweep.h says what it
 * holds): each point's final and best validation loss, final training loss and task scores
 * (RUN/eval.json, when `trainer eval --json` wrote one there), grouped into settings (the
 * points that differ only in their seed), with the mean, the standard deviation and the
 * spread over the seeds; what the provenance of the points says about them; and the curves of
 * each setting with its seeds' band. report/experiment.c reads and computes; the outputs (a
 * text table, JSON, CSV, the HTML page) are report/experiment_out.c's, from the same struct. */
#ifndef TR_REPORT_EXPERIMENT_H
#define TR_REPORT_EXPERIMENT_H

#include <stdint.h>
#include <stdio.h>

#define TR_EX_MAX_AXES 8
#define TR_EX_MAX_TASKS 8
#define TR_EX_NAME 200

/* The figures of one point or setting, over its seeds (n of them had the figure). */
typedef struct {
    int n;
    double mean, sd, min, max; /* sd: the sample's (n - 1); NAN for n < 2 */
} tr_ex_stat;

enum { TR_EX_FINAL_VAL, TR_EX_BEST_VAL, TR_EX_FINAL_LOSS, TR_EX_FIGURES };
extern const char *const tr_ex_figure_keys[TR_EX_FIGURES];

typedef struct {
    char name[TR_EX_NAME];
    char values[TR_EX_MAX_AXES][64]; /* per axis label */
    char state[16];                  /* done, failed, unfinished */
    int done;                        /* state "done": only these enter a setting's figures */
    char why[256];
    int setting;                     /* its setting's index */
    int64_t last_step;               /* -1: no metrics */
    double fig[TR_EX_FIGURES];       /* NAN when missing */
    double task[TR_EX_MAX_TASKS][2]; /* acc, acc_norm; NAN when missing */
    double hours;                    /* wall time of its steps */
    int n_curve;
    double *step, *loss, *val; /* its curves (val NAN off the eval steps) */
    char *prov;                /* provenance.json's text, NULL */
    size_t prov_len;
} tr_ex_point;

typedef struct {
    int first;                 /* its first point */
    int n;                     /* its points (seeds) */
    int done;                  /* of which done */
    char label[512];           /* "lr=1e-3, width=128" (or "all" with no axis but seeds) */
    tr_ex_stat fig[TR_EX_FIGURES];
    tr_ex_stat task[TR_EX_MAX_TASKS][2];
    char verdict[768];         /* against the first setting */
    char seeds_verdict[640];   /* among its own points */
    /* its curves: the mean over the seeds at each step all of them have, and their range */
    int n_curve;
    double *step, *loss, *loss_lo, *loss_hi, *val, *val_lo, *val_hi;
} tr_ex_setting;

typedef struct {
    char dir[1024];
    int n_axes, seed_axis; /* seed_axis: the index of "seed", -1 */
    char axes[TR_EX_MAX_AXES][64];
    int n_tasks;
    char tasks[TR_EX_MAX_TASKS][64];
    int n_points, n_settings, n_done, n_failed;
    tr_ex_point *points;
    tr_ex_setting *settings;
} tr_ex;

/* 1 when dir holds a sweep (dir/sweep.json). */
int tr_ex_is_experiment(const char *dir);
/* Read EXP and compute every figure: 0, or -1 with one line in err. */
int tr_ex_load(tr_ex *e, const char *dir, char *err, size_t errlen);
void tr_ex_free(tr_ex *e);

/* report/experiment_out.c */
void tr_ex_write_text(const tr_ex *e, FILE *f);
void tr_ex_write_json(const tr_ex *e, FILE *f);
void tr_ex_write_csv(const tr_ex *e, FILE *f);
void tr_ex_write_html(const tr_ex *e, FILE *f);

#endif
