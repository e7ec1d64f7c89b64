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

static void esc(FILE *f, const char *s) {
    for (; *s; s++) {
        switch (*s) {
        case '<':
            fputs("&lt;", f);
            break;
        case '>':
            fputs("&gt;", f);
            break;
        case '&':
            fputs("&amp;", f);
            break;
        case '"':
            fputs("&quot;", f);
            break;
        default:
            fputc(*s, f);
        }
    }
}

/* A table cell of a number: shown with 6 significant digits, exact in data-value. */
static void td(FILE *f, const char *key, double v) {
    if (isfinite(v))
        fprintf(f, "<td class=\"n\" data-key=\"%s\" data-value=\"%.17g\">%.6g</td>", key, v, v);
    else
        fprintf(f, "<td class=\"n\" data-key=\"%s\" data-value=\"null\">-</td>", key);
}

static void tdi(FILE *f, const char *key, int v) {
    fprintf(f, "<td class=\"n\" data-key=\"%s\" data-value=\"%d\">%d</td>", key, v, v);
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

/* ---- charts ------------------------------------------------------------------------------------
 */

typedef struct {
    const char *name, *color;
    int n, dots;
    const double *x, *y;
} series;

enum { W = 640, H = 240, ML = 64, MR = 12, MT = 10, MB = 40 };

static void range(const series *s, int ns, int yaxis, double *lo, double *hi) {
    *lo = INFINITY, *hi = -INFINITY;
    for (int k = 0; k < ns; k++)
        for (int i = 0; i < s[k].n; i++) {
            double v = yaxis ? s[k].y[i] : s[k].x[i];
            if (isfinite(s[k].x[i]) && isfinite(s[k].y[i])) {
                if (v < *lo) *lo = v;
                if (v > *hi) *hi = v;
            }
        }
    if (*hi <= *lo) { /* a flat series: in the middle */
        double d = *lo != 0 ? fabs(*lo) * 0.05 : 1;
        *lo -= d, *hi += d;
    }
}

static void axes(FILE *f, double x0, double x1, double y0, double y1, const char *xl,
                 const char *yl) {
    fprintf(f, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" class=\"ax\"/>", ML, H - MB, W - MR,
            H - MB);
    fprintf(f, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" class=\"ax\"/>", ML, MT, ML, H - MB);
    for (int t = 0; t <= 4; t++) {
        double fx = ML + (W - ML - MR) * t / 4.0, fy = H - MB - (H - MT - MB) * t / 4.0;
        fprintf(f, "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" class=\"ax\"/>", fx, H - MB,
                fx, H - MB + 4);
        fprintf(f, "<text x=\"%.1f\" y=\"%d\" class=\"tk\" text-anchor=\"middle\">%.4g</text>", fx,
                H - MB + 16, x0 + (x1 - x0) * t / 4.0);
        fprintf(f, "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" class=\"grid\"/>", ML, fy,
                W - MR, fy);
        fprintf(f, "<text x=\"%d\" y=\"%.1f\" class=\"tk\" text-anchor=\"end\">%.4g</text>", ML - 4,
                fy + 4, y0 + (y1 - y0) * t / 4.0);
    }
    fprintf(f, "<text x=\"%d\" y=\"%d\" class=\"lb\" text-anchor=\"middle\">%s</text>",
            (ML + W - MR) / 2, H - 6, xl);
    fprintf(f,
            "<text x=\"12\" y=\"%d\" class=\"lb\" text-anchor=\"middle\" "
            "transform=\"rotate(-90 12 %d)\">%s</text>",
            (MT + H - MB) / 2, (MT + H - MB) / 2, yl);
}

/* One series: its finite points as a polyline (or circles), the values in data-x/data-y. */
static void plot_series(FILE *f, const series *s, double x0, double x1, double y0, double y1) {
    fprintf(f, "<g data-series=\"%s\" data-x=\"", s->name);
    for (int i = 0, first = 1; i < s->n; i++)
        if (isfinite(s->x[i]) && isfinite(s->y[i]))
            fprintf(f, "%s%.17g", first ? "" : " ", s->x[i]), first = 0;
    fputs("\" data-y=\"", f);
    for (int i = 0, first = 1; i < s->n; i++)
        if (isfinite(s->x[i]) && isfinite(s->y[i]))
            fprintf(f, "%s%.17g", first ? "" : " ", s->y[i]), first = 0;
    fprintf(f, "\">");
    if (!s->dots)
        fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\" points=\"",
                s->color);
    for (int i = 0; i < s->n; i++) {
        if (!isfinite(s->x[i]) || !isfinite(s->y[i])) continue;
        double px = ML + (W - ML - MR) * (s->x[i] - x0) / (x1 - x0);
        double py = H - MB - (H - MT - MB) * (s->y[i] - y0) / (y1 - y0);
        if (s->dots)
            fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"%s\"/>", px, py, s->color);
        else
            fprintf(f, "%.1f,%.1f ", px, py);
    }
    fputs(s->dots ? "</g>" : "\"/></g>", f);
}

static void chart(FILE *f, const char *title, const char *xl, const char *yl, const series *s,
                  int ns) {
    int points = 0;
    for (int k = 0; k < ns; k++)
        for (int i = 0; i < s[k].n; i++)
            points += isfinite(s[k].x[i]) && isfinite(s[k].y[i]);
    fprintf(f, "<figure class=\"chart\"><figcaption>%s</figcaption>\n", title);
    if (!points) {
        fputs("<p class=\"nodata\">no data</p></figure>\n", f);
        return;
    }
    double x0, x1, y0, y1;
    range(s, ns, 0, &x0, &x1);
    range(s, ns, 1, &y0, &y1);
    fprintf(f, "<svg viewBox=\"0 0 %d %d\" width=\"%d\" height=\"%d\">", W, H, W, H);
    axes(f, x0, x1, y0, y1, xl, yl);
    for (int k = 0; k < ns; k++)
        plot_series(f, &s[k], x0, x1, y0, y1);
    fputs("</svg><div class=\"legend\">", f);
    for (int k = 0; k < ns; k++)
        fprintf(f, "<span><i style=\"background:%s\"></i>%s</span>", s[k].color, s[k].name);
    fputs("</div></figure>\n", f);
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
    fprintf(f, "<tr><th>wall time, s (%s)</th>", r->wall_from);
    td(f, "summary.wall_s", r->wall_s), fputs("</tr>", f);
    fputs("<tr><th>tokens</th>", f), td(f, "summary.tokens", r->tokens), fputs("</tr>", f);
    fputs("<tr><th>mean tokens/s</th>", f), td(f, "summary.tokens_per_s", r->tokens_per_s);
    fputs("</tr><tr><th>mean MFU</th>", f), td(f, "summary.mfu", r->mfu);
    fputs("</tr><tr><th>best validation loss</th>", f);
    td(f, "summary.best_val_loss", r->best_val_loss);
    fprintf(f, "</tr><tr><th>cost (%s)</th>", r->priced ? "USD" : "units");
    td(f, "cost.total", r->cost_total);
    fputs("</tr></table>\n", f);
    static const char *what[6] = {"",           "ledger.jsonl", "attempts.jsonl",
                                  "ranks.json", "memory.json",  "provenance.json"};
    int miss[6] = {0,
                   r->missing[1],
                   r->missing[2],
                   !r->has_ranks_json,
                   !r->has_memory_json,
                   !r->has_provenance};
    for (int i = 1; i < 6; i++) {
        char line[200];
        snprintf(line, sizeof(line),
                 "%s: not in the run folder (its sections say what is left out)", what[i]);
        if (miss[i]) note(f, line);
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

static void sec_curves(const tr_report *r, FILE *f) {
    double *st = COL(time_s), *loss = COL(loss), *val = COL(val_loss), *tps = COL(tokens_per_s),
           *mfu = COL(mfu), *step = malloc((size_t)(r->n_steps + 1) * sizeof(double));
    if (!st || !loss || !val || !tps || !mfu || !step) goto out;
    for (int i = 0; i < r->n_steps; i++)
        step[i] = r->steps[i].step;
    int n = r->n_steps;
    fputs("<section id=\"loss\"><h2>Loss</h2>\n", f);
    series a[2] = {{"loss", "#1f77b4", n, 0, step, loss}, {"val_loss", "#d62728", n, 1, step, val}};
    chart(f, "loss and validation loss over steps", "step", "nats/token", a, 2);
    series b[2] = {{"loss_time", "#1f77b4", n, 0, st, loss},
                   {"val_loss_time", "#d62728", n, 1, st, val}};
    chart(f, "loss and validation loss over time", "seconds since the start", "nats/token", b, 2);
    fputs("</section>\n<section id=\"throughput\"><h2>Throughput</h2>\n", f);
    series c[1] = {{"tokens_per_s", "#2ca02c", n, 0, st, tps}};
    chart(f, "tokens/s over time", "seconds since the start", "tokens/s", c, 1);
    series d[1] = {{"mfu", "#9467bd", n, 0, st, mfu}};
    chart(f, "MFU over time", "seconds since the start", "MFU", d, 1);
    if (!r->have_time) note(f, "metrics.jsonl has no \"time\": time is the running sum of step_s");
    fputs("</section>\n", f);
out:
    free(st), free(loss), free(val), free(tps), free(mfu), free(step);
}

static const char *part_color[TR_REPORT_PARTS] = {"#bbbbbb", "#2ca02c", "#1f77b4", "#d62728",
                                                  "#ff7f0e", "#8c564b", "#e377c2", "#17becf",
                                                  "#bcbd22", "#7f7f7f"};

static void sec_breakdown(const tr_report *r, FILE *f) {
    fputs("<section id=\"breakdown\"><h2>Where each rank's time went</h2>\n", f);
    char line[300];
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
                ML - 4, k * rowh + 15, k);
        for (int p = 0; p < TR_REPORT_PARTS && most > 0; p++) {
            double w = (W - ML - MR) * r->ranks[k].parts[p] / most;
            fprintf(f,
                    "<rect x=\"%.2f\" y=\"%d\" width=\"%.2f\" height=\"%d\" fill=\"%s\" "
                    "data-rank=\"%d\" data-part=\"%s\" data-value=\"%.17g\"><title>%s %.4g "
                    "s</title></rect>",
                    x, k * rowh + 2, w, rowh - 4, part_color[p], k, tr_report_part_names[p],
                    r->ranks[k].parts[p], tr_report_part_names[p], r->ranks[k].parts[p]);
            x += w;
        }
    }
    fputs("</svg><div class=\"legend\">", f);
    for (int p = 0; p < TR_REPORT_PARTS; p++)
        fprintf(f, "<span><i style=\"background:%s\"></i>%s</span>", part_color[p],
                tr_report_part_names[p]);
    fputs("</div><table><tr><th>rank</th><th>host</th>", f);
    for (int p = 0; p < TR_REPORT_PARTS; p++)
        fprintf(f, "<th>%s s</th>", tr_report_part_names[p]);
    fputs("<th>wall s</th></tr>\n", f);
    for (int k = 0; k < r->n_ranks; k++) {
        char key[96];
        fprintf(f, "<tr><td>%d</td>", k);
        snprintf(key, sizeof(key), "ranks.%d.host", k), tds(f, key, r->ranks[k].host);
        for (int p = 0; p < TR_REPORT_PARTS; p++) {
            snprintf(key, sizeof(key), "ranks.%d.parts.%s_s", k, tr_report_part_names[p]);
            td(f, key, r->ranks[k].parts[p]);
        }
        snprintf(key, sizeof(key), "ranks.%d.wall_s", k), td(f, key, r->ranks[k].wall_s);
        fputs("</tr>\n", f);
    }
    fputs("</table></section>\n", f);
}

static void sec_heatmap(const tr_report *r, FILE *f) {
    fputs("<section id=\"heatmap\"><h2>Ranks x steps: compute seconds</h2>\n", f);
    if (!r->n_cols) {
        fputs("<p class=\"nodata\">no data</p>", f);
        note(f, "no ledger.jsonl windows and no rank_compute_s in metrics.jsonl (one rank)");
    } else {
        double most = 0;
        for (int i = 0; i < r->n_cols; i++)
            for (int k = 0; k < r->n_ranks; k++)
                most = fmax(most, r->cols[i].v[k]);
        int rowh = 18, h = rowh * r->n_ranks + 30;
        double cw = (double)(W - ML - MR) / r->n_cols;
        fprintf(f, "<p class=\"note\">from %s; darker = longer (the longest: %.4g s)</p>",
                r->heat_from, most);
        fprintf(f, "<svg viewBox=\"0 0 %d %d\" width=\"%d\" height=\"%d\">", W, h, W, h);
        for (int k = 0; k < r->n_ranks; k++) {
            fprintf(f, "<text x=\"%d\" y=\"%d\" class=\"tk\" text-anchor=\"end\">rank %d</text>",
                    ML - 4, k * rowh + 13, k);
            for (int i = 0; i < r->n_cols; i++) {
                double v = r->cols[i].v[k], s = most > 0 && isfinite(v) ? v / most : 0;
                fprintf(f,
                        "<rect x=\"%.2f\" y=\"%d\" width=\"%.2f\" height=\"%d\" "
                        "fill=\"rgb(%d,%d,%d)\" data-rank=\"%d\" data-col=\"%d\" "
                        "data-value=\"%.17g\"><title>rank %d steps %d-%d: %.4g s</title></rect>",
                        ML + i * cw, k * rowh, cw + 0.3, rowh - 1, 255 - (int)(63 * s),
                        255 - (int)(200 * s), 255 - (int)(200 * s), k, i, v, k, r->cols[i].a,
                        r->cols[i].b, v);
            }
        }
        fprintf(f, "<text x=\"%d\" y=\"%d\" class=\"tk\">step %d</text>", ML, h - 8, r->cols[0].a);
        fprintf(f, "<text x=\"%d\" y=\"%d\" class=\"tk\" text-anchor=\"end\">step %d</text>",
                W - MR, h - 8, r->cols[r->n_cols - 1].b);
        fputs("</svg>\n", f);
    }
    if (r->missing[TR_RF_LEDGER])
        note(f, "straggler alarms: no ledger.jsonl");
    else if (!r->n_stragglers)
        note(f, "straggler alarms: none");
    else {
        fputs("<table><tr><th>attempt</th><th>step</th><th>rank</th><th>host</th><th>slowdown</th>"
              "<th>cost s/step</th></tr>\n",
              f);
        for (int i = 0; i < r->n_stragglers; i++) {
            const tr_report_straggler *s = &r->strag[i];
            char k[64];
            fputs("<tr>", f);
            snprintf(k, sizeof(k), "stragglers.%d.attempt", i), tdi(f, k, s->attempt);
            snprintf(k, sizeof(k), "stragglers.%d.step", i), tdi(f, k, s->step);
            snprintf(k, sizeof(k), "stragglers.%d.rank", i), tdi(f, k, s->rank);
            snprintf(k, sizeof(k), "stragglers.%d.host", i), tds(f, k, s->host);
            snprintf(k, sizeof(k), "stragglers.%d.slowdown", i), td(f, k, s->slowdown);
            snprintf(k, sizeof(k), "stragglers.%d.cost_s_per_step", i),
                td(f, k, s->cost_s_per_step);
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
        fprintf(f, "<th>%s bytes</th>", kinds[i]);
    fputs("</tr>\n", f);
    for (int k = 0; k < r->n_ranks; k++) {
        if (!r->ranks[k].has_mem) continue;
        for (int j = 0; j < 2; j++) {
            fprintf(f, "<tr><td>%d</td><td>%s</td>", k, j ? "predicted" : "measured");
            for (int i = 0; i < 5; i++) {
                char key[64];
                snprintf(key, sizeof(key), "ranks.%d.%s.%d", k,
                         j ? "predicted_bytes" : "memory_bytes", i);
                td(f, key, j ? r->ranks[k].pred[i] : r->ranks[k].mem[i]);
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
    series a[2] = {{"step_s", "#1f77b4", n, 0, step, ss},
                   {"predicted_step_s", "#ff7f0e", n, 0, step, ps}};
    chart(f, "step time: measured and predicted", "step", "seconds", a, 2);
    series b[2] = {{"memory_bytes", "#1f77b4", n, 0, step, m},
                   {"predicted_memory_bytes", "#ff7f0e", n, 0, step, pm}};
    chart(f, "memory of the fullest rank: measured and predicted", "step", "bytes", b, 2);
    fputs("<table><tr><th></th><th>measured</th><th>predicted</th></tr><tr><th>mean step s</th>",
          f);
    td(f, "plan.step_s", r->plan_step_s), td(f, "plan.predicted_step_s", r->plan_pred_step_s);
    fputs("</tr><tr><th>memory bytes</th>", f);
    td(f, "plan.memory_bytes", r->plan_mem), td(f, "plan.predicted_memory_bytes", r->plan_pred_mem);
    fputs("</tr></table></section>\n", f);
out:
    free(step), free(ss), free(ps), free(m), free(pm);
}

static void sec_provenance(const tr_report *r, FILE *f) {
    fputs("<section id=\"provenance\"><h2>Provenance</h2>\n", f);
    if (!r->has_provenance) note(f, "provenance.json: not in the run folder");
    if (r->n_prov) fputs("<table class=\"kv\">", f);
    for (int i = 0; i < r->n_prov; i++) {
        fputs("<tr><th>", f), esc(f, r->prov[i].key), fputs("</th><td data-prov=\"", f);
        esc(f, r->prov[i].key), fputs("\">", f), esc(f, r->prov[i].val), fputs("</td></tr>\n", f);
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
    fprintf(f, "<svg viewBox=\"0 0 %d %d\" width=\"%d\" height=\"%d\">", W, h, W, h);
    for (int i = 0; i < r->n_down; i++) {
        const tr_report_attempt *a = &r->att[i], *b = &r->att[i + 1];
        double x0 = tx(r, a->t_last), x1 = tx(r, b->t_start);
        fprintf(f,
                "<rect x=\"%.2f\" y=\"0\" width=\"%.2f\" height=\"%d\" fill=\"#ddd\" "
                "data-down=\"%d\" data-value=\"%.17g\"><title>downtime %.4g s</title></rect>",
                x0, x1 - x0, h - 30, i, r->down[i].downtime_s, r->down[i].downtime_s);
    }
    for (int i = 0; i < r->n_attempts; i++) {
        const tr_report_attempt *a = &r->att[i];
        if (!isfinite(a->t_start)) continue;
        double x0 = tx(r, a->t_start), x1 = tx(r, a->t_last), y = i * rowh + 4;
        fprintf(f, "<text x=\"%d\" y=\"%.0f\" class=\"tk\" text-anchor=\"end\">attempt %d</text>",
                ML - 4, y + 13, a->attempt);
        fprintf(f,
                "<rect x=\"%.2f\" y=\"%.0f\" width=\"%.2f\" height=\"16\" fill=\"%s\" "
                "data-attempt=\"%d\"><title>steps %d to %d</title></rect>",
                x0, y, fmax(x1 - x0, 1), a->ended && !a->status ? "#9ecae1" : "#fdae6b", a->attempt,
                a->start_step, a->last_step);
        for (int k = 0; k < r->n_saves; k++)
            if (r->saves[k].attempt == a->attempt)
                fprintf(f,
                        "<line x1=\"%.2f\" x2=\"%.2f\" y1=\"%.0f\" y2=\"%.0f\" stroke=\"#333\" "
                        "data-save=\"%d\"><title>save at step %d: stall %.4g s</title></line>",
                        tx(r, r->saves[k].t), tx(r, r->saves[k].t), y - 2, y + 18, k,
                        r->saves[k].step, r->saves[k].stall_s);
        if (!a->ended)
            fprintf(f,
                    "<text x=\"%.2f\" y=\"%.0f\" fill=\"#c00\" font-weight=\"bold\" "
                    "text-anchor=\"middle\">&#x2716;</text>",
                    x1, y + 13);
    }
    fprintf(f, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" class=\"ax\"/>", ML, h - 30, W - MR,
            h - 30);
    fprintf(f, "<text x=\"%d\" y=\"%d\" class=\"tk\">0 s</text>", ML, h - 16);
    fprintf(f, "<text x=\"%d\" y=\"%d\" class=\"tk\" text-anchor=\"end\">%.4g s</text>", W - MR,
            h - 16, r->wall_s);
    fputs("</svg>\n", f);
}

static void timeline_tables(const tr_report *r, FILE *f) {
    fputs("<table><tr><th>attempt</th><th>start step</th><th>last step</th><th>start s</th>"
          "<th>last seen s</th><th>ended</th><th>failed rank</th><th>host</th><th>why</th></tr>\n",
          f);
    for (int i = 0; i < r->n_attempts; i++) {
        const tr_report_attempt *a = &r->att[i];
        char k[64];
        fputs("<tr>", f);
        snprintf(k, sizeof(k), "attempts.%d.attempt", i), tdi(f, k, a->attempt);
        snprintf(k, sizeof(k), "attempts.%d.start_step", i), tdi(f, k, a->start_step);
        snprintf(k, sizeof(k), "attempts.%d.last_step", i), tdi(f, k, a->last_step);
        snprintf(k, sizeof(k), "attempts.%d.start_s", i), td(f, k, a->t_start - r->t0);
        snprintf(k, sizeof(k), "attempts.%d.last_s", i), td(f, k, a->t_last - r->t0);
        snprintf(k, sizeof(k), "attempts.%d.status", i);
        tds(f, k, a->ended ? (a->status ? "failed" : "ended") : "ended abnormally");
        snprintf(k, sizeof(k), "attempts.%d.failed_rank", i), tdi(f, k, a->failed_rank);
        snprintf(k, sizeof(k), "attempts.%d.failed_host", i), tds(f, k, a->failed_host);
        snprintf(k, sizeof(k), "attempts.%d.why", i), tds(f, k, a->why);
        fputs("</tr>\n", f);
    }
    fputs("</table>\n", f);
    if (r->n_down) {
        fputs("<table><tr><th>after attempt</th><th>downtime s</th><th>steps redone</th>"
              "<th>charged to rank</th><th>host</th></tr>\n",
              f);
        for (int i = 0; i < r->n_down; i++) {
            char k[64];
            fputs("<tr>", f);
            snprintf(k, sizeof(k), "downtime.%d.after_attempt", i), tdi(f, k, r->down[i].after);
            snprintf(k, sizeof(k), "downtime.%d.downtime_s", i), td(f, k, r->down[i].downtime_s);
            snprintf(k, sizeof(k), "downtime.%d.steps_redone", i),
                tdi(f, k, r->down[i].steps_redone);
            snprintf(k, sizeof(k), "downtime.%d.rank", i), tdi(f, k, r->down[i].rank);
            snprintf(k, sizeof(k), "downtime.%d.host", i), tds(f, k, r->down[i].host);
            fputs("</tr>\n", f);
        }
        fputs("</table>\n", f);
    }
    if (r->n_saves) {
        fputs("<table><tr><th>attempt</th><th>save at step</th><th>stall s</th></tr>\n", f);
        for (int i = 0; i < r->n_saves; i++) {
            char k[64];
            fputs("<tr>", f);
            snprintf(k, sizeof(k), "saves.%d.attempt", i), tdi(f, k, r->saves[i].attempt);
            snprintf(k, sizeof(k), "saves.%d.step", i), tdi(f, k, r->saves[i].step);
            snprintf(k, sizeof(k), "saves.%d.stall_s", i), td(f, k, r->saves[i].stall_s);
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
    snprintf(k, sizeof(k), "%s.flops", prefix), td(f, k, flops);
    snprintf(k, sizeof(k), "%s.compute_s", prefix), td(f, k, compute);
    snprintf(k, sizeof(k), "%s.waited_s", prefix), td(f, k, waited);
    snprintf(k, sizeof(k), "%s.waited_on_s", prefix), td(f, k, waited_on);
    snprintf(k, sizeof(k), "%s.downtime_s", prefix), td(f, k, down);
    snprintf(k, sizeof(k), "%s.cost", prefix), td(f, k, cost);
    fprintf(f, "<td class=\"n\">%.1f%%</td></tr>\n", total > 0 ? 100 * cost / total : 0);
}

static void contrib_head(FILE *f, const char *what, const char *unit) {
    fprintf(f,
            "<table><tr><th>%s</th><th>FLOPs delivered</th><th>compute s</th>"
            "<th>waited on others s</th><th>others waited on it s</th><th>downtime caused s</th>"
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
            "(waited_on_s), priced at the mean rate of those others, are charged to that rank. "
            "The rest of C is split in proportion to delivered FLOPs (%s).</div>\n",
            r->priced ? "the cluster file's price_per_hour" : "1 unit per rank without --cluster",
            r->flops_from);
    fputs("<table><tr><th>booked hours</th><th>C</th><th>downtime charged</th><th>waiting "
          "charged</th><th>split by FLOPs</th></tr><tr>",
          f);
    td(f, "cost.booked_hours", r->booked_h), td(f, "cost.total", r->cost_total);
    td(f, "cost.downtime", r->cost_downtime), td(f, "cost.waiting", r->cost_waiting);
    td(f, "cost.by_flops", r->cost_flops);
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

static const char *css =
    "body{font:14px/1.4 sans-serif;margin:24px auto;max-width:980px;color:#222}"
    "h1{font-size:22px}h2{font-size:18px;border-bottom:1px solid #ccc;margin-top:28px}"
    "table{border-collapse:collapse;margin:8px 0;font-size:12px}"
    "td,th{border:1px solid #ddd;padding:2px 6px;text-align:left}td.n{text-align:right}"
    "figure{margin:8px 0;display:inline-block;vertical-align:top}figure.chart{width:49%}"
    "figure.chart svg{width:100%;height:auto}figcaption{font-weight:bold;font-size:13px}"
    ".ax{stroke:#444}.grid{stroke:#eee}.tk{font-size:10px;fill:#444}.lb{font-size:11px}"
    ".legend span{margin-right:12px;font-size:12px}"
    ".legend i{display:inline-block;width:10px;height:10px;margin-right:4px}"
    ".note{color:#666;font-size:12px}.warn{color:#b00}.nodata{color:#999;font-style:italic}"
    ".rule{background:#f6f6f6;padding:8px;font-size:13px}"
    "section{page-break-inside:avoid}@media print{body{margin:0}}";

void tr_report_write_html(const tr_report *r, FILE *f) {
    fputs("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
          "<title>trainer report: ",
          f);
    esc(f, r->dir);
    fprintf(f, "</title><style>%s</style></head><body>\n<h1>trainer report: ", css);
    esc(f, r->dir);
    fputs("</h1>\n", f);
    sec_summary(r, f);
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
