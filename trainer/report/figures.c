/* The figures of a report from the records report.c read: the time base, the summary, each
 * rank's parts, FLOPs and memory, the attempts and the downtime between them, the heat map,
 * the cost split, its sums per host and provider, the provenance comparison and the --json
 * output. One place computes each number; the page (report/html.c) only shows them. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "data/json.h"
#include "trainer/report/report.h"

/* ---- time ------------------------------------------------------------------------------------ */

static void minf(double *m, double v) {
    if (isfinite(v) && !(*m <= v)) *m = v;
}

/* t0: the earliest start any record gives; each step's time since it (or, without "time" in
 * metrics.jsonl, the running sum of step_s). */
static void time_base(tr_report *r) {
    double t0 = NAN;
    for (int i = 0; i < r->n_attempts; i++)
        minf(&t0, r->att[i].t_start);
    for (int i = 0; i < r->n_led; i++)
        minf(&t0, r->led[i].t0);
    for (int i = 0; i < r->n_steps; i++) {
        const tr_report_step *s = &r->steps[i];
        if (isfinite(s->time_unix)) {
            r->have_time = 1;
            minf(&t0, s->time_unix - (isfinite(s->step_s) ? s->step_s : 0));
        }
    }
    r->t0 = isfinite(t0) ? t0 : 0;
    double sum = 0;
    for (int i = 0; i < r->n_steps; i++) {
        tr_report_step *s = &r->steps[i];
        sum += isfinite(s->step_s) ? s->step_s : 0;
        s->time_s = r->have_time ? s->time_unix - r->t0 : sum;
    }
}

/* ---- attempts and downtime --------------------------------------------------------------------
 */

static void seen(tr_report_attempt *a, double t, int64_t step) {
    if (isfinite(t) && !(a->t_last >= t)) a->t_last = t;
    if (step > a->last_step) a->last_step = step;
}

static int by_attempt(const void *x, const void *y) {
    const tr_report_attempt *a = x, *b = y;
    return (a->attempt > b->attempt) - (a->attempt < b->attempt);
}

static const char *host_of(const tr_report *r, int rank) {
    if (rank >= 0 && rank < r->n_start_hosts && r->start_hosts[rank][0])
        return r->start_hosts[rank];
    for (int i = 0; i < r->n_rjson; i++)
        if (r->rjson[i].rank == rank && r->rjson[i].host[0]) return r->rjson[i].host;
    return "-";
}

/* The failed rank of an attempt without an "end": the one a "failed" line names, else the one
 * rank that wrote no "stopped" line when all the others did. */
static void failed_rank(const tr_report *r, tr_report_attempt *a) {
    int n = a->ranks > 0 ? a->ranks : r->n_ranks;
    if (a->ended || a->failed_rank >= 0 || n < 2 || a->n_stopped != n - 1) return;
    for (int k = 0; k < n; k++) {
        int stopped = 0;
        for (int i = 0; i < a->n_stopped; i++)
            stopped |= a->stopped[i] == k;
        if (!stopped) a->failed_rank = k;
    }
}

/* The downtime between attempts a and b: as `trainer supervise` recorded it (its downtime,
 * steps redone and the cause: the exit status, the failed rank and host) when it ran the job,
 * else from the records: b's start less the last time any record saw a. */
static void downtime(const tr_report_attempt *a, const tr_report_attempt *b, tr_report_down *d) {
    const tr_report_sv *sv = &a->sv;
    d->after = a->attempt;
    d->downtime_s = isfinite(b->t_start) && b->t_start > a->t_last ? b->t_start - a->t_last : 0;
    d->steps_redone =
        b->start_step >= 0 && a->last_step > b->start_step ? a->last_step - b->start_step : 0;
    d->rank = a->ended ? -1 : a->failed_rank;
    snprintf(d->host, sizeof(d->host), "%s", d->rank >= 0 ? a->failed_host : "-");
    snprintf(d->cause, sizeof(d->cause), "%s", a->why);
    d->from = "records";
    if (!sv->has) return;
    d->from = "supervise";
    d->downtime_s = sv->down_s;
    if (sv->steps_redone >= 0) d->steps_redone = sv->steps_redone;
    if (sv->rank >= 0) {
        d->rank = sv->rank;
        snprintf(d->host, sizeof(d->host), "%s", sv->host[0] ? sv->host : a->failed_host);
    }
    snprintf(d->cause, sizeof(d->cause), "%s%s%s", sv->exit, sv->exit[0] && a->why[0] ? ": " : "",
             a->why);
}

static int attempts_fill(tr_report *r) {
    qsort(r->att, (size_t)r->n_attempts, sizeof(tr_report_attempt), by_attempt);
    for (int i = 0; i < r->n_attempts; i++) {
        tr_report_attempt *a = &r->att[i];
        for (int k = 0; k < r->n_steps; k++)
            if (r->steps[k].attempt == a->attempt) seen(a, r->steps[k].time_unix, r->steps[k].step);
        for (int k = 0; k < r->n_led; k++)
            if (r->led[k].attempt == a->attempt)
                seen(a, r->led[k].t1, r->led[k].total ? -1 : r->led[k].b);
        for (int k = 0; k < r->n_saves; k++)
            if (r->saves[k].attempt == a->attempt) seen(a, r->saves[k].t, r->saves[k].step);
        for (int k = 0; k < r->n_stragglers; k++)
            if (r->strag[k].attempt == a->attempt) seen(a, r->strag[k].t, -1);
        failed_rank(r, a);
        if (a->failed_rank >= 0 && !a->failed_host[0])
            snprintf(a->failed_host, sizeof(a->failed_host), "%s", host_of(r, a->failed_rank));
    }
    if (r->n_attempts > 1) {
        r->down = calloc((size_t)r->n_attempts - 1, sizeof(tr_report_down));
        if (!r->down) return -1;
    }
    for (int i = 0; i + 1 < r->n_attempts; i++)
        downtime(&r->att[i], &r->att[i + 1], &r->down[r->n_down++]);
    return 0;
}

/* ---- the summary ------------------------------------------------------------------------------
 */

/* The plan against the run: mean step time, the fullest memory, each measured and predicted. */
static void plan(tr_report *r) {
    double v[4] = {0, 0, NAN, NAN};
    int n[2] = {0, 0};
    for (int i = 0; i < r->n_steps; i++) {
        const tr_report_step *s = &r->steps[i];
        if (isfinite(s->step_s)) v[0] += s->step_s, n[0]++;
        if (isfinite(s->pred_step_s)) v[1] += s->pred_step_s, n[1]++;
        if (isfinite(s->mem) && !(v[2] >= s->mem)) v[2] = s->mem;
        if (isfinite(s->pred_mem) && !(v[3] >= s->pred_mem)) v[3] = s->pred_mem;
    }
    r->plan_step_s = n[0] ? v[0] / n[0] : NAN;
    r->plan_pred_step_s = n[1] ? v[1] / n[1] : NAN;
    r->plan_mem = v[2], r->plan_pred_mem = v[3];
}

static void summary(tr_report *r) {
    double tokens = 0, train_s = 0, mfu = 0, best = NAN;
    int n_mfu = 0, attempts = r->n_attempts > 0 ? r->n_attempts : 1;
    for (int i = 0; i < r->n_steps; i++) {
        const tr_report_step *s = &r->steps[i];
        if (isfinite(s->tokens_per_s) && isfinite(s->step_s)) /* a step's tokens: a count */
            tokens += round(s->tokens_per_s * s->step_s), train_s += s->step_s;
        if (isfinite(s->mfu)) mfu += s->mfu, n_mfu++;
        if (isfinite(s->val_loss) && !(best <= s->val_loss)) best = s->val_loss;
        if (s->attempt > attempts) attempts = s->attempt;
    }
    r->attempts = attempts;
    r->last_step = r->n_steps ? r->steps[r->n_steps - 1].step : 0;
    r->tokens = tokens;
    r->tokens_per_s = train_s > 0 ? tokens / train_s : NAN;
    r->mfu = n_mfu ? mfu / n_mfu : NAN;
    r->best_val_loss = best;
    plan(r);
    /* the wall time: the span of the attempts, else of the ledger, else of the steps' times */
    double first = NAN, last = NAN;
    for (int i = 0; i < r->n_attempts; i++) {
        minf(&first, r->att[i].t_start);
        if (isfinite(r->att[i].t_last) && !(last >= r->att[i].t_last)) last = r->att[i].t_last;
    }
    r->wall_from = "attempts.jsonl";
    if (!isfinite(first) && r->n_led) {
        r->wall_from = "ledger.jsonl";
        for (int i = 0; i < r->n_led; i++) {
            minf(&first, r->led[i].t0);
            if (!(last >= r->led[i].t1)) last = r->led[i].t1;
        }
    }
    if (!isfinite(first) && r->have_time) {
        r->wall_from = "metrics.jsonl time";
        first = r->t0;
        for (int i = 0; i < r->n_steps; i++)
            if (isfinite(r->steps[i].time_unix) && !(last >= r->steps[i].time_unix))
                last = r->steps[i].time_unix;
    }
    if (isfinite(first) && isfinite(last) && last >= first) {
        r->wall_s = last - first;
    } else {
        r->wall_from = "sum of step_s";
        r->wall_s = r->n_steps ? r->steps[r->n_steps - 1].time_s : 0;
    }
}

/* ---- ranks -------------------------------------------------------------------------------------
 */

static int has_total(const tr_report *r, int attempt) {
    for (int i = 0; i < r->n_led; i++)
        if (r->led[i].total && r->led[i].attempt == attempt) return 1;
    return 0;
}

/* Each rank's parts, FLOPs, tokens and waited_on_s: per attempt its "total" line when it has
 * one (its parts sum to the wall time), else the sum of its windows. */
static void parts_from_ledger(tr_report *r) {
    r->parts_from = r->flops_from = "ledger.jsonl";
    for (int i = 0; i < r->n_led; i++) {
        const tr_report_led *w = &r->led[i];
        if (!w->total && has_total(r, w->attempt)) continue;
        for (int k = 0; k < r->n_ranks && k < r->led_ranks; k++) {
            tr_report_rank *q = &r->ranks[k];
            const double *v = &w->v[k * TR_REPORT_LV];
            for (int p = 0; p < TR_REPORT_PARTS; p++)
                q->parts[p] += v[p];
            q->flops += v[TR_REPORT_PARTS];
            q->waited_on_s += v[TR_REPORT_PARTS + 2];
        }
    }
}

/* Without a ledger: ranks.json's compute, wait (communication and waiting together) and data
 * seconds, or one process's step times; the job's FLOPs (metrics' gflops x step_s) split by
 * compute seconds. */
static void parts_without_ledger(tr_report *r) {
    double job = 0, compute = 0;
    for (int i = 0; i < r->n_steps; i++)
        if (isfinite(r->steps[i].gflops) && isfinite(r->steps[i].step_s))
            job += r->steps[i].gflops * 1e9 * r->steps[i].step_s;
    if (r->n_rjson) {
        r->parts_from = "ranks.json";
        for (int i = 0; i < r->n_rjson; i++) {
            int k = r->rjson[i].rank;
            if (k < 0 || k >= r->n_ranks) continue;
            for (int p = 0; p < TR_REPORT_PARTS; p++)
                r->ranks[k].parts[p] = r->rjson[i].parts[p];
        }
    } else {
        r->parts_from = "metrics.jsonl step_s";
        r->ranks[0].parts[1] = r->wall_from[0] == 's' ? r->wall_s : 0;
        for (int i = 0; r->wall_from[0] != 's' && i < r->n_steps; i++)
            r->ranks[0].parts[1] += isfinite(r->steps[i].step_s) ? r->steps[i].step_s : 0;
    }
    r->flops_from = "metrics.jsonl gflops x step_s, split by compute seconds";
    for (int k = 0; k < r->n_ranks; k++)
        compute += r->ranks[k].parts[1];
    for (int k = 0; k < r->n_ranks; k++)
        r->ranks[k].flops = compute > 0 ? job * r->ranks[k].parts[1] / compute : job / r->n_ranks;
}

static int ranks_fill(tr_report *r, const tr_cluster *c, char *err, size_t errlen) {
    int n = r->n_ranks;
    if (c && tr_cluster_devices(c) < n) {
        snprintf(err, errlen,
                 "trainer report: cluster '%s' has %ld device(s), the run has %d ranks", r->cluster,
                 tr_cluster_devices(c), n);
        return -1;
    }
    r->ranks = calloc((size_t)n, sizeof(tr_report_rank));
    if (!r->ranks) {
        snprintf(err, errlen, "trainer report: out of memory");
        return -1;
    }
    for (int k = 0; k < n; k++) {
        tr_report_rank *q = &r->ranks[k];
        q->rank = k;
        snprintf(q->host, sizeof(q->host), "%s", host_of(r, k));
        snprintf(q->device, sizeof(q->device), "%s",
                 k < r->n_start_hosts ? r->start_devices[k] : "");
        for (int i = 0; i < r->n_rjson; i++)
            if (r->rjson[i].rank == k) {
                if (!q->device[0]) snprintf(q->device, sizeof(q->device), "%s", r->rjson[i].device);
                q->has_mem = r->rjson[i].has_mem;
                memcpy(q->mem, r->rjson[i].mem, sizeof(q->mem));
                memcpy(q->pred, r->rjson[i].pred, sizeof(q->pred));
            }
        if (n == 1 && !q->has_mem && r->mem_single) {
            q->has_mem = 1;
            memcpy(q->mem, r->mem1, sizeof(q->mem));
            memcpy(q->pred, r->pred1, sizeof(q->pred));
        }
        snprintf(q->provider, sizeof(q->provider), "-");
        q->price_hour = 1;
        if (c) {
            int g = tr_cluster_group_of(c, k, NULL);
            if (c->g[g].provider[0])
                snprintf(q->provider, sizeof(q->provider), "%s", c->g[g].provider);
            q->price_hour = c->g[g].price_hour.v;
        }
    }
    if (r->n_led)
        parts_from_ledger(r);
    else
        parts_without_ledger(r);
    for (int k = 0; k < n; k++)
        for (int p = 0; p < TR_REPORT_PARTS; p++)
            r->ranks[k].wall_s += r->ranks[k].parts[p];
    return 0;
}

/* ---- the heat map
 * -------------------------------------------------------------------------------- */

static int heat_fill(tr_report *r) {
    int n = r->n_ranks, cap = r->n_led + r->n_steps;
    r->cols = calloc((size_t)(cap > 0 ? cap : 1), sizeof(tr_report_col));
    if (!r->cols) return -1;
    r->heat_from = r->n_led ? "ledger.jsonl" : "metrics.jsonl rank_compute_s";
    for (int i = 0; i < r->n_led; i++) {
        const tr_report_led *w = &r->led[i];
        if (w->total) continue;
        while (r->n_cols && r->cols[r->n_cols - 1].a >= w->a) /* steps trained again */
            free(r->cols[--r->n_cols].v);
        tr_report_col *col = &r->cols[r->n_cols];
        if (!(col->v = calloc((size_t)n, sizeof(double)))) return -1;
        col->a = w->a, col->b = w->b;
        for (int k = 0; k < n && k < r->led_ranks; k++)
            col->v[k] = w->v[k * TR_REPORT_LV + 1];
        r->n_cols++;
    }
    for (int i = 0; !r->n_led && i < r->n_steps; i++) {
        const tr_report_step *s = &r->steps[i];
        if (!s->rank_compute || s->n_rank_compute != n) continue; /* another layout's step */
        tr_report_col *col = &r->cols[r->n_cols];
        if (!(col->v = malloc((size_t)n * sizeof(double)))) return -1;
        memcpy(col->v, s->rank_compute, (size_t)n * sizeof(double));
        col->a = col->b = s->step;
        r->n_cols++;
    }
    return 0;
}

/* ---- the cost split
 * ------------------------------------------------------------------------------ */

/* C = sum of price x booked hours (the span of the run, downtime included); each downtime
 * between attempts, priced for all ranks, to the rank whose failure caused it; the seconds
 * the others waited on a rank, at the mean price of the others, to that rank; the rest by
 * delivered FLOPs. */
static void cost_split(tr_report *r) {
    int n = r->n_ranks;
    double price = 0, flops = 0;
    for (int k = 0; k < n; k++)
        price += r->ranks[k].price_hour, flops += r->ranks[k].flops;
    r->booked_h = r->wall_s / 3600.0;
    r->cost_total = price * r->booked_h;
    for (int i = 0; i < r->n_down; i++) {
        tr_report_down *d = &r->down[i];
        if (d->rank < 0 || d->rank >= n) continue;
        d->cost = price * d->downtime_s / 3600.0;
        r->ranks[d->rank].downtime_s += d->downtime_s;
        r->ranks[d->rank].cost_downtime += d->cost;
        r->cost_downtime += d->cost;
    }
    for (int k = 0; n > 1 && k < n; k++) {
        tr_report_rank *q = &r->ranks[k];
        q->cost_waiting = q->waited_on_s / 3600.0 * (price - q->price_hour) / (n - 1);
        r->cost_waiting += q->cost_waiting;
    }
    r->cost_flops = r->cost_total - r->cost_downtime - r->cost_waiting;
    for (int k = 0; k < n; k++) {
        tr_report_rank *q = &r->ranks[k];
        q->cost_flops = r->cost_flops * (flops > 0 ? q->flops / flops : 1.0 / n);
        q->cost = q->cost_downtime + q->cost_waiting + q->cost_flops;
    }
}

/* The ranks summed by host (by_provider 0) or provider (1). */
static int group_by(const tr_report *r, int by_provider, tr_report_group **out, int *n_out) {
    tr_report_group *g = calloc((size_t)r->n_ranks, sizeof(tr_report_group));
    int n = 0;
    if (!g) return -1;
    for (int k = 0; k < r->n_ranks; k++) {
        const tr_report_rank *q = &r->ranks[k];
        const char *name = by_provider ? q->provider : q->host;
        int i = 0;
        while (i < n && strcmp(g[i].name, name))
            i++;
        if (i == n) snprintf(g[n++].name, sizeof(g[0].name), "%s", name);
        g[i].ranks++;
        g[i].flops += q->flops, g[i].compute_s += q->parts[1], g[i].wait_s += q->parts[3];
        g[i].waited_on_s += q->waited_on_s, g[i].downtime_s += q->downtime_s;
        g[i].cost += q->cost;
    }
    *out = g, *n_out = n;
    return 0;
}

int tr_report_figures(tr_report *r, const tr_cluster *c, char *err, size_t errlen) {
    if (r->n_ranks < 1) r->n_ranks = 1;
    time_base(r);
    int rc = attempts_fill(r);
    if (!rc) summary(r);
    if (!rc && ranks_fill(r, c, err, errlen)) return -1;
    if (!rc) rc = heat_fill(r);
    if (!rc) cost_split(r);
    if (!rc) rc = group_by(r, 0, &r->hosts, &r->n_hosts);
    if (!rc) rc = group_by(r, 1, &r->providers, &r->n_providers);
    if (rc) snprintf(err, errlen, "trainer report: out of memory");
    return rc;
}

/* ---- --json -----------------------------------------------------------------------------------
 */

static void jval(FILE *f, double v) {
    tr_json_write_num(f, v, 17);
}

static void jkey(FILE *f, const char *k, double v, int comma) {
    fprintf(f, "\"%s\": ", k);
    jval(f, v);
    if (comma) fputs(", ", f);
}

static void jks(FILE *f, const char *k, const char *v, int comma) {
    fprintf(f, "\"%s\": ", k);
    tr_json_write_string(f, v);
    if (comma) fputs(", ", f);
}

/* metrics' series: one array per field, NAN (null) where a step had no value */
static void json_series(const tr_report *r, FILE *f) {
    static const char *names[] = {"step",
                                  "attempt",
                                  "time_s",
                                  "loss",
                                  "val_loss",
                                  "tokens_per_s",
                                  "mfu",
                                  "step_s",
                                  "predicted_step_s",
                                  "memory_bytes",
                                  "predicted_memory_bytes"};
    fputs("  \"series\": {", f);
    for (int k = 0; k < 11; k++) {
        fprintf(f, "%s\n    \"%s\": [", k ? "," : "", names[k]);
        for (int i = 0; i < r->n_steps; i++) {
            const tr_report_step *s = &r->steps[i];
            double v[11] = {s->step,        s->attempt,      s->time_s,  s->loss,
                            s->val_loss,    s->tokens_per_s, s->mfu,     s->step_s,
                            s->pred_step_s, s->mem,          s->pred_mem};
            if (i) fputs(", ", f);
            jval(f, v[k]);
        }
        fputs("]", f);
    }
    fputs("\n  },\n", f);
}

static void json_ranks(const tr_report *r, FILE *f) {
    fprintf(f, "  \"ranks\": [");
    for (int k = 0; k < r->n_ranks; k++) {
        const tr_report_rank *q = &r->ranks[k];
        fprintf(f, "%s\n    {\"rank\": %d, ", k ? "," : "", k);
        jks(f, "host", q->host, 1), jks(f, "device", q->device, 1);
        jks(f, "provider", q->provider, 1), jkey(f, "price_hour", q->price_hour, 1);
        fputs("\"parts\": {", f);
        for (int p = 0; p < TR_REPORT_PARTS; p++) {
            char key[32];
            snprintf(key, sizeof(key), "%s_s", tr_report_part_names[p]);
            jkey(f, key, q->parts[p], p + 1 < TR_REPORT_PARTS);
        }
        fputs("}, ", f);
        jkey(f, "wall_s", q->wall_s, 1), jkey(f, "flops", q->flops, 1);
        jkey(f, "compute_s", q->parts[1], 1), jkey(f, "waited_s", q->parts[3], 1);
        jkey(f, "waited_on_s", q->waited_on_s, 1), jkey(f, "downtime_s", q->downtime_s, 1);
        jkey(f, "cost_downtime", q->cost_downtime, 1), jkey(f, "cost_waiting", q->cost_waiting, 1);
        jkey(f, "cost_flops", q->cost_flops, 1), jkey(f, "cost", q->cost, 1);
        fputs("\"memory_bytes\": ", f);
        for (int j = 0; j < 2; j++) {
            const double *m = j ? q->pred : q->mem;
            if (j) fputs(", \"predicted_bytes\": ", f);
            if (!q->has_mem) {
                fputs("null", f);
                continue;
            }
            for (int e = 0; e < 5; e++) {
                fputs(e ? ", " : "[", f);
                jval(f, m[e]);
            }
            fputs("]", f);
        }
        fputs("}", f);
    }
    fputs("\n  ],\n", f);
}

static void json_groups(FILE *f, const char *name, const tr_report_group *g, int n) {
    fprintf(f, "    \"%s\": [", name);
    for (int i = 0; i < n; i++) {
        fprintf(f, "%s\n      {", i ? "," : "");
        jks(f, "name", g[i].name, 1);
        fprintf(f, "\"ranks\": %d, ", g[i].ranks);
        jkey(f, "flops", g[i].flops, 1), jkey(f, "compute_s", g[i].compute_s, 1);
        jkey(f, "waited_s", g[i].wait_s, 1), jkey(f, "waited_on_s", g[i].waited_on_s, 1);
        jkey(f, "downtime_s", g[i].downtime_s, 1), jkey(f, "cost", g[i].cost, 0);
        fputs("}", f);
    }
    fputs("]", f);
}

static void json_events(const tr_report *r, FILE *f) {
    fputs("  \"attempts\": [", f);
    for (int i = 0; i < r->n_attempts; i++) {
        const tr_report_attempt *a = &r->att[i];
        fprintf(f, "%s\n    {\"attempt\": %d, \"start_step\": %lld, \"last_step\": %lld, ",
                i ? "," : "", a->attempt, (long long)a->start_step, (long long)a->last_step);
        jkey(f, "start_s", a->t_start - r->t0, 1), jkey(f, "last_s", a->t_last - r->t0, 1);
        jks(f, "status", a->ended ? (a->status ? "failed" : "ended") : "ended abnormally", 1);
        jkey(f, "failed_rank", a->failed_rank >= 0 ? a->failed_rank : NAN, 1); /* null: none */
        jks(f, "failed_host", a->failed_host, 1), jks(f, "why", a->why, 1);
        jks(f, "command", a->command, 0);
        fputs("}", f);
    }
    fputs("\n  ],\n  \"downtime\": [", f);
    for (int i = 0; i < r->n_down; i++) {
        const tr_report_down *d = &r->down[i];
        fprintf(f, "%s\n    {\"after_attempt\": %d, \"steps_redone\": %lld, ", i ? "," : "",
                d->after, (long long)d->steps_redone);
        jkey(f, "rank", d->rank >= 0 ? d->rank : NAN, 1); /* null: not charged */
        jkey(f, "downtime_s", d->downtime_s, 1), jks(f, "host", d->host, 1);
        jks(f, "cause", d->cause, 1), jks(f, "from", d->from, 1);
        jkey(f, "cost", d->cost, 0);
        fputs("}", f);
    }
    fputs("\n  ],\n  \"saves\": [", f);
    for (int i = 0; i < r->n_saves; i++) {
        const tr_report_save *s = &r->saves[i];
        fprintf(f, "%s\n    {\"attempt\": %d, \"step\": %lld, ", i ? "," : "", s->attempt,
                (long long)s->step);
        jkey(f, "t_s", s->t - r->t0, 1), jkey(f, "stall_s", s->stall_s, 0);
        fputs("}", f);
    }
    fputs("\n  ],\n  \"stragglers\": [", f);
    for (int i = 0; i < r->n_stragglers; i++) {
        const tr_report_straggler *s = &r->strag[i];
        fprintf(f, "%s\n    {\"attempt\": %d, \"step\": %lld, \"rank\": %d, ", i ? "," : "",
                s->attempt, (long long)s->step, s->rank);
        jks(f, "host", s->host, 1), jkey(f, "slowdown", s->slowdown, 1);
        jkey(f, "cost_s_per_step", s->cost_s_per_step, 0);
        fputs("}", f);
    }
    fputs("\n  ],\n", f);
}

static void json_heat_prov(const tr_report *r, FILE *f) {
    fputs("  \"heatmap\": {", f);
    jks(f, "from", r->heat_from, 1);
    fputs("\"columns\": [", f);
    for (int i = 0; i < r->n_cols; i++) {
        fprintf(f, "%s\n    {\"steps\": [%lld, %lld], \"compute_s\": [", i ? "," : "",
                (long long)r->cols[i].a, (long long)r->cols[i].b);
        for (int k = 0; k < r->n_ranks; k++) {
            if (k) fputs(", ", f);
            jval(f, r->cols[i].v[k]);
        }
        fputs("]}", f);
    }
    fputs("]},\n  \"provenance\": {", f);
    for (int i = 0; i < r->n_prov; i++) {
        fprintf(f, "%s\n    ", i ? "," : "");
        jks(f, r->prov[i].key, r->prov[i].val, 0);
    }
    fputs("},\n  \"compare\": ", f);
    if (!r->compared) {
        fputs("null,\n", f);
        return;
    }
    fputs("{", f);
    jks(f, "other", r->other, 1);
    jks(f, "verdict", r->verdict, 1);
    fprintf(f, "\"comparable\": %s, \"n_differences\": %d, \"differences\": [",
            r->comparable ? "true" : "false", r->n_diffs);
    for (int i = 0; i < r->n_diffs && i < TR_PROV_MAX_DIFFS; i++) {
        fprintf(f, "%s\n    {", i ? "," : "");
        jks(f, "key", r->diffs[i].field, 1), jks(f, "this", r->diffs[i].a, 1);
        jks(f, "other", r->diffs[i].b, 1);
        fprintf(f, "\"matters\": %s}", r->diffs[i].numbers ? "true" : "false");
    }
    fputs("]},\n", f);
}

void tr_report_write_json(const tr_report *r, FILE *f) {
    fputs("{\n  ", f);
    jks(f, "run_dir", r->dir, 0);
    fputs(",\n  \"missing\": [", f);
    const char *names[TR_REPORT_RECORDS];
    int n_missing = tr_report_missing(r, names);
    for (int i = 0; i < n_missing; i++) fprintf(f, "%s\"%s\"", i ? ", " : "", names[i]);
    fputs("],\n  \"skipped\": {", f);
    for (int k = 0; k < TR_RF_FILES; k++) {
        fprintf(f, "%s\"%s\": [", k ? ", " : "", tr_report_file_names[k]);
        for (int i = 0; i < r->skipped[k].n; i++)
            fprintf(f, "%s%d", i ? ", " : "", r->skipped[k].line[i]);
        fputs("]", f);
    }
    fprintf(f, "},\n  \"summary\": {\"ranks\": %d, \"attempts\": %d, \"steps\": %lld, ", r->n_ranks,
            r->attempts, (long long)r->last_step);
    jkey(f, "wall_s", r->wall_s, 1), jks(f, "wall_from", r->wall_from, 1);
    jkey(f, "tokens", r->tokens, 1), jkey(f, "tokens_per_s", r->tokens_per_s, 1);
    jkey(f, "mfu", r->mfu, 1), jkey(f, "best_val_loss", r->best_val_loss, 1);
    jks(f, "parts_from", r->parts_from, 1), jks(f, "flops_from", r->flops_from, 0);
    fputs("},\n  \"plan\": {", f);
    jkey(f, "step_s", r->plan_step_s, 1), jkey(f, "predicted_step_s", r->plan_pred_step_s, 1);
    jkey(f, "memory_bytes", r->plan_mem, 1), jkey(f, "predicted_memory_bytes", r->plan_pred_mem, 0);
    fputs("},\n", f);
    json_series(r, f);
    json_ranks(r, f);
    json_events(r, f);
    json_heat_prov(r, f);
    fputs("  \"cost\": {", f);
    jks(f, "unit", r->priced ? "USD" : "units", 1), jks(f, "cluster", r->cluster, 1);
    jkey(f, "booked_hours", r->booked_h, 1), jkey(f, "total", r->cost_total, 1);
    jkey(f, "downtime", r->cost_downtime, 1), jkey(f, "waiting", r->cost_waiting, 1);
    jkey(f, "by_flops", r->cost_flops, 0);
    fputs(",\n", f);
    json_groups(f, "hosts", r->hosts, r->n_hosts);
    fputs(",\n", f);
    json_groups(f, "providers", r->providers, r->n_providers);
    fputs("\n  }\n}\n", f);
}
