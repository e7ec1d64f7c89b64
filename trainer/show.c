/* `trainer show RECIPE`: the model tree with parameters, FLOPs and activation memory per
 * component, then the resolved layout of a run, its pipeline's chunks, the memory one of its
 * processes needs (tr_layout_memory, exactly what `run` predicts; one per pipeline rank), and
 * how tensor parallelism splits the tensors (the torch7 print(model) of this project).
 * Nothing is allocated for the model. `trainer show CHECKPOINT`: the saved recipe's tree and
 * the layout and pipeline the checkpoint was saved with. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "parallel/dp.h"
#include "parallel/schedule.h"
#include "trainer/trainer.h"

static void describe(const tr_model_desc *d, const tr_node *n, char *buf, size_t len) {
    switch (n->kind) {
    case TR_NODE_SEQUENCE:
        snprintf(buf, len, "model  vocab %d, dim %d, seq_len %d", d->vocab, d->dim, d->seq_len);
        break;
    case TR_NODE_STACK:
        snprintf(buf, len, "stack x%d  (the figures of one repeat below)", n->repeat);
        break;
    case TR_NODE_RESIDUAL:
        snprintf(buf, len, "residual");
        break;
    case TR_NODE_EMBEDDING:
        snprintf(buf, len, "embedding  %d x %d", d->vocab, d->dim);
        break;
    case TR_NODE_POSITIONS:
        snprintf(buf, len, "positions  learned, %d x %d", d->seq_len, d->dim);
        break;
    case TR_NODE_ROPE:
        snprintf(buf, len, "rope  theta %g", n->rope_theta);
        break;
    case TR_NODE_LAYERNORM:
        snprintf(buf, len, "layernorm  eps %g%s", n->eps, n->bias ? "" : ", no bias");
        break;
    case TR_NODE_RMSNORM:
        snprintf(buf, len, "rmsnorm  eps %g", n->eps);
        break;
    case TR_NODE_ATTENTION:
        if (n->kv_heads != n->heads)
            snprintf(buf, len, "attention  %d heads of %d, %d kv heads%s%s", n->heads,
                     d->dim / n->heads, n->kv_heads, n->rope_theta > 0 ? ", rope" : "",
                     n->bias ? "" : ", no bias");
        else
            snprintf(buf, len, "attention  %d heads of %d%s%s", n->heads, d->dim / n->heads,
                     n->rope_theta > 0 ? ", rope" : "", n->bias ? "" : ", no bias");
        break;
    case TR_NODE_MLP:
        snprintf(buf, len, "mlp  %s, hidden %d%s",
                 n->activation == TR_ACT_SWIGLU ? "swiglu" : "gelu", n->hidden,
                 n->bias ? "" : ", no bias");
        break;
    case TR_NODE_LM_HEAD:
        snprintf(buf, len, "lm_head  %s", n->tied ? "tied to the embedding" : "own weights");
        break;
    case TR_NODE_KIND_COUNT:
        snprintf(buf, len, "?");
        break;
    }
}

static void print_node(const tr_model_desc *d, const tr_node *n, int T, const char *prefix,
                       const char *branch) {
    char what[160], line[256], p[32], f[32], a[32], st[32];
    describe(d, n, what, sizeof(what));
    tr_cost c;
    tr_cost_node(d, n, T, &c);
    tr_fmt_count(c.params, p, sizeof(p));
    tr_fmt_count(c.fwd_flops, f, sizeof(f));
    tr_fmt_bytes(c.act_bytes, a, sizeof(a));
    tr_fmt_bytes(c.param_bytes + c.grad_bytes + c.optim_bytes, st, sizeof(st));
    snprintf(line, sizeof(line), "%s%s%s", prefix, branch, what);
    /* the tree glyphs are 3 bytes but 1 column wide: pad by columns, not bytes */
    int cols = 0;
    for (const char *s = line; *s; s++)
        cols += ((unsigned char)*s & 0xC0) != 0x80;
    printf("%s%*s %8s %11s %11s %11s\n", line, cols < 60 ? 60 - cols : 0, "",
           c.params > 0 ? p : "-", c.params > 0 ? st : "-", c.fwd_flops > 0 ? f : "-",
           c.act_bytes > 0 ? a : "-");
    char sub[256];
    for (int i = 0; i < n->n_children; i++) {
        int last = i == n->n_children - 1;
        if (n->kind == TR_NODE_SEQUENCE)
            snprintf(sub, sizeof(sub), "%s", prefix);
        else
            snprintf(sub, sizeof(sub), "%s%s", prefix,
                     *branch == '\0' ? "" : (strstr(branch, "└") ? "   " : "│  "));
        print_node(d, &n->children[i], T, sub, last ? "└─ " : "├─ ");
    }
}

/* How tensor parallelism splits p, read off its placement (model.h, tr_param_seg). */
static void split_of(const tr_param *p, char *buf, size_t len) {
    const char *by = strstr(p->name, "attention") ? "heads"
                     : strstr(p->name, "mlp")     ? "hidden units"
                                                  : "vocabulary";
    int shared = 1, replicas = p->seg[0].copies;
    for (int s = 0; s < p->n_seg; s++)
        if (p->seg[s].copies > shared) shared = p->seg[s].copies;
    if (p->shape[0] != p->gshape[0] || p->n_seg > 1) {
        int n = snprintf(buf, len, "rows split (column-parallel, by %s)", by);
        if (shared > 1 && n > 0 && (size_t)n < len)
            snprintf(buf + n, len - (size_t)n, "; key/value heads shared by %d ranks", shared);
    } else if (p->shape[1] != p->gshape[1]) {
        snprintf(buf, len, "columns split (row-parallel, by %s)", by);
    } else if (replicas > 1) {
        snprintf(buf, len, "replicated on %d ranks%s", replicas,
                 p->seg[0].partial ? ", each computing part of its gradient" : "");
    } else {
        snprintf(buf, len, "whole on this rank");
    }
}

static void shape_of(int ndim, const int *shape, char *buf, size_t len) {
    if (ndim == 1)
        snprintf(buf, len, "%d", shape[0]);
    else
        snprintf(buf, len, "%d x %d", shape[0], shape[1]);
}

/* One tensor of each kind (the repeats of a stack named stack.*.): its global shape, tp rank
 * 0's shape and how it is split, from the model planned with rank 0's options. */
static int print_splits(const tr_layout *l, const tr_model_desc *d, char *err, size_t errlen) {
    tr_model_opts mo = tr_layout_model_opts(l, 0);
    tr_model *m;
    if (tr_model_plan(&m, d, TR_DTYPE_F32, &mo, err, errlen)) return -1;
    int n = tr_model_num_params(m), shown = 0;
    char(*kinds)[TR_PARAM_NAME_MAX] = calloc((size_t)(n ? n : 1), TR_PARAM_NAME_MAX);
    if (!kinds) {
        tr_model_free(m);
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    printf("tensor parallel   tp %d: each kind of tensor, its global shape -> tp rank 0's\n",
           l->tp);
    for (int i = 0; i < n; i++) {
        const tr_param *p = tr_model_param(m, i);
        char kind[TR_PARAM_NAME_MAX], g[32], mine[32], how[160];
        const char *s = p->name;
        size_t k = 0;
        while (*s && k + 1 < sizeof(kind)) { /* stack.N. -> stack.*. */
            if (!strncmp(s, "stack.", 6) && s[6] >= '0' && s[6] <= '9') {
                k += (size_t)snprintf(kind + k, sizeof(kind) - k, "stack.*");
                for (s += 6; *s >= '0' && *s <= '9'; s++) {
                }
                continue;
            }
            kind[k++] = *s++;
        }
        kind[k] = 0;
        int seen = 0;
        for (int j = 0; j < shown && !seen; j++)
            seen = !strcmp(kinds[j], kind);
        if (seen) continue;
        snprintf(kinds[shown++], TR_PARAM_NAME_MAX, "%s", kind);
        shape_of(p->ndim, p->gshape, g, sizeof(g));
        shape_of(p->ndim, p->shape, mine, sizeof(mine));
        split_of(p, how, sizeof(how));
        printf("  %-44s %13s -> %-13s %s\n", kind, g, mine, how);
    }
    free(kinds);
    tr_model_free(m);
    return 0;
}

/* The memory of the process at world rank `rank` (`who` names it), and one line of exact
 * bytes for tools ("memory bytes per process:", with pp > 1 "... (pipeline rank P):"). */
static int print_memory(const tr_layout *l, const tr_recipe *r, int rank, const char *who,
                        char *err, size_t errlen) {
    tr_memory mem;
    if (tr_layout_memory(l, &r->model, TR_DTYPE_F32, rank, &mem, err, errlen)) return -1;
    char b[6][32], tag[48] = "";
    double all = (double)(mem.params + mem.grads + mem.optimizer + mem.activations + mem.scratch);
    double v[6] = {(double)mem.params,      (double)mem.grads,   (double)mem.optimizer,
                   (double)mem.activations, (double)mem.scratch, all};
    for (int i = 0; i < 6; i++)
        tr_fmt_bytes(v[i], b[i], sizeof(b[i]));
    printf("memory (fp32)    per process (%s):\n"
           "                 parameters %s, gradients %s, AdamW state %s,\n"
           "                 activations %s, scratch %s: %s in all\n",
           who, b[0], b[1], b[2], b[3], b[4], b[5]);
    if (l->pp > 1) snprintf(tag, sizeof(tag), " (pipeline rank %d)", tr_layout_coord_of(l, rank).p);
    printf("memory bytes per process%s: params %zu grads %zu optimizer %zu activations %zu "
           "scratch %zu\n",
           tag, mem.params, mem.grads, mem.optimizer, mem.activations, mem.scratch);
    return 0;
}

/* The layout's lines: the pipeline's chunks (pp > 1), what each process holds (the same
 * figures `run` predicts; with pp > 1 one process of each pipeline rank, whose chunks
 * differ), one line of exact bytes for tools, and how tensor parallelism splits the tensors. */
static int print_layout(const tr_layout *l, const tr_recipe *r, char *err, size_t errlen) {
    char desc[256], rec[96];
    tr_layout_recompute_name(l, rec, sizeof rec);
    tr_layout_describe(l, desc, sizeof(desc));
    printf("layout           %d process%s, %s\n", l->world, l->world == 1 ? "" : "es", desc);
    printf("micro-batch      %d x %d tokens%s, %d %s of %ld tokens; recompute %s\n", l->micro_batch,
           l->seq_len, l->micro_auto ? " (auto)" : "", l->accum,
           l->pp > 1            ? "micro-batch(es) per step"
           : l->shares_uneven ? "accumulation step(s) at most (dp_shares)"
                              : "accumulation step(s)",
           r->train.batch_tokens,
           rec);
    const tr_guard_desc *g = &r->train.guard;
    if (g->on)
        printf("guard            skip a step whose loss or gradient norm is not finite, or whose "
               "loss is over %g sigma above (median, MAD) or norm over %g times the median of "
               "the last %d steps (from step %d); roll back after %d in a row\n",
               (double)g->z_loss, (double)g->norm_ratio, g->window, g->warmup + 1, g->max_bad);
    else
        printf("guard            off: a step whose loss or gradient norm is not finite stops "
               "the run\n");
    tr_layout_describe_stages(l, &r->model, stdout);
    for (int p = 0; p < l->pp; p++) {
        char who[64];
        int rank = p * l->tp; /* (d 0, p, t 0) */
        if (l->pp > 1)
            snprintf(who, sizeof(who), "pipeline rank %d: world rank %d", p, rank);
        else
            snprintf(who, sizeof(who), "rank 0");
        if (print_memory(l, r, rank, who, err, errlen)) return -1;
    }
    tr_zero sh = tr_zero_of(l->zero);
    if (sh.grads)
        printf("                 (ZeRO-%d: plus the gradient buckets being computed and reduced%s, "
               "a few times parallel.bucket_kb and the largest tensor)\n",
               l->zero,
               sh.params ? " and the parameter buckets of the op running and the next" : "");
    return l->tp > 1 ? print_splits(l, &r->model, err, errlen) : 0;
}

/* A checkpoint's pipeline in one line: "1f1b, pp 2 x 1 virtual stage, 8 micro-batches,
 * stages: blocks 0-3 | 4-7"; with virtual stages each chunk in model order with its stage
 * ("chunks: blocks 0-1 (stage 0) | 2-3 (stage 1) | ..."). An older trainer's checkpoint
 * records neither schedule nor cut: said so. */
static void print_ckpt_pipeline(const tr_ckpt *c) {
    if (c->chunks <= 1) {
        printf("pipeline         none (pp %d)\n", c->pp > 0 ? c->pp : 1);
        return;
    }
    printf("pipeline         %s, pp %d x %d virtual stage%s",
           c->schedule >= 0 ? tr_pp_kind_name((tr_pp_kind)c->schedule)
                            : "schedule not recorded (an older trainer's checkpoint)",
           c->pp, c->virtual_stages, c->virtual_stages == 1 ? "" : "s");
    if (c->microbatches) printf(", %d micro-batches", c->microbatches);
    if (!c->has_stages) {
        printf(", stages not recorded\n");
        return;
    }
    int v1 = c->virtual_stages == 1;
    printf(", %s: blocks ", v1 ? "stages" : "chunks");
    for (int k = 0; k < c->chunks; k++) {
        int a = c->chunk_start[k], b = c->chunk_start[k + 1] - 1;
        printf("%s%d", k ? " | " : "", a);
        if (b > a) printf("-%d", b);
        if (!v1) printf(" (stage %d)", k % c->pp);
    }
    printf("\n");
}

/* `trainer show CHECKPOINT` (a step folder, or a run folder: its newest good checkpoint): the
 * model tree of the recipe saved in it, then its step and the layout that saved it (the
 * manifest's parallel section). */
static int show_checkpoint(const char *arg) {
    tr_ckpt c;
    tr_recipe r;
    char err[1024];
    if (tr_ckpt_open_arg(arg, &c, 0, stderr, err, sizeof(err))) {
        fprintf(stderr, "trainer show: %s\n", err);
        return 1;
    }
    if (tr_recipe_load_string(&r, c.recipe, "recipe.lua (saved in the checkpoint)", c.dir, NULL, 0,
                              err, sizeof(err))) {
        printf("model            the saved recipe does not load here: %s\n", err);
    } else {
        printf("%-60s %8s %11s %11s %11s\n", "recipe.lua (saved in the checkpoint)", "params",
               "p+g+adam", "FLOPs/tok", "act/tok");
        print_node(&r.model, &r.model.root, r.model.seq_len, "", "");
        tr_recipe_free(&r);
    }
    printf("\ncheckpoint       %s: step %ld\n", c.dir, c.step);
    if (c.world > 0)
        printf("saved by         %d process%s: dp %d x tp %d x pp %d, ZeRO-%d%s\n", c.world,
               c.world == 1 ? "" : "es", c.dp, c.tp, c.pp, c.zero,
               c.sequence_parallel ? ", sequence parallel" : "");
    print_ckpt_pipeline(&c);
    tr_ckpt_free(&c);
    return 0;
}

/* How many processes a mesh dimension has: the flag's, else the recipe's, else 1. */
static int along(int flag, int recipe) {
    return flag > 0 ? flag : recipe > 0 ? recipe : 1;
}

int tr_cmd_show(int argc, char **argv) {
    tr_options o;
    int rc = tr_parse_options(&o, "show", argc, argv, 2);
    if (rc) return rc < 0 ? 2 : 0;
    struct stat st;
    if (o.recipe && !stat(o.recipe, &st) && S_ISDIR(st.st_mode)) return show_checkpoint(o.recipe);
    tr_recipe r;
    if (tr_load_recipe(&r, &o, "show")) return 1;
    const tr_model_desc *d = &r.model;
    const tr_parallel_desc *par = &r.parallel;
    /* the processes of the run shown: dp x tp x pp from the flags, else the recipe, else 1 */
    double world = (double)along(o.layout.dp, par->dp) * along(o.layout.tp, par->tp) *
                   along(o.layout.pp, par->pp); /* each up to 1e9: no integer overflows */
    char err[1024];
    tr_layout l;
    if (world > 1000000) {
        fprintf(stderr, "trainer show: dp x tp x pp is %.0f processes: too many to plan (at most "
                        "1000000)\n", world);
        tr_recipe_free(&r);
        return 1;
    }
    if (tr_resolve_layout(&l, &r, &o, (int)world, tr_backend_cpu(), "show", err, sizeof(err))) {
        fprintf(stderr, "%s\n", err);
        tr_recipe_free(&r);
        return 1;
    }
    printf("%-60s %8s %11s %11s %11s\n", r.path, "params", "p+g+adam", "FLOPs/tok", "act/tok");
    print_node(d, &d->root, d->seq_len, "", "");

    tr_cost c;
    tr_cost_model(d, d->seq_len, &c);
    char b1[32], b2[32];
    tr_fmt_count(c.params, b1, sizeof(b1));
    tr_fmt_count(c.matrix_params, b2, sizeof(b2));
    printf("\ncolumns: parameters | fp32 parameters + gradients + AdamW state | forward FLOPs "
           "per token | activation bytes kept per token\n");
    printf("parameters       %s (%s in matrices, which get weight decay)\n", b1, b2);
    tr_fmt_count(c.fwd_flops, b1, sizeof(b1));
    tr_fmt_count(3 * c.fwd_flops, b2, sizeof(b2));
    printf("FLOPs per token  %s forward, %s training (matrix products; attention's causal "
           "half only; training = 3x forward)\n",
           b1, b2);
    rc = print_layout(&l, &r, err, sizeof(err));
    if (rc) fprintf(stderr, "%s: %s\n", r.path, err);
    tr_recipe_free(&r);
    return rc ? 1 : 0;
}
