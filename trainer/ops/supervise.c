/* `trainer supervise [options] -- COMMAND...`: runs a training command (a `trainer run`, or a
 * launcher such as mpirun that starts one), and when it fails relaunches it with --resume after
 * a backoff. It reads the run's own records (OUT/attempts.jsonl, OUT/metrics.jsonl) to name the
 * rank, host and step that failed, drops a host that failed twice from the host file, stops
 * when two attempts in a row fail the same way, and charges the lost work to the records
 * (README "Supervision"). The records' side is trainer/ops/supervise_records.c. */
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "parallel/comm/base.h"
#include "trainer/ops/spawn.h"
#include "trainer/ops/supervise.h"

static const char *help =
    "usage: trainer supervise [--restarts N] [--backoff S] [--grace S] [--hostfile FILE] --\n"
    "                         COMMAND...\n"
    "\n"
    "Run COMMAND (a `trainer run ...`, or a launcher that starts one: mpirun ... trainer run\n"
    "...) in a process group of its own, passing SIGINT, SIGTERM, SIGHUP and SIGUSR1 on to it\n"
    "(a run saves a checkpoint and stops on SIGINT, SIGTERM and SIGUSR1). When it exits\n"
    "with a non-zero status, read the run's attempts.jsonl and metrics.jsonl (in the run\n"
    "command's --out, else the recipe's train.out) to name the rank, host and step that\n"
    "failed, wait, and run it again with --resume added to its `trainer run` part (training\n"
    "from step 0 when nothing was saved yet). Each relaunch is written to attempts.jsonl as a\n"
    "\"supervisor\" line (seconds down, steps redone, the cause, the action); at the end the\n"
    "goodput: the share of the wall time spent on the training steps the run kept.\n"
    "\n"
    "  --restarts N   relaunch at most N times (default 10)\n"
    "  --backoff S    seconds to wait before the first relaunch, doubled for each next one,\n"
    "                 at most 300 (default 5; 0 relaunches at once)\n"
    "  --grace S      seconds the command has to end once a rank of the run announced that\n"
    "                 it gives up on the job (a \"failed\" line in attempts.jsonl: a peer dead,\n"
    "                 stuck or cut off); then its process group gets SIGTERM, and SIGKILL 5 s\n"
    "                 later (default 30): a launcher that cannot reach a lost host's daemon\n"
    "                 would otherwise hang\n"
    "  --hostfile F   the job's host file (Open MPI's format: `host slots=N` lines; every\n"
    "                 line needs its slots=, which Open MPI would otherwise take as the\n"
    "                 host's core count): a host on which ranks failed twice is removed:\n"
    "                 OUT/supervise.hostfile (the hosts left) replaces the value of every\n"
    "                 --hostfile, -hostfile, --machinefile and -machinefile argument of\n"
    "                 COMMAND, and -np, --np, -n or -c is lowered to their slots (each flag\n"
    "                 as `-flag VALUE` or `-flag=VALUE`; a --dp in the command is scaled\n"
    "                 with it, or the supervisor gives up saying why)\n"
    "Its own flags may also be written --restarts=N, --backoff=S, --grace=S, --hostfile=F.\n"
    "\n"
    "It gives up (exit 1, with a paragraph saying what failed where) when two attempts in a\n"
    "row fail the same way (the same rank, exit status and last step: a crash that a relaunch\n"
    "repeats), after N relaunches, or when no host is left; exit 2 for a mistake in its own\n"
    "flags or the command, 128+SIG when it was itself stopped by a signal. A run that stopped\n"
    "because it was asked to (a signal sent to it alone: its attempts.jsonl has a \"stop\"\n"
    "line) is not relaunched either: the supervisor exits with the run's 128+SIG.\n"
    "A command that exits 0 succeeded only if it trained: a `trainer run` started in the\n"
    "run folder after the launch (attempts.jsonl) and the folder's records reach the\n"
    "recipe's last step; else the supervisor says what the folder shows and exits 1.\n";

/* ---- the command line ------------------------------------------------------------------- */

TR_PRINTF(1, 2) static int usage_error(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "trainer supervise: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, " (see trainer supervise --help)\n");
    va_end(ap);
    return -1;
}

/* The supervisor's own flags, up to "--" (each as `--flag VALUE` or `--flag=VALUE`); the
 * command after it. 1 for --help. */
static int parse_flags(sv_run *s, int argc, char **argv, int *cmd_at) {
    static const char *const takes[] = {"--restarts", "--backoff", "--hostfile", "--grace", NULL};
    s->restarts = 10, s->backoff = 5, s->grace = 30;
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i], *v = NULL, *eq = strchr(a, '=');
        char *end = NULL;
        if (!strcmp(a, "--")) {
            *cmd_at = i + 1;
            return i + 1 < argc ? 0 : usage_error("no command after '--'");
        }
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) return 1;
        int k = 0;
        size_t len = eq && a[0] == '-' ? (size_t)(eq - a) : strlen(a);
        while (takes[k] && (strlen(takes[k]) != len || strncmp(a, takes[k], len)))
            k++;
        if (!takes[k]) {
            if (a[0] == '-') return usage_error("unknown option '%.*s'", (int)len, a);
            return usage_error("'%s': the command goes after '--' (trainer supervise [options] "
                               "-- COMMAND...)",
                               a);
        }
        if (a[len] == '=')
            v = a + len + 1;
        else if (i + 1 < argc)
            v = argv[++i];
        if (!v) return usage_error("%s needs a value", takes[k]);
        if (k == 2) {
            if (!*v) return usage_error("--hostfile needs a file, got ''");
            s->hostfile = v;
        } else if (k == 0) {
            long n = strtol(v, &end, 10);
            if (!*v || *end || n < 0 || n > 1000000)
                return usage_error("--restarts needs a non-negative integer, got '%s'", v);
            s->restarts = (int)n;
        } else {
            double b = strtod(v, &end);
            if (!*v || *end || !(b >= 0 && b <= 86400))
                return usage_error("%s needs seconds from 0 to 86400, got '%s'", takes[k], v);
            *(k == 1 ? &s->backoff : &s->grace) = b;
        }
    }
    return usage_error("no command: put it after '--'");
}

/* Where the command runs `trainer run`: the index of "run" right after an argument whose file
 * name starts with "trainer"; -1 when there is none. */
static int find_run(char **cmd, int n) {
    for (int i = 1; i < n; i++) {
        const char *prog = strrchr(cmd[i - 1], '/');
        prog = prog ? prog + 1 : cmd[i - 1];
        if (!strcmp(cmd[i], "run") && !strncmp(prog, "trainer", 7)) return i;
    }
    return -1;
}

/* The run folder: the command's --out, else the recipe's train.out, read by `trainer run`'s
 * own option parser and recipe loader with the command's flags. */
static int find_out(sv_run *s) {
    tr_options o;
    char msg[1024];
    int rc = tr_parse_options_msg(&o, "run", s->n, s->cmd, s->run_at + 1, msg, sizeof(msg));
    if (rc) {
        fprintf(stderr, "trainer supervise: the command's %s\n",
                rc > 0 ? "trainer run asks for --help: nothing to supervise" : msg);
        return -1;
    }
    tr_recipe r;
    if (tr_load_recipe_msg(&r, &o, "run", msg, sizeof(msg))) {
        fprintf(stderr, "trainer supervise: the command's recipe: %s\n", msg);
        return -1;
    }
    snprintf(s->out, sizeof(s->out), "%s", r.train.out);
    s->steps = r.train.steps;
    tr_recipe_free(&r);
    return 0;
}

/* The command as an editable array of its own strings (NULL-terminated, room for --resume). */
static int copy_command(sv_run *s, int argc, char **argv, int at) {
    s->n = argc - at;
    s->cmd = calloc((size_t)s->n + 2, sizeof(char *));
    if (!s->cmd) return -1;
    for (int i = 0; i < s->n; i++)
        if (!(s->cmd[i] = strdup(argv[at + i]))) return -1;
    return 0;
}

static void free_command(sv_run *s) {
    for (int i = 0; s->cmd && i < s->n; i++)
        free(s->cmd[i]);
    free(s->cmd);
    free(s->hosts);
}

/* --resume added to the `trainer run` part, once; an --overwrite there goes (the relaunch
 * continues the run the first launch replaced the folder's with). */
static int add_resume(sv_run *s) {
    for (int i = s->run_at + 1; i < s->n; i++)
        if (!strcmp(s->cmd[i], "--overwrite")) {
            free(s->cmd[i]);
            memmove(s->cmd + i, s->cmd + i + 1, (size_t)(s->n - i) * sizeof(char *));
            s->n--;
            break;
        }
    for (int i = s->run_at + 1; i < s->n; i++)
        if (!strcmp(s->cmd[i], "--resume")) return 0;
    char *r = strdup("--resume");
    if (!r) return -1;
    memmove(s->cmd + s->run_at + 2, s->cmd + s->run_at + 1,
            (size_t)(s->n - s->run_at - 1) * sizeof(char *));
    s->cmd[s->run_at + 1] = r;
    s->cmd[++s->n] = NULL;
    return 0;
}

/* ---- running the command ------------------------------------------------------------------ */

/* While the command runs: the ranks' reports that they gave up are collected, and once a rank
 * announced that it gives up on the job (sv_abort_announced), the launcher has --grace seconds
 * to end it; a launcher that cannot (mpirun waiting on a host it can no longer reach) gets
 * SIGTERM, its group SIGKILL 5 s later, so that a relaunch can follow. */
typedef struct {
    sv_run *s;
    double t_launch, next_look, t_abort;
    int sent;
} sv_watch;

static void watch(void *ctx, pid_t pid) {
    sv_watch *w = ctx;
    double now = tr_ledger_unix_now();
    tr_witness_collect(w->s->witness, sv_heard, w->s);
    if (!w->t_abort && now >= w->next_look) { /* counted from when seen here: the rank's clock
                                                 may be another host's */
        if (sv_abort_announced(w->s, w->t_launch) > 0) w->t_abort = now;
        w->next_look = now + 0.5;
    }
    if (w->t_abort && w->sent == 0 && now > w->t_abort + w->s->grace) {
        printf("supervise: a rank gave up on the job %.0f s ago and the launcher has not "
               "ended it: ending its process group (--grace %g)\n",
               now - w->t_abort, w->s->grace);
        fflush(stdout);
        kill(-pid, SIGTERM);
        w->sent = 1;
    } else if (w->sent == 1 && now > w->t_abort + w->s->grace + 5) {
        kill(-pid, SIGKILL);
        w->sent = 2;
    }
}

/* The command's wait status, or -1 when it could not be started. */
static int launch(sv_run *s, double t_launch) {
    sv_watch w = {.s = s, .t_launch = t_launch};
    int status = tr_spawn(s->cmd, NULL, NULL, watch, &w, "trainer supervise");
    tr_witness_collect(s->witness, sv_heard, s); /* the reports of its last moments */
    return status;
}

/* The witness (witness.h): OUT made if need be, and the supervisor's addresses written there. */
static void listen_for_ranks(sv_run *s) {
    char err[TR_PATH_MAX + 128];
    if (!tr_mkdirs(s->out, err, sizeof(err)))
        s->witness = tr_witness_listen(s->out, err, sizeof(err));
    if (!s->witness)
        printf("supervise: %s: where a cut link's two sides blame each other, the records "
               "alone decide\n", err);
}

/* ---- the loop ------------------------------------------------------------------------------ */

static int same_failure(const sv_attempt *a, const sv_attempt *b) {
    return a->status == b->status && a->rank == b->rank && a->last_step == b->last_step &&
           !strcmp(a->host, b->host);
}

/* What to do after failed attempt a (prev: the one before, or NULL); *action and the summary
 * in why when giving up. 0: relaunch, 1: give up. */
static int decide(sv_run *s, const sv_attempt *a, const sv_attempt *prev, char *action, size_t alen,
                  char *why, size_t wlen) {
    snprintf(action, alen, "relaunch");
    if (prev && same_failure(a, prev)) {
        snprintf(why, wlen,
                 "two attempts in a row failed the same way, at the same step: a "
                 "relaunch repeats the crash");
        snprintf(action, alen, "give up");
        return 1;
    }
    if (s->relaunches >= s->restarts) {
        snprintf(why, wlen, "%d relaunch%s (--restarts) used up", s->restarts,
                 s->restarts == 1 ? "" : "es");
        snprintf(action, alen, "give up");
        return 1;
    }
    int h = a->host[0] ? sv_host_find(s, a->host) : -1;
    if (h < 0 || ++s->hosts[h].fails < 2) return 0;
    if (sv_drop_host(s, h, why, wlen)) {
        snprintf(action, alen, "give up");
        return 1;
    }
    snprintf(action, alen, "drop host %s", a->host);
    return 0;
}

/* One line on stdout for a failed attempt: what failed, where, at which step. */
static void say_failure(const sv_attempt *a, int resume_step) {
    char st[64], who[160];
    tr_spawn_describe(a->status, st, sizeof(st));
    if (a->rank >= 0)
        snprintf(who, sizeof(who), "rank %d on %s failed%s", a->rank,
                 a->host[0] ? a->host : "an unknown host",
                 a->others_stopped ? " (the launcher "
                                     "stopped the others)"
                                   : "");
    else
        snprintf(who, sizeof(who), "which rank failed is not known");
    printf("supervise: attempt %d ended with %s after step %d: %s%s%s; %d step(s) since the "
           "checkpoint of step %d\n",
           a->attempt, st, a->last_step, who, a->why[0] ? ": " : "", a->why,
           a->last_step > resume_step ? a->last_step - resume_step : 0, resume_step);
    fflush(stdout);
}

/* The paragraph that ends a run the supervisor gave up on. */
static void say_give_up(const sv_run *s, const sv_attempt *a, const char *why) {
    char st[64];
    tr_spawn_describe(a->status, st, sizeof(st));
    printf("supervise: gave up after %d attempt(s) and %d relaunch(es): %s. The last attempt "
           "ended with %s after step %d of %d",
           s->launches, s->relaunches, why, st, a->last_step, s->steps);
    if (a->rank >= 0)
        printf(", rank %d on %s failing", a->rank, a->host[0] ? a->host : "an unknown host");
    if (a->why[0]) printf(" (%s)", a->why);
    printf("; %d step(s) were redone in all and the run was down %.1f s. Its records are in "
           "%s/attempts.jsonl; fix the cause, then run the same command again with --resume.\n",
           s->redone, s->down_s, s->out);
}

/* An attempt that stopped on request (a signal to the run, not to the supervisor: Slurm's
 * --signal, a scheduler's preemption) is not a failure, and a relaunch would go against the
 * request: the supervisor stops too, with the run's status, 128 + the signal. */
static int say_stopped(const sv_attempt *a) {
    int sig = !strcmp(a->stop, "SIGINT") ? SIGINT : !strcmp(a->stop, "SIGUSR1") ? SIGUSR1 : SIGTERM;
    printf("supervise: attempt %d was asked to stop by %s after step %d and ", a->attempt, a->stop,
           a->last_step);
    if (a->stop_ckpt[0])
        printf("saved checkpoint %s: not relaunched; the same command with --resume goes on\n",
               a->stop_ckpt);
    else
        printf("saved nothing: not relaunched\n");
    return 128 + sig;
}

/* The command exited 0: a success only when a `trainer run` started in the run folder after
 * the launch and its records reach the recipe's last step (a command that exits 0 without
 * training, or a run that ended early, is not one). 0, or 1 after one line. */
static int trained(sv_run *s, double t_launch) {
    sv_attempt a;
    sv_read_attempt(s, 0, t_launch, &a);
    if (a.started && a.last_step >= s->steps) {
        sv_finish(s);
        return 0;
    }
    if (!a.started)
        fprintf(stderr,
                "trainer supervise: the command exited 0, but no `trainer run` started in %s "
                "(its attempts.jsonl has no start since the launch): nothing was trained\n",
                s->out);
    else
        fprintf(stderr,
                "trainer supervise: the command exited 0, but %s records step %d of the "
                "recipe's %d: the run did not finish\n",
                s->out, a.last_step, s->steps);
    return 1;
}

/* Relaunches until the command succeeds or the supervisor gives up: the exit status. */
static int supervise(sv_run *s) {
    sv_attempt prev = {0}, a;
    int have_prev = 0;
    for (;;) {
        double t_launch = tr_ledger_unix_now();
        int status = launch(s, t_launch);
        s->launches++;
        if (status < 0) return 1;
        int sig = tr_spawn_signal();
        if (sig) {
            printf("supervise: stopped by %s (passed on to the command)\n", tr_signal_name(sig));
            return 128 + sig;
        }
        if (status == 0) return trained(s, t_launch);
        sv_read_attempt(s, status, t_launch, &a);
        if (a.stop[0]) return say_stopped(&a);
        int resume_step = sv_checkpoint_step(s);
        say_failure(&a, resume_step);
        if (s->steps > 0 && resume_step >= s->steps) { /* killed after its last save */
            printf("supervise: the checkpoint of the run's last step (%d) is saved: the training "
                   "is complete (what comes after it, the end-of-run summary and sample, was "
                   "cut short); not relaunched\n",
                   resume_step);
            sv_finish(s);
            return 0;
        }
        char action[128], why[512] = "";
        int give_up =
            decide(s, &a, have_prev ? &prev : NULL, action, sizeof(action), why, sizeof(why));
        double wait = give_up ? 0 : s->backoff * pow(2.0, s->relaunches);
        if (wait > fmax(s->backoff, 300.0)) wait = fmax(s->backoff, 300.0);
        sv_write_event(s, &a, resume_step, wait, action);
        if (give_up) {
            say_give_up(s, &a, why);
            sv_goodput(s, 0);
            return 1;
        }
        printf("supervise: relaunch %d of %d in %.1f s, with --resume%s%s\n", s->relaunches + 1,
               s->restarts, wait, strncmp(action, "drop", 4) ? "" : ", after the ",
               strncmp(action, "drop", 4) ? "" : action);
        fflush(stdout);
        tr_spawn_sleep(wait);
        if (tr_spawn_signal()) return 128 + tr_spawn_signal();
        if (add_resume(s)) return 1;
        s->relaunches++;
        prev = a, have_prev = 1;
    }
}

int tr_cmd_supervise(int argc, char **argv) {
    sv_run *s = calloc(1, sizeof(*s));
    if (!s) return 1;
    int at = 0, rc = parse_flags(s, argc, argv, &at);
    if (rc) {
        if (rc > 0) fputs(help, stdout);
        free(s);
        return rc > 0 ? 0 : 2;
    }
    rc = 2;
    if (copy_command(s, argc, argv, at)) {
        fprintf(stderr, "trainer supervise: out of memory\n");
    } else if ((s->run_at = find_run(s->cmd, s->n)) < 0) {
        fprintf(stderr,
                "trainer supervise: the command runs no `trainer run` (it needs one, "
                "to add --resume to): %s\n",
                s->cmd[0]);
    } else if (!find_out(s) && !sv_read_hostfile(s)) {
        tr_spawn_handlers();
        s->t0 = tr_now();
        listen_for_ranks(s);
        rc = supervise(s);
        tr_witness_close(s->witness);
    }
    free(s->heard);
    free_command(s);
    free(s);
    return rc;
}
