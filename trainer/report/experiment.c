/* An experiment folder's points read and summarized (trainer/report/experiment.h): each point's
 * run folder through the run report's own reader (tr_report_load), grouped into settings over
 * the seeds, and the provenance of the points compared. */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "data/json.h"
#include "parallel/comm/base.h"
#include "trainer/report/experiment.h"
#include "trainer/report/report.h"

const char *const tr_ex_figure_keys[TR_EX_FIGURES] = {"final_val_loss", "best_val_loss",
                                                      "final_loss"};

static double json_num(const tr_json *o, const char *k) {
    const tr_json *v = o ? tr_json_get(o, k) : NULL;
    return v && v->type == TR_JSON_NUM ? v->num : NAN;
}

int tr_ex_is_experiment(const char *dir) {
    char path[1100];
    snprintf(path, sizeof path, "%s/sweep.json", dir);
    return access(path, F_OK) == 0;
}

/* ---- one point ------------------------------------------------------------------------------ */

static void point_state(const tr_ex *e, tr_ex_point *p) {
    char path[1400];
    snprintf(path, sizeof path, "%s/status/%s.json", e->dir, p->name);
    tr_json j;
    snprintf(p->state, sizeof p->state, "unfinished");
    if (tr_json_parse_file(&j, path, NULL, 0)) return;
    const tr_json *st = tr_json_get(&j, "state"), *why = tr_json_get(&j, "why");
    if (st && st->type == TR_JSON_STR) snprintf(p->state, sizeof p->state, "%s", st->str);
    if (why && why->type == TR_JSON_STR) snprintf(p->why, sizeof p->why, "%s", why->str);
    p->done = !strcmp(p->state, "done");
    tr_json_free(&j);
}

/* The point's metrics: final and best figures, its curves. */
static void point_metrics(const tr_report *r, tr_ex_point *p) {
    int n = r->n_steps;
    p->last_step = n ? r->steps[n - 1].step : -1;
    p->fig[TR_EX_FINAL_LOSS] = n ? r->steps[n - 1].loss : NAN;
    p->hours = n ? (r->steps[n - 1].time_s - r->steps[0].time_s + r->steps[0].step_s) / 3600 : NAN;
    p->step = malloc((size_t)(n + 1) * sizeof(double));
    p->loss = malloc((size_t)(n + 1) * sizeof(double));
    p->val = malloc((size_t)(n + 1) * sizeof(double));
    if (!p->step || !p->loss || !p->val) return;
    p->n_curve = n;
    for (int i = 0; i < n; i++) {
        const tr_report_step *s = &r->steps[i];
        p->step[i] = (double)s->step, p->loss[i] = s->loss, p->val[i] = s->val_loss;
        if (isfinite(s->val_loss)) {
            p->fig[TR_EX_FINAL_VAL] = s->val_loss;
            if (!(p->fig[TR_EX_BEST_VAL] <= s->val_loss)) p->fig[TR_EX_BEST_VAL] = s->val_loss;
        }
    }
}

static int task_index(tr_ex *e, const char *name) {
    for (int t = 0; t < e->n_tasks; t++)
        if (!strcmp(e->tasks[t], name)) return t;
    if (e->n_tasks == TR_EX_MAX_TASKS) return -1;
    snprintf(e->tasks[e->n_tasks], sizeof e->tasks[0], "%s", name);
    return e->n_tasks++;
}

static void put_task(tr_ex *e, tr_ex_point *p, const char *name, const tr_json *o) {
    int t = task_index(e, name);
    if (t < 0) return;
    p->task[t][0] = json_num(o, "acc");
    p->task[t][1] = json_num(o, "acc_norm");
}

/* The tasks of the last line of RUN/metrics.jsonl that has them (eval { } during training:
 * "tasks": {NAME: {acc, acc_norm, ...}}), when one has. */
static void metrics_tasks(tr_ex *e, tr_ex_point *p, const char *run) {
    char path[1400], err[160];
    snprintf(path, sizeof path, "%s/metrics.jsonl", run);
    size_t len, n = 0;
    char *text = tr_read_file(path, SIZE_MAX, &len), *last = NULL;
    for (char *l = text; l && l < text + len;) { /* each line, cut at its end */
        char *end = memchr(l, '\n', (size_t)(text + len - l));
        if (end) *end = '\0';
        size_t ln = end ? (size_t)(end - l) : strlen(l);
        if (strstr(l, "\"tasks\": {")) last = l, n = ln;
        l += ln + 1;
    }
    tr_json j;
    int found = last && !tr_json_parse(&j, last, n, err, sizeof err);
    const tr_json *ts = found ? tr_json_get(&j, "tasks") : NULL;
    for (int i = 0; ts && ts->type == TR_JSON_OBJ && i < ts->n; i++)
        put_task(e, p, ts->kids[i].key, &ts->kids[i]);
    if (found) tr_json_free(&j);
    free(text);
}

/* RUN/eval.json, as `trainer eval --json` writes it ({"tasks": [{"name", "acc", "acc_norm"}]}),
 * else the tasks eval { } scored at the run's last scoring step. */
static void point_tasks(tr_ex *e, tr_ex_point *p, const char *run) {
    char path[1400];
    snprintf(path, sizeof path, "%s/eval.json", run);
    tr_json j;
    if (tr_json_parse_file(&j, path, NULL, 0)) {
        metrics_tasks(e, p, run);
        return;
    }
    const tr_json *ts = tr_json_get(&j, "tasks");
    for (int i = 0; ts && ts->type == TR_JSON_ARR && i < ts->n; i++) {
        const tr_json *name = tr_json_get(&ts->kids[i], "name");
        if (name && name->type == TR_JSON_STR) put_task(e, p, name->str, &ts->kids[i]);
    }
    tr_json_free(&j);
}

static void load_point(tr_ex *e, tr_ex_point *p, const tr_json *jp) {
    const tr_json *name = tr_json_get(jp, "name"), *vals = tr_json_get(jp, "values");
    snprintf(p->name, sizeof p->name, "%s", name && name->type == TR_JSON_STR ? name->str : "?");
    for (int a = 0; a < e->n_axes; a++) {
        const tr_json *v = vals ? tr_json_get(vals, e->axes[a]) : NULL;
        snprintf(p->values[a], sizeof p->values[a], "%s", v && v->type == TR_JSON_STR ? v->str : "");
    }
    for (int f = 0; f < TR_EX_FIGURES; f++) p->fig[f] = NAN;
    for (int t = 0; t < TR_EX_MAX_TASKS; t++) p->task[t][0] = p->task[t][1] = NAN;
    p->last_step = -1;
    p->hours = NAN;
    point_state(e, p);
    char run[1300], err[512];
    snprintf(run, sizeof run, "%s/points/%s", e->dir, p->name);
    tr_report *r = calloc(1, sizeof *r);
    if (r && access(run, F_OK) == 0 && !tr_report_load(r, run, NULL, err, sizeof err))
        point_metrics(r, p);
    if (r) tr_report_free(r), free(r);
    point_tasks(e, p, run);
    char prov[1400];
    snprintf(prov, sizeof prov, "%s/provenance.json", run);
    p->prov = tr_read_file(prov, 64u << 20, &p->prov_len);
}

/* ---- settings ------------------------------------------------------------------------------- */

static int same_setting(const tr_ex *e, const tr_ex_point *a, const tr_ex_point *b) {
    for (int x = 0; x < e->n_axes; x++)
        if (x != e->seed_axis && strcmp(a->values[x], b->values[x])) return 0;
    return 1;
}

static void stat_of(tr_ex_stat *s, const double *v, int n) {
    memset(s, 0, sizeof *s);
    double sum = 0, sq = 0;
    s->min = INFINITY, s->max = -INFINITY;
    for (int i = 0; i < n; i++) {
        if (!isfinite(v[i])) continue;
        s->n++, sum += v[i];
        s->min = fmin(s->min, v[i]), s->max = fmax(s->max, v[i]);
    }
    s->mean = s->n ? sum / s->n : NAN;
    for (int i = 0; i < n; i++)
        if (isfinite(v[i])) sq += (v[i] - s->mean) * (v[i] - s->mean);
    s->sd = s->n > 1 ? sqrt(sq / (s->n - 1)) : NAN;
    if (!s->n) s->min = s->max = NAN;
}

/* A figure of a point that finished; NAN for one cut short or failed (its last figures are
 * not the experiment's). */
static double done_or_nan(const tr_ex_point *p, double v) {
    return p->done ? v : NAN;
}

static void setting_stats(tr_ex *e, tr_ex_setting *g) {
    double v[4096];
    int n = g->n > 4096 ? 4096 : g->n;
    for (int f = 0; f < TR_EX_FIGURES; f++) {
        for (int i = 0; i < n; i++) v[i] = done_or_nan(&e->points[g->first + i], e->points[g->first + i].fig[f]);
        stat_of(&g->fig[f], v, n);
    }
    for (int t = 0; t < e->n_tasks; t++)
        for (int k = 0; k < 2; k++) {
            for (int i = 0; i < n; i++)
                v[i] = done_or_nan(&e->points[g->first + i], e->points[g->first + i].task[t][k]);
            stat_of(&g->task[t][k], v, n);
        }
}

static void setting_label(const tr_ex *e, tr_ex_setting *g) {
    const tr_ex_point *p = &e->points[g->first];
    size_t used = 0;
    g->label[0] = 0;
    for (int x = 0; x < e->n_axes; x++) {
        if (x == e->seed_axis) continue;
        used += (size_t)snprintf(g->label + used, sizeof g->label - used, "%s%s=%s",
                                 used ? ", " : "", e->axes[x], p->values[x]);
        if (used >= sizeof g->label) break;
    }
    if (!g->label[0]) snprintf(g->label, sizeof g->label, "all");
}

/* The mean of the finished seeds' curve y at each of the first point's steps that every one
 * of them has (NAN where one lacks it), and their range there. */
/* The setting's point whose steps its curves follow: its first finished one, else its first. */
static const tr_ex_point *ref_point(const tr_ex *e, const tr_ex_setting *g) {
    for (int j = 0; j < g->n; j++)
        if (e->points[g->first + j].done) return &e->points[g->first + j];
    return &e->points[g->first];
}

static void mean_curve(const tr_ex *e, const tr_ex_setting *g, int val, double *m, double *lo,
                       double *hi) {
    const tr_ex_point *p0 = ref_point(e, g);
    int at[4096] = {0};
    for (int i = 0; i < p0->n_curve; i++) {
        double sum = 0, mn = INFINITY, mx = -INFINITY;
        int have = 0;
        for (int j = 0; j < g->n && j < 4096; j++) {
            const tr_ex_point *p = &e->points[g->first + j];
            if (!p->done) continue;
            while (at[j] < p->n_curve && p->step[at[j]] < p0->step[i]) at[j]++;
            if (at[j] >= p->n_curve || p->step[at[j]] != p0->step[i]) continue;
            double y = val ? p->val[at[j]] : p->loss[at[j]];
            if (!isfinite(y)) continue;
            have++, sum += y, mn = fmin(mn, y), mx = fmax(mx, y);
        }
        int all = have > 0 && have == g->done;
        m[i] = all ? sum / have : NAN, lo[i] = all ? mn : NAN, hi[i] = all ? mx : NAN;
    }
}

static void setting_curves(tr_ex *e, tr_ex_setting *g) {
    const tr_ex_point *p0 = ref_point(e, g);
    int n = p0->n_curve;
    double **arr[7] = {&g->step, &g->loss, &g->loss_lo, &g->loss_hi, &g->val, &g->val_lo, &g->val_hi};
    for (int k = 0; k < 7; k++)
        if (!(*arr[k] = malloc((size_t)(n + 1) * sizeof(double)))) return;
    g->n_curve = n;
    if (n) memcpy(g->step, p0->step, (size_t)n * sizeof(double));
    mean_curve(e, g, 0, g->loss, g->loss_lo, g->loss_hi);
    mean_curve(e, g, 1, g->val, g->val_lo, g->val_hi);
}

/* ---- what the provenance says ----------------------------------------------------------------- */

/* The fields that can change the numbers in which points a and b differ, beside the ones a sweep
 * varies on purpose (the recipe's training text, the seed): into buf, "" when none; -1 when
 * either has no provenance. */
static int other_diffs(const tr_ex_point *a, const tr_ex_point *b, char *buf, size_t n) {
    buf[0] = 0;
    if (!a->prov || !b->prov) return -1;
    tr_json ja, jb;
    char err[160];
    if (tr_json_parse(&ja, a->prov, a->prov_len, err, sizeof err)) return -1;
    if (tr_json_parse(&jb, b->prov, b->prov_len, err, sizeof err)) {
        tr_json_free(&ja);
        return -1;
    }
    tr_prov_diff *d = calloc(TR_PROV_MAX_DIFFS, sizeof *d);
    int nd = d ? tr_provenance_diff(&ja, &jb, d, TR_PROV_MAX_DIFFS) : 0;
    size_t used = 0;
    for (int i = 0; i < nd && i < TR_PROV_MAX_DIFFS && used < n; i++) {
        if (!d[i].numbers || !strcmp(d[i].field, "recipe.training") ||
            !strcmp(d[i].field, "seeds.train"))
            continue;
        used += (size_t)snprintf(buf + used, n - used, "%s%s (%s -> %s)", used ? ", " : "",
                                 d[i].field, d[i].a, d[i].b);
    }
    free(d);
    tr_json_free(&ja), tr_json_free(&jb);
    return 0;
}

static void setting_verdict(tr_ex *e, tr_ex_setting *g) {
    const tr_ex_point *p = &e->points[g->first], *b = &e->points[e->settings[0].first];
    char axes[256] = "", extra[400];
    int n = 0;
    size_t used = 0;
    for (int x = 0; x < e->n_axes; x++)
        if (x != e->seed_axis && strcmp(p->values[x], b->values[x]))
            used += (size_t)snprintf(axes + used, sizeof axes - used, "%s%s",
                                     n++ ? ", " : "", e->axes[x]);
    if (g == e->settings) snprintf(g->verdict, sizeof g->verdict, "baseline");
    else snprintf(g->verdict, sizeof g->verdict, "differs in %s%s", axes, n == 1 ? " only" : "");
    int rc = other_diffs(b, p, extra, sizeof extra);
    size_t l = strlen(g->verdict);
    if (g != e->settings && rc < 0)
        snprintf(g->verdict + l, sizeof g->verdict - l, " (no provenance to confirm it)");
    else if (g != e->settings && extra[0])
        snprintf(g->verdict + l, sizeof g->verdict - l, "; the runs also differ in %s", extra);
    /* among the seeds */
    snprintf(g->seeds_verdict, sizeof g->seeds_verdict,
             g->n > 1 ? "same experiment, another seed" : "one seed");
    for (int j = 1; j < g->n; j++) {
        const tr_ex_point *q = &e->points[g->first + j];
        if (other_diffs(p, q, extra, sizeof extra) < 0)
            snprintf(extra, sizeof extra, "provenance missing");
        if (!extra[0]) continue;
        snprintf(g->seeds_verdict, sizeof g->seeds_verdict, "%s: %s", q->name, extra);
        break;
    }
}

/* ---- the whole -------------------------------------------------------------------------------- */

static int read_axes(tr_ex *e, const tr_json *axes) {
    if (!axes || axes->type != TR_JSON_ARR || axes->n > TR_EX_MAX_AXES) return -1;
    e->n_axes = axes->n, e->seed_axis = -1;
    for (int a = 0; a < axes->n; a++) {
        const tr_json *l = tr_json_get(&axes->kids[a], "label");
        if (!l || l->type != TR_JSON_STR) return -1;
        snprintf(e->axes[a], sizeof e->axes[a], "%s", l->str);
        if (!strcmp(l->str, "seed")) e->seed_axis = a;
    }
    return 0;
}

static int group(tr_ex *e) {
    e->settings = calloc((size_t)e->n_points + 1, sizeof *e->settings);
    if (!e->settings) return -1;
    for (int k = 0; k < e->n_points; k++) {
        tr_ex_point *p = &e->points[k];
        int g = 0;
        while (g < e->n_settings && !same_setting(e, &e->points[e->settings[g].first], p)) g++;
        if (g == e->n_settings) e->settings[e->n_settings++].first = k;
        else if (e->settings[g].first + e->settings[g].n != k) return -1; /* not contiguous */
        e->settings[g].n++;
        e->settings[g].done += p->done;
        p->setting = g;
        e->n_done += !strcmp(p->state, "done");
        e->n_failed += !strcmp(p->state, "failed");
    }
    for (int g = 0; g < e->n_settings; g++) {
        setting_label(e, &e->settings[g]);
        setting_stats(e, &e->settings[g]);
        setting_curves(e, &e->settings[g]);
        setting_verdict(e, &e->settings[g]);
    }
    return 0;
}

int tr_ex_load(tr_ex *e, const char *dir, char *err, size_t errlen) {
    memset(e, 0, sizeof *e);
    snprintf(e->dir, sizeof e->dir, "%s", dir);
    char path[1100];
    snprintf(path, sizeof path, "%s/sweep.json", dir);
    tr_json j;
    if (tr_json_parse_file(&j, path, NULL, 0))
        return tr_errf(err, errlen, "trainer report: %s: cannot read it as JSON", path);
    const tr_json *pts = tr_json_get(&j, "points");
    int rc = read_axes(e, tr_json_get(&j, "axes"));
    if (rc || !pts || pts->type != TR_JSON_ARR || pts->n < 1 || pts->n > 4096) {
        tr_json_free(&j);
        return tr_errf(err, errlen, "trainer report: %s: not a sweep this trainer wrote", path);
    }
    e->n_points = pts->n;
    e->points = calloc((size_t)pts->n, sizeof *e->points);
    if (!e->points) rc = -1;
    for (int k = 0; !rc && k < pts->n; k++) load_point(e, &e->points[k], &pts->kids[k]);
    tr_json_free(&j);
    if (!rc) rc = group(e);
    return rc ? tr_errf(err, errlen, "trainer report: %s: the points of a setting are not "
                                     "together (or out of memory)", path)
              : 0;
}

void tr_ex_free(tr_ex *e) {
    for (int k = 0; k < e->n_points && e->points; k++) {
        tr_ex_point *p = &e->points[k];
        free(p->step), free(p->loss), free(p->val), free(p->prov);
    }
    for (int g = 0; g < e->n_settings && e->settings; g++) {
        tr_ex_setting *s = &e->settings[g];
        free(s->step), free(s->loss), free(s->loss_lo), free(s->loss_hi);
        free(s->val), free(s->val_lo), free(s->val_hi);
    }
    free(e->points), free(e->settings);
    memset(e, 0, sizeof *e);
}
