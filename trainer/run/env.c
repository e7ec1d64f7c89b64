/* `trainer run`'s environment switches, each read and checked once, right after the ranks
 * connect, by parallel/comm/env.h's helpers, then only read from x: the tests' fault injection
 * (TR_FAULT_*), TR_LEDGER, TR_DP_SYNC_REFRESH, TR_DP_SYNC_REDUCE, TR_CKPT_SYNC and TR_DUMP_PARAMS
 * (and TR_HOSTNAME, kept by trainer/util.c, and TR_PLAN_MEMORY, by trainer/plan_memory.c). A
 * malformed value is one line naming the variable and what it must be, never silently ignored. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "parallel/comm/env.h"
#include "trainer/run/run.h"

/* One more ":N" at *end into *y (N >= 0); 0 when it is there and well formed. */
static int env_next(char **end, long *y) {
    const char *m = *end;
    if (*m != ':' || !m[1]) return -1;
    errno = 0;
    *y = strtol(m + 1, end, 10);
    return errno || *end == m + 1 || *y < 0 ? -1 : 0;
}

/* TR_FAULT_SLOW_RANK: RANK:MILLISECONDS with an optional third ":STEP" (*c keeps its value
 * when it is not given); unset or empty leaves them alone. -1 with the line in msg. */
static int env_slow(const char *name, long *a, long *b, long *c, char *msg, size_t msglen) {
    const char *v = getenv(name);
    if (!v || !*v) return 0;
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10), y = 0, z = *c;
    int ok = !errno && end != v && x >= 0 && !env_next(&end, &y);
    if (ok && *end) ok = !env_next(&end, &z);
    if (!ok || *end) return tr_env_bad(name, "RANK:MILLISECONDS[:FROM_STEP]", v, msg, msglen);
    *a = x, *b = y, *c = z;
    return 0;
}

/* TR_FAULT_NAN_STEP / TR_FAULT_SPIKE_STEP: unset or empty, or a list S[,S...] of steps >= 1
 * (at most RUN_FAULT_STEPS); anything else is -1 with the line in msg. */
static int fault_steps(const char *name, long *out, char *msg, size_t msglen) {
    const char *v = getenv(name), *p = v;
    memset(out, 0, RUN_FAULT_STEPS * sizeof(long));
    if (!v || !*v) return 0;
    for (int n = 0;; n++) {
        char *end;
        errno = 0;
        long s = strtol(p, &end, 10);
        if (n == RUN_FAULT_STEPS || errno || end == p || s < 1 || s > INT_MAX ||
            (*end && *end != ',')) {
            char what[96];
            snprintf(what, sizeof what, "a list of steps S[,S...] (each >= 1, at most %d)",
                     RUN_FAULT_STEPS);
            return tr_env_bad(name, what, v, msg, msglen);
        }
        out[n] = s;
        if (!*end) return 0;
        p = end + 1;
    }
}

/* TR_DUMP_PARAMS=FILE: rank 0 writes it after training, so its folder must be there now. */
static int dump_params_path(run_ctx *x, char *msg, size_t msglen) {
    const char *v = getenv("TR_DUMP_PARAMS");
    x->dump_params = v && *v ? v : NULL;
    if (!x->dump_params || x->rank != 0) return 0;
    char dir[TR_PATH_MAX];
    snprintf(dir, sizeof dir, "%s", v);
    char *slash = strrchr(dir, '/');
    if (!slash) snprintf(dir, sizeof dir, ".");
    else if (slash == dir) dir[1] = 0;
    else *slash = 0;
    struct stat st;
    if (stat(dir, &st) || !S_ISDIR(st.st_mode) || access(dir, W_OK))
        return tr_env_bad("TR_DUMP_PARAMS", "a file in a writable folder", v, msg, msglen);
    return 0;
}

/* The flags' and the fault lists' variables (see run_env_settings). */
static int fault_settings(run_ctx *x, char *m, size_t ml) {
    /* TR_FAULT_KILL_AFTER_STEP=S dies right after step S's save (TR_FAULT_KILL_RANK=R: only
       rank R); TR_FAULT_SLOW_RANK=R:MS[:S] makes rank R MS milliseconds slower every step
       (from step S on, counted from 1); TR_FAULT_NAN_STEP, TR_FAULT_SPIKE_STEP and
       TR_FAULT_LOSS_SPIKE_STEP list the steps the guard's tests break (trainer/run/guard.c);
       TR_FAULT_SAVE_BYTES=N aborts after N bytes of checkpoint writes, TR_FAULT_SAVE_HANG=1
       makes the checkpoint writer's first write never return */
    long kill_r = -1, slow_r = -1, bytes = 0;
    x->kill_step = -1;
    int kill_alone = tr_env_int("TR_FAULT_KILL_RANK", 0, INT_MAX, &kill_r, m, ml);
    if (tr_env_int("TR_FAULT_KILL_AFTER_STEP", 0, INT_MAX, &x->kill_step, m, ml) < 0 ||
        kill_alone < 0 || env_slow("TR_FAULT_SLOW_RANK", &slow_r, &x->slow_ms, &x->slow_from, m, ml) ||
        fault_steps("TR_FAULT_NAN_STEP", x->fault_nan, m, ml) ||
        fault_steps("TR_FAULT_SPIKE_STEP", x->fault_spike, m, ml) ||
        fault_steps("TR_FAULT_LOSS_SPIKE_STEP", x->fault_loss, m, ml) ||
        tr_env_int("TR_FAULT_SAVE_BYTES", 1, LONG_MAX, &bytes, m, ml) < 0 ||
        tr_env_bool("TR_FAULT_SAVE_HANG", &x->fault_save_hang, m, ml) < 0)
        return -1;
    x->fault_save_bytes = bytes;
    x->kill_alone = kill_alone > 0;
    if (kill_r >= 0 && kill_r != x->rank) x->kill_step = -1;
    if (slow_r != x->rank) x->slow_ms = 0;
    return 0;
}

int run_env_settings(run_ctx *x) {
    char m[TR_PATH_MAX + 200];
    size_t ml = sizeof m;
    static const char *const on_off[] = {"on", "off", NULL};
    int ledger = 0;
    x->fault_save_hang = x->dp_sync_refresh = x->dp_sync_reduce = x->ckpt_sync = 0;
    /* TR_LEDGER=off (benchmarks: the baseline) writes no ledger files; TR_DP_SYNC_REFRESH=1
       (benchmarks: the baseline) completes ZeRO-1/2's parameter refresh right after the
       update instead of during the next forward; TR_DP_SYNC_REDUCE=1 (the baseline of
       bench/wire_overlap.sh) completes each gradient bucket's reduction as it starts;
       TR_CKPT_SYNC=1 (benchmarks) saves synchronously */
    if (fault_settings(x, m, ml) || tr_env_word("TR_LEDGER", on_off, &ledger, m, ml) < 0 ||
        tr_env_bool("TR_DP_SYNC_REFRESH", &x->dp_sync_refresh, m, ml) < 0 ||
        tr_env_bool("TR_DP_SYNC_REDUCE", &x->dp_sync_reduce, m, ml) < 0 ||
        tr_env_bool("TR_CKPT_SYNC", &x->ckpt_sync, m, ml) < 0 || dump_params_path(x, m, ml) ||
        tr_hostname_init(m, ml) || tr_plan_memory_dir(x->memory_dir, sizeof x->memory_dir, m, ml)) {
        snprintf(x->msg, sizeof(x->msg), "trainer run: %s", m);
        return -1;
    }
    x->ledger_off = ledger == 1;
    return 0;
}
