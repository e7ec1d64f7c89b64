/* Continuing a run from its checkpoints: --resume and the guard's rollback load the newest
 * usable checkpoint (the recipe compared with the saved one, with or without checkpoints),
 * and metrics.jsonl drops the records of the steps trained again. Called by setup.c and
 * guard.c; calls neither. */
#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "trainer/run/run.h"

/* A resumed run appends to metrics.jsonl: first the records of steps after the checkpoint
 * (written before the run was interrupted, and about to be written again) are dropped, so
 * every step has one record. The file is rewritten to a temporary and renamed over. */
static int trim_metrics(FILE **mf, const char *path, long step) {
    char tmp[TR_PATH_MAX + 48];
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    fclose(*mf);
    *mf = NULL;
    FILE *in = fopen(path, "r"), *out = in ? fopen(tmp, "w") : NULL;
    if (!in || !out) {
        int e = errno;
        if (in) fclose(in);
        return run_cannot_write(in ? tmp : path, e);
    }
    char *line = NULL;
    size_t cap = 0;
    long dropped = 0;
    while (getline(&line, &cap, in) > 0) {
        long k;
        if (sscanf(line, "{\"step\": %ld", &k) == 1 && k > step)
            dropped++;
        else
            fputs(line, out);
    }
    free(line);
    fclose(in);
    if (run_close_output(out, tmp)) return -1;
    if (rename(tmp, path)) return run_cannot_write(path, errno);
    if (dropped)
        printf("metrics.jsonl: dropped %ld record(s) of steps after %ld (they are trained again)\n",
               dropped, step);
    *mf = fopen(path, "a");
    return *mf ? 0 : run_cannot_write(path, errno);
}

int run_trim_metrics(run_ctx *x, long step) {
    return x->metrics ? trim_metrics(&x->metrics, x->metrics_path, step) : 0;
}

/* Checkpoint c into the model and the loader, if the recipe still matches it: 0; -1 with err
 * when it cannot be used (another recipe, nothing left to do); 1 when a block this process
 * reads is damaged (lazily read checkpoints: an older one may do). */
/* The recipe the run was saved with (`text`, from `chunk`) against this run's: 0, or -1 with
 * the changes that matter in err (harmless ones printed). */
static int same_recipe(const run_ctx *x, const char *text, const char *chunk, char *err,
                       size_t errlen) {
    tr_recipe saved;
    int rc = tr_recipe_load_string(&saved, text, chunk, ".", NULL, 0, err, errlen);
    if (!rc) {
        rc = tr_ckpt_compare_recipes(&saved, &x->r, stdout, err, errlen);
        tr_recipe_free(&saved);
    }
    return rc ? -1 : 0;
}

/* --resume with no checkpoint yet: OUT/recipe.lua, when there is one, must be this run's as a
 * checkpoint's recipe must. 0, or -1 with err. */
static int same_folder_recipe(const run_ctx *x, char *err, size_t errlen) {
    char path[TR_PATH_MAX + 16];
    snprintf(path, sizeof(path), "%s/recipe.lua", x->r.train.out);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    char *text = NULL;
    size_t len;
    int unread = tr_read_all(f, SIZE_MAX, &text, &len);
    fclose(f);
    char why[768] = "";
    int rc = unread ? -1 : same_recipe(x, text, path, why, sizeof(why));
    free(text);
    if (rc && snprintf(err, errlen, "%s (no checkpoint yet: compared with %s)",
                       unread ? "cannot read the run's recipe" : why, path) < 0)
        err[0] = 0;
    return rc;
}

static int use_checkpoint(run_ctx *x, tr_ckpt *c, char *err, size_t errlen) {
    const tr_recipe *r = &x->r;
    char chunk[TR_PATH_MAX + 32];
    snprintf(chunk, sizeof(chunk), "%s/manifest.yaml", c->dir);
    if (same_recipe(x, c->recipe, chunk, err, errlen)) return -1;
    if (c->step >= r->train.steps) {
        if (snprintf(err, errlen,
                     "%s is at step %ld and the recipe trains %d steps: nothing to "
                     "do (raise --steps)",
                     c->dir, c->step, r->train.steps) < 0)
            err[0] = 0;
        return -1;
    }
    if (tr_ckpt_apply(c, x->model, err, errlen)) return 1;
    if (c->has_loader && tr_loader_set_pos(x->loader, c->loader, err, errlen)) return -1;
    return 0;
}

/* --resume (below = LONG_MAX) and the guard's rollback: the newest checkpoint in OUT of a step
 * below `below` that verifies, if the recipe still matches it. Restores the parameters, the
 * AdamW state and step count, the loader position and the guard's state; *start is the number
 * of steps done.
 * --resume in a run folder with no checkpoint yet, but an earlier attempt's attempts.jsonl,
 * trains from step 0 as the run's next attempt (its records appended to: trainer supervise
 * relies on it after a kill before the first save); in a folder that holds no run, --resume is
 * refused (a mistyped folder must not start a fresh run).
 * One process resuming verifies every file first; otherwise each rank checks only the blocks
 * it reads, and when any rank finds one damaged, all go back to the checkpoint before (each
 * rank that found damage says where). */
int run_load_checkpoint(run_ctx *x, long below, int *start, char *err, size_t errlen) {
    tr_comm *world = x->world;
    const tr_recipe *r = &x->r;
    tr_ckpt c;
    int rc = -1, me = tr_comm_rank(world);
    double t0 = tr_now();
    if (x->dp) tr_dp_settle(x->dp); /* a rollback: no transfer may still write the slab */
    if (below == LONG_MAX) {
        long *none;
        char rec[TR_PATH_MAX + 32];
        int have = tr_ckpt_steps(r->train.out, &none);
        free(none);
        if (have == 0 && same_folder_recipe(x, err, errlen)) return -1;
        snprintf(rec, sizeof(rec), "%s/attempts.jsonl", r->train.out);
        if (have == 0 && access(rec, F_OK) == 0) { /* a relaunch killed before the first save */
            *start = 0;
            printf("--resume: no checkpoint in %s/checkpoints/ yet: training from step 0\n",
                   r->train.out);
            return 0;
        }
    }
    if (tr_comm_size(world) == 1 && below == LONG_MAX) {
        if (tr_ckpt_find_resume(r->train.out, &c, 1, stdout, err, errlen)) return -1;
        rc = use_checkpoint(x, &c, err, errlen) ? -1 : 0;
    } else {
        long *steps;
        int n = tr_ckpt_steps(r->train.out, &steps);
        if (snprintf(err, errlen, "no usable checkpoint in %s/checkpoints/", r->train.out) < 0)
            err[0] = 0;
        for (int i = 0; i < n; i++) {
            char dir[TR_PATH_MAX + 64], why[768];
            if (steps[i] >= below) continue;
            snprintf(dir, sizeof(dir), "%s/checkpoints/step_%08ld", r->train.out, steps[i]);
            int opened = tr_ckpt_read_lazy(&c, dir, 1, why, sizeof(why)) == 0;
            int mine = opened ? use_checkpoint(x, &c, why, sizeof(why)) : 1;
            long long v[2] = {mine == 1, mine < 0}; /* damaged here, unusable here */
            tr_comm_all_reduce(world, v, 2, TR_COMM_I64);
            if (mine == 1) fprintf(stderr, "trainer: rank %d: checkpoint %s: %s\n", me, dir, why);
            if (v[1]) { /* a reason that is not damage (recipe, steps): said by one rank */
                if (snprintf(err, errlen, "%s", mine < 0 ? why : "another rank's reason") < 0)
                    err[0] = 0;
                if (opened) tr_ckpt_free(&c);
                rc = mine < 0 ? -1 : -2;
                break;
            }
            if (!v[0]) {
                rc = 0;
                break;
            }
            if (me == 0)
                printf("skipping checkpoint %s: damaged (found by %lld rank(s))\n", dir, v[0]);
            if (opened) tr_ckpt_free(&c);
        }
        free(steps);
        if (rc) return rc;
    }
    if (!rc) {
        double t_read = tr_now() - t0, bytes = 0;
        for (int i = 0; i < c.n_files; i++)
            bytes += (double)c.files[i].size;
        *start = (int)c.step;
        char size[32];
        tr_fmt_bytes(bytes, size, sizeof(size));
        if (below == LONG_MAX)
            printf("resuming from %s (step %ld; checkpoint of %s read and verified in %.2f s)\n",
                   c.dir, c.step, size, t_read);
        run_guard_restore(x, &c);
    }
    tr_ckpt_free(&c);
    return rc;
}
