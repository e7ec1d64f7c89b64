/* The report page's private parts (report/html.c, report/svg.c): how a number is shown in
 * human units, and the line charts as inline SVG with ticks in those units. */
#ifndef TR_REPORT_SVG_H
#define TR_REPORT_SVG_H

#include <stdio.h>

/* What a number is, which picks its formatter (trainer/util.c's tr_fmt_*): a plain number,
 * seconds, hours (shown as a duration), bytes, FLOPs, tokens/s, a share (0.278 is 27.8%). */
typedef enum { TR_U_NUM, TR_U_S, TR_U_H, TR_U_B, TR_U_FLOP, TR_U_TOKS, TR_U_SHARE } tr_report_unit;

void tr_report_human(tr_report_unit u, double v, char *buf, size_t n);
/* s with <, >, &, " escaped for HTML. */
void tr_report_esc(FILE *f, const char *s);

/* One plotted series: `key` names it in data-series (the --json series it shows), `label` in
 * the legend; a dashed one is drawn wide and under the solid ones. With lo and hi (else
 * NULL), a band from lo to hi is shaded under its line (the spread of several runs). */
typedef struct {
    const char *key, *label, *color;
    int n, dots, dashed;
    const double *x, *y;
    const double *lo, *hi;
} tr_report_series;

/* A figure: the caption, each axis's title and unit, the series (drawn in order, so what
 * must stay visible comes last), the legend; "no data" without a finite point. */
void tr_report_chart(FILE *f, const char *title, const char *xl, tr_report_unit xu, const char *yl,
                     tr_report_unit yu, const tr_report_series *s, int ns);

/* The page's style sheet (every page of the report's shares it). */
extern const char *const tr_report_css;

/* The chart's size and margins (the other figures of the page share them). */
enum {
    TR_SVG_W = 640,
    TR_SVG_H = 240,
    TR_SVG_ML = 84,
    TR_SVG_MR = 14,
    TR_SVG_MT = 10,
    TR_SVG_MB = 44
};

#endif
