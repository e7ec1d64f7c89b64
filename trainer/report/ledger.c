/* The run's ledger and its attempts (trainer/report/ledger.h has the model of time it keeps). */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "data/json.h"
#include "trainer/ops/witness.h"
#include "trainer/report/ledger.h"
#include "trainer/report/links.h"
#include "trainer/trainer.h"

#define HOST_LEN TR_HOST_LEN
#define DEVICE_LEN TR_DEVICE_LEN
#define MAX_WINDOWS 500
#define RING 5 /* steps of history a straggler is judged on (medians) */
/* A rank's record, gathered after each step: its parts since the last gather, its busy
 * seconds (what the others may have waited for) and the caller's extra figures. */
#define REC_BUSY LED_PARTS
#define REC_TELE (LED_PARTS + 1) /* power, SM clock, temperature: NAN when unknown */
#define REC_EXTRA (LED_PARTS + 4)
#define REC (LED_PARTS + 4 + TR_LEDGER_EXTRA)

static const char *part_names[LED_PARTS] = {"setup_s",  "compute_s", "comm_s", "wait_s",
                                            "data_s",   "ckpt_s",    "bubble_s", "mask_s",
                                            "eval_s",   "log_s",     "end_s"};

const char *tr_ledger_part_name(tr_ledger_part p) {
    return p < LED_PARTS ? part_names[p] : "?";
}

static double g_mono0, g_unix0; /* the process's start */

static double unix_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void tr_ledger_clock_start(void) {
    g_mono0 = tr_now();
    g_unix0 = unix_now();
}

struct tr_ledger {
    tr_comm *world;
    int rank, n, attempt, steps, start_step, window, straggler, files, tty;
    int redone;                     /* steps trained again after the guard's rollbacks */
    double flops_rank, tokens_rank; /* per step */
    char (*hosts)[HOST_LEN];
    double last;            /* the last mark */
    double parts[LED_PARTS]; /* this rank's, since the last gather */
    double setup_s;
    double *rec; /* every rank's record, REC each */
    /* rank 0: the window being filled and the totals, per rank */
    FILE *f;
    char path[TR_PATH_MAX + 32];
    int w_first, w_steps;
    double w_t0;
    double *win, *tot;        /* n x LED_PARTS */
    double *w_waited_on, *tot_waited_on; /* n */
    double *w_waited;         /* n x n: seconds rank i waited for rank j */
    int (*telemetry)(double out[3]);
    double *w_tele;           /* n x 3 sums of the samples, and n x 3 counts */
    double *scratch;          /* 2n: per-step arithmetic (no allocation a step) */
    /* straggler watch */
    double *ring;             /* n x RING busy seconds */
    double *base;             /* n: each rank's median pace when first known */
    int *streak, *since, *alarmed, seen;
    tr_links *links;          /* the network between hosts (links.h); NULL on one host */
};

/* ---- attempts.jsonl ------------------------------------------------------------------------ */

/* What the signal handler and the abort hook write (prepared once: a handler formats nothing
 * that needs a lock). */
static int g_fd = -1;
static volatile long g_last_step;
static char g_who[HOST_LEN + 160]; /* "\"attempt\": 2, \"rank\": 1, \"host\": \"h\"" */
static char (*g_hosts)[HOST_LEN];
static int g_n, g_attempt, g_rank;

/* Decimal digits of v (>= 0) at p; returns the end. */
static char *put_uint(char *p, unsigned long v) {
    char d[24];
    int k = 0;
    do d[k++] = (char)('0' + v % 10), v /= 10;
    while (v);
    while (k) *p++ = d[--k];
    return p;
}

static char *put_str(char *p, const char *s) {
    while (*s) *p++ = *s++;
    return p;
}

void tr_ledger_signal_line(int sig) {
    char line[512], *p = line;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    const char *name = tr_signal_name(sig);
    p = put_str(p, "{\"event\": \"stopped\", ");
    p = put_str(p, g_who);
    p = put_str(p, ", \"last_step\": ");
    p = put_uint(p, (unsigned long)g_last_step);
    p = put_str(p, ", \"t\": ");
    p = put_uint(p, (unsigned long)ts.tv_sec);
    *p++ = '.';
    long ms = ts.tv_nsec / 1000000;
    *p++ = (char)('0' + ms / 100), *p++ = (char)('0' + ms / 10 % 10), *p++ = (char)('0' + ms % 10);
    p = put_str(p, ", \"signal\": \"");
    p = put_str(p, name);
    p = put_str(p, "\"}\n");
    if (g_fd >= 0 && write(g_fd, line, (size_t)(p - line)) < 0) {
        /* nothing to do: the process is ending */
    }
}

static void on_signal(int sig) {
    tr_ledger_signal_line(sig);
    raise(sig); /* SA_RESETHAND restored the default action */
}

/* The rank that gave up on a dead or stuck peer says so before the job is aborted. */
static void on_abort(int silent, const char *why) {
    if (g_fd < 0) return;
    FILE *f = fdopen(dup(g_fd), "a");
    if (!f) return;
    fprintf(f, "{\"event\": \"failed\", %s, \"last_step\": %ld, \"t\": %.3f, \"failed_rank\": %d, "
               "\"failed_host\": ",
            g_who, (long)g_last_step, unix_now(), silent);
    tr_json_write_string(f, silent >= 0 && silent < g_n ? g_hosts[silent] : "");
    fprintf(f, ", \"why\": ");
    tr_json_write_string(f, why);
    fprintf(f, "}\n");
    fclose(f);
    tr_witness_tell(g_attempt, g_rank); /* the side of a cut the supervisor hears wins */
}

static void install_handlers(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_signal;
    sa.sa_flags = (int)SA_RESETHAND;
    sigemptyset(&sa.sa_mask);
    int sigs[3] = {SIGTERM, SIGINT, SIGHUP};
    for (int i = 0; i < 3; i++)
        sigaction(sigs[i], &sa, NULL);
    tr_comm_on_abort(on_abort);
}

/* Rank 0: the attempt's number (1 + the start lines of attempts.jsonl on --resume; else 1 and
 * both files start over), and ledger.jsonl opened. */
static int open_files(tr_ledger *L, const tr_ledger_opts *o) {
    char path[TR_PATH_MAX + 32];
    snprintf(path, sizeof(path), "%s/attempts.jsonl", o->out);
    int attempt = 1;
    char err[TR_PATH_MAX + 128];
    snprintf(L->path, sizeof(L->path), "%s/ledger.jsonl", o->out);
    if (o->resume && (tr_jsonl_repair(path, stdout, err, sizeof(err)) ||
                      tr_jsonl_repair(L->path, stdout, err, sizeof(err))))
        fprintf(stderr, "trainer run: %s\n", err); /* the records may glue two lines: no more */
    FILE *a = o->resume ? fopen(path, "r") : NULL;
    if (a) {
        char *line = NULL;
        size_t cap = 0;
        while (getline(&line, &cap, a) > 0)
            if (strstr(line, "\"event\": \"start\"")) attempt++;
        free(line);
        fclose(a);
    }
    if (!o->resume) { /* a fresh run: the records start over */
        FILE *t = fopen(path, "w");
        if (t) fclose(t);
    }
    L->f = fopen(L->path, o->resume ? "a" : "w");
    if (!L->f) {
        fprintf(stderr, "trainer run: cannot write '%s': %s (the run goes on without its "
                        "ledger)\n", L->path, strerror(errno));
    }
    return attempt;
}

/* "name": [v[0], v[stride], ...] with `decimals` after the point (-1: 6 significant); null
 * where a value is not finite. */
static void put_array(FILE *f, const char *name, const double *v, int n, int stride,
                      int decimals) {
    fprintf(f, "\"%s\": [", name);
    for (int k = 0; k < n; k++) {
        double x = v[(size_t)k * stride];
        if (k) fputs(", ", f);
        tr_json_write_num(f, x, decimals < 0 ? 6 : -decimals); /* null: unknown */
    }
    fputc(']', f);
}

static void write_start(tr_ledger *L, const tr_ledger_opts *o, const char (*dev)[DEVICE_LEN]) {
    char path[TR_PATH_MAX + 32];
    snprintf(path, sizeof(path), "%s/attempts.jsonl", o->out);
    FILE *f = fopen(path, "a");
    if (!f) {
        fprintf(stderr, "trainer run: cannot write '%s': %s\n", path, strerror(errno));
        return;
    }
    fprintf(f, "{\"event\": \"start\", \"attempt\": %d, \"t\": %.3f, \"start_step\": %d, "
               "\"steps\": %d, \"ranks\": %d, \"hosts\": [",
            L->attempt, g_unix0, o->start_step, o->steps, L->n);
    for (int k = 0; k < L->n; k++) {
        if (k) fputs(", ", f);
        tr_json_write_string(f, L->hosts[k]);
    }
    fputs("], \"devices\": [", f);
    for (int k = 0; k < L->n; k++) {
        if (k) fputs(", ", f);
        tr_json_write_string(f, dev[k]);
    }
    fprintf(f, "], \"layout\": %s, \"command\": ", o->layout);
    tr_json_write_string(f, o->command);
    fprintf(f, "}\n");
    fclose(f);
}

/* ---- opening ---------------------------------------------------------------------------- */

static int alloc_all(tr_ledger *L) {
    size_t n = (size_t)L->n;
    L->hosts = calloc(n, HOST_LEN);
    L->rec = calloc(n * REC, sizeof(double));
    L->win = calloc(n * LED_PARTS, sizeof(double));
    L->tot = calloc(n * LED_PARTS, sizeof(double));
    L->w_waited_on = calloc(n, sizeof(double));
    L->tot_waited_on = calloc(n, sizeof(double));
    L->w_waited = calloc(n * n, sizeof(double));
    L->ring = calloc(n * RING, sizeof(double));
    L->base = calloc(n, sizeof(double));
    L->streak = calloc(n, sizeof(int));
    L->since = calloc(n, sizeof(int));
    L->alarmed = calloc(n, sizeof(int));
    L->w_tele = calloc(n * 6, sizeof(double));
    L->scratch = calloc(n * 2, sizeof(double));
    return L->hosts && L->rec && L->win && L->tot && L->w_waited_on && L->tot_waited_on &&
                   L->w_waited && L->ring && L->base && L->streak && L->since && L->alarmed &&
                   L->w_tele && L->scratch
               ? 0
               : -1;
}

static void free_all(tr_ledger *L) {
    free(L->hosts), free(L->rec), free(L->win), free(L->tot), free(L->w_waited_on);
    free(L->tot_waited_on), free(L->w_waited), free(L->ring), free(L->base), free(L->streak);
    free(L->since), free(L->alarmed), free(L->w_tele), free(L->scratch);
    tr_links_free(L->links);
    free(L);
}

tr_ledger *tr_ledger_open(tr_comm *world, const tr_ledger_opts *o) {
    tr_ledger *L = calloc(1, sizeof(*L));
    if (!L) return NULL;
    L->world = world;
    L->rank = tr_comm_rank(world), L->n = tr_comm_size(world);
    L->steps = o->steps, L->start_step = o->start_step;
    L->window = (o->steps + MAX_WINDOWS - 1) / MAX_WINDOWS;
    if (L->window < 1) L->window = 1;
    L->straggler = o->files && L->n > 1;
    L->files = o->files;
    L->tty = o->tty;
    L->telemetry = o->telemetry;
    L->flops_rank = o->flops_step / L->n, L->tokens_rank = (double)o->tokens_step / L->n;
    if (alloc_all(L)) {
        free_all(L);
        return NULL;
    }
    const char(*dev)[DEVICE_LEN] = (const char(*)[DEVICE_LEN])o->devices;
    memcpy(L->hosts, o->hosts, (size_t)L->n * HOST_LEN);
    if (L->n > 1) L->links = tr_links_open(world, (const char *)L->hosts, L->n, o->start_step);
    double attempt = L->rank == 0 && o->files ? open_files(L, o) : 1;
    tr_comm_broadcast(world, &attempt, 1, TR_COMM_F64, 0);
    L->attempt = (int)attempt;
    if (L->rank == 0 && o->files) write_start(L, o, dev);
    L->last = tr_now();
    L->setup_s = L->last - g_mono0;
    L->w_first = -1;
    if (!o->files) return L;
    /* every rank appends its own stopped or failed line (a shared folder, or its own) */
    char path[TR_PATH_MAX + 32];
    snprintf(path, sizeof(path), "%s/attempts.jsonl", o->out);
    g_fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    g_hosts = L->hosts, g_n = L->n;
    g_attempt = L->attempt, g_rank = L->rank;
    g_last_step = o->start_step;
    tr_witness_prepare(o->out);
    /* the host goes in as JSON: a name with a quote in it stays one string */
    char host[HOST_LEN * 2 + 4], *h = host;
    *h++ = '"';
    for (const char *s = L->hosts[L->rank]; *s; s++)
        if (*s >= ' ' && *s != '"' && *s != '\\') *h++ = *s;
    *h++ = '"', *h = 0;
    snprintf(g_who, sizeof(g_who), "\"attempt\": %d, \"rank\": %d, \"host\": %s", L->attempt,
             L->rank, host);
    install_handlers();
    return L;
}

double tr_ledger_total(const tr_ledger *L, int rank, tr_ledger_part part) {
    if (!L || L->rank != 0 || rank < 0 || rank >= L->n || part >= LED_PARTS) return 0;
    return L->tot[(size_t)rank * LED_PARTS + part];
}

int tr_ledger_attempt(const tr_ledger *L) {
    return L ? L->attempt : 1;
}

double tr_ledger_unix_now(void) {
    return unix_now();
}

void tr_ledger_mark(tr_ledger *L, tr_ledger_part part) {
    if (!L) return;
    double t = tr_now();
    L->parts[part] += t - L->last;
    L->last = t;
}

void tr_ledger_step(tr_ledger *L, const tr_ledger_step_waits *w) {
    if (!L) return;
    double t = tr_now();
    L->parts[LED_LOG] += w->t0 - L->last; /* between the last mark and the step */
    /* GPU-timed waits may include a previous step's last operation: never more than the step */
    double dt = t - w->t0, comm = fmin(w->comm_s, fmax(0.0, dt - w->data_s - w->fence_s));
    double bubble = fmin(w->idle_s, comm);
    L->parts[LED_BUBBLE] += bubble;
    L->parts[LED_COMM] += comm - bubble;
    L->parts[LED_DATA] += w->data_s;
    L->parts[LED_CKPT] += w->fence_s;
    double mask = fmin(w->mask_s, fmax(0.0, dt - comm - w->data_s - w->fence_s));
    L->parts[LED_MASK] += mask;
    L->parts[LED_COMPUTE] += dt - comm - w->data_s - w->fence_s - mask;
    L->last = t;
}

void tr_ledger_step_done(tr_ledger *L, int step) {
    (void)L;
    g_last_step = step;
}

/* ---- the gathered records: waiting split from communication, the window, stragglers ------ */

/* Rank 0: each rank's communication time of the record split into waiting for the busiest
 * rank (up to the difference of their busy seconds) and exposed communication. */
/* Rank k's communication time, up to `most`, moved to waiting for `on` (a rank, or a host
 * whose link is slow: the tables are indexed alike). */
static void charge_wait(tr_ledger *L, int k, int on, double most) {
    double *r = L->rec + (size_t)k * REC, wait = fmin(r[LED_COMM], most);
    r[LED_WAIT] += wait;
    r[LED_COMM] -= wait;
    L->w_waited[(size_t)k * L->n + on] += wait;
    L->w_waited_on[on] += wait;
    L->tot_waited_on[on] += wait;
}

static void split_waits(tr_ledger *L) {
    int n = L->n, slow = 0;
    for (int k = 1; k < n; k++)
        if (L->rec[(size_t)k * REC + REC_BUSY] > L->rec[(size_t)slow * REC + REC_BUSY]) slow = k;
    double bmax = L->rec[(size_t)slow * REC + REC_BUSY];
    for (int k = 0; k < n; k++)
        charge_wait(L, k, slow, fmax(0.0, bmax - L->rec[(size_t)k * REC + REC_BUSY]));
    for (int k = 0; k < n; k++) { /* a slow link named: the rest of the excess is its host's */
        double excess;
        int h = tr_links_blame(L->links, k, &excess);
        if (h >= 0) charge_wait(L, k, h, excess);
    }
}

/* Rank 0: a rank whose median pace over the last RING steps is 1.5x the median of the other
 * ranks' (and at least 20 ms more: below that, a shared machine's scheduling noise) for four
 * steps in a row is named once, with what it costs. Its own history: its best pace so far. */
static void watch_stragglers(tr_ledger *L, int step) {
    int n = L->n, slot = L->seen % RING;
    for (int k = 0; k < n; k++) {
        const double *r = L->rec + (size_t)k * REC;
        L->ring[(size_t)k * RING + slot] = r[LED_COMPUTE] + r[LED_DATA];
    }
    if (++L->seen < RING) return;
    double *pace = L->scratch, *others = pace + n;
    for (int k = 0; k < n; k++) {
        double v[RING];
        memcpy(v, L->ring + (size_t)k * RING, sizeof(v));
        pace[k] = tr_median_doubles(v, RING);
        if (L->base[k] == 0 || pace[k] < L->base[k]) L->base[k] = pace[k];
    }
    for (int k = 0; k < n; k++) {
        int m = 0;
        for (int j = 0; j < n; j++)
            if (j != k) others[m++] = pace[j];
        double typical = tr_median_doubles(others, (size_t)m), excess = pace[k] - typical;
        int slow = pace[k] > 1.5 * typical && excess > 0.02;
        if (!slow) {
            L->streak[k] = 0;
            continue;
        }
        if (L->streak[k]++ == 0) L->since[k] = step + 1 - RING / 2; /* the median's lag */
        if (L->streak[k] < 4 || L->alarmed[k]) continue;
        L->alarmed[k] = 1;
        double ratio = pace[k] / typical, share = 1.0 - 1.0 / ratio;
        printf("%sstraggler: rank %d on %s has computed %.2fx as long as the other ranks since "
               "about step %d (%.3f s more a step, %.2fx its own best pace): every step "
               "waits for it, %.0f%% of the job's time, %.3f rank-seconds a step across the "
               "%d other%s\n",
               L->tty ? "\n" : "", k, L->hosts[k], ratio, L->since[k], excess,
               L->base[k] > 0 ? pace[k] / L->base[k] : 1.0, 100.0 * share, excess * (n - 1),
               n - 1, n > 2 ? "s" : "");
        fflush(stdout);
        if (L->f) {
            fprintf(L->f, "{\"kind\": \"straggler\", \"attempt\": %d, \"step\": %d, \"t\": %.3f, "
                          "\"rank\": %d, \"host\": ",
                    L->attempt, step + 1, unix_now(), k);
            tr_json_write_string(L->f, L->hosts[k]);
            fprintf(L->f, ", \"since_step\": %d, \"slowdown\": ", L->since[k]);
            tr_json_write_num(L->f, ratio, -4);
            fprintf(L->f, ", \"cost_s_per_step\": ");
            tr_json_write_num(L->f, excess, -6);
            fprintf(L->f, "}\n");
            fflush(L->f);
        }
    }
}

static void write_window(tr_ledger *L, int last) {
    FILE *f = L->f;
    int n = L->n;
    if (!f || L->w_steps == 0) return;
    fprintf(f, "{\"kind\": \"window\", \"attempt\": %d, \"steps\": [%d, %d], \"t\": [%.3f, %.3f], "
               "\"parts\": {",
            L->attempt, L->w_first + 1, last + 1, L->w_t0, unix_now());
    for (int p = LED_COMPUTE; p < LED_END; p++) {
        if (p > LED_COMPUTE) fputs(", ", f);
        put_array(f, part_names[p], L->win + p, n, LED_PARTS, 6);
    }
    double fl = L->flops_rank * L->w_steps, tk = L->tokens_rank * L->w_steps;
    fprintf(f, "}, ");
    put_array(f, "flops", &fl, n, 0, -1);
    fputs(", ", f);
    put_array(f, "tokens", &tk, n, 0, 0);
    fputs(", ", f);
    put_array(f, "waited_on_s", L->w_waited_on, n, 1, 6);
    if (L->telemetry) { /* each rank's means over the window's samples */
        static const char *names[3] = {"power_w", "sm_clock_mhz", "temp_c"};
        double *mean = L->scratch;
        for (int q = 0; q < 3; q++) {
            for (int k = 0; k < n; k++) {
                const double *t = L->w_tele + (size_t)k * 6;
                mean[k] = t[3 + q] > 0 ? t[q] / t[3 + q] : NAN;
            }
            fputs(", ", f);
            put_array(f, names[q], mean, n, 1, 1);
        }
    }
    fputs(", \"waited_for\": [", f);
    for (int k = 0; k < n; k++) {
        int who = -1;
        for (int j = 0; j < n; j++)
            if (L->w_waited[(size_t)k * n + j] > 0 &&
                (who < 0 || L->w_waited[(size_t)k * n + j] > L->w_waited[(size_t)k * n + who]))
                who = j;
        fprintf(f, "%s%d", k ? ", " : "", who);
    }
    fputs("]}\n", f);
    if (fflush(f) || ferror(f)) {
        fprintf(stderr, "trainer run: cannot write '%s': %s (the run goes on without its "
                        "ledger)\n", L->path, strerror(errno ? errno : EIO));
        fclose(f);
        L->f = NULL;
    }
    memset(L->win, 0, (size_t)n * LED_PARTS * sizeof(double));
    memset(L->w_waited_on, 0, (size_t)n * sizeof(double));
    memset(L->w_waited, 0, (size_t)n * n * sizeof(double));
    memset(L->w_tele, 0, (size_t)n * 6 * sizeof(double));
    L->w_steps = 0;
    L->w_first = -1;
}

void tr_ledger_gather(tr_ledger *L, int step, const double *extra, double *all_extra,
                      double *compute_s) {
    double mine[REC];
    memcpy(mine, L->parts, sizeof(L->parts));
    mine[REC_BUSY] = 0;
    for (int p = 0; p < LED_PARTS; p++)
        if (p != LED_COMM && p != LED_WAIT && p != LED_BUBBLE) mine[REC_BUSY] += L->parts[p];
    memcpy(mine + REC_EXTRA, extra, TR_LEDGER_EXTRA * sizeof(double));
    mine[REC_TELE] = mine[REC_TELE + 1] = mine[REC_TELE + 2] = NAN;
    if (L->telemetry) L->telemetry(mine + REC_TELE);
    memset(L->parts, 0, sizeof(L->parts));
    if (L->n > 1)
        tr_comm_all_gather(L->world, mine, L->rec, REC, TR_COMM_F64);
    else
        memcpy(L->rec, mine, sizeof(mine));
    for (int k = 0; k < L->n; k++) {
        const double *r = L->rec + (size_t)k * REC;
        if (all_extra) memcpy(all_extra + k * TR_LEDGER_EXTRA, r + REC_EXTRA,
                              TR_LEDGER_EXTRA * sizeof(double));
        if (compute_s) compute_s[k] = r[LED_COMPUTE];
        L->scratch[k] = r[LED_COMM] + r[LED_WAIT];
    }
    tr_links_step(L->links, L->scratch, step, L->rank == 0 ? L->f : NULL, L->attempt, L->tty);
    if (L->rank == 0) {
        if (L->w_first < 0) L->w_first = step, L->w_t0 = unix_now();
        split_waits(L);
        for (size_t i = 0; i < (size_t)L->n; i++) {
            for (int p = 0; p < LED_PARTS; p++) {
                L->win[i * LED_PARTS + p] += L->rec[i * REC + p];
                L->tot[i * LED_PARTS + p] += L->rec[i * REC + p];
            }
            for (int q = 0; q < 3; q++) {
                double v = L->rec[i * REC + REC_TELE + q];
                if (isfinite(v)) L->w_tele[i * 6 + q] += v, L->w_tele[i * 6 + 3 + q]++;
            }
        }
        L->w_steps++;
        if (step > L->start_step && L->straggler) watch_stragglers(L, step);
        if ((step + 1) % L->window == 0 || step + 1 == L->steps) write_window(L, step);
    }
    tr_ledger_mark(L, LED_LOG); /* the gather and the window: the ledger's own time */
}

void tr_ledger_save(tr_ledger *L, int step, double stall_s) {
    if (!L || !L->f) return;
    fprintf(L->f, "{\"kind\": \"save\", \"attempt\": %d, \"step\": %d, \"t\": %.3f, "
                  "\"stall_s\": ",
            L->attempt, step, unix_now());
    tr_json_write_num(L->f, stall_s, -6);
    fprintf(L->f, "}\n");
    fflush(L->f);
}

void tr_ledger_stop(tr_ledger *L, int step, const char *signal, const char *checkpoint) {
    if (!L || L->rank != 0 || g_fd < 0) return;
    char line[256];
    int k = snprintf(line, sizeof(line),
                     "{\"event\": \"stop\", \"attempt\": %d, \"t\": %.3f, \"last_step\": %d, "
                     "\"signal\": \"%s\", \"checkpoint\": %s%s%s}\n",
                     L->attempt, unix_now(), step, signal, checkpoint ? "\"" : "",
                     checkpoint ? checkpoint : "null", checkpoint ? "\"" : "");
    if (k > 0 && write(g_fd, line, (size_t)k) < 0) {
        /* said nowhere: the run's own line on stderr says the same */
    }
}

void tr_ledger_rollback(tr_ledger *L, int step, int to) {
    if (!L) return;
    L->redone += step - to;
    g_last_step = to;
    if (L->rank != 0) return;
    write_window(L, step - 1); /* a window never spans a rollback */
    if (!L->f) return;
    fprintf(L->f,
            "{\"kind\": \"rollback\", \"attempt\": %d, \"step\": %d, \"to_step\": %d, "
            "\"t\": %.3f}\n",
            L->attempt, step, to, unix_now());
    fflush(L->f);
}

/* Rank 0: the attempt's totals; every rank's parts (setup and end included) and wall time. */
static void write_total(tr_ledger *L, const double *fin) {
    FILE *f = L->f;
    int n = L->n;
    if (!f) return;
    double *wall = malloc((size_t)n * sizeof(double));
    if (!wall) return;
    for (int k = 0; k < n; k++) {
        const double *r = fin + (size_t)k * (LED_PARTS + 1);
        for (int p = 0; p < LED_PARTS; p++)
            L->tot[(size_t)k * LED_PARTS + p] += r[p];
        wall[k] = r[LED_PARTS];
    }
    int done = L->steps - L->start_step + L->redone; /* every step trained */
    double fl = L->flops_rank * done, tk = L->tokens_rank * done;
    fprintf(f, "{\"kind\": \"total\", \"attempt\": %d, \"t\": [%.3f, %.3f], ", L->attempt, g_unix0,
            unix_now());
    put_array(f, "wall_s", wall, n, 1, 6);
    fputs(", \"parts\": {", f);
    for (int p = 0; p < LED_PARTS; p++) {
        if (p) fputs(", ", f);
        put_array(f, part_names[p], L->tot + p, n, LED_PARTS, 6);
    }
    fputs("}, ", f);
    put_array(f, "flops", &fl, n, 0, -1);
    fputs(", ", f);
    put_array(f, "tokens", &tk, n, 0, 0);
    fputs(", ", f);
    put_array(f, "waited_on_s", L->tot_waited_on, n, 1, 6);
    fputs("}\n", f);
    free(wall);
}

void tr_ledger_close(tr_ledger *L, int status, int together) {
    if (!L) return;
    tr_ledger_mark(L, LED_END);
    /* what came after the last gather, the setup and the wall time */
    double fin[LED_PARTS + 1], *all = NULL;
    memcpy(fin, L->parts, sizeof(L->parts));
    fin[LED_SETUP] += L->setup_s;
    fin[LED_PARTS] = L->last - g_mono0;
    if (together) {
        all = L->rank == 0 ? malloc((size_t)L->n * sizeof(fin)) : NULL;
        double *buf = malloc((size_t)L->n * sizeof(fin));
        if (buf) tr_comm_all_gather(L->world, fin, buf, LED_PARTS + 1, TR_COMM_F64);
        if (all && buf) memcpy(all, buf, (size_t)L->n * sizeof(fin));
        free(buf);
    }
    if (L->rank == 0) {
        if (all) write_total(L, all);
        if (L->f && (ferror(L->f) | fclose(L->f)))
            fprintf(stderr, "trainer run: cannot write '%s': %s\n", L->path,
                    strerror(errno ? errno : EIO));
        L->f = NULL;
        if (g_fd >= 0 && L->files) {
            char line[256];
            int k = snprintf(line, sizeof(line),
                             "{\"event\": \"end\", \"attempt\": %d, \"t\": %.3f, \"last_step\": "
                             "%ld, \"status\": %d}\n",
                             L->attempt, unix_now(), (long)g_last_step, status);
            if (k > 0 && write(g_fd, line, (size_t)k) < 0) {
                /* said nowhere: the run's own exit status stands */
            }
        }
    }
    free(all);
    if (L->files) {
        tr_comm_on_abort(NULL);
        signal(SIGTERM, SIG_DFL), signal(SIGINT, SIG_DFL), signal(SIGHUP, SIG_DFL);
    }
    if (g_fd >= 0) close(g_fd);
    g_fd = -1;
    g_hosts = NULL;
    free_all(L);
}
