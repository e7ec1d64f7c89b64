/* The NaN and spike guard of `trainer run` (recipe: train { guard = { ... } }): a step whose loss
 * or gradient norm is not finite, or spikes, is skipped, its update not made; max_bad bad steps
 * in a row roll back to the newest checkpoint saved before them and skip their data. Its state
 * goes into every checkpoint and comes back on --resume and on a rollback. Also the tests'
 * faults that make such steps.
 *
 * The spike rule, chosen from bench/guard_stats.sh's measurements (README, "The NaN and spike
 * guard"): over the last `window` accepted steps,
 *   loss:          (loss - median) / max(1.4826 MAD, 1% of the median) > z_loss
 *   gradient norm: norm > norm_ratio x median
 * Robust statistics because one earlier outlier must neither hide the next nor widen the
 * deviation for fifty steps; and the gradient norm by a ratio, not in sigmas, because healthy
 * norms are heavy-tailed (2-4x the median within a few steps, 6-13 sigma by mean and sd) and a
 * norm rise alone is what gradient clipping is for: only a norm far past any healthy one is a
 * fault. A real divergence shows in the loss. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "trainer/run/run.h"

/* The deviation the loss's z-score divides by is at least this share of the window's median: a
 * window of nearly equal losses would otherwise make rounding noise a spike. */
#define SIGMA_FLOOR 0.01

/* 1.4826 x the median absolute deviation estimates a normal distribution's standard deviation */
#define MAD_SIGMA 1.4826

/* 1 when step (from 1) is in the list, which forgets it: a fault fires the first time only. */
static int take(long *list, int step) {
    for (int i = 0; i < RUN_FAULT_STEPS; i++)
        if (list[i] == step) {
            list[i] = 0;
            return 1;
        }
    return 0;
}

float run_guard_fault(run_ctx *x, int step) {
    /* an infinite loss scale makes the gradients inf and NaN, the loss stays finite (NaN would
       not do: the model seeds a backward only for a scale > 0) */
    if (take(x->fault_nan, step + 1)) return INFINITY;
    if (take(x->fault_spike, step + 1)) return 1000.0f;
    return 1.0f;
}

void run_guard_targets(run_ctx *x, int step, int *targets, long n, int last) {
    int v = x->r.model.vocab;
    for (int i = 0; i < RUN_FAULT_STEPS; i++)
        if (x->fault_loss[i] == step + 1) { /* every micro-batch of the step, the first time */
            for (long k = 0; k < n; k++)
                if (targets[k] >= 0) targets[k] = (targets[k] + v / 2) % v;
            if (last) x->fault_loss[i] = 0;
            return;
        }
}

int run_guard_init(run_ctx *x) {
    run_guard *g = &x->guard;
    int w = x->r.train.guard.window > 0 ? x->r.train.guard.window : 1;
    g->rolled_to = -1;
    g->loss = malloc((size_t)w * sizeof(double));
    g->norm = malloc((size_t)w * sizeof(double));
    g->scratch = malloc((size_t)w * sizeof(double));
    return g->loss && g->norm && g->scratch ? 0 : -1;
}

void run_guard_free(run_ctx *x) {
    free(x->guard.loss);
    free(x->guard.norm);
    free(x->guard.scratch);
    x->guard.loss = x->guard.norm = x->guard.scratch = NULL;
}

/* The accepted steps the window must hold before spikes are judged: half of it, at least 2. */
static int judged_from(const tr_guard_desc *gd) {
    return gd->window / 2 > 2 ? gd->window / 2 : 2;
}

const tr_ckpt_guard *run_guard_state(const run_ctx *x, tr_ckpt_guard *s) {
    const run_guard *g = &x->guard;
    if (!x->r.train.guard.on) return NULL; /* nothing judged: nothing to keep */
    *s = (tr_ckpt_guard){.window = x->r.train.guard.window,
                         .n = g->n,
                         .next = g->next,
                         .loss = g->loss,
                         .norm = g->norm,
                         .bad = g->bad,
                         .first_bad = g->first_bad,
                         .rolled_to = g->rolled_to,
                         .last_loss = g->last_loss,
                         .last_norm = g->last_norm};
    return s;
}

void run_guard_restore(run_ctx *x, const tr_ckpt *c) {
    const tr_ckpt_guard *s = &c->guard;
    run_guard *g = &x->guard;
    int w = x->r.train.guard.window;
    if (!x->r.train.guard.on) return;
    g->n = g->next = 0; /* unless the ring below fits: the warm-up again */
    g->bad = g->first_bad = 0, g->rolled_to = -1;
    if (c->has_guard) {
        g->bad = s->bad, g->first_bad = s->first_bad, g->rolled_to = s->rolled_to;
        g->last_loss = s->last_loss, g->last_norm = s->last_norm;
    }
    if (c->has_guard && s->window == w) {
        g->n = s->n, g->next = s->next;
        memcpy(g->loss, s->loss, (size_t)s->n * sizeof(double));
        memcpy(g->norm, s->norm, (size_t)s->n * sizeof(double));
        return;
    }
    if (x->rank != 0) return;
    char why[128];
    if (c->has_guard)
        snprintf(why, sizeof(why), "holds a guard window of %d steps, the recipe asks for %d",
                 s->window, w);
    else
        snprintf(why, sizeof(why),
                 "holds no guard state (an older trainer's, or the guard was off)");
    printf("guard: %s %s: the guard starts its warm-up again (spikes are judged again once its "
           "window holds %d accepted steps)\n",
           c->dir, why, judged_from(&x->r.train.guard));
    fflush(stdout);
}

/* The median of the n values of ring, sorted in tmp (n doubles of scratch; may be ring). */
static double median(const double *ring, int n, double *tmp) {
    if (tmp != ring) memcpy(tmp, ring, (size_t)n * sizeof(double));
    return tr_median_doubles(tmp, (size_t)n);
}

/* How many robust deviations v lies above the median m of the ring's n values: the deviation
 * is 1.4826 x their median absolute deviation, floored at SIGMA_FLOOR of the median. */
static double robust_z(const double *ring, int n, double m, double v, double *tmp) {
    for (int i = 0; i < n; i++)
        tmp[i] = fabs(ring[i] - m);
    double sd = MAD_SIGMA * median(tmp, n, tmp), floor = SIGMA_FLOOR * fabs(m);
    return (v - m) / (sd > floor ? sd : floor);
}

/* Spikes are judged after the guard's warm-up steps, once the window is half full. */
static int spike(run_ctx *x, int step, double loss, double norm, char *why, size_t len) {
    const tr_guard_desc *gd = &x->r.train.guard;
    run_guard *g = &x->guard;
    if (step + 1 <= gd->warmup || g->n < judged_from(gd)) return 0;
    double *tmp = g->scratch; /* the medians' scratch, apart from the rings checkpoints hold */
    double ml = median(g->loss, g->n, tmp), zl = robust_z(g->loss, g->n, ml, loss, tmp);
    double mn = median(g->norm, g->n, tmp), rn = norm / mn;
    int hl = zl > gd->z_loss, hn = mn > 0 && rn > gd->norm_ratio;
    if (!hl && !hn) return 0;
    char a[96] = "", b[96] = "";
    if (hl) snprintf(a, sizeof(a), "loss %.4g is %.1f sigma above", loss, zl);
    if (hn) snprintf(b, sizeof(b), "gradient norm %.4g is %.1f times", norm, rn);
    snprintf(why, len,
             "%s%s%s the median of the last %d steps (medians: loss %.4g, gradient norm "
             "%.4g)",
             a, hl && hn ? " and " : "", b, g->n, ml, mn);
    return 1;
}

int run_guard_judge(run_ctx *x, int step, double loss, double norm) {
    const tr_guard_desc *gd = &x->r.train.guard;
    run_guard *g = &x->guard;
    const char *nl = x->tty ? "\n" : "";
    int finite = isfinite(loss) && isfinite(norm);
    if (!gd->on) {
        if (finite) return GUARD_OK;
        fprintf(stderr,
                "%s%s: step %d: loss is %g and gradient norm %g: training diverged "
                "(lower optimizer.lr or raise schedule.warmup)\n",
                nl, x->r.path, step + 1, loss, norm);
        return -1;
    }
    char why[256];
    int verdict = !finite                                        ? GUARD_NAN
                  : spike(x, step, loss, norm, why, sizeof(why)) ? GUARD_SPIKE
                                                                 : GUARD_OK;
    if (verdict == GUARD_OK) {
        g->loss[g->next] = loss, g->norm[g->next] = norm;
        g->next = (g->next + 1) % gd->window;
        if (g->n < gd->window) g->n++;
        g->bad = 0;
        return GUARD_OK;
    }
    if (verdict == GUARD_NAN) /* "nan", not "-nan" */
        snprintf(why, sizeof(why), "loss %g and gradient norm %g: not finite",
                 isnan(loss) ? NAN : loss, isnan(norm) ? NAN : norm);
    if (g->bad++ == 0) g->first_bad = step + 1;
    g->skipped++;
    g->last_loss = loss, g->last_norm = norm;
    if (x->rank == 0) { /* training goes on: the progress's stream */
        printf("%sguard: step %d: %s: update skipped\n", nl, step + 1, why);
        fflush(stdout);
    }
    return verdict;
}

/* The divergence line of streak g with nowhere to go back to: -1. */
static int diverged(run_ctx *x, const run_guard *g, int step, const char *reason) {
    double l = g->last_loss, n = g->last_norm;
    if (x->rank == 0)
        fprintf(stderr,
                "%s%s: steps %d-%d: %d bad steps in a row (step %d: loss is %g and gradient norm "
                "%g) and %s: training diverged (lower optimizer.lr or raise schedule.warmup)\n",
                x->tty ? "\n" : "", x->r.path, g->first_bad, step + 1, g->bad, step + 1,
                isnan(l) ? NAN : l, isnan(n) ? NAN : n, reason);
    return -1;
}

int run_guard_rollback(run_ctx *x, int step, int *to) {
    run_guard *g = &x->guard;
    const run_guard was = *g; /* the streak and the last target: the load brings back the
                                 checkpoint's guard state */
    char reason[TR_PATH_MAX + 1200];
    if (!x->ckw)
        return diverged(x, &was, step, "no checkpoints to roll back to (checkpoint_every 0)");
    /* the save in flight published (rank 0 publishes after every rank's part is written) */
    int failed = tr_ckpt_wait(x->ckw, x->err, sizeof(x->err));
    tr_comm_barrier(x->world);
    if (failed) {
        fprintf(stderr, "trainer run: rank %d: %s\n", x->rank, x->err);
        return -1;
    }
    tr_loader_pos pos = tr_loader_get_pos(x->loader); /* past the bad steps' batches */
    int c = 0, rc = run_load_checkpoint(x, was.first_bad, &c, x->err, sizeof(x->err));
    if (rc == -1)
        snprintf(reason, sizeof(reason), "no checkpoint from before step %d to roll back to (%s)",
                 was.first_bad, x->err);
    if (rc == -2) snprintf(reason, sizeof(reason), "another rank could not roll back");
    if (rc) return diverged(x, &was, step, reason);
    if (c == was.rolled_to) { /* the same trouble again before a newer save: no loop */
        snprintf(reason, sizeof(reason), "the run was rolled back to step %d before", c);
        return diverged(x, &was, step, reason);
    }
    if (tr_loader_set_pos(x->loader, pos, x->err, sizeof(x->err))) {
        fprintf(stderr, "trainer run: rank %d: %s\n", x->rank, x->err);
        return -1;
    }
    if (x->rank == 0) {
        printf("%sguard: %d bad steps in a row (%d-%d): rolled back to step %d and skipped the "
               "%d batches of steps %d-%d\n",
               x->tty ? "\n" : "", was.bad, was.first_bad, step + 1, c, step + 1 - c, c + 1,
               step + 1);
        fflush(stdout);
        if (tr_ckpt_remove_after(x->r.train.out, c, x->err, sizeof(x->err)))
            fprintf(stderr, "trainer run: %s\n", x->err), x->out_failed = 1;
        if (run_trim_metrics(x, c)) x->out_failed = 1;
    }
    tr_ledger_rollback(x->ledger, step + 1, c);
    g->rolled_to = c;
    g->bad = 0;
    g->rollbacks++;
    g->redone += step + 1 - c;
    *to = c;
    return 0;
}
