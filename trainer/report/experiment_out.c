/* An experiment's table and curves (trainer/report/experiment.h) as text, JSON, CSV and one HTML
 * page, all from the same computed figures. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "data/json.h"
#include "trainer/report/experiment.h"
#include "trainer/report/svg.h"
#include "trainer/trainer.h"

static const char *const fig_titles[TR_EX_FIGURES] = {"final val loss", "best val loss",
                                                      "final loss"};

/* "4.0793 ± 0.0012", "4.0793" (one seed), "-" (none) */
static void mean_sd(const tr_ex_stat *s, int digits, char *buf, size_t n) {
    if (!s->n) snprintf(buf, n, "-");
    else if (!isfinite(s->sd)) snprintf(buf, n, "%.*f", digits, s->mean);
    else snprintf(buf, n, "%.*f ± %.*f", digits, s->mean, digits, s->sd);
}

/* ---- text ------------------------------------------------------------------------------------ */

/* "8 points in 4 settings: 8 done, 0 failed, 0 unfinished; 0:12:31 of training" */
static void summary(const tr_ex *e, char *buf, size_t n) {
    double h = 0;
    for (int k = 0; k < e->n_points; k++)
        if (isfinite(e->points[k].hours)) h += e->points[k].hours;
    char t[32];
    tr_fmt_hms(h * 3600, t, sizeof t);
    snprintf(buf, n, "%d point%s in %d setting%s: %d done, %d failed, %d unfinished; %s of training",
             e->n_points, e->n_points == 1 ? "" : "s", e->n_settings, e->n_settings == 1 ? "" : "s",
             e->n_done, e->n_failed, e->n_points - e->n_done - e->n_failed, t);
}

void tr_ex_write_text(const tr_ex *e, FILE *f) {
    char sum[256];
    summary(e, sum, sizeof sum);
    fprintf(f, "experiment %s: %s\n", e->dir, sum);
    fprintf(f, "%-28s %5s", "setting", "seeds");
    for (int k = 0; k < TR_EX_FIGURES; k++) fprintf(f, "  %-20s", fig_titles[k]);
    for (int t = 0; t < e->n_tasks; t++) fprintf(f, "  %-16.16s", e->tasks[t]);
    fputs("  verdict\n", f);
    char b[64];
    for (int g = 0; g < e->n_settings; g++) {
        const tr_ex_setting *s = &e->settings[g];
        fprintf(f, "%-28s %2d/%-2d", s->label, s->done, s->n);
        for (int k = 0; k < TR_EX_FIGURES; k++) {
            mean_sd(&s->fig[k], 4, b, sizeof b);
            fprintf(f, "  %-*s", 20 + (strstr(b, "±") ? 1 : 0), b); /* ± is 2 bytes */
        }
        for (int t = 0; t < e->n_tasks; t++) {
            tr_ex_stat pct = s->task[t][0];
            pct.mean *= 100, pct.sd *= 100;
            mean_sd(&pct, 1, b, sizeof b);
            fprintf(f, "  %-*s", 16 + (strstr(b, "±") ? 1 : 0), b);
        }
        fprintf(f, "  %s\n", s->verdict);
    }
    for (int g = 0; g < e->n_settings; g++)
        fprintf(f, "seeds of %s: %s\n", e->settings[g].label, e->settings[g].seeds_verdict);
    if (e->n_tasks) fputs("tasks: accuracy in %, mean ± standard deviation over the seeds\n", f);
    for (int k = 0; k < e->n_points; k++)
        if (e->points[k].why[0])
            fprintf(f, "%s %s: %s\n", e->points[k].state, e->points[k].name, e->points[k].why);
}

/* ---- JSON ------------------------------------------------------------------------------------ */

static void jnum(FILE *f, const char *key, double v, int comma) {
    fprintf(f, "%s\"%s\": ", comma ? ", " : "", key);
    tr_json_write_num(f, v, 0);
}

static void jstat(FILE *f, const char *key, const tr_ex_stat *s, int comma) {
    fprintf(f, "%s\"%s\": {\"n\": %d", comma ? ", " : "", key, s->n);
    jnum(f, "mean", s->mean, 1), jnum(f, "sd", s->sd, 1);
    jnum(f, "min", s->min, 1), jnum(f, "max", s->max, 1);
    fputc('}', f);
}

static void jvalues(const tr_ex *e, const tr_ex_point *p, int seed, FILE *f) {
    fputs("\"values\": {", f);
    for (int x = 0, c = 0; x < e->n_axes; x++) {
        if (x == e->seed_axis && !seed) continue;
        fputs(c++ ? ", " : "", f);
        tr_json_write_string(f, e->axes[x]);
        fputs(": ", f);
        tr_json_write_string(f, p->values[x]);
    }
    fputc('}', f);
}

static void json_point(const tr_ex *e, const tr_ex_point *p, FILE *f) {
    fputs("    {\"name\": ", f);
    tr_json_write_string(f, p->name);
    fputs(", ", f);
    jvalues(e, p, 1, f);
    fprintf(f, ", \"state\": \"%s\", \"why\": ", p->state);
    tr_json_write_string(f, p->why);
    fprintf(f, ", \"last_step\": %lld", (long long)p->last_step);
    for (int k = 0; k < TR_EX_FIGURES; k++) jnum(f, tr_ex_figure_keys[k], p->fig[k], 1);
    jnum(f, "hours", p->hours, 1);
    fputs(", \"tasks\": {", f);
    for (int t = 0; t < e->n_tasks; t++) {
        fputs(t ? ", " : "", f);
        tr_json_write_string(f, e->tasks[t]);
        fputs(": {", f);
        jnum(f, "acc", p->task[t][0], 0), jnum(f, "acc_norm", p->task[t][1], 1);
        fputc('}', f);
    }
    fputs("}}", f);
}

static void json_setting(const tr_ex *e, const tr_ex_setting *s, FILE *f) {
    fputs("    {\"label\": ", f);
    tr_json_write_string(f, s->label);
    fputs(", ", f);
    jvalues(e, &e->points[s->first], 0, f);
    fprintf(f, ", \"seeds\": %d, \"done\": %d", s->n, s->done);
    for (int k = 0; k < TR_EX_FIGURES; k++) jstat(f, tr_ex_figure_keys[k], &s->fig[k], 1);
    fputs(", \"tasks\": {", f);
    for (int t = 0; t < e->n_tasks; t++) {
        fputs(t ? ", " : "", f);
        tr_json_write_string(f, e->tasks[t]);
        fputs(": {", f);
        jstat(f, "acc", &s->task[t][0], 0), jstat(f, "acc_norm", &s->task[t][1], 1);
        fputc('}', f);
    }
    fputs("}, \"verdict\": ", f);
    tr_json_write_string(f, s->verdict);
    fputs(", \"seeds_verdict\": ", f);
    tr_json_write_string(f, s->seeds_verdict);
    fputc('}', f);
}

void tr_ex_write_json(const tr_ex *e, FILE *f) {
    fputs("{\"experiment\": ", f);
    tr_json_write_string(f, e->dir);
    fprintf(f, ",\n  \"points_done\": %d, \"points_failed\": %d, \"axes\": [", e->n_done,
            e->n_failed);
    for (int x = 0; x < e->n_axes; x++) {
        fputs(x ? ", " : "", f);
        tr_json_write_string(f, e->axes[x]);
    }
    fputs("],\n  \"settings\": [\n", f);
    for (int g = 0; g < e->n_settings; g++) {
        json_setting(e, &e->settings[g], f);
        fputs(g + 1 < e->n_settings ? ",\n" : "\n", f);
    }
    fputs("  ],\n  \"points\": [\n", f);
    for (int k = 0; k < e->n_points; k++) {
        json_point(e, &e->points[k], f);
        fputs(k + 1 < e->n_points ? ",\n" : "\n", f);
    }
    fputs("  ]\n}\n", f);
}

/* ---- CSV ------------------------------------------------------------------------------------- */

static void csv_field(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) *s == '"' ? fputs("\"\"", f) : fputc(*s, f);
    fputc('"', f);
}

static void csv_stat(FILE *f, const tr_ex_stat *s) {
    const double v[4] = {s->mean, s->sd, s->min, s->max};
    for (int i = 0; i < 4; i++) {
        fputc(',', f);
        if (isfinite(v[i])) fprintf(f, "%.17g", v[i]);
    }
}

void tr_ex_write_csv(const tr_ex *e, FILE *f) {
    static const char *const parts[4] = {"mean", "sd", "min", "max"};
    for (int x = 0, c = 0; x < e->n_axes; x++)
        if (x != e->seed_axis) fprintf(f, "%s%s", c++ ? "," : "", e->axes[x]);
    fputs(e->n_axes > (e->seed_axis >= 0) ? ",seeds,done" : "seeds,done", f);
    for (int k = 0; k < TR_EX_FIGURES; k++)
        for (int i = 0; i < 4; i++) fprintf(f, ",%s_%s", tr_ex_figure_keys[k], parts[i]);
    for (int t = 0; t < e->n_tasks; t++)
        for (int a = 0; a < 2; a++)
            for (int i = 0; i < 4; i++)
                fprintf(f, ",%s_%s_%s", e->tasks[t], a ? "acc_norm" : "acc", parts[i]);
    fputs(",verdict,seeds_verdict\n", f);
    for (int g = 0; g < e->n_settings; g++) {
        const tr_ex_setting *s = &e->settings[g];
        const tr_ex_point *p = &e->points[s->first];
        int c = 0;
        for (int x = 0; x < e->n_axes; x++)
            if (x != e->seed_axis) fputs(c++ ? "," : "", f), csv_field(f, p->values[x]);
        fprintf(f, "%s%d,%d", c ? "," : "", s->n, s->done);
        for (int k = 0; k < TR_EX_FIGURES; k++) csv_stat(f, &s->fig[k]);
        for (int t = 0; t < e->n_tasks; t++) csv_stat(f, &s->task[t][0]), csv_stat(f, &s->task[t][1]);
        fputc(',', f), csv_field(f, s->verdict);
        fputc(',', f), csv_field(f, s->seeds_verdict);
        fputc('\n', f);
    }
}

/* ---- HTML ------------------------------------------------------------------------------------ */

static const char *const palette[10] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                        "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};

static void td_stat(FILE *f, const char *key, const tr_ex_stat *s, int digits, double scale) {
    char b[64];
    tr_ex_stat v = *s;
    v.mean *= scale, v.sd *= scale;
    mean_sd(&v, digits, b, sizeof b);
    fprintf(f, "<td class=\"n\" data-key=\"%s\" data-value=\"", key);
    tr_json_write_num(f, s->mean, 0);
    fprintf(f, "\" data-sd=\"");
    tr_json_write_num(f, s->sd, 0);
    fprintf(f, "\">%s</td>", b);
}

static void html_table(const tr_ex *e, FILE *f) {
    fputs("<table><tr><th>setting</th><th>seeds done</th>", f);
    for (int k = 0; k < TR_EX_FIGURES; k++) fprintf(f, "<th>%s</th>", fig_titles[k]);
    for (int t = 0; t < e->n_tasks; t++) {
        fputs("<th>", f), tr_report_esc(f, e->tasks[t]), fputs(" accuracy (%)</th>", f);
    }
    fputs("<th>verdict</th><th>seeds</th></tr>\n", f);
    for (int g = 0; g < e->n_settings; g++) {
        const tr_ex_setting *s = &e->settings[g];
        fputs("<tr data-setting=\"", f), tr_report_esc(f, s->label), fputs("\"><td>", f);
        tr_report_esc(f, s->label);
        fprintf(f, "</td><td class=\"n\">%d of %d</td>", s->done, s->n);
        for (int k = 0; k < TR_EX_FIGURES; k++) td_stat(f, tr_ex_figure_keys[k], &s->fig[k], 4, 1);
        for (int t = 0; t < e->n_tasks; t++) td_stat(f, "acc", &s->task[t][0], 1, 100);
        fputs("<td>", f), tr_report_esc(f, s->verdict), fputs("</td><td>", f);
        tr_report_esc(f, s->seeds_verdict), fputs("</td></tr>\n", f);
    }
    fputs("</table>\n<p class=\"note\">mean ± standard deviation over the seeds that finished "
          "(the sample's, n - 1); the JSON and CSV also give each figure's minimum and "
          "maximum</p>\n",
          f);
}

static void html_curves(const tr_ex *e, FILE *f, int val) {
    int n = e->n_settings < 10 ? e->n_settings : 10;
    tr_report_series s[10];
    for (int g = 0; g < n; g++) {
        const tr_ex_setting *t = &e->settings[g];
        s[g] = (tr_report_series){val ? "val_loss" : "loss", t->label, palette[g], t->n_curve,
                                  0, 0, t->step, val ? t->val : t->loss,
                                  val ? t->val_lo : t->loss_lo, val ? t->val_hi : t->loss_hi};
    }
    tr_report_chart(f, val ? "validation loss per setting (the mean of its seeds; shaded: their range)"
                           : "training loss per setting (the mean of its seeds; shaded: their range)",
                    "step", TR_U_NUM, "nats per token", TR_U_NUM, s, n);
}

static void html_points(const tr_ex *e, FILE *f) {
    fputs("<table><tr><th>point</th><th>state</th><th>last step</th><th>final val loss</th>"
          "<th>final loss</th><th>time</th><th>why</th></tr>\n",
          f);
    char b[32];
    for (int k = 0; k < e->n_points; k++) {
        const tr_ex_point *p = &e->points[k];
        fputs("<tr><td>", f), tr_report_esc(f, p->name);
        fprintf(f, "</td><td>%s</td><td class=\"n\">%lld</td>", p->state, (long long)p->last_step);
        for (int i = 0; i < 2; i++) {
            double v = p->fig[i ? TR_EX_FINAL_LOSS : TR_EX_FINAL_VAL];
            snprintf(b, sizeof b, isfinite(v) ? "%.4f" : "-", v);
            fprintf(f, "<td class=\"n\">%s</td>", b);
        }
        if (isfinite(p->hours)) tr_fmt_hms(p->hours * 3600, b, sizeof b);
        else snprintf(b, sizeof b, "-");
        fprintf(f, "<td class=\"n\" data-key=\"hours\" data-value=\"");
        tr_json_write_num(f, p->hours, 0);
        fprintf(f, "\">%s</td><td>", b);
        tr_report_esc(f, p->why), fputs("</td></tr>\n", f);
    }
    fputs("</table>\n", f);
}

void tr_ex_write_html(const tr_ex *e, FILE *f) {
    fputs("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>trainer "
          "experiment: ",
          f);
    tr_report_esc(f, e->dir);
    fprintf(f, "</title><style>%s</style></head><body>\n<h1>trainer experiment: ", tr_report_css);
    tr_report_esc(f, e->dir);
    char sum[256];
    summary(e, sum, sizeof sum);
    fprintf(f, "</h1>\n<p>%s</p>\n", sum);
    fputs("<section id=\"table\"><h2>Settings</h2>\n", f);
    html_table(e, f);
    fputs("</section>\n<section id=\"curves\"><h2>Curves</h2>\n", f);
    html_curves(e, f, 1);
    html_curves(e, f, 0);
    if (e->n_settings > 10)
        fputs("<p class=\"note\">the first 10 settings are drawn; the table has them all</p>\n", f);
    fputs("</section>\n<section id=\"points\"><h2>Points</h2>\n", f);
    html_points(e, f);
    fputs("</section></body></html>\n", f);
}
