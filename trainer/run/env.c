/* `trainer run`'s environment switches, each parsed and checked once at setup: the tests'
 * fault injection (TR_FAULT_*), TR_LEDGER and TR_DP_SYNC_REFRESH. A malformed value is one line naming the
 * variable and what it must be, never silently ignored. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "trainer/run/run.h"

/* A fault-injection variable for tests: unset or empty leaves *a (and *b) alone; "N", or
 * "N:M" where b is given, sets them; anything else is -1 with the message in msg. */
/* One more ":N" at *end into *y (N >= 0); 0 when it is there and well formed. */
static int env_next(char **end, long *y) {
    const char *m = *end;
    if (*m != ':' || !m[1]) return -1;
    errno = 0;
    *y = strtol(m + 1, end, 10);
    return errno || *end == m + 1 || *y < 0 ? -1 : 0;
}

/* A test's fault variable: N, or with b RANK:MILLISECONDS, and with c an optional third
 * ":STEP" (c keeps its value when it is not given). */
static int env_count(const char *name, long *a, long *b, long *c, char *msg, size_t msglen) {
    const char *v = getenv(name);
    if (!v || !*v) return 0;
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10), y = 0, z = c ? *c : 0;
    int ok = !errno && end != v && x >= 0;
    if (ok && b) ok = !env_next(&end, &y);
    if (ok && c && *end) ok = !env_next(&end, &z);
    if (!ok || *end) {
        snprintf(msg, msglen, "trainer run: %s must be %s, got '%s'", name,
                 c ? "RANK:MILLISECONDS[:FROM_STEP]" : b ? "RANK:MILLISECONDS"
                                                          : "a non-negative integer", v);
        return -1;
    }
    *a = x;
    if (b) *b = y;
    if (c) *c = z;
    return 0;
}

/* TR_FAULT_NAN_STEP / TR_FAULT_SPIKE_STEP: unset or empty, or a list S[,S...] of steps >= 1
 * (at most RUN_FAULT_STEPS); anything else is -1 with the line in x->msg. */
static int fault_steps(run_ctx *x, const char *name, long *out) {
    const char *v = getenv(name), *p = v;
    memset(out, 0, RUN_FAULT_STEPS * sizeof(long));
    if (!v || !*v) return 0;
    for (int n = 0;; n++) {
        char *end;
        errno = 0;
        long s = strtol(p, &end, 10);
        if (n == RUN_FAULT_STEPS || errno || end == p || s < 1 || s > INT_MAX ||
            (*end && *end != ',')) {
            snprintf(x->msg, sizeof(x->msg),
                     "trainer run: %s must be a list of steps S[,S...] (each >= 1, at most %d), "
                     "got '%s'",
                     name, RUN_FAULT_STEPS, v);
            return -1;
        }
        out[n] = s;
        if (!*end) return 0;
        p = end + 1;
    }
}

int run_env_settings(run_ctx *x) {
    /* TR_FAULT_KILL_AFTER_STEP=S dies right after step S's save (TR_FAULT_KILL_RANK=R: only
       rank R); TR_FAULT_SLOW_RANK=R:MS[:S] makes rank R MS milliseconds slower every step
       (from step S on, counted from 1); TR_FAULT_NAN_STEP, TR_FAULT_SPIKE_STEP and
       TR_FAULT_LOSS_SPIKE_STEP list the steps the guard's tests break (trainer/run/guard.c) */
    long kill_r = -1, slow_r = -1;
    x->kill_step = -1;
    const char *kill_rank = getenv("TR_FAULT_KILL_RANK"), *ledger = getenv("TR_LEDGER");
    if (env_count("TR_FAULT_KILL_AFTER_STEP", &x->kill_step, NULL, NULL, x->msg,
                  sizeof(x->msg)) ||
        env_count("TR_FAULT_KILL_RANK", &kill_r, NULL, NULL, x->msg, sizeof(x->msg)) ||
        env_count("TR_FAULT_SLOW_RANK", &slow_r, &x->slow_ms, &x->slow_from, x->msg,
                  sizeof(x->msg)) ||
        fault_steps(x, "TR_FAULT_NAN_STEP", x->fault_nan) ||
        fault_steps(x, "TR_FAULT_SPIKE_STEP", x->fault_spike) ||
        fault_steps(x, "TR_FAULT_LOSS_SPIKE_STEP", x->fault_loss))
        return -1;
    /* TR_LEDGER=off (benchmarks: the baseline) writes no ledger files */
    if (ledger && *ledger && strcmp(ledger, "on") && strcmp(ledger, "off")) {
        snprintf(x->msg, sizeof(x->msg), "trainer run: TR_LEDGER must be on or off, got '%s'",
                 ledger);
        return -1;
    }
    x->ledger_off = ledger && !strcmp(ledger, "off");
    /* TR_DP_SYNC_REFRESH=1 (benchmarks: the baseline) completes ZeRO-1/2's parameter refresh
       right after the update instead of during the next forward */
    const char *sync = getenv("TR_DP_SYNC_REFRESH");
    if (sync && *sync && strcmp(sync, "0") && strcmp(sync, "1")) {
        snprintf(x->msg, sizeof(x->msg), "trainer run: TR_DP_SYNC_REFRESH must be 0 or 1, got '%s'",
                 sync);
        return -1;
    }
    if (x->dp) tr_dp_set_sync_refresh(x->dp, sync && !strcmp(sync, "1"));
    x->kill_alone = kill_rank && *kill_rank;
    if (kill_r >= 0 && kill_r != x->rank) x->kill_step = -1;
    if (slow_r != x->rank) x->slow_ms = 0;
    return 0;
}
