/* `trainer supervise`, its reading of the run: which attempt failed where (OUT/attempts.jsonl,
 * written by trainer/report/ledger.c; OUT/metrics.jsonl), the lost work and goodput it writes back,
 * and the host file whose failing hosts it drops. */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/json.h"
#include "parallel/comm/base.h"
#include "trainer/checkpoint/checkpoint.h"
#include "trainer/ops/supervise.h"

/* ---- reading the JSONL records ----------------------------------------------------------- */

/* Calls fn on every line of OUT/name that is a JSON object (a line cut short by a kill, or
 * anything else that does not parse, is passed over). */
typedef void (*line_fn)(void *ctx, const tr_json *obj);
static void each_line(const sv_run *s, const char *name, line_fn fn, void *ctx) {
    char path[TR_PATH_MAX + 32], err[200];
    snprintf(path, sizeof(path), "%s/%s", s->out, name);
    FILE *f = fopen(path, "r");
    if (!f) return;
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    while ((len = getline(&line, &cap, f)) > 0) {
        tr_json j;
        if (tr_json_parse(&j, line, (size_t)len, err, sizeof(err))) continue;
        if (j.type == TR_JSON_OBJ) fn(ctx, &j);
        tr_json_free(&j);
    }
    free(line);
    fclose(f);
}

static double num(const tr_json *o, const char *key, double dflt) {
    const tr_json *v = tr_json_get(o, key);
    return v && v->type == TR_JSON_NUM ? v->num : dflt;
}

static const char *str(const tr_json *o, const char *key) {
    const tr_json *v = tr_json_get(o, key);
    return v && v->type == TR_JSON_STR ? v->str : NULL;
}

static int is_event(const tr_json *o, const char *ev) {
    const char *e = str(o, "event");
    return e && !strcmp(e, ev);
}

static void count_start(void *ctx, const tr_json *o) {
    if (is_event(o, "start")) ++*(int *)ctx;
}

int sv_count_starts(const sv_run *s) {
    int n = 0;
    each_line(s, "attempts.jsonl", count_start, &n);
    return n;
}

typedef struct {
    double since, first; /* lines from `since` on; the first "failed" one's t (0: none) */
} abort_scan;

static void scan_abort(void *ctx, const tr_json *o) {
    abort_scan *c = ctx;
    double t = num(o, "t", 0);
    if (is_event(o, "failed") && t >= c->since && (!c->first || t < c->first)) c->first = t;
}

double sv_abort_announced(const sv_run *s, double since) {
    abort_scan c = {since, 0};
    each_line(s, "attempts.jsonl", scan_abort, &c);
    return c.first;
}

int sv_checkpoint_step(const sv_run *s) {
    long *steps;
    int n = tr_ckpt_steps(s->out, &steps), step = n > 0 ? (int)steps[0] : 0;
    free(steps);
    return step;
}

/* ---- one attempt ------------------------------------------------------------------------ */

/* A "failed" line: who gave up, whom it blamed, when, and whether it reached the supervisor. */
typedef struct {
    int rank, blamed, heard;
    double t;
    char host[SV_HOST_LEN], why[256];
} failed_line;

typedef struct {
    sv_attempt *a;
    const sv_run *s;
    failed_line *failed;
    int n_failed, cap_failed;
    int ranks, n_stopped;
    char *stopped; /* per rank: wrote a stopped line */
    char (*hosts)[SV_HOST_LEN];
    double t_start; /* of the last start line */
    int last_start; /* its attempt number */
} attempt_scan;

/* attempts.jsonl: the last start line. The launch got through its setup when that line is its
 * own: written by a process that started after the launch (a second of slack for the clocks of
 * other hosts; sv_read_attempt). */
static void scan_last_start(void *ctx, const tr_json *o) {
    attempt_scan *c = ctx;
    if (!is_event(o, "start")) return;
    c->last_start = (int)num(o, "attempt", 0);
    c->t_start = num(o, "t", 0);
}

static void scan_start(attempt_scan *c, const tr_json *o) {
    const tr_json *h = tr_json_get(o, "hosts");
    c->a->start_step = (int)num(o, "start_step", 0);
    if (c->a->start_step > c->a->last_step) c->a->last_step = c->a->start_step;
    c->ranks = (int)num(o, "ranks", 0);
    if (c->ranks < 1 || c->ranks > 1 << 20) c->ranks = 0;
    free(c->stopped), free(c->hosts);
    c->stopped = calloc((size_t)c->ranks + 1, 1);
    c->hosts = calloc((size_t)c->ranks + 1, SV_HOST_LEN);
    for (int k = 0; h && h->type == TR_JSON_ARR && c->hosts && k < h->n && k < c->ranks; k++)
        if (h->kids[k].type == TR_JSON_STR)
            snprintf(c->hosts[k], SV_HOST_LEN, "%s", h->kids[k].str);
}

static int was_heard(const sv_run *s, int attempt, int rank) {
    for (int k = 0; k < s->nheard; k++)
        if (s->heard[2 * k] == attempt && s->heard[2 * k + 1] == rank) return 1;
    return 0;
}

static void add_failed(attempt_scan *c, const tr_json *o) {
    if (c->n_failed == c->cap_failed) {
        int cap = c->cap_failed ? 2 * c->cap_failed : 8;
        failed_line *f = realloc(c->failed, (size_t)cap * sizeof(*f));
        if (!f) return;
        c->failed = f, c->cap_failed = cap;
    }
    failed_line *f = &c->failed[c->n_failed++];
    const char *h = str(o, "failed_host"), *why = str(o, "why");
    f->rank = (int)num(o, "rank", -1);
    f->blamed = (int)num(o, "failed_rank", -1);
    f->heard = was_heard(c->s, c->a->attempt, f->rank);
    f->t = num(o, "t", 0);
    snprintf(f->host, sizeof(f->host), "%s", h ? h : "");
    snprintf(f->why, sizeof(f->why), "%s", why ? why : "");
}

/* How many of the failed lines blame f's host (f's rank when the hosts are not known). */
static int votes(const attempt_scan *c, const failed_line *f) {
    int v = 0;
    for (int k = 0; k < c->n_failed; k++)
        v += f->host[0] ? !strcmp(c->failed[k].host, f->host) : c->failed[k].blamed == f->blamed;
    return v;
}

/* The cause among the failed lines: the ranks whose report reached the supervisor are still
 * connected, and when a link is cut both sides blame each other: a line heard wins; then the
 * host most lines blame; then the earliest line. */
static void choose_failed(attempt_scan *c) {
    const failed_line *best = NULL;
    int best_v = 0;
    for (int k = 0; k < c->n_failed; k++) {
        const failed_line *f = &c->failed[k];
        int v = votes(c, f);
        if (!best || f->heard > best->heard ||
            (f->heard == best->heard && (v > best_v || (v == best_v && f->t < best->t))))
            best = f, best_v = v;
    }
    if (!best) return;
    sv_attempt *a = c->a;
    a->rank = best->blamed;
    snprintf(a->host, sizeof(a->host), "%s", best->host);
    snprintf(a->why, sizeof(a->why), "%s", best->why);
    for (int k = 0; k < c->n_failed; k++)
        if (c->failed[k].heard && !strcmp(c->failed[k].host, best->host) &&
            a->n_witnesses < (int)(sizeof(a->witnesses) / sizeof(a->witnesses[0])))
            a->witnesses[a->n_witnesses++] = c->failed[k].rank;
}

void sv_heard(void *ctx, int attempt, int rank) {
    sv_run *s = ctx;
    if (was_heard(s, attempt, rank)) return;
    if (s->nheard == s->heard_cap) {
        int cap = s->heard_cap ? 2 * s->heard_cap : 16;
        int *h = realloc(s->heard, (size_t)cap * 2 * sizeof(int));
        if (!h) return;
        s->heard = h, s->heard_cap = cap;
    }
    s->heard[2 * s->nheard] = attempt, s->heard[2 * s->nheard + 1] = rank;
    s->nheard++;
}

/* The lines of attempt a->attempt: its start (ranks, hosts), the ranks the launcher stopped,
 * the rank another one found dead or stuck, its end. */
static void scan_attempt_line(void *ctx, const tr_json *o) {
    attempt_scan *c = ctx;
    sv_attempt *a = c->a;
    if ((int)num(o, "attempt", -1) != a->attempt) return;
    if (is_event(o, "start")) scan_start(c, o);
    int last = (int)num(o, "last_step", -1), rank = (int)num(o, "rank", -1);
    if (last > a->last_step) a->last_step = last;
    if (is_event(o, "stopped") && rank >= 0 && rank < c->ranks && c->stopped && !c->stopped[rank]) {
        c->stopped[rank] = 1;
        c->n_stopped++;
    } else if (is_event(o, "failed") && num(o, "failed_rank", -1) >= 0) {
        add_failed(c, o);
    } else if (is_event(o, "stop")) {
        const char *sig = str(o, "signal"), *ck = str(o, "checkpoint");
        snprintf(a->stop, sizeof(a->stop), "%s", sig ? sig : "a signal");
        snprintf(a->stop_ckpt, sizeof(a->stop_ckpt), "%s", ck ? ck : "");
    } else if (is_event(o, "end")) {
        snprintf(a->why, sizeof(a->why), "the run ended itself with status %d",
                 (int)num(o, "status", -1));
    }
}

/* metrics.jsonl: the attempt's last step and the time of its last record. */
static void scan_metrics_line(void *ctx, const tr_json *o) {
    attempt_scan *c = ctx;
    if ((int)num(o, "attempt", -1) != c->a->attempt) return;
    int step = (int)num(o, "step", -1);
    if (step > c->a->last_step) c->a->last_step = step;
    double t = num(o, "time", 0);
    if (t > c->a->t_last) c->a->t_last = t;
}

/* The rank that failed when the launcher stopped the others (some ranks wrote a "stopped"
 * line): the first rank of the one host none of whose ranks wrote one, where every other host
 * has a rank that did (the host that died took its ranks with it; a rank elsewhere may die
 * too before the launcher stops it, of its lost connections to that host). Else (no host
 * names, or no host wholly silent): the only silent rank, if one is. -1 when neither names
 * one, or two hosts are silent. */
static int silent_host(const attempt_scan *c) {
    int found = -1, n_silent = 0, only = -1;
    for (int k = 0; k < c->ranks; k++)
        if (!c->stopped[k]) n_silent++, only = only < 0 ? k : only;
    for (int k = 0; c->hosts && k < c->ranks; k++) { /* k: a host's first rank */
        const char *h = c->hosts[k];
        int first = 1, all_silent = 1;
        for (int j = 0; j < c->ranks; j++)
            if (!strcmp(c->hosts[j], h)) {
                first &= j >= k;
                all_silent &= !c->stopped[j];
            }
        if (!first || !*h || !all_silent) continue;
        if (found >= 0) return -1; /* two silent hosts: which failed is not known */
        found = k;
    }
    return found >= 0 || n_silent != 1 ? found : only;
}

void sv_read_attempt(sv_run *s, int status, double t_launch, sv_attempt *a) {
    memset(a, 0, sizeof(*a));
    a->status = status, a->rank = -1, a->last_step = -1;
    attempt_scan c = {.a = a, .s = s};
    each_line(s, "attempts.jsonl", scan_last_start, &c);
    a->started = c.last_start > 0 && c.t_start >= t_launch - 1.0;
    a->attempt = c.last_start + !a->started; /* else the number it would have had */
    if (a->started) {
        each_line(s, "attempts.jsonl", scan_attempt_line, &c);
        each_line(s, "metrics.jsonl", scan_metrics_line, &c);
        choose_failed(&c);
    } else {
        a->last_step = a->start_step = sv_checkpoint_step(s);
        c.t_start = t_launch;
        snprintf(a->why, sizeof(a->why),
                 "it stopped before its first step (its own output "
                 "says why)");
    }
    if (a->rank < 0 && c.ranks > 1 && c.n_stopped > 0 && c.n_stopped < c.ranks) {
        a->rank = silent_host(&c);
        a->others_stopped = a->rank >= 0;
    }
    if (a->rank >= 0 && a->rank < c.ranks && c.hosts && c.hosts[a->rank][0])
        snprintf(a->host, sizeof(a->host), "%s", c.hosts[a->rank]);
    if (a->t_last <= 0) a->t_last = c.t_start;
    free(c.stopped), free(c.hosts), free(c.failed);
}

/* ---- what the supervisor writes ---------------------------------------------------------- */

static FILE *open_attempts(const sv_run *s) {
    char path[TR_PATH_MAX + 32];
    snprintf(path, sizeof(path), "%s/attempts.jsonl", s->out);
    char err[TR_PATH_MAX + 128];
    /* an attempt that died before its rank 0 made OUT (a failed set-up removes what it made):
       the records start the run folder, so that the relaunch resumes into it */
    if (tr_mkdirs(s->out, err, sizeof(err)))
        fprintf(stderr, "trainer supervise: %s\n", err);
    else if (tr_jsonl_repair(path, stdout, err, sizeof(err))) /* a run killed in a write */
        fprintf(stderr, "trainer supervise: %s\n", err);
    FILE *f = fopen(path, "a");
    if (!f)
        fprintf(stderr, "trainer supervise: cannot write '%s': %s (the relaunch goes on)\n", path,
                strerror(errno));
    return f;
}

void sv_write_event(sv_run *s, const sv_attempt *a, int resume_step, double wait,
                    const char *action) {
    double now = tr_ledger_unix_now(), down = now - a->t_last + wait;
    int redone = a->last_step > resume_step ? a->last_step - resume_step : 0;
    s->down_s += down;
    s->redone += redone;
    FILE *f = open_attempts(s);
    if (!f) return;
    char st[64];
    tr_spawn_describe(a->status, st, sizeof(st));
    fprintf(f,
            "{\"event\": \"supervisor\", \"attempt\": %d, \"t\": %.3f, \"down_s\": ",
            a->attempt, now);
    tr_json_write_num(f, down, -3);
    fprintf(f, ", \"steps_redone\": %d, \"last_step\": %d, \"resume_step\": %d, \"cause\": {",
            redone, a->last_step, resume_step);
    if (a->rank >= 0)
        fprintf(f, "\"rank\": %d, \"host\": ", a->rank);
    else
        fprintf(f, "\"rank\": null, \"host\": ");
    if (a->host[0])
        tr_json_write_string(f, a->host);
    else
        fputs("null", f);
    fputs(", \"exit\": ", f);
    tr_json_write_string(f, st);
    if (a->n_witnesses) { /* the ranks that blamed it and reached the supervisor */
        fputs(", \"told_by\": [", f);
        for (int k = 0; k < a->n_witnesses; k++)
            fprintf(f, "%s%d", k ? ", " : "", a->witnesses[k]);
        fputs("]", f);
    }
    fputs("}, \"action\": ", f);
    tr_json_write_string(f, action);
    fputs("}\n", f);
    if (fclose(f)) fprintf(stderr, "trainer supervise: cannot write attempts.jsonl\n");
}

/* metrics.jsonl: each step's step_s, the last record of a step winning (as the run keeps
 * them: a resumed run drops the records of the steps it trains again). */
typedef struct {
    double *step_s;
    int cap, last;
} kept_scan;

static void scan_kept(void *ctx, const tr_json *o) {
    kept_scan *k = ctx;
    int step = (int)num(o, "step", -1);
    double dt = num(o, "step_s", -1);
    if (step < 1 || dt < 0 || step > 1 << 28) return;
    if (step > k->cap) {
        int cap = step * 2;
        double *p = realloc(k->step_s, (size_t)cap * sizeof(double));
        if (!p) return;
        memset(p + k->cap, 0, (size_t)(cap - k->cap) * sizeof(double));
        k->step_s = p, k->cap = cap;
    }
    k->step_s[step - 1] = dt;
    if (step > k->last) k->last = step;
}

void sv_goodput(sv_run *s, int done) {
    kept_scan k = {0};
    each_line(s, "metrics.jsonl", scan_kept, &k);
    double kept = 0, wall = tr_now() - s->t0;
    for (int i = 0; i < k.last; i++)
        kept += k.step_s[i];
    free(k.step_s);
    double g = wall > 0 ? kept / wall : 0;
    printf("supervise: goodput %.1f%%: %.2f s of training kept in %.2f s of wall time (%d "
           "attempt(s), %d relaunch(es), %d step(s) redone, %.2f s down between attempts)\n",
           100.0 * g, kept, wall, s->launches, s->relaunches, s->redone, s->down_s);
    fflush(stdout);
    FILE *f = done ? open_attempts(s) : NULL;
    if (!f) return;
    fprintf(f,
            "{\"event\": \"supervisor\", \"attempt\": %d, \"t\": %.3f, \"action\": \"done\", "
            "\"relaunches\": %d, \"steps_redone\": %d",
            sv_count_starts(s), tr_ledger_unix_now(), s->relaunches, s->redone);
    const char *key[] = {"wall_s", "train_s", "goodput", "down_s"};
    double v[] = {wall, kept, g, s->down_s};
    for (int i = 0; i < 4; i++) {
        fprintf(f, ", \"%s\": ", key[i]);
        tr_json_write_num(f, v[i], i == 2 ? -4 : -3);
    }
    fprintf(f, "}\n");
    fclose(f);
}

void sv_finish(sv_run *s) {
    printf("supervise: the run finished after %d attempt(s)\n", s->launches);
    sv_goodput(s, 1);
}

/* ---- the host file ------------------------------------------------------------------------ */

/* The launcher's flags the supervisor edits, each as `-flag VALUE` or `-flag=VALUE` (mpirun
 * takes the first form, srun and newer launchers also the second). */
static const char *const hostfile_flags[] = {"--hostfile", "-hostfile", "--machinefile",
                                             "-machinefile", NULL};
static const char *const np_flags[] = {"-np", "--np", "-n", "--n", "-c", NULL};

/* When cmd[i] (i + 1 < end) is one of flags with its value: 1, *at the argument holding the
 * value and *pre the length of what comes before the value there ("--np=": 5; 0 for the
 * value as the next argument). */
static int flag_value(char **cmd, int i, int end, const char *const *flags, int *at, int *pre) {
    for (int k = 0; flags[k]; k++) {
        size_t n = strlen(flags[k]);
        if (strncmp(cmd[i], flags[k], n)) continue;
        if (!cmd[i][n] && i + 1 < end) {
            *at = i + 1, *pre = 0;
            return 1;
        }
        if (cmd[i][n] == '=') {
            *at = i, *pre = (int)n + 1;
            return 1;
        }
    }
    return 0;
}

/* One line of the host file: "host slots=N [max_slots=M]" (# starts a comment). 0, 1 for a
 * line with no host, -1 with the mistake in why (also for a host without slots=). */
static int parse_host_line(char *line, sv_host *h, char *why, size_t wlen) {
    line[strcspn(line, "#\r\n")] = 0;
    char *save = NULL, *tok = strtok_r(line, " \t", &save);
    if (!tok) return 1;
    memset(h, 0, sizeof(*h));
    if (strlen(tok) >= sizeof(h->name)) {
        snprintf(why, wlen, "host name longer than %zu bytes", sizeof(h->name) - 1);
        return -1;
    }
    snprintf(h->name, sizeof(h->name), "%s", tok);
    while ((tok = strtok_r(NULL, " \t", &save))) {
        char *end;
        int slots = !strncmp(tok, "slots=", 6), max = !strncmp(tok, "max_slots=", 10);
        long v = slots || max ? strtol(tok + (slots ? 6 : 10), &end, 10) : 0;
        if (!(slots || max) || *end || v < 1 || v > 1000000) {
            snprintf(why, wlen, "'%.60s': expected `host slots=N`", tok);
            return -1;
        }
        if (slots) h->slots = (int)v;
    }
    if (!h->slots) /* Open MPI counts the host's cores there, which only that host knows */
        snprintf(why, wlen,
                 "host %s has no slots=N (Open MPI would give it one slot per core of that host, "
                 "which the supervisor cannot count): write `%s slots=N`",
                 h->name, h->name);
    return h->slots ? 0 : -1;
}

static int read_hosts(sv_run *s) {
    FILE *f = fopen(s->hostfile, "r");
    if (!f) {
        fprintf(stderr, "trainer supervise: --hostfile '%s': %s\n", s->hostfile, strerror(errno));
        return -1;
    }
    char line[1024], why[320];
    int lineno = 0, rc = 0;
    while (!rc && fgets(line, sizeof(line), f)) {
        lineno++;
        sv_host h;
        int r = parse_host_line(line, &h, why, sizeof(why));
        if (r < 0) {
            fprintf(stderr, "trainer supervise: %s:%d: %s\n", s->hostfile, lineno, why);
            rc = -1;
        } else if (r == 0) {
            int at = sv_host_find(s, h.name);
            if (at >= 0) { /* a host named twice: its slots add up, as Open MPI counts them */
                s->hosts[at].slots += h.slots;
                continue;
            }
            sv_host *p = realloc(s->hosts, (size_t)(s->nhosts + 1) * sizeof(sv_host));
            if (!p) rc = -1;
            if (p) s->hosts = p, s->hosts[s->nhosts++] = h;
        }
    }
    fclose(f);
    if (!rc && s->nhosts == 0) {
        fprintf(stderr, "trainer supervise: --hostfile '%s' names no host\n", s->hostfile);
        rc = -1;
    }
    return rc;
}

/* The launcher's -np and the run's --dp, which a host's drop lowers (a positive count each),
 * or why not. */
static int find_counts(sv_run *s) {
    int at, pre;
    const char *flag = "-np";
    s->np_at = s->dp_at = -1;
    for (int i = 0; i < s->run_at; i++)
        if (flag_value(s->cmd, i, s->run_at, np_flags, &at, &pre))
            s->np_at = at, s->np_pre = pre, flag = s->cmd[i];
    for (int i = s->run_at + 1; i + 1 < s->n; i++)
        if (!strcmp(s->cmd[i], "--dp")) s->dp_at = i + 1;
    const char *v[2] = {s->np_at >= 0 ? s->cmd[s->np_at] + s->np_pre : NULL,
                        s->dp_at >= 0 ? s->cmd[s->dp_at] : NULL};
    for (int k = 0; k < 2; k++) {
        char *end;
        long x = v[k] ? strtol(v[k], &end, 10) : 1;
        if (v[k] && (!*v[k] || *end || x < 1 || x > 1000000)) {
            fprintf(stderr,
                    "trainer supervise: the command's %.*s '%s' is not a number of processes\n",
                    k ? 4 : s->np_pre ? s->np_pre - 1 : (int)strlen(flag), k ? "--dp" : flag,
                    v[k]);
            return -1;
        }
    }
    return 0;
}

int sv_read_hostfile(sv_run *s) {
    s->np_at = s->dp_at = -1;
    if (!s->hostfile) return 0; /* nothing to edit: the launcher reads its own flags */
    if (read_hosts(s) || find_counts(s)) return -1;
    int at, pre;
    for (int i = 0; i < s->run_at; i++)
        if (flag_value(s->cmd, i, s->run_at, hostfile_flags, &at, &pre)) return 0;
    fprintf(stderr, "trainer supervise: --hostfile is given but the command has no --hostfile, "
                    "-hostfile or --machinefile argument (before `trainer run`) to replace\n");
    return -1;
}

int sv_host_find(const sv_run *s, const char *name) {
    for (int i = 0; i < s->nhosts; i++)
        if (!strcmp(s->hosts[i].name, name)) return i;
    return -1;
}

/* cmd[at]'s value, after its first pre bytes (a flag's "NAME="), made fmt's. */
TR_PRINTF(4, 5) static int replace_arg(sv_run *s, int at, int pre, const char *fmt, ...) {
    char buf[TR_PATH_MAX + 64];
    va_list ap;
    va_start(ap, fmt);
    int n = snprintf(buf, sizeof(buf), "%.*s", pre, s->cmd[at]);
    vsnprintf(buf + n, sizeof(buf) - (size_t)n, fmt, ap);
    va_end(ap);
    char *v = strdup(buf);
    if (!v) return -1;
    free(s->cmd[at]);
    s->cmd[at] = v;
    return 0;
}

/* -np (and --dp) for the slots left: 0, or -1 with why. */
static int lower_np(sv_run *s, int left, char *why, size_t wlen) {
    if (s->np_at < 0) {
        if (s->dp_at < 0) return 0; /* the launcher fills the slots the host file gives */
        snprintf(why, wlen, "the command fixes --dp %s but gives no -np to scale it from",
                 s->cmd[s->dp_at]);
        return -1;
    }
    int np = atoi(s->cmd[s->np_at] + s->np_pre), now = np < left ? np : left;
    if (s->dp_at >= 0) {
        int dp = atoi(s->cmd[s->dp_at]);
        int per = dp > 0 && np % dp == 0 ? np / dp : 0; /* tp x pp */
        if (!per || now % per) {
            snprintf(why, wlen,
                     "the command fixes --dp %d on %d processes and the %d slots left "
                     "hold no whole number of its tp x pp groups",
                     dp, np, left);
            return -1;
        }
        if (replace_arg(s, s->dp_at, 0, "%d", now / per)) return -1;
    }
    return now == np ? 0 : replace_arg(s, s->np_at, s->np_pre, "%d", now);
}

int sv_drop_host(sv_run *s, int h, char *why, size_t wlen) {
    char path[TR_PATH_MAX + 32];
    snprintf(path, sizeof(path), "%s/supervise.hostfile", s->out);
    s->hosts[h].dropped = 1;
    int left = 0;
    for (int i = 0; i < s->nhosts; i++)
        if (!s->hosts[i].dropped) left += s->hosts[i].slots;
    if (left == 0) {
        snprintf(why, wlen, "host %s failed twice and no other host is left", s->hosts[h].name);
        return -1;
    }
    FILE *f = fopen(path, "w");
    for (int i = 0; f && i < s->nhosts; i++)
        if (!s->hosts[i].dropped) fprintf(f, "%s slots=%d\n", s->hosts[i].name, s->hosts[i].slots);
    if (!f || fclose(f)) {
        snprintf(why, wlen, "cannot write '%s': %s", path, strerror(errno));
        return -1;
    }
    int at, pre;
    for (int i = 0; i < s->run_at; i++)
        if (flag_value(s->cmd, i, s->run_at, hostfile_flags, &at, &pre) &&
            replace_arg(s, at, pre, "%s", path))
            return -1;
    if (lower_np(s, left, why, wlen)) return -1;
    printf("supervise: host %s failed twice: dropped; %s lists the %d slot(s) left%s%s%s%s\n",
           s->hosts[h].name, path, left, s->np_at >= 0 ? ", -np " : "",
           s->np_at >= 0 ? s->cmd[s->np_at] + s->np_pre : "", s->dp_at >= 0 ? ", --dp " : "",
           s->dp_at >= 0 ? s->cmd[s->dp_at] : "");
    return 0;
}
