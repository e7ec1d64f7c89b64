/* The pipeline's chunks (layout.h): the balanced cut of the model's blocks into pp x V chunks
 * (tr_layout_partition) and the description of a resolved pipeline for `show` and the run's
 * log (tr_layout_describe_stages): which blocks each rank runs, their FLOPs and the bubble. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "parallel/layout.h"
#include "parallel/schedule.h"

/* best[i]: the best value for the first i blocks in one chunk fewer; cut[i] where the last
 * chunk starts. One step of the two programs below: for chunk count kk and i blocks, the
 * earliest j (the previous chunks end earliest) that minimises combine(prev[j], S[i] - S[j]). */
typedef double (*combine_fn)(double prev, double seg, double cap);

static double by_max(double prev, double seg, double cap) {
    (void)cap;
    return prev > seg ? prev : seg;
}

/* the sum of squares, over chunks no dearer than cap (HUGE_VAL: not allowed) */
static double by_squares(double prev, double seg, double cap) {
    return seg > cap ? HUGE_VAL : prev + seg * seg;
}

/* best[kk * (n + 1) + i]: the best value of the first i blocks in kk + 1 chunks; chunk kk's
 * time is its cost over speed[kk] (NULL: 1). */
static void program(const double *S, int n, int k, const double *speed, combine_fn f, double cap,
                    double *best, int *cut) {
    for (int i = 0; i <= n; i++) {
        best[i] = i > 0 ? f(0, speed ? S[i] / speed[0] : S[i], cap) : HUGE_VAL;
        cut[i] = 0;
    }
    for (int kk = 1; kk < k; kk++) {
        const double *prev = best + (size_t)(kk - 1) * (size_t)(n + 1);
        double *cur = best + (size_t)kk * (size_t)(n + 1);
        int *cc = cut + (size_t)kk * (size_t)(n + 1);
        for (int i = 0; i <= n; i++) {
            cur[i] = HUGE_VAL;
            cc[i] = 0;
            for (int j = kk; j < i; j++) { /* kk chunks of blocks [0, j), then [j, i) */
                double seg = speed ? (S[i] - S[j]) / speed[kk] : S[i] - S[j];
                double v = f(prev[j], seg, cap);
                if (v < cur[i]) {
                    cur[i] = v;
                    cc[i] = j;
                }
            }
        }
    }
}

int tr_layout_partition(const double *cost, int n, int k, int *start) {
    return tr_layout_partition_speeds(cost, n, k, NULL, start);
}

int tr_layout_partition_speeds(const double *cost, int n, int k, const double *speed,
                               int *start) {
    if (k < 1 || k > n) return -1;
    for (int c = 0; speed && c < k; c++)
        if (!(speed[c] > 0)) return -1;
    size_t cells = (size_t)k * (size_t)(n + 1);
    double *S = malloc((size_t)(n + 1) * sizeof(double));
    double *best = malloc(cells * sizeof(double));
    int *cut = malloc(cells * sizeof(int));
    if (!S || !best || !cut) {
        free(S);
        free(best);
        free(cut);
        return -1;
    }
    S[0] = 0;
    for (int i = 0; i < n; i++)
        S[i + 1] = S[i] + cost[i];
    /* the cheapest most expensive chunk, then the most even cut under it: every chunk cost
     * is the same (S[i] - S[j]) / speed expression in both programs, so the cap compares
     * exactly */
    program(S, n, k, speed, by_max, 0, best, cut);
    double cap = best[(size_t)(k - 1) * (size_t)(n + 1) + (size_t)n];
    program(S, n, k, speed, by_squares, cap, best, cut);
    start[k] = n;
    for (int kk = k - 1, i = n; kk >= 0; kk--) {
        i = kk > 0 ? cut[(size_t)kk * (size_t)(n + 1) + (size_t)i] : 0;
        start[kk] = i;
    }
    free(S);
    free(best);
    free(cut);
    return 0;
}

/* ---- describing the pipeline ---------------------------------------------------------- */

/* The name of a top-level layer outside the stacks; `last`: no stack after it. */
static const char *extra_name(const tr_node *n, int last) {
    switch (n->kind) {
    case TR_NODE_LAYERNORM:
    case TR_NODE_RMSNORM:
        return last ? "final norm" : "norm";
    case TR_NODE_LM_HEAD:
        return "head";
    default:
        return tr_node_kind_name(n->kind);
    }
}

/* "blocks 0-5 (+ embedding, positions)": the blocks [a, b) and the top-level layers outside
 * the stacks that tr_cost_blocks counts in them (before the first stack: block 0; any other:
 * the block before it). */
static void chunk_label(const tr_model_desc *d, int a, int b, char *buf, size_t len) {
    const tr_node *root = &d->root;
    int used = b - a == 1 ? snprintf(buf, len, "block %d", a)
                          : snprintf(buf, len, "blocks %d-%d", a, b - 1);
    int blocks = 0, extras = 0, last_stack = -1;
    for (int i = 0; i < root->n_children; i++)
        if (root->children[i].kind == TR_NODE_STACK) last_stack = i;
    for (int i = 0; i < root->n_children && used > 0 && (size_t)used < len; i++) {
        const tr_node *c = &root->children[i];
        if (c->kind == TR_NODE_STACK) {
            blocks += c->repeat;
            continue;
        }
        int in = blocks == 0 ? 0 : blocks - 1;
        if (in < a || in >= b) continue;
        used += snprintf(buf + used, len - (size_t)used, "%s%s", extras++ ? ", " : " (+ ",
                         extra_name(c, i > last_stack));
    }
    if (extras && used > 0 && (size_t)used < len) snprintf(buf + used, len - (size_t)used, ")");
}

/* 1.23G, 456.7M: FLOPs as show prints them (trainer's tr_fmt_count). */
static void fmt_count(double x, char *buf, size_t n) {
    static const char *const unit[] = {"", "K", "M", "G", "T"};
    int u = 0;
    while (x >= 1000 && u < 4) {
        x /= 1000;
        u++;
    }
    snprintf(buf, n, u ? "%.2f%s" : "%.0f%s", x, unit[u]);
}

/* The schedule's bubble, or -1 when it cannot be generated here. */
static double bubble_of(const tr_layout *l) {
    char why[256];
    tr_pp_schedule s;
    tr_pp_kind k = (tr_pp_kind)l->schedule;
    if (tr_pp_check(k, l->pp, l->virtual_stages, l->microbatches, why, sizeof(why)) ||
        tr_pp_generate(&s, k, l->pp, l->virtual_stages, l->microbatches))
        return -1;
    double b = tr_pp_bubble(&s);
    tr_pp_free(&s);
    return b;
}

void tr_layout_describe_stages(const tr_layout *l, const tr_model_desc *d, FILE *out) {
    if (l->pp <= 1) return;
    int n = l->n_blocks, K = l->pp * l->virtual_stages;
    tr_cost *blocks = calloc((size_t)n, sizeof(tr_cost));
    if (!blocks) return;
    tr_cost_blocks(d, d->seq_len, blocks, n);
    double total = 0;
    for (int i = 0; i < n; i++)
        total += blocks[i].fwd_flops;
    double bubble = bubble_of(l);
    fprintf(out, "pipeline         pp %d, schedule %s", l->pp,
            tr_pp_kind_name((tr_pp_kind)l->schedule));
    if (l->virtual_stages > 1) fprintf(out, " (%d chunks per rank)", l->virtual_stages);
    fprintf(out, ", %d micro-batch%s of %d sequence%s; %d blocks in %d chunks (%s)\n",
            l->microbatches, l->microbatches == 1 ? "" : "es", l->micro_batch,
            l->micro_batch == 1 ? "" : "s", n, K,
            l->stages_given ? "the recipe's stages" : "balanced by forward FLOPs");
    if (bubble >= 0)
        fprintf(out,
                "                 bubble %.1f%% of a step in theory (forward 1, backward 2, "
                "communication free)\n",
                100 * bubble);
    for (int p = 0; p < l->pp; p++) {
        int first = 1;
        for (int c = 0; c < K; c++) {
            if (tr_pp_rank_of_kind((tr_pp_kind)l->schedule, l->pp, c) != p) continue;
            double f = 0;
            for (int i = l->chunk_start[c]; i < l->chunk_start[c + 1]; i++)
                f += blocks[i].fwd_flops;
            char rank[32] = "", label[256], fl[32];
            if (first) snprintf(rank, sizeof(rank), "rank p%d", p);
            first = 0;
            chunk_label(d, l->chunk_start[c], l->chunk_start[c + 1], label, sizeof(label));
            fmt_count(f, fl, sizeof(fl));
            fprintf(out, "  %-10s chunk %-3d %-40s %8s FLOPs/token %5.1f%%\n", rank, c, label, fl,
                    total > 0 ? 100 * f / total : 0.0);
        }
    }
    free(blocks);
}
