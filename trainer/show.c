/* `trainer show RECIPE`: the model tree with parameters, FLOPs and activation memory per
 * component, and the memory one training process needs (the torch7 print(model) of this
 * project). Pure function of the recipe: nothing is allocated for the model. */
#include <stdio.h>
#include <string.h>

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
        snprintf(buf, len, "mlp  %s, hidden %d%s", n->activation == TR_ACT_SWIGLU ? "swiglu" : "gelu",
                 n->hidden, n->bias ? "" : ", no bias");
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
    for (const char *s = line; *s; s++) cols += ((unsigned char)*s & 0xC0) != 0x80;
    printf("%s%*s %8s %11s %11s %11s\n", line, cols < 60 ? 60 - cols : 0, "",
           c.params > 0 ? p : "-", c.params > 0 ? st : "-", c.fwd_flops > 0 ? f : "-",
           c.act_bytes > 0 ? a : "-");
    char sub[256];
    for (int i = 0; i < n->n_children; i++) {
        int last = i == n->n_children - 1;
        if (n->kind == TR_NODE_SEQUENCE)
            snprintf(sub, sizeof(sub), "%s", prefix);
        else
            snprintf(sub, sizeof(sub), "%s%s", prefix, *branch == '\0' ? "" : (strstr(branch, "└") ? "   " : "│  "));
        print_node(d, &n->children[i], T, sub, last ? "└─ " : "├─ ");
    }
}

int tr_cmd_show(int argc, char **argv) {
    tr_options o;
    int rc = tr_parse_options(&o, "show", argc, argv, 2);
    if (rc) return rc < 0 ? 2 : 0;
    tr_recipe r;
    if (tr_load_recipe(&r, &o, "show")) return 1;
    const tr_model_desc *d = &r.model;
    int T = d->seq_len, micro, accum;
    char err[512];
    int ranks = o.dp > 0 ? o.dp : r.parallel.dp > 0 ? r.parallel.dp : 1;
    int zero = o.zero >= 0 ? o.zero : r.parallel.zero > 0 ? r.parallel.zero : 0;
    if (tr_resolve_micro_batch(&r, ranks, TR_DTYPE_F32, 0, &micro, &accum, err, sizeof(err))) {
        fprintf(stderr, "%s: %s\n", r.path, err);
        tr_recipe_free(&r);
        return 1;
    }
    printf("%-60s %8s %11s %11s %11s\n", r.path, "params", "p+g+adam", "FLOPs/tok", "act/tok");
    print_node(d, &d->root, T, "", "");

    tr_cost c;
    tr_cost_model(d, T, &c);
    tr_memory mem;
    tr_model_opts mo = {.B = micro, .T = T, .recompute = (tr_recompute)r.train.recompute,
                        .shards = zero == 1 ? ranks : 1, .shard = 0, .external_grads = zero == 2,
                        .external_params = zero == 3};
    if (tr_model_measure(d, TR_DTYPE_F32, &mo, &mem, err, sizeof(err))) {
        fprintf(stderr, "%s: %s\n", r.path, err);
        tr_recipe_free(&r);
        return 1;
    }
    if (zero >= 2) { /* each rank keeps 1/N of the gradient and of the optimizer state */
        size_t n = (size_t)c.params, per = (n + (size_t)ranks - 1) / (size_t)ranks;
        mem.grads = per * sizeof(float);
        mem.optimizer = 2 * per * sizeof(float);
        if (zero == 3) mem.params = per * sizeof(float); /* and of the parameters */
    }
    char b1[32], b2[32], b3[32], b4[32], b5[32], b6[32];
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
    static const char *const recompute[] = {"none", "selective", "full"};
    printf("micro-batch      %d x %d tokens%s, %d accumulation step(s) of %ld tokens; "
           "recompute %s\n",
           micro, T, r.train.micro_batch ? "" : " (auto)", accum, r.train.batch_tokens,
           recompute[r.train.recompute]);
    tr_fmt_bytes((double)mem.params, b1, sizeof(b1));
    tr_fmt_bytes((double)mem.grads, b2, sizeof(b2));
    tr_fmt_bytes((double)mem.optimizer, b3, sizeof(b3));
    tr_fmt_bytes((double)mem.activations, b4, sizeof(b4));
    tr_fmt_bytes((double)mem.scratch, b5, sizeof(b5));
    tr_fmt_bytes((double)(mem.params + mem.grads + mem.optimizer + mem.activations + mem.scratch),
                 b6, sizeof(b6));
    printf("memory (fp32)    per process with %d data-parallel rank(s) at ZeRO-%d:\n"
           "                 parameters %s, gradients %s, AdamW state %s,\n"
           "                 activations %s, scratch %s: %s in all\n",
           ranks, zero, b1, b2, b3, b4, b5, b6);
    if (zero >= 2)
        printf("                 (ZeRO-%d: plus the gradient buckets being computed and reduced%s, "
               "a few times parallel.bucket_kb and the largest tensor)\n",
               zero, zero == 3 ? " and the parameter buckets of the op running and the next" : "");
    tr_recipe_free(&r);
    return 0;
}
