/* The report page's line charts as inline SVG, and how its numbers are shown: human units
 * (trainer/util.c's formatters), axes with round ticks labelled in the axis's unit under one
 * prefix and precision ("0:05:00", "19.2 MiB", "20k", "27.5%"), the legend in words, and
 * every series' exact points in data-x/data-y for the tests. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "trainer/report/svg.h"
#include "trainer/trainer.h"

void tr_report_human(tr_report_unit u, double v, char *buf, size_t n) {
    switch (u) {
    case TR_U_S:
        tr_fmt_seconds(v, buf, n);
        break;
    case TR_U_H:
        tr_fmt_seconds(v * 3600, buf, n);
        break;
    case TR_U_B:
        tr_fmt_bytes(v, buf, n);
        break;
    case TR_U_FLOP:
        tr_fmt_si(v, "FLOP", buf, n);
        break;
    case TR_U_TOKS:
        tr_fmt_si(v, "tok/s", buf, n);
        break;
    case TR_U_SHARE:
        tr_fmt_percent(v, buf, n);
        break;
    default:
        tr_fmt_num(v, buf, n);
    }
}

void tr_report_esc(FILE *f, const char *s) {
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

/* ---- axes ---------------------------------------------------------------------------------- */

enum { W = TR_SVG_W, H = TR_SVG_H, ML = TR_SVG_ML, MR = TR_SVG_MR, MT = TR_SVG_MT, MB = TR_SVG_MB };

/* An axis from lo to hi (round bounds) with a tick every `step` (all in the raw unit),
 * labelled under one prefix (power; binary for bytes) with `dec` decimals, or as h:mm:ss. */
typedef struct {
    tr_report_unit u;
    double lo, hi, step;
    int n, power, binary, dec, hms;
} axis;

/* The smallest of 1, 2, 2.5, 5 x 10^k at least x (x > 0). */
static double nice(double x) {
    double e = pow(10, floor(log10(x))), m = x / e;
    return (m <= 1 ? 1 : m <= 2 ? 2 : m <= 2.5 ? 2.5 : m <= 5 ? 5 : 10) * e;
}

/* A clock's round steps, in seconds, for an h:mm:ss axis. */
static double nice_seconds(double x) {
    static const double s[] = {1,   2,   5,    10,   15,   20,   30,    60,    120,   300,
                               600, 900, 1200, 1800, 3600, 7200, 10800, 21600, 43200, 86400};
    for (size_t i = 0; i < sizeof(s) / sizeof(s[0]); i++)
        if (s[i] >= x) return s[i];
    return nice(x / 86400) * 86400;
}

/* The decimals that show every multiple of step exactly (at most 6). */
static int decimals(double step) {
    int d = 0;
    while (d < 6 && fabs(step * pow(10, d) - round(step * pow(10, d))) > 1e-6 * step * pow(10, d))
        d++;
    return d;
}

static void axis_make(axis *a, tr_report_unit u, double lo, double hi) {
    double ref = fmax(fabs(lo), fabs(hi)), span = hi - lo, least = ref * 1e-3;
    if (span < least) /* a near-flat series: ticks of at most 4 significant digits */
        lo -= (least - span) / 2, hi += (least - span) / 2, span = least;
    memset(a, 0, sizeof(*a));
    a->u = u;
    double scale = 1, raw;
    if (u == TR_U_B)
        a->binary = 1, a->power = tr_fmt_power(ref, 1), scale = pow(1024, a->power);
    else if (u == TR_U_S && ref >= 60 && span / 4 >= 1)
        a->hms = 1;
    else if (u == TR_U_SHARE)
        scale = 0.01; /* in percent */
    else if (u == TR_U_S || ref >= 1e4)
        a->power = tr_fmt_power(ref, 0), scale = pow(1000, a->power);
    /* the least round step that spans the data in at most 7 intervals */
    raw = span / 7 / scale;
    double step = a->hms ? nice_seconds(raw) : nice(raw);
    while (ceil(hi / (step * scale)) - floor(lo / (step * scale)) > 7)
        step = a->hms ? nice_seconds(step * 1.001) : nice(step * 1.001);
    a->dec = a->hms ? 0 : decimals(step);
    a->step = step * scale;
    a->lo = floor(lo / a->step) * a->step;
    a->hi = ceil(hi / a->step) * a->step;
    if (a->hi <= a->lo) a->hi = a->lo + a->step;
    a->n = (int)llround((a->hi - a->lo) / a->step) + 1;
}

static void axis_label(const axis *a, double v, char *buf, size_t n) {
    if (fabs(v) < a->step * 1e-6) v = 0;
    if (a->hms)
        tr_fmt_hms(v, buf, n);
    else if (a->u == TR_U_SHARE)
        snprintf(buf, n, "%.*f%%", a->dec, 100 * v);
    else
        tr_fmt_scaled(v, a->power, a->binary, a->dec,
                      a->u == TR_U_B   ? "B"
                      : a->u == TR_U_S ? "s"
                                       : "",
                      buf, n);
}

static double px(const axis *a, double x) {
    return ML + (W - ML - MR) * (x - a->lo) / (a->hi - a->lo);
}

static double py(const axis *a, double y) {
    return H - MB - (H - MT - MB) * (y - a->lo) / (a->hi - a->lo);
}

/* The axes, their ticks and labels (the last x label ends at the edge rather than past it),
 * the titles clear of the labels. */
static void axes(FILE *f, const axis *x, const axis *y, const char *xl, const char *yl) {
    char lab[48];
    fprintf(f, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" class=\"ax\"/>", ML, H - MB, W - MR,
            H - MB);
    fprintf(f, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" class=\"ax\"/>", ML, MT, ML, H - MB);
    for (int t = 0; t < x->n; t++) {
        double v = x->lo + t * x->step, fx = px(x, v);
        axis_label(x, v, lab, sizeof(lab));
        fprintf(f, "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" class=\"ax\"/>", fx, H - MB,
                fx, H - MB + 4);
        fprintf(f, "<text x=\"%.1f\" y=\"%d\" class=\"tk\" text-anchor=\"%s\">%s</text>", fx,
                H - MB + 17, t == x->n - 1 ? "end" : "middle", lab);
    }
    for (int t = 0; t < y->n; t++) {
        double v = y->lo + t * y->step, fy = py(y, v);
        axis_label(y, v, lab, sizeof(lab));
        fprintf(f, "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" class=\"grid\"/>", ML, fy,
                W - MR, fy);
        fprintf(f, "<text x=\"%d\" y=\"%.1f\" class=\"tk\" text-anchor=\"end\">%s</text>", ML - 6,
                fy + 3.5, lab);
    }
    fprintf(f, "<text x=\"%d\" y=\"%d\" class=\"lb\" text-anchor=\"middle\">%s</text>",
            (ML + W - MR) / 2, H - 8, xl);
    fprintf(f,
            "<text x=\"14\" y=\"%d\" class=\"lb\" text-anchor=\"middle\" "
            "transform=\"rotate(-90 14 %d)\">%s</text>",
            (MT + H - MB) / 2, (MT + H - MB) / 2, yl);
}

/* ---- series -------------------------------------------------------------------------------- */

static void widen(double v, double *lo, double *hi) {
    if (!isfinite(v)) return;
    if (v < *lo) *lo = v;
    if (v > *hi) *hi = v;
}

static void range(const tr_report_series *s, int ns, int yaxis, double *lo, double *hi) {
    *lo = INFINITY, *hi = -INFINITY;
    for (int k = 0; k < ns; k++)
        for (int i = 0; i < s[k].n; i++) {
            if (!isfinite(s[k].x[i]) || !isfinite(s[k].y[i])) continue;
            widen(yaxis ? s[k].y[i] : s[k].x[i], lo, hi);
            if (yaxis && s[k].lo) widen(s[k].lo[i], lo, hi), widen(s[k].hi[i], lo, hi);
        }
    if (*hi <= *lo) { /* a flat series: in the middle */
        double d = *lo != 0 ? fabs(*lo) * 0.05 : 1;
        *lo -= d, *hi += d;
    }
}

/* The shaded band of a series from lo to hi: along hi, then back along lo. */
static void band(FILE *f, const tr_report_series *s, const axis *x, const axis *y) {
    fprintf(f, "<polygon fill=\"%s\" fill-opacity=\"0.18\" stroke=\"none\" points=\"", s->color);
    for (int i = 0; i < s->n; i++)
        if (isfinite(s->x[i]) && isfinite(s->lo[i]) && isfinite(s->hi[i]))
            fprintf(f, "%.1f,%.1f ", px(x, s->x[i]), py(y, s->hi[i]));
    for (int i = s->n - 1; i >= 0; i--)
        if (isfinite(s->x[i]) && isfinite(s->lo[i]) && isfinite(s->hi[i]))
            fprintf(f, "%.1f,%.1f ", px(x, s->x[i]), py(y, s->lo[i]));
    fputs("\"/>", f);
}

/* One series: its finite points as a polyline (or circles), the values in data-x/data-y. */
static void plot_series(FILE *f, const tr_report_series *s, const axis *x, const axis *y) {
    fprintf(f, "<g data-series=\"%s\" data-label=\"%s\" data-x=\"", s->key, s->label);
    for (int i = 0, first = 1; i < s->n; i++)
        if (isfinite(s->x[i]) && isfinite(s->y[i]))
            fprintf(f, "%s%.17g", first ? "" : " ", s->x[i]), first = 0;
    fputs("\" data-y=\"", f);
    for (int i = 0, first = 1; i < s->n; i++)
        if (isfinite(s->x[i]) && isfinite(s->y[i]))
            fprintf(f, "%s%.17g", first ? "" : " ", s->y[i]), first = 0;
    fprintf(f, "\">");
    if (s->lo) band(f, s, x, y);
    if (!s->dots)
        fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"%s\"%s points=\"",
                s->color, s->dashed ? "3.5" : "1.5",
                s->dashed ? " stroke-dasharray=\"7 4\" stroke-opacity=\"0.75\"" : "");
    for (int i = 0; i < s->n; i++) {
        if (!isfinite(s->x[i]) || !isfinite(s->y[i])) continue;
        if (s->dots)
            fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"%s\"/>", px(x, s->x[i]),
                    py(y, s->y[i]), s->color);
        else
            fprintf(f, "%.1f,%.1f ", px(x, s->x[i]), py(y, s->y[i]));
    }
    fputs(s->dots ? "</g>" : "\"/></g>", f);
}

void tr_report_chart(FILE *f, const char *title, const char *xl, tr_report_unit xu, const char *yl,
                     tr_report_unit yu, const tr_report_series *s, int ns) {
    int points = 0;
    for (int k = 0; k < ns; k++)
        for (int i = 0; i < s[k].n; i++)
            points += isfinite(s[k].x[i]) && isfinite(s[k].y[i]);
    fprintf(f, "<figure class=\"chart\"><figcaption>%s</figcaption>\n", title);
    if (!points) {
        fputs("<p class=\"nodata\">no data</p></figure>\n", f);
        return;
    }
    double lo, hi;
    axis x, y;
    range(s, ns, 0, &lo, &hi), axis_make(&x, xu, lo, hi);
    range(s, ns, 1, &lo, &hi), axis_make(&y, yu, lo, hi);
    fprintf(f, "<svg viewBox=\"0 0 %d %d\" width=\"%d\" height=\"%d\">", W, H, W, H);
    axes(f, &x, &y, xl, yl);
    for (int k = 0; k < ns; k++)
        plot_series(f, &s[k], &x, &y);
    fputs("</svg><div class=\"legend\">", f);
    for (int k = 0; k < ns; k++)
        fprintf(f, "<span><i class=\"%s\" style=\"%s:%s\"></i>%s</span>",
                s[k].dashed ? "dash"
                : s[k].dots ? "dot"
                            : "",
                s[k].dashed ? "border-color" : "background", s[k].color, s[k].label);
    fputs("</div></figure>\n", f);
}
