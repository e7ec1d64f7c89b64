/* Tensor parallelism against one process (run under mpirun -np 2 and 4; alone it checks tp 1).
 * Every rank builds the single-process model and its tensor-parallel shard of it over the
 * world (tp = world size), from the same seed, and runs the same micro-batches through both:
 * the losses, every gradient (this rank's slice of the global one, after the partial ones are
 * summed over their tp groups) and the gradient norm must agree within 1e-5 relative; then a
 * few AdamW steps, and the parameters must still agree; logits for tools and KV-cache decoding
 * too. Shapes: GPT (LayerNorm with bias, learned positions, GELU, tied head) and Llama
 * (RMSNorm, rope, grouped-query attention with kv_heads 2 (split by tp 2, shared at tp 4) and
 * 1 (shared), SwiGLU, untied head), with and without sequence parallelism, every recompute
 * level, a padded vocabulary, and ZeRO-2 over a data-parallel group of one. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsl/recipe.h"
#include "model/model.h"
#include "parallel/comm/comm.h"
#include "parallel/dp.h"

static int g_fail, g_rank;

static void check(int ok, const char *what, double got, double lim) {
    if (!ok) g_fail++;
    if (!ok || g_rank == 0)
        printf("%s rank %d %s (%.2e, limit %.0e)\n", ok ? "ok  " : "FAIL", g_rank, what, got, lim);
}

static const char *gpt =
    "model { vocab = 250, dim = 32, seq_len = 16, embedding {}, positions {},\n"
    "  stack { n = 2, residual { layernorm {}, attention { heads = 4 } },\n"
    "                 residual { layernorm {}, mlp { hidden = 64 } } },\n"
    "  layernorm {}, lm_head {} }\n"
    "data { text = 'x' } train { batch_tokens = 64, steps = 1 }\n";

#define LLAMA(KV)                                                                                \
    "model { vocab = 250, dim = 32, seq_len = 16, embedding {}, rope { theta = 10000 },\n"       \
    "  stack { n = 2, residual { rmsnorm {}, attention { heads = 4, kv_heads = " #KV             \
    ", bias = false } },\n"                                                                      \
    "    residual { rmsnorm {}, mlp { hidden = 48, activation = 'swiglu', bias = false } } },\n" \
    "  rmsnorm {}, lm_head { tied = false } }\n"                                                 \
    "data { text = 'x' } train { batch_tokens = 64, steps = 1 }\n"

/* This rank's slice of every tensor against the single process's global tensor: the largest
 * |a - b| of a tensor over a scale, the tensor's largest |b| but at least `floor` times the
 * largest |b| of all tensors. Rounding differs between the layouts (sums split over ranks), and
 * its error is relative to the terms of a sum, not to the sum: a gradient that cancels to
 * nearly nothing (a key bias's: attention does not depend on it) is all rounding, and so is the
 * Adam update it drives, which is O(lr) whatever the gradient's size. Gradients are compared per
 * tensor above a floor of 1e-3 of the largest; parameters after steps against the largest (as
 * tests/dp.sh does). */
static double compare(tr_model *one, tr_model *part, int grads, double floor) {
    int np = tr_model_num_params(part);
    double top = 0, worst = 0;
    float **mine = calloc((size_t)np, sizeof(float *)), **all = calloc((size_t)np, sizeof(float *));
    for (int i = 0; i < np; i++) {
        const tr_param *p = tr_model_param(part, i), *q = tr_model_param(one, i);
        mine[i] = malloc((p->numel + 1) * sizeof(float));
        all[i] = malloc((q->numel + 1) * sizeof(float));
        (grads ? tr_model_get_grad : tr_model_get_param)(part, i, mine[i]);
        (grads ? tr_model_get_grad : tr_model_get_param)(one, i, all[i]);
        for (size_t j = 0; j < q->numel; j++) top = fmax(top, fabs(all[i][j]));
    }
    for (int i = 0; i < np; i++) {
        const tr_param *p = tr_model_param(part, i), *q = tr_model_param(one, i);
        double scale = floor * top, diff = 0;
        for (size_t j = 0; j < q->numel; j++) scale = fmax(scale, fabs(all[i][j]));
        int n = tr_param_runs(p, 0, p->numel, NULL, 0);
        tr_run *r = malloc((size_t)(n + 1) * sizeof(tr_run));
        tr_param_runs(p, 0, p->numel, r, n);
        for (int k = 0; k < n; k++)
            for (size_t j = 0; j < r[k].n; j++)
                diff = fmax(diff, fabs(mine[i][r[k].local + j] - all[i][r[k].global + j]));
        if (scale > 0 && diff / scale > worst) worst = diff / scale;
        if (scale > 0 && diff / scale > 1e-5 && g_rank == 0)
            printf("     %s %s: %.2e\n", grads ? "gradient" : "parameter", p->name, diff / scale);
        free(r);
        free(mine[i]);
        free(all[i]);
    }
    free(mine);
    free(all);
    return worst;
}

typedef struct {
    const char *name, *recipe;
    int sp, recompute, zero, pad;
} variant;

static void run(tr_comm *world, const variant *v) {
    char err[512];
    tr_recipe r;
    if (tr_recipe_load_string(&r, v->recipe, v->name, ".", NULL, 0, err, sizeof(err))) {
        printf("FAIL %s: %s\n", v->name, err);
        g_fail++;
        return;
    }
    int W = tr_comm_size(world), B = 2, T = r.model.seq_len, N = B * T;
    tr_comm *dp = NULL, *pp = NULL, *tp = NULL;
    if (tr_comm_mesh(world, (tr_mesh){1, 1, W}, &dp, &pp, &tp, err, sizeof(err))) {
        printf("FAIL mesh: %s\n", err);
        exit(1);
    }
    tr_model_opts o1 = {.B = B, .T = T, .recompute = (tr_recompute)v->recompute,
                        .pad_vocab = v->pad};
    tr_model_opts ot = o1;
    ot.tp = W, ot.tp_rank = tr_comm_rank(tp), ot.tp_comm = tp, ot.sequence_parallel = v->sp;
    ot.external_grads = ot.external_params = v->zero == 3;
    ot.external_grads |= v->zero == 2;
    tr_model *one = NULL, *part = NULL;
    tr_dp *d1 = NULL, *dt = NULL;
    if (tr_model_init_opts(&one, &r.model, tr_backend_cpu(), &o1, err, sizeof(err)) ||
        tr_model_init_opts(&part, &r.model, tr_backend_cpu(), &ot, err, sizeof(err)) ||
        tr_dp_init(&d1, one, dp, 0, 0, err, sizeof(err)) ||
        tr_dp_init(&dt, part, dp, v->zero, 1024, err, sizeof(err))) {
        printf("FAIL %s: %s\n", v->name, err);
        exit(1);
    }
    tr_model_init_params(one, 5);
    tr_model_init_params(part, 5);
    char what[160];
    snprintf(what, sizeof(what), "%s: initial parameters are slices of one process's", v->name);
    double e = compare(one, part, 0, 0);
    check(e == 0, what, e, 0);
    int *tok = malloc((size_t)N * sizeof(int)), *tgt = malloc((size_t)N * sizeof(int));
    /* eps well above rounding-level gradients: with 1e-8, a gradient that is all rounding (a
       key bias's) moves its parameter by about lr in a random direction, in any layout */
    tr_adamw opt = {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-3f,
                    .weight_decay = 0.1f, .grad_scale = 1.0f};
    for (int step = 0; step < 3; step++) {
        double l1 = 0, lt = 0;
        tr_model_zero_grad(one);
        tr_model_zero_grad(part);
        for (int a = 0; a < 2; a++) { /* two micro-batches of accumulation */
            for (int n = 0; n < N; n++) {
                tok[n] = (n * 37 + step * 11 + a * 5) % r.model.vocab;
                tgt[n] = n == 3 ? -1 : (n * 53 + 7 * step + a) % r.model.vocab; /* one ignored */
            }
            l1 += tr_model_forward(one, tok, tgt, B, T, 0.5f);
            lt += tr_model_forward(part, tok, tgt, B, T, 0.5f);
            if (a == 1) tr_dp_arm(dt); /* as the trainer: before the last backward */
            tr_model_backward(one);
            tr_model_backward(part);
            tr_dp_micro_end(dt);
        }
        tr_dp_sync_grads(d1);
        tr_dp_sync_grads(dt);
        snprintf(what, sizeof(what), "%s: step %d loss", v->name, step);
        e = fabs(lt - l1) / fabs(l1);
        check(e <= 1e-5, what, e, 1e-5);
        double n1 = tr_dp_grad_norm(d1), nt = tr_dp_grad_norm(dt);
        snprintf(what, sizeof(what), "%s: step %d gradient norm", v->name, step);
        e = fabs(nt - n1) / n1;
        check(e <= 1e-5, what, e, 1e-5);
        if (v->zero < 2) {
            snprintf(what, sizeof(what), "%s: step %d gradients", v->name, step);
            e = compare(one, part, 1, 1e-3);
            check(e <= 1e-5, what, e, 1e-5);
        }
        tr_dp_step(d1, &opt);
        tr_dp_step(dt, &opt);
    }
    tr_dp_settle(d1); /* ZeRO-1/2: the other ranks' parts of the last update */
    tr_dp_settle(dt);
    snprintf(what, sizeof(what), "%s: parameters after 3 AdamW steps", v->name);
    e = compare(one, part, 0, 1);
    check(e <= 1e-5, what, e, 1e-5);
    /* logits for tools (the last position, every position) and KV-cache decoding */
    int V = r.model.vocab;
    float *a = malloc((size_t)N * V * sizeof(float)), *b = malloc((size_t)N * V * sizeof(float));
    double worst = 0;
    tr_dp_hold_params(dt, 1);
    tr_model_all_logits(one, tok, B, T, a);
    tr_model_all_logits(part, tok, B, T, b);
    for (size_t i = 0; i < (size_t)N * V; i++) worst = fmax(worst, fabs(a[i] - b[i]));
    tr_model_last_logits(one, tok, 1, 5, a);
    tr_model_last_logits(part, tok, 1, 5, b);
    for (int i = 0; i < V; i++) worst = fmax(worst, fabs(a[i] - b[i]));
    tr_kv_cache *c1 = NULL, *ct = NULL;
    if (tr_kv_cache_init(&c1, one, err, sizeof(err)) || tr_kv_cache_init(&ct, part, err, sizeof(err))) {
        printf("FAIL kv cache: %s\n", err);
        exit(1);
    }
    for (int pos = 0; pos < 6; pos++) {
        tr_model_decode(one, c1, tok[pos], pos, a);
        tr_model_decode(part, ct, tok[pos], pos, b);
        for (int i = 0; i < V; i++) worst = fmax(worst, fabs(a[i] - b[i]));
    }
    tr_dp_hold_params(dt, 0);
    snprintf(what, sizeof(what), "%s: logits (all, last, decoded) equal one process's", v->name);
    check(worst <= 1e-4, what, worst, 1e-4);
    tr_kv_cache_free(c1);
    tr_kv_cache_free(ct);
    free(a);
    free(b);
    free(tok);
    free(tgt);
    tr_dp_free(d1);
    tr_dp_free(dt);
    tr_model_free(one);
    tr_model_free(part);
    tr_comm_free(dp);
    tr_comm_free(pp);
    tr_comm_free(tp);
    tr_recipe_free(&r);
}

int main(int argc, char **argv) {
    char err[256];
    tr_comm *world;
    if (tr_comm_init(&world, &argc, &argv, 60, err, sizeof(err))) {
        printf("FAIL comm: %s\n", err);
        return 1;
    }
    g_rank = tr_comm_rank(world);
    const char *l2 = LLAMA(2), *l1 = LLAMA(1);
    const variant vs[] = {
        {"gpt", gpt, 0, 0, 0, 0},
        {"gpt sp", gpt, 1, 0, 0, 0},
        {"gpt sp full-recompute zero2", gpt, 1, 2, 2, 0},
        {"gpt selective-recompute padded-vocab", gpt, 0, 1, 0, 128},
        {"llama kv2", l2, 0, 0, 0, 0},
        {"llama kv2 sp", l2, 1, 0, 0, 0},
        {"llama kv1 sp zero3", l1, 1, 0, 3, 0},
        {"llama kv1 full-recompute", l1, 0, 2, 0, 0},
    };
    for (size_t i = 0; i < sizeof(vs) / sizeof(vs[0]); i++) run(world, &vs[i]);
    if (g_rank == 0)
        printf("%s: %d failure(s) on rank 0 (tp %d)\n", g_fail ? "FAIL" : "PASS", g_fail,
               tr_comm_size(world));
    int bad = g_fail;
    tr_comm_all_reduce(world, &bad, 1, TR_COMM_I32);
    tr_comm_free(world);
    return bad ? 1 : 0;
}
