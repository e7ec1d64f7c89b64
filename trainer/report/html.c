/* The report as one self-contained HTML page: inline CSS and SVG, no script, no network,
 * printable. It only shows the figures of a tr_report (report/figures.c computes them): every
 * table cell of a figure carries data-key (the JSON path of the same number in `--json`) and
 * data-value (the number exactly), and every plotted series its points (data-series, data-x,
 * data-y), so a test can check the page against the JSON. */
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "trainer/report/report.h"
#include "trainer/report/svg.h"
#include "trainer/trainer.h"

#define esc tr_report_esc

/* A table cell of a number: shown in human units (u), exact in data-value and the tooltip. */
static void td(FILE *f, const char *key, double v, tr_report_unit u) {
    char text[64], exact[40];
    if (!isfinite(v)) {
        fprintf(f, "<td class=\"n\" data-key=\"%s\" data-value=\"null\">-</td>", key);
        return;
    }
    tr_report_human(u, v, text, sizeof(text));
    tr_fmt_real(v, exact, sizeof(exact));
    fprintf(f, "<td class=\"n\" data-key=\"%s\" data-value=\"%.17g\" title=\"%s\">%s</td>", key, v,
            exact, text);
}

static void tdi(FILE *f, const char *key, int64_t v) {
    fprintf(f, "<td class=\"n\" data-key=\"%s\" data-value=\"%lld\">%lld</td>", key, (long long)v,
            (long long)v);
}

/* A rank, or words where there is none (the --json value is null). */
static void td_rank(FILE *f, const char *key, int rank, const char *none) {
    if (rank >= 0)
        tdi(f, key, rank);
    else
        fprintf(f, "<td data-key=\"%s\" data-value=\"null\">%s</td>", key, none);
}

static void tds(FILE *f, const char *key, const char *s) {
    fprintf(f, "<td data-key=\"%s\">", key);
    esc(f, s[0] ? s : "-");
    fputs("</td>", f);
}

static void note(FILE *f, const char *text) {
    fputs("<p class=\"note\">", f);
    esc(f, text);
    fputs("</p>\n", f);
}

/* n (at most cap) split into `parts` runs: the first of run i. */
static int bucket(int i, int n, int parts) {
    return (int)((int64_t)i * n / parts);
}

/* A column of metrics' steps (offset of a double in tr_report_step) as a fresh array. */
static double *column(const tr_report *r, size_t off) {
    double *a = malloc((size_t)(r->n_steps > 0 ? r->n_steps : 1) * sizeof(double));
    for (int i = 0; a && i < r->n_steps; i++)
        a[i] = *(const double *)((const char *)&r->steps[i] + off);
    return a;
}

#define COL(field) column(r, offsetof(tr_report_step, field))

/* ---- sections ----------------------------------------------------------------------------------
 */

static void sec_summary(const tr_report *r, FILE *f) {
    fputs("<section id=\"summary\"><h2>Summary</h2><table class=\"kv\">", f);
    fputs("<tr><th>run folder</th>", f), tds(f, "run_dir", r->dir), fputs("</tr>", f);
    fputs("<tr><th>ranks</th>", f), tdi(f, "summary.ranks", r->n_ranks), fputs("</tr>", f);
    fputs("<tr><th>attempts</th>", f), tdi(f, "summary.attempts", r->attempts), fputs("</tr>", f);
    fputs("<tr><th>steps</th>", f), tdi(f, "summary.steps", r->last_step), fputs("</tr>", f);
    fprintf(f, "<tr><th>wall time (%s)</th>", r->wall_from);
    td(f, "summary.wall_s", r->wall_s, TR_U_S), fputs("</tr>", f);
    fputs("<tr><th>tokens</th>", f), td(f, "summary.tokens", r->tokens, TR_U_NUM);
    fputs("</tr><tr><th>mean throughput</th>", f);
    td(f, "summary.tokens_per_s", r->tokens_per_s, TR_U_TOKS);
    fputs("</tr><tr><th>mean MFU</th>", f), td(f, "summary.mfu", r->mfu, TR_U_SHARE);
    fputs("</tr><tr><th>best validation loss</th>", f);
    td(f, "summary.best_val_loss", r->best_val_loss, TR_U_NUM);
    fprintf(f, "</tr><tr><th>cost (%s)</th>", r->priced ? "USD" : "units");
    td(f, "cost.total", r->cost_total, TR_U_NUM);
    fputs("</tr></table>\n", f);
    const char *what[TR_REPORT_RECORDS];
    int n_missing = tr_report_missing(r, what);
    for (int i = 0; i < n_missing; i++) {
        char line[200];
        snprintf(line, sizeof(line),
                 "%s: not in the run folder (its sections say what is left out)", what[i]);
        note(f, line);
    }
    for (int k = 0; k < TR_RF_FILES; k++) {
        char line[600];
        tr_report_skipped_line(r, k, line, sizeof(line));
        if (line[0])
            fprintf(f, "<p class=\"warn\" data-skipped=\"%s\">%s</p>\n", tr_report_file_names[k],
                    line);
    }
    fputs("</section>\n", f);
}

/* Private gradients (provenance.json's record, README "Private gradients"): what the run
 * masked, what it sent in the clear, what is out of scope, and what the masking cost. */
static void sec_private(const tr_report *r, FILE *f) {
    const char *pre = "private_gradients.";
    size_t np = strlen(pre);
    int any = 0;
    for (int i = 0; i < r->n_prov && !any; i++) any = !strncmp(r->prov[i].key, pre, np);
    if (!any) return;
    fputs("<section id=\"private\"><h2>Private gradients</h2><table class=\"kv\">", f);
    for (int i = 0; i < r->n_prov; i++) {
        const tr_report_kv *e = &r->prov[i];
        if (strncmp(e->key, pre, np)) continue;
        char th[128];
        snprintf(th, sizeof th, "%s", e->key + np);
        th[strcspn(th, "[")] = 0; /* in_clear[2] -> in_clear */
        for (char *c = th; *c; c++)
            if (*c == '_') *c = ' ';
        fputs("<tr><th>", f), esc(f, th), fputs("</th>", f), tds(f, e->key, e->val);
        fputs("</tr>", f);
    }
    double mask = 0, wall = 0;
    for (int k = 0; r->ranks && k < r->n_ranks; k++)
        mask += r->ranks[k].parts[TR_REPORT_MASK], wall += r->ranks[k].wall_s;
    fputs("<tr><th>masking (every rank)</th>", f), td(f, "private.mask_s", mask, TR_U_S);
    fputs("</tr><tr><th>of the ranks' time</th>", f);
    td(f, "private.mask_share", wall > 0 ? mask / wall : NAN, TR_U_SHARE);
    fputs("</tr></table></section>\n", f);
}

static void sec_curves(const tr_report *r, FILE *f) {
    double *st = COL(time_s), *loss = COL(loss), *val = COL(val_loss), *tps = COL(tokens_per_s),
           *mfu = COL(mfu), *step = malloc((size_t)(r->n_steps + 1) * sizeof(double));
    if (!st || !loss || !val || !tps || !mfu || !step) goto out;
    for (int i = 0; i < r->n_steps; i++)
        step[i] = r->steps[i].step;
    int n = r->n_steps;
    const char *since = "time since the start";
    fputs("<section id=\"loss\"><h2>Loss</h2>\n", f);
    tr_report_series a[2] = {{"loss", "training loss", "#1f77b4", n, 0, 0, step, loss, NULL, NULL},
                             {"val_loss", "validation loss", "#d62728", n, 1, 0, step, val, NULL, NULL}};
    tr_report_chart(f, "loss and validation loss over steps", "step", TR_U_NUM, "nats per token",
                    TR_U_NUM, a, 2);
    tr_report_series b[2] = {{"loss_time", "training loss", "#1f77b4", n, 0, 0, st, loss, NULL, NULL},
                             {"val_loss_time", "validation loss", "#d62728", n, 1, 0, st, val, NULL, NULL}};
    tr_report_chart(f, "loss and validation loss over time", since, TR_U_S, "nats per token",
                    TR_U_NUM, b, 2);
    fputs("</section>\n<section id=\"throughput\"><h2>Throughput</h2>\n", f);
    tr_report_series c[1] = {{"tokens_per_s", "tokens per second", "#2ca02c", n, 0, 0, st, tps, NULL, NULL}};
    tr_report_chart(f, "tokens per second over time", since, TR_U_S, "tokens per second", TR_U_TOKS,
                    c, 1);
    tr_report_series d[1] = {{"mfu", "model FLOPs utilization", "#9467bd", n, 0, 0, st, mfu, NULL, NULL}};
    tr_report_chart(f, "MFU over time", since, TR_U_S, "MFU", TR_U_SHARE, d, 1);
    if (!r->have_time) note(f, "metrics.jsonl has no \"time\": time is the running sum of step_s");
    fputs("</section>\n", f);
out:
    free(st), free(loss), free(val), free(tps), free(mfu), free(step);
}

static const char *part_color[TR_REPORT_PARTS] = {"#bbbbbb", "#2ca02c", "#1f77b4", "#d62728",
                                                  "#ff7f0e", "#8c564b", "#e377c2", "#9467bd",
                                                  "#17becf", "#bcbd22", "#7f7f7f"};

enum { W = TR_SVG_W, ML = TR_SVG_ML, MR = TR_SVG_MR };

static void sec_breakdown(const tr_report *r, FILE *f) {
    fputs("<section id=\"breakdown\"><h2>Where each rank's time went</h2>\n", f);
    char line[300], v[64];
    snprintf(line, sizeof(line), "from %s%s", r->parts_from,
             r->n_led ? "" : " (no ledger.jsonl: wait includes communication)");
    note(f, line);
    double most = 0;
    for (int k = 0; k < r->n_ranks; k++)
        most = fmax(most, r->ranks[k].wall_s);
    int rowh = 22, h = rowh * r->n_ranks + 10;
    fprintf(f, "<svg viewBox=\"0 0 %d %d\" width=\"%d\" height=\"%d\">", W, h, W, h);
    for (int k = 0; k < r->n_ranks; k++) {
        double x = ML;
        fprintf(f, "<text x=\"%d\" y=\"%d\" class=\"tk\" text-anchor=\"end\">rank %d</text>",
                ML - 6, k * rowh + 15, k);
        for (int p = 0; p < TR_REPORT_PARTS && most > 0; p++) {
            double w = (W - ML - MR) * r->ranks[k].parts[p] / most;
            tr_fmt_seconds(r->ranks[k].parts[p], v, sizeof(v));
            fprintf(f,
                    "<rect x=\"%.2f\" y=\"%d\" width=\"%.2f\" height=\"%d\" fill=\"%s\" "
                    "data-rank=\"%d\" data-part=\"%s\" data-value=\"%.17g\"><title>%s: "
                    "%s</title></rect>",
                    x, k * rowh + 2, w, rowh - 4, part_color[p], k, tr_report_part_names[p],
                    r->ranks[k].parts[p], tr_report_part_names[p], v);
            x += w;
        }
    }
    fputs("</svg><div class=\"legend\">", f);
    for (int p = 0; p < TR_REPORT_PARTS; p++)
        fprintf(f, "<span><i style=\"background:%s\"></i>%s</span>", part_color[p],
                tr_report_part_names[p]);
    fputs("</div><table><tr><th>rank</th><th>host</th>", f);
    for (int p = 0; p < TR_REPORT_PARTS; p++)
        fprintf(f, "<th>%s</th>", tr_report_part_names[p]);
    fputs("<th>wall</th></tr>\n", f);
    for (int k = 0; k < r->n_ranks; k++) {
        char key[96];
        fprintf(f, "<tr><td>%d</td>", k);
        snprintf(key, sizeof(key), "ranks.%d.host", k), tds(f, key, r->ranks[k].host);
        for (int p = 0; p < TR_REPORT_PARTS; p++) {
            snprintf(key, sizeof(key), "ranks.%d.parts.%s_s", k, tr_report_part_names[p]);
            td(f, key, r->ranks[k].parts[p], TR_U_S);
        }
        snprintf(key, sizeof(key), "ranks.%d.wall_s", k), td(f, key, r->ranks[k].wall_s, TR_U_S);
        fputs("</tr>\n", f);
    }
    fputs("</table></section>\n", f);
}

/* "rank 3" or "ranks 0-63": the ranks [a, b) of a row of the heat map. */
static void ranks_name(int a, int b, char *buf, size_t n) {
    if (b - a == 1)
        snprintf(buf, n, "rank %d", a);
    else
        snprintf(buf, n, "ranks %d-%d", a, b - 1);
}

/* The heat map, at most HEAT_ROWS x HEAT_COLS cells whatever the records hold (a cell covers
 * several ranks or columns then, showing the longest of them), so the page stays small. */
enum { HEAT_ROWS = 64, HEAT_COLS = 400 };

static void heat_svg(const tr_report *r, FILE *f, double most) {
    int rows = r->n_ranks < HEAT_ROWS ? r->n_ranks : HEAT_ROWS;
    int cols = r->n_cols < HEAT_COLS ? r->n_cols : HEAT_COLS;
    int rowh = 18, h = rowh * rows + 30;
    double cw = (double)(W - ML - MR) / cols;
    char who[48], v[64];
    fprintf(f, "<svg viewBox=\"0 0 %d %d\" width=\"%d\" height=\"%d\">", W, h, W, h);
    for (int i = 0; i < rows; i++) {
        int k0 = bucket(i, r->n_ranks, rows), k1 = bucket(i + 1, r->n_ranks, rows);
        ranks_name(k0, k1, who, sizeof(who));
        fprintf(f, "<text x=\"%d\" y=\"%d\" class=\"tk\" text-anchor=\"end\">%s</text>", ML - 6,
                i * rowh + 13, who);
        for (int j = 0; j < cols; j++) {
            int c0 = bucket(j, r->n_cols, cols), c1 = bucket(j + 1, r->n_cols, cols);
            double val = NAN;
            for (int c = c0; c < c1; c++)
                for (int k = k0; k < k1; k++)
                    if (isfinite(r->cols[c].v[k]) && !(val >= r->cols[c].v[k]))
                        val = r->cols[c].v[k];
            double s = most > 0 && isfinite(val) ? val / most : 0;
            tr_fmt_seconds(val, v, sizeof(v));
            fprintf(f,
                    "<rect x=\"%.2f\" y=\"%d\" width=\"%.2f\" height=\"%d\" fill=\"rgb(%d,%d,%d)\" "
                    "data-rank=\"%d\" data-col=\"%d\" data-value=\"%.17g\"><title>%s, steps "
                    "%lld-%lld: %s</title></rect>",
                    ML + j * cw, i * rowh, cw + 0.3, rowh - 1, 255 - (int)(63 * s),
                    255 - (int)(200 * s), 255 - (int)(200 * s), k0, c0, val, who,
                    (long long)r->cols[c0].a, (long long)r->cols[c1 - 1].b, v);
        }
    }
    fprintf(f, "<text x=\"%d\" y=\"%d\" class=\"tk\">step %lld</text>", ML, h - 8,
            (long long)r->cols[0].a);
    fprintf(f, "<text x=\"%d\" y=\"%d\" class=\"tk\" text-anchor=\"end\">step %lld</text>", W - MR,
            h - 8, (long long)r->cols[r->n_cols - 1].b);
    fputs("</svg>\n", f);
}

static void sec_heatmap(const tr_report *r, FILE *f) {
    fputs("<section id=\"heatmap\"><h2>Ranks x steps: compute seconds</h2>\n", f);
    if (!r->n_cols) {
        fputs("<p class=\"nodata\">no data</p>", f);
        note(f, "no ledger.jsonl windows and no rank_compute_s in metrics.jsonl (one rank)");
    } else {
        double most = 0;
        char v[64];
        for (int i = 0; i < r->n_cols; i++)
            for (int k = 0; k < r->n_ranks; k++)
                most = fmax(most, r->cols[i].v[k]);
        tr_fmt_seconds(most, v, sizeof(v));
        fprintf(f, "<p class=\"note\">from %s; darker = longer (the longest: %s)</p>", r->heat_from,
                v);
        heat_svg(r, f, most);
    }
    if (r->missing[TR_RF_LEDGER])
        note(f, "straggler alarms: no ledger.jsonl");
    else if (!r->n_stragglers)
        note(f, "straggler alarms: none");
    else {
        fputs("<table><tr><th>attempt</th><th>step</th><th>rank</th><th>host</th><th>slowdown</th>"
              "<th>cost per step</th></tr>\n",
              f);
        for (int i = 0; i < r->n_stragglers; i++) {
            const tr_report_straggler *s = &r->strag[i];
            char k[64];
            fputs("<tr>", f);
            snprintf(k, sizeof(k), "stragglers.%d.attempt", i), tdi(f, k, s->attempt);
            snprintf(k, sizeof(k), "stragglers.%d.step", i), tdi(f, k, s->step);
            snprintf(k, sizeof(k), "stragglers.%d.rank", i), tdi(f, k, s->rank);
            snprintf(k, sizeof(k), "stragglers.%d.host", i), tds(f, k, s->host);
            snprintf(k, sizeof(k), "stragglers.%d.slowdown", i), td(f, k, s->slowdown, TR_U_NUM);
            snprintf(k, sizeof(k), "stragglers.%d.cost_s_per_step", i),
                td(f, k, s->cost_s_per_step, TR_U_S);
            fputs("</tr>\n", f);
        }
        fputs("</table>", f);
    }
    fputs("</section>\n", f);
}

static void sec_memory(const tr_report *r, FILE *f) {
    static const char *kinds[5] = {"params", "grads", "optimizer", "activations", "scratch"};
    fputs("<section id=\"memory\"><h2>Memory per rank</h2>\n", f);
    int any = 0;
    for (int k = 0; k < r->n_ranks; k++)
        any |= r->ranks[k].has_mem;
    if (!any) {
        fputs("<p class=\"nodata\">no data</p>", f);
        note(f, "no ranks.json (and no memory.json for a one-rank run)");
        fputs("</section>\n", f);
        return;
    }
    fputs("<table><tr><th>rank</th><th></th>", f);
    for (int i = 0; i < 5; i++)
        fprintf(f, "<th>%s</th>", kinds[i]);
    fputs("</tr>\n", f);
    for (int k = 0; k < r->n_ranks; k++) {
        if (!r->ranks[k].has_mem) continue;
        for (int j = 0; j < 2; j++) {
            fprintf(f, "<tr><td>%d</td><td>%s</td>", k, j ? "predicted" : "measured");
            for (int i = 0; i < 5; i++) {
                char key[64];
                snprintf(key, sizeof(key), "ranks.%d.%s.%d", k,
                         j ? "predicted_bytes" : "memory_bytes", i);
                td(f, key, j ? r->ranks[k].pred[i] : r->ranks[k].mem[i], TR_U_B);
            }
            fputs("</tr>\n", f);
        }
    }
    fputs("</table></section>\n", f);
}

static void sec_plan(const tr_report *r, FILE *f) {
    double *step = malloc((size_t)(r->n_steps + 1) * sizeof(double)), *ss = COL(step_s),
           *ps = COL(pred_step_s), *m = COL(mem), *pm = COL(pred_mem);
    if (!step || !ss || !ps || !m || !pm) goto out;
    for (int i = 0; i < r->n_steps; i++)
        step[i] = r->steps[i].step;
    int n = r->n_steps;
    fputs("<section id=\"plan\"><h2>The plan against the run</h2>\n", f);
    /* the prediction wide and dashed underneath, the measurement on top: both show where
     * they agree */
    tr_report_series a[2] = {{"predicted_step_s", "predicted", "#ff7f0e", n, 0, 1, step, ps, NULL, NULL},
                             {"step_s", "measured", "#1f77b4", n, 0, 0, step, ss, NULL, NULL}};
    tr_report_chart(f, "step time: measured and predicted", "step", TR_U_NUM, "step time", TR_U_S,
                    a, 2);
    tr_report_series b[2] = {{"predicted_memory_bytes", "predicted", "#ff7f0e", n, 0, 1, step, pm, NULL, NULL},
                             {"memory_bytes", "measured", "#1f77b4", n, 0, 0, step, m, NULL, NULL}};
    tr_report_chart(f, "memory of the fullest rank: measured and predicted", "step", TR_U_NUM,
                    "memory", TR_U_B, b, 2);
    fputs("<table><tr><th></th><th>measured</th><th>predicted</th></tr><tr><th>mean step time</th>",
          f);
    td(f, "plan.step_s", r->plan_step_s, TR_U_S);
    td(f, "plan.predicted_step_s", r->plan_pred_step_s, TR_U_S);
    fputs("</tr><tr><th>memory</th>", f);
    td(f, "plan.memory_bytes", r->plan_mem, TR_U_B);
    td(f, "plan.predicted_memory_bytes", r->plan_pred_mem, TR_U_B);
    fputs("</tr></table></section>\n", f);
out:
    free(step), free(ss), free(ps), free(m), free(pm);
}

static void sec_provenance(const tr_report *r, FILE *f) {
    fputs("<section id=\"provenance\"><h2>Provenance</h2>\n", f);
    if (!r->has_provenance) note(f, "provenance.json: not in the run folder");
    if (r->n_prov) fputs("<table class=\"kv\">", f);
    for (int i = 0; i < r->n_prov; i++) {
        const tr_report_kv *e = &r->prov[i];
        char shown[40];
        fputs("<tr><th>", f), esc(f, e->key), fputs("</th><td data-prov=\"", f), esc(f, e->key);
        if (e->is_num) { /* a float's real digits: 0.1, not 0.100000001 */
            tr_fmt_real(e->num, shown, sizeof(shown));
            fprintf(f, "\" data-value=\"%s\" title=\"%s\">%s</td></tr>\n", e->val, e->val, shown);
            continue;
        }
        fputs("\">", f), esc(f, e->val), fputs("</td></tr>\n", f);
    }
    if (r->n_prov) fputs("</table>", f);
    if (r->compared) {
        fputs("<h3>Compared with ", f), esc(f, r->other), fputs("</h3>", f);
        fprintf(f, "<p class=\"verdict\" data-key=\"compare.comparable\" data-value=\"%s\">",
                r->comparable ? "true" : "false");
        esc(f, r->verdict), fputs(" (the fields marked * can change the numbers)</p>", f);
        fputs("<table><tr><th>field</th><th>this run</th><th>the other</th></tr>\n", f);
        for (int i = 0; i < r->n_diffs && i < TR_PROV_MAX_DIFFS; i++) {
            fprintf(f, "<tr><td>%s", r->diffs[i].numbers ? "* " : "");
            esc(f, r->diffs[i].field), fputs("</td><td>", f), esc(f, r->diffs[i].a);
            fputs("</td><td>", f), esc(f, r->diffs[i].b), fputs("</td></tr>\n", f);
        }
        fputs("</table>", f);
    }
    fputs("</section>\n", f);
}

/* x of unix time t on the timeline */
static double tx(const tr_report *r, double t) {
    double end = r->wall_s > 0 ? r->wall_s : 1;
    return ML + (W - ML - MR) * (t - r->t0) / end;
}

/* Attempts as bars over time, saves as ticks, failures as red marks, downtime as grey gaps. */
static void timeline_svg(const tr_report *r, FILE *f) {
    int rowh = 26, h = rowh * r->n_attempts + 36;
    char v[64];
    fprintf(f, "<svg viewBox=\"0 0 %d %d\" width=\"%d\" height=\"%d\">", W, h, W, h);
    for (int i = 0; i < r->n_down; i++) {
        const tr_report_attempt *a = &r->att[i], *b = &r->att[i + 1];
        double x0 = tx(r, a->t_last), x1 = tx(r, b->t_start);
        if (!isfinite(x0) || !isfinite(x1)) continue;
        tr_fmt_seconds(r->down[i].downtime_s, v, sizeof(v));
        fprintf(f,
                "<rect x=\"%.2f\" y=\"0\" width=\"%.2f\" height=\"%d\" fill=\"#ddd\" "
                "data-down=\"%d\" data-value=\"%.17g\"><title>downtime %s",
                x0, fmax(x1 - x0, 0), h - 30, i, r->down[i].downtime_s, v);
        if (r->down[i].cause[0]) fputs(": ", f), esc(f, r->down[i].cause);
        fputs("</title></rect>", f);
    }
    for (int i = 0; i < r->n_attempts; i++) {
        const tr_report_attempt *a = &r->att[i];
        if (!isfinite(a->t_start)) continue;
        double x0 = tx(r, a->t_start), x1 = tx(r, a->t_last), y = i * rowh + 4;
        fprintf(f, "<text x=\"%d\" y=\"%.0f\" class=\"tk\" text-anchor=\"end\">attempt %d</text>",
                ML - 6, y + 13, a->attempt);
        fprintf(f,
                "<rect x=\"%.2f\" y=\"%.0f\" width=\"%.2f\" height=\"16\" fill=\"%s\" "
                "data-attempt=\"%d\"><title>steps %lld to %lld</title></rect>",
                x0, y, fmax(x1 - x0, 1), a->ended && !a->status ? "#9ecae1" : "#fdae6b", a->attempt,
                (long long)a->start_step, (long long)a->last_step);
        for (int k = 0; k < r->n_saves; k++)
            if (r->saves[k].attempt == a->attempt && isfinite(r->saves[k].t)) {
                tr_fmt_seconds(r->saves[k].stall_s, v, sizeof(v));
                fprintf(f,
                        "<line x1=\"%.2f\" x2=\"%.2f\" y1=\"%.0f\" y2=\"%.0f\" stroke=\"#333\" "
                        "data-save=\"%d\"><title>save at step %lld: stall %s</title></line>",
                        tx(r, r->saves[k].t), tx(r, r->saves[k].t), y - 2, y + 18, k,
                        (long long)r->saves[k].step, v);
            }
        if (!a->ended) /* clear of the attempt labels and the edge */
            fprintf(f,
                    "<text x=\"%.2f\" y=\"%.0f\" fill=\"#c00\" font-weight=\"bold\" "
                    "text-anchor=\"middle\">&#x2716;</text>",
                    fmin(fmax(x1, ML + 8), W - 8), y + 13);
    }
    tr_fmt_seconds(r->wall_s, v, sizeof(v));
    fprintf(f, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" class=\"ax\"/>", ML, h - 30, W - MR,
            h - 30);
    fprintf(f, "<text x=\"%d\" y=\"%d\" class=\"tk\">0 s</text>", ML, h - 16);
    fprintf(f, "<text x=\"%d\" y=\"%d\" class=\"tk\" text-anchor=\"end\">%s</text>", W - MR, h - 16,
            v);
    fputs("</svg>\n", f);
}

static void attempts_table(const tr_report *r, FILE *f) {
    fputs("<table><tr><th>attempt</th><th>start step</th><th>last step</th><th>started at</th>"
          "<th>last seen at</th><th>ended</th><th>failed rank</th><th>host</th><th>why</th></tr>\n",
          f);
    for (int i = 0; i < r->n_attempts; i++) {
        const tr_report_attempt *a = &r->att[i];
        int done = a->ended && !a->status;
        char k[64];
        fputs("<tr>", f);
        snprintf(k, sizeof(k), "attempts.%d.attempt", i), tdi(f, k, a->attempt);
        snprintf(k, sizeof(k), "attempts.%d.start_step", i), tdi(f, k, a->start_step);
        snprintf(k, sizeof(k), "attempts.%d.last_step", i), tdi(f, k, a->last_step);
        snprintf(k, sizeof(k), "attempts.%d.start_s", i), td(f, k, a->t_start - r->t0, TR_U_S);
        snprintf(k, sizeof(k), "attempts.%d.last_s", i), td(f, k, a->t_last - r->t0, TR_U_S);
        snprintf(k, sizeof(k), "attempts.%d.status", i);
        tds(f, k, a->ended ? (a->status ? "failed" : "ended") : "ended abnormally");
        snprintf(k, sizeof(k), "attempts.%d.failed_rank", i);
        td_rank(f, k, a->failed_rank, done ? "none: it finished" : "not known");
        snprintf(k, sizeof(k), "attempts.%d.failed_host", i), tds(f, k, a->failed_host);
        snprintf(k, sizeof(k), "attempts.%d.why", i), tds(f, k, a->why);
        fputs("</tr>\n", f);
    }
    fputs("</table>\n", f);
}

static void timeline_tables(const tr_report *r, FILE *f) {
    attempts_table(r, f);
    if (r->n_down) {
        fputs("<table><tr><th>after attempt</th><th>downtime</th><th>cause</th><th>recorded by"
              "</th><th>steps redone</th><th>charged to rank</th><th>host</th></tr>\n",
              f);
        for (int i = 0; i < r->n_down; i++) {
            const tr_report_down *d = &r->down[i];
            char k[64];
            fputs("<tr>", f);
            snprintf(k, sizeof(k), "downtime.%d.after_attempt", i), tdi(f, k, d->after);
            snprintf(k, sizeof(k), "downtime.%d.downtime_s", i), td(f, k, d->downtime_s, TR_U_S);
            snprintf(k, sizeof(k), "downtime.%d.cause", i), tds(f, k, d->cause);
            snprintf(k, sizeof(k), "downtime.%d.from", i), tds(f, k, d->from);
            snprintf(k, sizeof(k), "downtime.%d.steps_redone", i), tdi(f, k, d->steps_redone);
            snprintf(k, sizeof(k), "downtime.%d.rank", i);
            td_rank(f, k, d->rank, "not charged: no failure known");
            snprintf(k, sizeof(k), "downtime.%d.host", i), tds(f, k, d->host);
            fputs("</tr>\n", f);
        }
        fputs("</table>\n", f);
    }
    if (r->n_saves) {
        fputs("<table><tr><th>attempt</th><th>save at step</th><th>stall</th></tr>\n", f);
        for (int i = 0; i < r->n_saves; i++) {
            char k[64];
            fputs("<tr>", f);
            snprintf(k, sizeof(k), "saves.%d.attempt", i), tdi(f, k, r->saves[i].attempt);
            snprintf(k, sizeof(k), "saves.%d.step", i), tdi(f, k, r->saves[i].step);
            snprintf(k, sizeof(k), "saves.%d.stall_s", i), td(f, k, r->saves[i].stall_s, TR_U_S);
            fputs("</tr>\n", f);
        }
        fputs("</table>\n", f);
    }
}

static void sec_timeline(const tr_report *r, FILE *f) {
    fputs("<section id=\"timeline\"><h2>Timeline: attempts, saves, failures, downtime</h2>\n", f);
    if (r->missing[TR_RF_ATTEMPTS] || !r->n_attempts) {
        fputs("<p class=\"nodata\">no data</p>", f);
        note(f, "no attempts.jsonl: the attempts, failures and downtime are not known");
    } else {
        timeline_svg(r, f);
        timeline_tables(r, f);
    }
    if (r->missing[TR_RF_LEDGER])
        note(f, "no ledger.jsonl: checkpoint saves and stalls are not known");
    fputs("</section>\n", f);
}

/* One row of the contribution table: a rank, host or provider. */
static void contrib_row(FILE *f, const char *prefix, const char *name, double flops, double compute,
                        double waited, double waited_on, double down, double cost, double total) {
    char k[128];
    fputs("<tr>", f);
    snprintf(k, sizeof(k), "%s.%s", prefix, prefix[0] == 'r' ? "rank" : "name");
    if (prefix[0] == 'r')
        fprintf(f, "<td data-key=\"%s\" data-value=\"%s\">%s</td>", k, name, name);
    else
        tds(f, k, name);
    snprintf(k, sizeof(k), "%s.flops", prefix), td(f, k, flops, TR_U_FLOP);
    snprintf(k, sizeof(k), "%s.compute_s", prefix), td(f, k, compute, TR_U_S);
    snprintf(k, sizeof(k), "%s.waited_s", prefix), td(f, k, waited, TR_U_S);
    snprintf(k, sizeof(k), "%s.waited_on_s", prefix), td(f, k, waited_on, TR_U_S);
    snprintf(k, sizeof(k), "%s.downtime_s", prefix), td(f, k, down, TR_U_S);
    snprintf(k, sizeof(k), "%s.cost", prefix), td(f, k, cost, TR_U_NUM);
    char share[32];
    tr_fmt_percent(total > 0 ? cost / total : 0, share, sizeof(share));
    fprintf(f, "<td class=\"n\">%s</td></tr>\n", share);
}

static void contrib_head(FILE *f, const char *what, const char *unit) {
    fprintf(f,
            "<table><tr><th>%s</th><th>FLOPs delivered</th><th>compute</th>"
            "<th>waited on others</th><th>others waited on it</th><th>downtime caused</th>"
            "<th>cost (%s)</th><th>share</th></tr>\n",
            what, unit);
}

static void sec_contribution(const tr_report *r, FILE *f) {
    const char *unit = r->priced ? "USD" : "units";
    fputs("<section id=\"contribution\"><h2>Contribution and cost</h2>\n<div class=\"rule\">", f);
    fprintf(f,
            "<b>The rule.</b> The job's cost C = the sum over ranks of the price per hour "
            "(%s) times the booked hours: the run's span from the first attempt's start to "
            "the last attempt's end, downtime included. Each downtime between attempts, "
            "priced for all ranks, is charged to the rank whose failure caused it (not "
            "charged when no failure is known). The seconds the other ranks waited on a rank "
            "(waited on), priced at the mean rate of those others, are charged to that rank. "
            "The rest of C is split in proportion to delivered FLOPs (%s).</div>\n",
            r->priced ? "the cluster file's price_per_hour" : "1 unit per rank without --cluster",
            r->flops_from);
    fputs("<table><tr><th>booked time</th><th>C</th><th>downtime charged</th><th>waiting "
          "charged</th><th>split by FLOPs</th></tr><tr>",
          f);
    td(f, "cost.booked_hours", r->booked_h, TR_U_H), td(f, "cost.total", r->cost_total, TR_U_NUM);
    td(f, "cost.downtime", r->cost_downtime, TR_U_NUM);
    td(f, "cost.waiting", r->cost_waiting, TR_U_NUM);
    td(f, "cost.by_flops", r->cost_flops, TR_U_NUM);
    fputs("</tr></table>\n", f);
    contrib_head(f, "rank", unit);
    for (int k = 0; k < r->n_ranks; k++) {
        const tr_report_rank *q = &r->ranks[k];
        char p[32], name[16];
        snprintf(p, sizeof(p), "ranks.%d", k), snprintf(name, sizeof(name), "%d", k);
        contrib_row(f, p, name, q->flops, q->parts[1], q->parts[3], q->waited_on_s, q->downtime_s,
                    q->cost, r->cost_total);
    }
    fputs("</table>\n", f);
    for (int j = 0; j < 2; j++) {
        const tr_report_group *g = j ? r->providers : r->hosts;
        int n = j ? r->n_providers : r->n_hosts;
        contrib_head(f, j ? "provider" : "host", unit);
        for (int i = 0; i < n; i++) {
            char p[48];
            snprintf(p, sizeof(p), "cost.%s.%d", j ? "providers" : "hosts", i);
            contrib_row(f, p, g[i].name, g[i].flops, g[i].compute_s, g[i].wait_s, g[i].waited_on_s,
                        g[i].downtime_s, g[i].cost, r->cost_total);
        }
        fputs("</table>\n", f);
    }
    fputs("</section>\n", f);
}

const char *const tr_report_css =
    "body{font:14px/1.4 sans-serif;margin:24px auto;max-width:980px;color:#222}"
    "h1{font-size:22px}h2{font-size:18px;border-bottom:1px solid #ccc;margin-top:28px}"
    "table{border-collapse:collapse;margin:8px 0;font-size:12px}"
    "td,th{border:1px solid #ddd;padding:2px 6px;text-align:left}td.n{text-align:right}"
    "figure{margin:8px 0;display:inline-block;vertical-align:top}figure.chart{width:49%}"
    "figure.chart svg{width:100%;height:auto}figcaption{font-weight:bold;font-size:13px}"
    ".ax{stroke:#444}.grid{stroke:#eee}.tk{font-size:10px;fill:#444}.lb{font-size:11px}"
    ".legend span{margin-right:12px;font-size:12px}"
    ".legend i{display:inline-block;width:10px;height:10px;margin-right:4px}"
    ".legend i.dash{width:16px;height:0;border-top:3px dashed;vertical-align:middle}"
    ".legend i.dot{border-radius:5px}"
    ".note{color:#666;font-size:12px}.warn{color:#b00}.nodata{color:#999;font-style:italic}"
    ".rule{background:#f6f6f6;padding:8px;font-size:13px}"
    "section{page-break-inside:avoid}@media print{body{margin:0}}";

void tr_report_write_html(const tr_report *r, FILE *f) {
    fputs("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
          "<title>trainer report: ",
          f);
    esc(f, r->dir);
    fprintf(f, "</title><style>%s</style></head><body>\n<h1>trainer report: ", tr_report_css);
    esc(f, r->dir);
    fputs("</h1>\n", f);
    sec_summary(r, f);
    sec_private(r, f);
    sec_curves(r, f);
    sec_breakdown(r, f);
    sec_heatmap(r, f);
    sec_memory(r, f);
    sec_timeline(r, f);
    sec_plan(r, f);
    sec_provenance(r, f);
    sec_contribution(r, f);
    fputs("</body></html>\n", f);
}
