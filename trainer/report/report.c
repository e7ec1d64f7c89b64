/* `trainer report RUN_DIR`: the command line and the reading of a run folder's records into
 * a tr_report (report.h). Every JSONL line goes through data/json.h's tree parser; a line that
 * does not parse or lacks the fields its kind needs is skipped and its number kept, so a
 * truncated or damaged file still gives a report that names what it left out. The figures
 * are computed in report/figures.c, the page written by report/html.c. */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "data/json.h"
#include "parallel/comm/base.h"
#include "trainer/report/experiment.h"
#include "trainer/report/report.h"

const char *const tr_report_file_names[TR_RF_FILES] = {"metrics.jsonl", "ledger.jsonl",
                                                       "attempts.jsonl"};
const char *const tr_report_part_names[TR_REPORT_PARTS] = {
    "setup", "compute", "comm", "wait", "data", "ckpt", "bubble", "mask", "eval", "log", "end"};

/* Room for one more element of `size` bytes in *p (capacity *cap); -1 when out of memory. */
static int grow(void **p, int *cap, int n, size_t size) {
    if (n < *cap) return 0;
    int nc = *cap ? 2 * *cap : 16;
    void *q = realloc(*p, (size_t)nc * size);
    if (!q) return -1;
    *p = q, *cap = nc;
    return 0;
}

/* ---- values out of a parsed line ------------------------------------------------------- */

static double num(const tr_json *o, const char *k) {
    const tr_json *v = tr_json_get(o, k);
    return v && v->type == TR_JSON_NUM ? v->num : NAN;
}

static int has_num(const tr_json *o, const char *k) {
    return isfinite(num(o, k));
}

/* The whole number o[k] within [lo, hi] into *out (dflt when absent or null): 0, or 1 when it
 * is out of bounds or not whole, said in one line naming the file, line and field (the
 * caller leaves the line out). */
static int whole(const tr_report *r, const tr_json *o, const char *k, int64_t lo, int64_t hi,
                 int64_t dflt, int64_t *out) {
    const tr_json *x = tr_json_get(o, k);
    *out = dflt;
    if (!x || x->type != TR_JSON_NUM) return 0;
    double v = x->num;
    if (!(v >= (double)lo && v <= (double)hi) || v != floor(v)) {
        fprintf(stderr,
                "trainer report: %s:%d: \"%s\" is %.17g, not a whole number in %lld..%lld "
                "(the line is left out)\n",
                tr_report_file_names[r->at_file], r->at_line, k, v, (long long)lo, (long long)hi);
        return 1;
    }
    *out = (int64_t)v;
    return 0;
}

/* whole() for an int field */
static int whole_int(const tr_report *r, const tr_json *o, const char *k, int lo, int hi, int dflt,
                     int *out) {
    int64_t v;
    int rc = whole(r, o, k, lo, hi, dflt, &v);
    *out = (int)v;
    return rc;
}

/* An array o[k] longer than the ranks a report takes: said like whole()'s bounds. */
static int too_many_ranks(const tr_report *r, const tr_json *o, const char *k) {
    const tr_json *v = tr_json_get(o, k);
    if (!v || v->type != TR_JSON_ARR || v->n <= TR_REPORT_MAX_RANKS) return 0;
    fprintf(stderr,
            "trainer report: %s:%d: \"%s\" has %d entries, more than %d ranks (the line "
            "is left out)\n",
            tr_report_file_names[r->at_file], r->at_line, k, v->n, TR_REPORT_MAX_RANKS);
    return 1;
}

static void str(const tr_json *o, const char *k, char *out, size_t n) {
    const tr_json *v = tr_json_get(o, k);
    snprintf(out, n, "%s", v && v->type == TR_JSON_STR ? v->str : "");
}

/* The numeric array o[k] into a fresh array (NULL values become NAN); its length in *n.
 * NULL when absent, not an array or out of memory (*n = -1 then). */
static double *num_array(const tr_json *o, const char *k, int *n) {
    const tr_json *v = tr_json_get(o, k);
    *n = 0;
    if (!v || v->type != TR_JSON_ARR || v->n == 0) return NULL;
    double *a = malloc((size_t)v->n * sizeof(double));
    if (!a) {
        *n = -1;
        return NULL;
    }
    for (int i = 0; i < v->n; i++)
        a[i] = v->kids[i].type == TR_JSON_NUM ? v->kids[i].num : NAN;
    *n = v->n;
    return a;
}

static void skip_line(tr_report_lines *s, int line, int *oom) {
    if (grow((void **)&s->line, &s->cap, s->n, sizeof(int))) {
        *oom = 1;
        return;
    }
    s->line[s->n++] = line;
}

/* A line's handler: 0 kept, 1 lacks its fields (skipped), -1 out of memory. */
typedef int (*line_fn)(tr_report *r, const tr_json *j);

/* Every line of r->dir/NAME through fn. 1 when the file is not there, -1 when it cannot be
 * read (err), else 0. */
static int read_jsonl(tr_report *r, int file, line_fn fn, char *err, size_t errlen) {
    char path[1200];
    snprintf(path, sizeof(path), "%s/%s", r->dir, tr_report_file_names[file]);
    size_t len = 0;
    char *text = tr_read_file(path, SIZE_MAX, &len);
    if (!text) {
        if (errno == ENOENT) return 1;
        snprintf(err, errlen, "trainer report: cannot read '%s': %s", path, strerror(errno));
        return -1;
    }
    int oom = 0, line = 0;
    for (char *p = text; p < text + len && !oom; line++) {
        char *e = memchr(p, '\n', (size_t)(text + len - p));
        size_t n = e ? (size_t)(e - p) : (size_t)(text + len - p);
        char *q = p;
        p += n + 1;
        if (strspn(q, " \t\r") >= n) continue; /* a blank line */
        tr_json j;
        char jerr[160];
        int rc = 1;
        r->at_file = file, r->at_line = line + 1;
        if (tr_json_parse(&j, q, n, jerr, sizeof(jerr)) == 0) {
            rc = j.type == TR_JSON_OBJ ? fn(r, &j) : 1;
            tr_json_free(&j);
        }
        if (rc < 0) oom = 1;
        if (rc > 0) skip_line(&r->skipped[file], line + 1, &oom);
    }
    free(text);
    if (oom) snprintf(err, errlen, "trainer report: out of memory reading '%s'", path);
    return oom ? -1 : 0;
}

/* ---- metrics.jsonl ------------------------------------------------------------------------ */

static int on_metrics(tr_report *r, const tr_json *j) {
    int64_t step;
    int attempt;
    if (!has_num(j, "step") || !has_num(j, "loss") || num(j, "step") < 1) return 1;
    if (whole(r, j, "step", 1, TR_REPORT_MAX_STEP, 0, &step) ||
        whole_int(r, j, "attempt", 1, INT32_MAX, 1, &attempt) ||
        too_many_ranks(r, j, "rank_compute_s"))
        return 1;
    if (grow((void **)&r->steps, &r->cap_steps, r->n_steps, sizeof(tr_report_step))) return -1;
    tr_report_step *s = &r->steps[r->n_steps];
    memset(s, 0, sizeof(*s));
    s->step = step;
    s->seq = r->n_steps;
    s->attempt = attempt;
    s->time_unix = num(j, "time");
    s->loss = num(j, "loss"), s->val_loss = num(j, "val_loss");
    s->tokens_per_s = num(j, "tokens_per_s"), s->mfu = num(j, "mfu");
    s->gflops = num(j, "gflops"), s->step_s = num(j, "step_s");
    s->pred_step_s = num(j, "predicted_step_s");
    s->mem = num(j, "memory_bytes"), s->pred_mem = num(j, "predicted_memory_bytes");
    int n;
    s->rank_compute = num_array(j, "rank_compute_s", &n);
    if (n < 0) return -1;
    s->n_rank_compute = s->rank_compute ? n : 0;
    if (n > r->n_ranks) r->n_ranks = n;
    r->n_steps++;
    return 0;
}

static int by_step(const void *a, const void *b) {
    const tr_report_step *x = a, *y = b;
    if (x->step != y->step) return x->step < y->step ? -1 : 1;
    return x->seq < y->seq ? -1 : x->seq > y->seq;
}

/* In step order; of the lines of one step (a resumed run that trained it again) the last. */
static void sort_steps(tr_report *r) {
    qsort(r->steps, (size_t)r->n_steps, sizeof(tr_report_step), by_step);
    int k = 0;
    for (int i = 0; i < r->n_steps; i++) {
        if (i + 1 < r->n_steps && r->steps[i + 1].step == r->steps[i].step) {
            free(r->steps[i].rank_compute);
            continue;
        }
        r->steps[k++] = r->steps[i];
    }
    r->n_steps = k;
}

/* ---- ledger.jsonl ------------------------------------------------------------------------- */

/* A window's or total's per-rank arrays into one record; 1 when they are missing or their
 * lengths disagree. */
static int on_ledger_parts(tr_report *r, const tr_json *j, int total) {
    const tr_json *parts = tr_json_get(j, "parts"), *t = tr_json_get(j, "t");
    if (!parts || parts->type != TR_JSON_OBJ || !t || t->type != TR_JSON_ARR || t->n != 2) return 1;
    const tr_json *st = tr_json_get(j, "steps");
    if (!total && (!st || st->type != TR_JSON_ARR || st->n != 2)) return 1;
    const tr_json *c = tr_json_get(parts, "compute_s");
    int n = c && c->type == TR_JSON_ARR ? c->n : 0;
    if (too_many_ranks(r, parts, "compute_s")) return 1;
    if (n < 1 || (r->led_ranks && n != r->led_ranks)) return 1;
    if (t->kids[0].type != TR_JSON_NUM || t->kids[1].type != TR_JSON_NUM) return 1;
    int attempt;
    int64_t ab[2] = {0, 0};
    for (int i = 0; !total && i < 2; i++) {
        double v = st->kids[i].type == TR_JSON_NUM ? st->kids[i].num : -1;
        if (!(v >= 0 && v <= (double)TR_REPORT_MAX_STEP)) {
            fprintf(stderr,
                    "trainer report: ledger.jsonl:%d: \"steps\"[%d] is not a step in "
                    "0..%lld (the line is left out)\n",
                    r->at_line, i, TR_REPORT_MAX_STEP);
            return 1;
        }
        ab[i] = (int64_t)v;
    }
    if (whole_int(r, j, "attempt", 1, INT32_MAX, 1, &attempt)) return 1;
    if (grow((void **)&r->led, &r->cap_led, r->n_led, sizeof(tr_report_led))) return -1;
    tr_report_led *w = &r->led[r->n_led];
    memset(w, 0, sizeof(*w));
    w->v = calloc((size_t)n * TR_REPORT_LV, sizeof(double));
    if (!w->v) return -1;
    int bad = 0;
    for (int k = 0; k < TR_REPORT_LV && !bad; k++) {
        char key[32];
        const tr_json *src = parts;
        if (k < TR_REPORT_PARTS)
            snprintf(key, sizeof(key), "%s_s", tr_report_part_names[k]);
        else
            src = j, snprintf(key, sizeof(key), "%s",
                              k == TR_REPORT_PARTS       ? "flops"
                              : k == TR_REPORT_PARTS + 1 ? "tokens"
                                                         : "waited_on_s");
        int m;
        double *a = num_array(src, key, &m);
        if (m < 0) bad = -1;
        if (!a) { /* setup and end only in totals; parts a layout lacks (bubble) may be absent */
            int needed = !strcmp(key, "compute_s") || !strcmp(key, "flops");
            if (needed) bad = 1;
            continue;
        }
        if (m != n) bad = 1;
        for (int i = 0; i < n && !bad; i++)
            w->v[i * TR_REPORT_LV + k] = isfinite(a[i]) ? a[i] : 0;
        free(a);
    }
    if (bad) {
        free(w->v);
        return bad;
    }
    w->attempt = attempt;
    w->total = total;
    w->t0 = t->kids[0].num, w->t1 = t->kids[1].num;
    w->a = ab[0], w->b = ab[1];
    r->led_ranks = n;
    if (n > r->n_ranks) r->n_ranks = n;
    r->n_led++;
    return 0;
}

static int on_ledger(tr_report *r, const tr_json *j) {
    char kind[32];
    str(j, "kind", kind, sizeof(kind));
    if (!strcmp(kind, "window") || !strcmp(kind, "total"))
        return on_ledger_parts(r, j, kind[0] == 't');
    int attempt, rank;
    int64_t step;
    if (whole_int(r, j, "attempt", 1, INT32_MAX, 1, &attempt) ||
        whole(r, j, "step", 0, TR_REPORT_MAX_STEP, 0, &step) ||
        whole_int(r, j, "rank", 0, TR_REPORT_MAX_RANKS - 1, 0, &rank))
        return 1;
    if (!strcmp(kind, "save")) {
        if (!has_num(j, "step") || !has_num(j, "t")) return 1;
        if (grow((void **)&r->saves, &r->cap_saves, r->n_saves, sizeof(tr_report_save))) return -1;
        tr_report_save *s = &r->saves[r->n_saves++];
        s->attempt = attempt, s->step = step, s->t = num(j, "t");
        s->stall_s = has_num(j, "stall_s") ? num(j, "stall_s") : 0;
        return 0;
    }
    if (!strcmp(kind, "straggler")) {
        if (!has_num(j, "rank") || !has_num(j, "step")) return 1;
        if (grow((void **)&r->strag, &r->cap_strag, r->n_stragglers, sizeof(tr_report_straggler)))
            return -1;
        tr_report_straggler *s = &r->strag[r->n_stragglers++];
        s->attempt = attempt, s->step = step, s->rank = rank;
        s->t = num(j, "t"), s->slowdown = num(j, "slowdown");
        s->cost_s_per_step = num(j, "cost_s_per_step");
        str(j, "host", s->host, sizeof(s->host));
        return 0;
    }
    return kind[0] ? 0 : 1; /* a kind this report does not know is not damage */
}

/* ---- attempts.jsonl ----------------------------------------------------------------------- */

static tr_report_attempt *attempt_of(tr_report *r, int k) {
    for (int i = 0; i < r->n_attempts; i++)
        if (r->att[i].attempt == k) return &r->att[i];
    if (grow((void **)&r->att, &r->cap_att, r->n_attempts, sizeof(tr_report_attempt))) return NULL;
    tr_report_attempt *a = &r->att[r->n_attempts++];
    memset(a, 0, sizeof(*a));
    a->attempt = k, a->failed_rank = -1, a->last_step = -1, a->start_step = -1;
    a->t_start = NAN;
    return a;
}

static void seen(tr_report_attempt *a, double t, int64_t last_step) {
    if (isfinite(t) && !(a->t_last >= t)) a->t_last = t;
    if (last_step > a->last_step) a->last_step = last_step;
}

static int on_start(tr_report *r, tr_report_attempt *a, const tr_json *j) {
    if (!has_num(j, "t")) return 1;
    int64_t start_step, steps;
    int ranks;
    if (whole(r, j, "start_step", 0, TR_REPORT_MAX_STEP, 0, &start_step) ||
        whole(r, j, "steps", 0, TR_REPORT_MAX_STEP, 0, &steps) ||
        whole_int(r, j, "ranks", 0, TR_REPORT_MAX_RANKS, 0, &ranks) ||
        too_many_ranks(r, j, "hosts") || too_many_ranks(r, j, "devices"))
        return 1;
    a->t_start = num(j, "t");
    seen(a, a->t_start, -1);
    a->start_step = start_step, a->steps = steps, a->ranks = ranks;
    if (a->ranks > r->n_ranks) r->n_ranks = a->ranks;
    str(j, "command", a->command, sizeof(a->command));
    const tr_json *h = tr_json_get(j, "hosts"), *d = tr_json_get(j, "devices");
    int n = h && h->type == TR_JSON_ARR ? h->n : 0;
    if (n > 0) {
        free(r->start_hosts);
        free(r->start_devices);
        r->start_hosts = calloc((size_t)n, sizeof(*r->start_hosts));
        r->start_devices = calloc((size_t)n, sizeof(*r->start_devices));
        if (!r->start_hosts || !r->start_devices) return -1;
        r->n_start_hosts = n;
        for (int i = 0; i < n; i++) {
            if (h->kids[i].type == TR_JSON_STR)
                snprintf(r->start_hosts[i], 64, "%s", h->kids[i].str);
            if (d && d->type == TR_JSON_ARR && i < d->n && d->kids[i].type == TR_JSON_STR)
                snprintf(r->start_devices[i], 96, "%s", d->kids[i].str);
        }
    }
    return 0;
}

/* trainer supervise's line after an attempt ended (supervise_records.c, sv_write_event): the
 * downtime it measured, the steps redone and the cause ({"rank", "host", "exit"}). Its "t" is
 * the supervisor's, not a sign of the attempt's life. The closing "done" line sums the run. */
static int on_supervisor(tr_report *r, tr_report_attempt *a, const tr_json *j) {
    char action[96];
    str(j, "action", action, sizeof(action));
    if (!strcmp(action, "done")) return 0;
    double down = num(j, "down_s");
    const tr_json *c = tr_json_get(j, "cause");
    tr_report_sv sv = {.has = 1, .down_s = down};
    if (!(down >= 0) || !isfinite(down)) return 1;
    if (whole(r, j, "steps_redone", 0, TR_REPORT_MAX_STEP, -1, &sv.steps_redone)) return 1;
    if (c && c->type == TR_JSON_OBJ) {
        if (whole_int(r, c, "rank", 0, TR_REPORT_MAX_RANKS - 1, -1, &sv.rank)) return 1;
        str(c, "host", sv.host, sizeof(sv.host));
        str(c, "exit", sv.exit, sizeof(sv.exit));
    } else {
        sv.rank = -1;
    }
    snprintf(sv.action, sizeof(sv.action), "%s", action);
    a->sv = sv;
    return 0;
}

static int on_attempts(tr_report *r, const tr_json *j) {
    char ev[32];
    int attempt, failed, rank, status;
    int64_t last;
    str(j, "event", ev, sizeof(ev));
    if (!ev[0] || !has_num(j, "attempt")) return 1;
    if (whole_int(r, j, "attempt", 0, INT32_MAX, 1, &attempt) ||
        whole(r, j, "last_step", 0, TR_REPORT_MAX_STEP, -1, &last) ||
        whole_int(r, j, "failed_rank", 0, TR_REPORT_MAX_RANKS - 1, -1, &failed) ||
        whole_int(r, j, "rank", 0, TR_REPORT_MAX_RANKS - 1, -1, &rank) ||
        whole_int(r, j, "status", INT32_MIN, INT32_MAX, 0, &status))
        return 1;
    tr_report_attempt *a = attempt_of(r, attempt);
    if (!a) return -1;
    if (!strcmp(ev, "start")) return on_start(r, a, j);
    if (!strcmp(ev, "supervisor")) return on_supervisor(r, a, j);
    seen(a, num(j, "t"), last);
    if (!strcmp(ev, "end")) {
        a->ended = 1;
        a->status = status;
    } else if (!strcmp(ev, "failed")) {
        if (failed >= 0 && a->failed_rank < 0) {
            a->failed_rank = failed;
            str(j, "failed_host", a->failed_host, sizeof(a->failed_host));
            str(j, "why", a->why, sizeof(a->why));
        }
    } else if (!strcmp(ev, "stopped")) {
        if (rank < 0) return 1;
        int *s = realloc(a->stopped, (size_t)(a->n_stopped + 1) * sizeof(int));
        if (!s) return -1;
        a->stopped = s;
        s[a->n_stopped++] = rank;
    }
    return 0;
}

/* ---- ranks.json, memory.json, provenance.json --------------------------------------------- */

/* The whole file parsed into *j: 1 when it is not there, -1 when damaged (err names it). */
static int read_json(const char *dir, const char *name, tr_json *j, char *err, size_t errlen) {
    char path[1200], jerr[160];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    size_t len;
    char *text = tr_read_file(path, SIZE_MAX, &len);
    if (!text) {
        if (errno == ENOENT) return 1;
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        return -1;
    }
    int rc = tr_json_parse(j, text, len, jerr, sizeof(jerr));
    free(text);
    if (rc) snprintf(err, errlen, "%s: %s", path, jerr);
    return rc ? -1 : 0;
}

static void fill5(const tr_json *o, const char *k, double *out) {
    int n;
    double *a = num_array(o, k, &n);
    for (int i = 0; i < 5; i++)
        out[i] = a && i < n && isfinite(a[i]) ? a[i] : 0;
    free(a);
}

static int read_ranks_json(tr_report *r, char *err, size_t errlen) {
    tr_json j;
    int rc = read_json(r->dir, "ranks.json", &j, err, errlen);
    if (rc) return rc;
    if (j.type == TR_JSON_ARR && j.n > TR_REPORT_MAX_RANKS) {
        snprintf(err, errlen, "%s/ranks.json: %d ranks, more than %d", r->dir, j.n,
                 TR_REPORT_MAX_RANKS);
        rc = -1;
    } else if (j.type == TR_JSON_ARR && j.n > 0) {
        r->rjson = calloc((size_t)j.n, sizeof(tr_report_rank));
        if (!r->rjson) rc = -1;
        for (int i = 0; r->rjson && i < j.n; i++) {
            const tr_json *o = &j.kids[i];
            tr_report_rank *k = &r->rjson[r->n_rjson++];
            double rank = has_num(o, "rank") ? num(o, "rank") : i;
            k->rank = rank >= 0 && rank < TR_REPORT_MAX_RANKS ? (int)rank : -1; /* -1: not used */
            str(o, "host", k->host, sizeof(k->host));
            str(o, "device", k->device, sizeof(k->device));
            k->parts[1] = has_num(o, "compute_s") ? num(o, "compute_s") : 0;
            k->parts[3] = has_num(o, "wait_s") ? num(o, "wait_s") : 0;
            k->parts[4] = has_num(o, "data_wait_s") ? num(o, "data_wait_s") : 0;
            fill5(o, "memory_bytes", k->mem);
            fill5(o, "predicted_bytes", k->pred);
            k->has_mem = tr_json_get(o, "memory_bytes") != NULL;
        }
        if (r->n_rjson > r->n_ranks) r->n_ranks = r->n_rjson;
        r->has_ranks_json = 1;
    } else {
        snprintf(err, errlen, "%s/ranks.json: not an array of ranks", r->dir);
        rc = -1;
    }
    tr_json_free(&j);
    return rc;
}

static int read_memory_json(tr_report *r, char *err, size_t errlen) {
    tr_json j;
    int rc = read_json(r->dir, "memory.json", &j, err, errlen);
    if (rc) return rc;
    static const char *kinds[5] = {"params", "grads", "optimizer", "activations", "scratch"};
    const tr_json *p = tr_json_get(&j, "predicted");
    for (int k = 0; k < 5; k++) {
        r->mem1[k] = has_num(&j, kinds[k]) ? num(&j, kinds[k]) : 0;
        r->pred1[k] = p && has_num(p, kinds[k]) ? num(p, kinds[k]) : 0;
    }
    r->has_memory_json = r->mem_single = 1;
    tr_json_free(&j);
    return 0;
}

/* A tree flattened to "a.b[2].c" = value pairs. */
static int flatten(tr_report_kv **kv, int *n, int *cap, const tr_json *j, const char *prefix) {
    if (j->type == TR_JSON_OBJ || j->type == TR_JSON_ARR) {
        for (int i = 0; i < j->n; i++) {
            char key[128];
            if (j->type == TR_JSON_OBJ)
                snprintf(key, sizeof(key), "%s%s%s", prefix, *prefix ? "." : "", j->kids[i].key);
            else
                snprintf(key, sizeof(key), "%s[%d]", prefix, i);
            if (flatten(kv, n, cap, &j->kids[i], key)) return -1;
        }
        return 0;
    }
    if (grow((void **)kv, cap, *n, sizeof(tr_report_kv))) return -1;
    tr_report_kv *e = &(*kv)[(*n)++];
    snprintf(e->key, sizeof(e->key), "%s", prefix);
    e->is_num = j->type == TR_JSON_NUM, e->num = j->num;
    if (j->type == TR_JSON_STR)
        snprintf(e->val, sizeof(e->val), "%s", j->str);
    else if (j->type == TR_JSON_NUM)
        for (int p = 1; p <= 17; p++) { /* the shortest text that reads back exactly */
            snprintf(e->val, sizeof(e->val), "%.*g", p, j->num);
            if (strtod(e->val, NULL) == j->num) break;
        }
    else if (j->type == TR_JSON_BOOL)
        snprintf(e->val, sizeof(e->val), "%s", j->num != 0 ? "true" : "false");
    else
        snprintf(e->val, sizeof(e->val), "null");
    return 0;
}

static int read_provenance(const char *dir, tr_report_kv **kv, int *n, char *err, size_t errlen) {
    tr_json j;
    int rc = read_json(dir, "provenance.json", &j, err, errlen), cap = 0;
    if (rc) return rc;
    *n = 0;
    if (flatten(kv, n, &cap, &j, "")) {
        snprintf(err, errlen, "trainer report: out of memory");
        rc = -1;
    }
    tr_json_free(&j);
    return rc;
}

/* ---- the folder ----------------------------------------------------------------------------- */

static line_fn readers[TR_RF_FILES] = {on_metrics, on_ledger, on_attempts};

int tr_report_load(tr_report *r, const char *dir, const char *cluster, char *err, size_t errlen) {
    memset(r, 0, sizeof(*r));
    snprintf(r->dir, sizeof(r->dir), "%s", dir);
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
        snprintf(err, errlen, "trainer report: '%s' is not a run folder (%s)", dir,
                 stat(dir, &st) != 0 ? strerror(errno) : "not a folder");
        return -1;
    }
    tr_cluster c;
    if (cluster) {
        if (tr_cluster_load(&c, cluster, err, errlen)) return -1;
        snprintf(r->cluster, sizeof(r->cluster), "%s", cluster);
        r->priced = 1;
    }
    for (int f = 0; f < TR_RF_FILES; f++) {
        int rc = read_jsonl(r, f, readers[f], err, errlen);
        if (rc < 0) return -1;
        r->missing[f] = rc == 1;
    }
    if (r->missing[TR_RF_METRICS]) {
        snprintf(err, errlen, "trainer report: '%s' has no metrics.jsonl (not a run folder?)", dir);
        return -1;
    }
    sort_steps(r);
    char e2[2048];
    if (read_ranks_json(r, e2, sizeof(e2)) < 0)
        fprintf(stderr, "trainer report: %s (left out)\n", e2);
    if (read_memory_json(r, e2, sizeof(e2)) < 0)
        fprintf(stderr, "trainer report: %s (left out)\n", e2);
    int rc = read_provenance(dir, &r->prov, &r->n_prov, e2, sizeof(e2));
    if (rc < 0) fprintf(stderr, "trainer report: %s (left out)\n", e2);
    r->has_provenance = rc == 0;
    return tr_report_figures(r, cluster ? &c : NULL, err, errlen);
}

/* The two runs' provenance.json through trainer/report/provenance.h's comparison (the one `trainer
 * run` and the tests use): what differs, whether it can change the numbers, the verdict. */
int tr_report_load_compare(tr_report *r, const char *other, char *err, size_t errlen) {
    tr_json a, b;
    char e2[2048];
    int rc = read_json(other, "provenance.json", &b, e2, sizeof(e2));
    if (rc) {
        if (rc > 0)
            snprintf(err, errlen, "trainer report: --compare '%s': no provenance.json there",
                     other);
        else
            snprintf(err, errlen, "trainer report: --compare: %s", e2);
        return -1;
    }
    rc = read_json(r->dir, "provenance.json", &a, e2, sizeof(e2));
    if (rc) {
        snprintf(err, errlen, "trainer report: --compare: %s",
                 rc > 0 ? "this run folder has no provenance.json" : e2);
        tr_json_free(&b);
        return -1;
    }
    snprintf(r->other, sizeof(r->other), "%s", other);
    r->compared = 1;
    r->n_diffs = tr_provenance_diff(&a, &b, r->diffs, TR_PROV_MAX_DIFFS);
    int shown = r->n_diffs < TR_PROV_MAX_DIFFS ? r->n_diffs : TR_PROV_MAX_DIFFS;
    r->comparable = 1;
    for (int i = 0; i < shown; i++)
        if (r->diffs[i].numbers) r->comparable = 0;
    tr_provenance_verdict(r->diffs, shown, r->verdict, sizeof(r->verdict));
    tr_json_free(&a);
    tr_json_free(&b);
    return 0;
}

void tr_report_free(tr_report *r) {
    if (!r) return;
    for (int i = 0; i < r->n_steps; i++)
        free(r->steps[i].rank_compute);
    for (int i = 0; i < r->n_led; i++)
        free(r->led[i].v);
    for (int i = 0; i < r->n_cols; i++)
        free(r->cols[i].v);
    for (int i = 0; i < r->n_attempts; i++)
        free(r->att[i].stopped);
    for (int f = 0; f < TR_RF_FILES; f++)
        free(r->skipped[f].line);
    free(r->steps), free(r->led), free(r->cols), free(r->att), free(r->down), free(r->saves);
    free(r->strag), free(r->prov), free(r->ranks), free(r->rjson), free(r->hosts);
    free(r->providers), free(r->start_hosts), free(r->start_devices);
    memset(r, 0, sizeof(*r));
}

int tr_report_missing(const tr_report *r, const char *names[TR_REPORT_RECORDS]) {
    static const char *what[] = {"ledger.jsonl", "attempts.jsonl", "ranks.json", "memory.json",
                                 "provenance.json"};
    int miss[] = {r->missing[1], r->missing[2], !r->has_ranks_json, !r->has_memory_json,
                  !r->has_provenance};
    int n = 0;
    for (int i = 0; i < TR_REPORT_RECORDS; i++)
        if (miss[i]) names[n++] = what[i];
    return n;
}

void tr_report_skipped_line(const tr_report *r, int k, char *buf, size_t len) {
    const tr_report_lines *s = &r->skipped[k];
    buf[0] = 0;
    if (s->n == 0) return;
    size_t used = (size_t)snprintf(
        buf, len, "%s: skipped %d damaged line(s): ", tr_report_file_names[k], s->n);
    for (int i = 0; i < s->n && used + 16 < len; i++)
        used += (size_t)snprintf(buf + used, len - used, "%s%d", i ? ", " : "", s->line[i]);
}

/* ---- the command ---------------------------------------------------------------------------- */

static const char *report_help =
    "usage: trainer report RUN_DIR [--out FILE] [--json] [--cluster FILE] [--compare RUN_DIR]\n"
    "       trainer report --compare EXP [--out FILE] [--json | --csv]\n"
    "\n"
    "Read a run folder's records (metrics.jsonl, ledger.jsonl, attempts.jsonl, ranks.json,\n"
    "memory.json, provenance.json) and write one self-contained HTML page (inline SVG, no\n"
    "script, no network): the summary, loss and validation loss, tokens/s and MFU, each rank's\n"
    "time by part, a ranks x steps heat map with the straggler alarms, memory per rank, the\n"
    "timeline of attempts, saves and failures, the plan against the run, the provenance, and\n"
    "the cost split per rank, host and provider (the rule is written in the page).\n"
    "\n"
    "  --out FILE        where to write (default RUN_DIR/report.html; with --json, stdout)\n"
    "  --json            the same figures as JSON instead of the page\n"
    "  --cluster FILE    a cluster file (see trainer plan): ranks are numbered through its\n"
    "                    groups in order and take their provider and price_per_hour from it;\n"
    "                    without it every rank costs 1 unit per hour\n"
    "  --compare DIR     what differs from DIR's provenance.json, and whether the two runs\n"
    "                    are comparable\n"
    "\n"
    "With an experiment folder (`trainer sweep --out EXP`; `trainer report EXP` is the same):\n"
    "a table of its settings (the points that differ only in their seed) with the final and\n"
    "best validation loss, the final training loss and the task accuracies (RUN/eval.json)\n"
    "as mean ± standard deviation over the seeds that finished; what the points' provenance\n"
    "says (\"differs in lr only\", \"same experiment, another seed\", or the fields that also\n"
    "differ); on stdout, with the page (curves per setting with their seeds' range) in\n"
    "EXP/report.html, or --json / --csv (every figure's mean, sd, min and max) instead.\n";

static int write_out(const tr_report *r, const char *out, int json) {
    char def[1200];
    if (!out && !json) snprintf(def, sizeof(def), "%s/report.html", r->dir), out = def;
    FILE *f = out ? fopen(out, "w") : stdout;
    if (!f) {
        fprintf(stderr, "trainer report: cannot write '%s': %s\n", out, strerror(errno));
        return 1;
    }
    if (json)
        tr_report_write_json(r, f);
    else
        tr_report_write_html(r, f);
    int bad = fflush(f) != 0 || ferror(f);
    if (out && fclose(f)) bad = 1;
    if (bad) {
        fprintf(stderr, "trainer report: cannot write '%s': %s\n", out ? out : "stdout",
                strerror(errno ? errno : EIO));
        return 1;
    }
    if (out && !json) printf("report: %s\n", out);
    return 0;
}

/* An experiment folder (a sweep's): the table on stdout and the page in EXP/report.html, or
 * the JSON or CSV (to --out, else stdout). */
static int report_experiment(const char *dir, const char *out, int json, int csv) {
    tr_ex e;
    char err[1200], def[1200];
    if (tr_ex_load(&e, dir, err, sizeof err)) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    if (!out && !json && !csv) snprintf(def, sizeof def, "%s/report.html", dir), out = def;
    tr_atomic a;
    int rc = out ? tr_atomic_open(&a, out, err, sizeof err) : 0;
    FILE *f = out ? a.f : stdout;
    if (!rc) {
        if (json) tr_ex_write_json(&e, f);
        else if (csv) tr_ex_write_csv(&e, f);
        else tr_ex_write_html(&e, f);
        rc = out ? tr_atomic_commit(&a, err, sizeof err) : fflush(stdout);
    }
    if (rc) fprintf(stderr, "trainer report: %s\n", out ? err : "cannot write stdout");
    else if (!json && !csv) tr_ex_write_text(&e, stdout), printf("report: %s\n", out);
    tr_ex_free(&e);
    return rc ? 1 : 0;
}

int tr_cmd_report(int argc, char **argv) {
    const char *dir = NULL, *out = NULL, *cluster = NULL, *other = NULL;
    int json = 0, csv = 0;
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        const char **dst = !strcmp(a, "--out")       ? &out
                           : !strcmp(a, "--cluster") ? &cluster
                           : !strcmp(a, "--compare") ? &other
                                                     : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(report_help, stdout);
            return 0;
        } else if (!strcmp(a, "--json")) {
            json = 1;
        } else if (!strcmp(a, "--csv")) {
            csv = 1;
        } else if (dst) {
            if (i + 1 >= argc) {
                fprintf(stderr, "trainer report: %s needs a value (see trainer report --help)\n",
                        a);
                return 2;
            }
            *dst = argv[++i];
        } else if (a[0] == '-' && a[1]) {
            fprintf(stderr, "trainer report: unknown option '%s' (see trainer report --help)\n", a);
            return 2;
        } else if (dir) {
            fprintf(stderr, "trainer report: unexpected argument '%s' (one run folder only)\n", a);
            return 2;
        } else {
            dir = a;
        }
    }
    const char *exp = dir && tr_ex_is_experiment(dir)                        ? dir
                      : !dir && other && tr_ex_is_experiment(other) ? other
                                                                              : NULL;
    if (exp && json && csv) {
        fprintf(stderr, "trainer report: --json or --csv, not both\n");
        return 2;
    }
    if (exp && dir && other) {
        fprintf(stderr, "trainer report: %s is an experiment folder: `trainer report --compare "
                        "%s` tables its points (no second folder)\n", exp, exp);
        return 2;
    }
    if (exp) return report_experiment(exp, out, json, csv);
    if (csv) {
        fprintf(stderr, "trainer report: --csv is for an experiment folder (a sweep's)\n");
        return 2;
    }
    if (!dir) {
        fprintf(stderr, "trainer report: no run folder given (see trainer report --help)\n");
        return 2;
    }
    tr_report *r = calloc(1, sizeof(tr_report));
    char err[4096];
    if (!r) return 1;
    int rc = tr_report_load(r, dir, cluster, err, sizeof(err));
    if (rc == 0 && other) rc = tr_report_load_compare(r, other, err, sizeof(err));
    if (rc) {
        fprintf(stderr, "%s\n", err);
        tr_report_free(r);
        free(r);
        return 1;
    }
    for (int k = 0; k < TR_RF_FILES; k++) {
        char line[600];
        tr_report_skipped_line(r, k, line, sizeof(line));
        if (line[0]) fprintf(stderr, "%s\n", line);
    }
    rc = write_out(r, out, json);
    tr_report_free(r);
    free(r);
    return rc;
}
