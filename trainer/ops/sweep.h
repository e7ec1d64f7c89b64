/* Private header of `trainer sweep` (trainer/ops/sweep.c: the command line, the experiment's
 * sweep.json and its points; trainer/ops/sweep_run.c: running the points, here one after
 * another or as a Slurm job array, and their records).
 *
 * An experiment folder EXP holds:
 *   sweep.json         what to run: the recipe, the flags every point gets, the axes, the
 *                      launcher, and each point's name and values ({"name", "values":
 *                      {LABEL: VALUE}}, in order) (written once, when the sweep is made)
 *   recipe.lua         a copy of the recipe as it was then (a later sweep of EXP refuses a
 *                      recipe that changed since)
 *   points/NAME/       each point's run folder, a normal `trainer run --out` folder
 *   logs/NAME.log      what the point's run printed
 *   status/NAME.json   how it ended: {"point", "state": "done" | "failed", "why", "trained",
 *                      "seconds"}, written atomically when the run (and its evaluation)
 *                      ends; a point without one is unfinished
 *   points/NAME/eval.json  with --eval-task: `trainer eval --json` of the point's last
 *                      checkpoint, which `trainer report --compare EXP` tables
 */
#ifndef TR_SWEEP_H
#define TR_SWEEP_H

#include "trainer/trainer.h"

#define SW_MAX_AXES 8
#define SW_MAX_VALUES 64
#define SW_MAX_POINTS 4096
#define SW_MAX_ARGS 128
#define SW_NAME_LEN 200
#define SW_VALUE_MAX 128 /* bytes of one value of an axis */

/* One axis of the grid: a knob or train field given with --set NAME=VALUE, or a flag of
 * `trainer run` given as --NAME VALUE (a layout per point: --tp, --zero, ...). */
typedef struct {
    char name[64];  /* the knob or field ("lr", "train.seed"), or the flag without "--" */
    char label[64]; /* in point names and tables: the name, "seed" for train.seed */
    int flag;
    int n;
    char *values[SW_MAX_VALUES];
} sw_axis;

typedef struct {
    char exp[TR_PATH_MAX];       /* the experiment folder */
    char recipe[TR_PATH_MAX];    /* the recipe, as an absolute path */
    char cwd[TR_PATH_MAX];       /* where the sweep was made: the points run there */
    char launcher[512];          /* "local", "slurm", or a command put before `trainer run` */
    char task_launcher[512];     /* slurm: the command before `trainer run` in a task, or "" */
    char *args[SW_MAX_ARGS];     /* `trainer run` flags every point gets */
    int n_args;
    char *sbatch[32]; /* slurm: sbatch's own options */
    int n_sbatch;
    sw_axis axes[SW_MAX_AXES];
    int n_axes;
    int n_points;
    char *eval_tasks[8]; /* `trainer eval --task` files (absolute) for each point's end */
    int n_eval;
    char self[TR_PATH_MAX]; /* this binary, found once when the sweep starts (a rebuild
                               during the sweep replaces the file, not this path) */
} sw_spec;

/* Point k's values (one per axis) and its name, "lr-1e-3_seed-1338". */
void sw_point_values(const sw_spec *s, int k, const char **values);
void sw_point_name(const sw_spec *s, int k, char *buf, size_t n);
/* Point k's `trainer run` command after the launcher: this binary, run, the recipe, the
 * common flags, the point's own, --out EXP/points/NAME (and --resume when its folder holds
 * an earlier attempt). argv has room for SW_MAX_ARGS + 3 * SW_MAX_AXES + 8 entries; its
 * strings live in `store` (4096 bytes). Returns argc. */
int sw_point_argv(const sw_spec *s, int k, const char *self, int resume, char **argv,
                  char *store);

/* sweep_run.c */
/* s->self from /proc/self/exe: 0, or -1 said on stderr. */
int sw_self_path(sw_spec *s);
typedef enum { SW_TODO = 0, SW_DONE, SW_FAILED } sw_state;
/* Point k's state from its status file (why: the failed run's reason; trained, may be NULL:
 * whether its training finished, for a point whose evaluation failed). */
sw_state sw_point_state(const sw_spec *s, int k, char *why, size_t n, int *trained);
/* Run point k here (through the launcher prefix, if any): 0 done, 1 failed (recorded),
 * 128 + a signal that stopped the sweep (the point left unfinished), -1 a sweep error. */
int sw_run_point(const sw_spec *s, int k, const char *prefix);
/* Every unfinished point, one after another: the sweep's exit status. */
int sw_run_local(const sw_spec *s);
/* The unfinished points as one Slurm job array (sbatch; --wait: until it ends). */
int sw_run_slurm(const sw_spec *s, int wait);
/* A line per point with its state, and the counts: 0 when every point is done. */
int sw_summary(const sw_spec *s, FILE *f);

#endif
