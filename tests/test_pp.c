/* Pipeline parallelism against one process (run under mpirun -np 2 and 4; alone it skips).
 * Every rank builds the single-process model and its part of a dp x pp x tp layout over the
 * world, from the same seed. Each step, the single process runs all dp x M micro-batches one
 * after the other; the layout runs its schedule (parallel/pipeline.c) over its dp rank's M of
 * them, then the gradient sync (dp, tp and the tied embedding's pair of stages). The losses,
 * the gradient norm, every gradient this rank holds (its slice of the global tensor) and, after
 * three AdamW steps, the parameters must agree within 1e-5 relative; evaluation and KV-cache
 * decoding through the stages too. Every schedule, GPT (tied head) and Llama (untied,
 * grouped-query attention, SwiGLU) shapes, ZeRO 0-3 over dp with pp 2 (every schedule and
 * stage with both heads; ZeRO-2/3's gradients and ZeRO-3's parameters gathered from every
 * rank's pieces), tensor and sequence parallelism inside the stages. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsl/recipe.h"
#include "model/model.h"
#include "parallel/comm/comm.h"
#include "parallel/dp.h"
#include "parallel/pipeline.h"

static int g_fail, g_rank;

static void check(int ok, const char *what, double got, double lim) {
    if (!ok) g_fail++;
    if (!ok || g_rank == 0)
        printf("%s rank %d %s (%.2e, limit %.0e)\n", ok ? "ok  " : "FAIL", g_rank, what, got, lim);
}

static const char *gpt = "model { vocab = 61, dim = 32, seq_len = 8, embedding {}, positions {},\n"
                         "  stack { n = 8, residual { layernorm {}, attention { heads = 4 } },\n"
                         "                 residual { layernorm {}, mlp { hidden = 64 } } },\n"
                         "  layernorm {}, lm_head {} }\n"
                         "data { text = 'x' } train { batch_tokens = 32, steps = 1 }\n";

static const char *llama =
    "model { vocab = 61, dim = 32, seq_len = 8, embedding {}, rope { theta = 10000 },\n"
    "  stack { n = 4, residual { rmsnorm {}, attention { heads = 4, kv_heads = 2, bias = false } "
    "},\n"
    "    residual { rmsnorm {}, mlp { hidden = 48, activation = 'swiglu', bias = false } } },\n"
    "  rmsnorm {}, lm_head { tied = false } }\n"
    "data { text = 'x' } train { batch_tokens = 32, steps = 1 }\n";

enum { B = 2, M = 4 };

/* This rank's tensors against the single process's tensors of the same names (the slice it
 * holds of each; a pipeline replica too): the largest |a - b| over a scale, per tensor (its
 * largest |b|, at least floor x the largest of all), as tests/test_tp.c. held: this rank's
 * values indexed like its slab (ZeRO-2/3: gathered from the dp group's pieces), or NULL to
 * read the model's own. */
static double compare(tr_model *one, tr_model *part, int grads, double floor, const float *held) {
    double top = 0, worst = 0;
    for (int i = 0; i < tr_model_num_params(one); i++) {
        const tr_param *q = tr_model_param(one, i);
        float *all = malloc((q->numel + 1) * sizeof(float));
        (grads ? tr_model_get_grad : tr_model_get_param)(one, i, all);
        for (size_t j = 0; j < q->numel; j++)
            top = fmax(top, fabs(all[j]));
        free(all);
    }
    for (int i = 0; i < tr_model_num_params(part); i++) {
        const tr_param *p = tr_model_param(part, i), *q = NULL;
        for (int k = 0; k < tr_model_num_params(one) && !q; k++)
            if (!strcmp(tr_model_param(one, k)->name, p->name)) q = tr_model_param(one, k);
        if (!q) return 1e9;
        float *mine = malloc((p->numel + 1) * sizeof(float)), *all = malloc((q->numel + 1) * 4);
        if (held)
            memcpy(mine, held + p->offset, p->numel * sizeof(float));
        else
            (grads ? tr_model_get_grad : tr_model_get_param)(part, i, mine);
        (grads ? tr_model_get_grad : tr_model_get_param)(one, (int)(q - tr_model_param(one, 0)),
                                                         all);
        double scale = floor * top, diff = 0;
        for (size_t j = 0; j < q->numel; j++)
            scale = fmax(scale, fabs(all[j]));
        int n = tr_param_runs(p, 0, p->numel, NULL, 0);
        tr_run *r = malloc((size_t)(n + 1) * sizeof(tr_run));
        tr_param_runs(p, 0, p->numel, r, n);
        for (int k = 0; k < n; k++)
            for (size_t j = 0; j < r[k].n; j++)
                diff = fmax(diff, fabs(mine[r[k].local + j] - all[r[k].global + j]));
        if (scale > 0 && diff / scale > worst) worst = diff / scale;
        if (scale > 0 && diff / scale > 1e-5)
            printf("     rank %d %s %s: %.2e\n", g_rank, grads ? "gradient" : "parameter", p->name,
                   diff / scale);
        free(r), free(mine), free(all);
    }
    return worst;
}

typedef struct {
    const char *name, *recipe;
    int dp, tp, pp, V, zero, sp;
    tr_pp_kind kind;
    int big; /* buckets of 4 MiB (each a whole run of tensors that complete together), not 1 KiB */
} variant;

typedef struct {
    tr_comm *dp, *pp, *tp, *tie, *self;
    tr_model *one, *part;
    tr_dp *d1, *dt;
    tr_pipe *pipe;
    tr_recipe r;
} setup;

static void micro_end(void *d) {
    tr_dp_micro_end(d);
}

/* The layout's model: chunks cut evenly over the blocks, slots from the schedule. */
static tr_model_opts part_opts(const variant *v, const setup *s, int T, int blocks) {
    tr_model_opts o = {.B = B, .T = T};
    int nc = v->pp * v->V, p = tr_comm_rank(s->pp);
    tr_pp_schedule sc;
    tr_pp_generate(&sc, v->kind, v->pp, v->V, M);
    o.tp = v->tp, o.tp_rank = tr_comm_rank(s->tp), o.tp_comm = s->tp, o.sequence_parallel = v->sp;
    o.shards = v->zero == 1 ? v->dp : 1, o.shard = tr_comm_rank(s->dp);
    o.external_grads = v->zero >= 2, o.external_params = v->zero == 3;
    o.n_chunks = nc, o.split_backward = v->kind == TR_PP_ZBH1 || v->kind == TR_PP_ZBV;
    o.pp_comm = s->pp, o.tie_comm = s->tie;
    for (int c = 0; c <= nc; c++)
        o.chunk_start[c] = c * blocks / nc;
    for (int c = 0; c < nc; c++) {
        o.held[c] = tr_pp_rank_of(&sc, c) == p;
        o.slots[c] = o.held[c] ? tr_pp_chunk_slots(&sc, c) : 1;
        tr_pp_grad_bufs(&sc, c, &o.grad_recv[c], &o.grad_send[c]);
    }
    tr_pp_free(&sc);
    return o;
}

static int make(tr_comm *world, const variant *v, setup *s) {
    char err[512];
    memset(s, 0, sizeof(*s));
    if (tr_recipe_load_string(&s->r, v->recipe, v->name, ".", NULL, 0, err, sizeof(err)) ||
        tr_comm_mesh(world, (tr_mesh){v->dp, v->pp, v->tp}, &s->dp, &s->pp, &s->tp, err,
                     sizeof(err))) {
        printf("FAIL %s: %s\n", v->name, err);
        return -1;
    }
    int p = tr_comm_rank(s->pp), T = s->r.model.seq_len;
    if (tr_comm_split(s->pp, p == 0 || p == v->pp - 1 ? 0 : 1, p, "tie", &s->tie, err,
                      sizeof(err)) ||
        tr_comm_split(world, tr_comm_rank(world), 0, "self", &s->self, err, sizeof(err)))
        return -1;
    tr_model_opts o1 = {.B = B, .T = T};
    tr_model_opts ot = part_opts(v, s, T, tr_cost_blocks(&s->r.model, T, NULL, 0));
    if (tr_model_init_opts(&s->one, &s->r.model, tr_backend_cpu(), &o1, err, sizeof(err)) ||
        tr_model_init_opts(&s->part, &s->r.model, tr_backend_cpu(), &ot, err, sizeof(err)) ||
        tr_dp_init(&s->d1, s->one, s->self, 0, 0, err, sizeof(err)) ||
        tr_dp_init(&s->dt, s->part, s->dp, v->zero, v->big ? 0 : 1024, err, sizeof(err)) ||
        tr_pipe_init(&s->pipe, s->part, s->pp, v->kind, v->V, M, err, sizeof(err))) {
        printf("FAIL %s: %s\n", v->name, err);
        return -1;
    }
    tr_pipe_set_backward_hook(s->pipe, micro_end, s->dt);
    tr_pipe_final_hooks(s->pipe, v->zero < 2); /* as the trainer */
    tr_model_init_params(s->one, 5);
    tr_model_init_params(s->part, 5);
    return 0;
}

static void release(setup *s) {
    tr_pipe_free(s->pipe);
    tr_dp_free(s->d1);
    tr_dp_free(s->dt);
    tr_model_free(s->one);
    tr_model_free(s->part);
    tr_comm_free(s->dp), tr_comm_free(s->pp), tr_comm_free(s->tp), tr_comm_free(s->tie);
    tr_comm_free(s->self);
    tr_recipe_free(&s->r);
}

/* Micro-batch k of a step's dp x M (every rank makes all of them; dp rank d runs d*M ..). */
static void batch(int step, int k, int V, int N, int *tok, int *tgt) {
    for (int n = 0; n < N; n++) {
        tok[n] = (n * 37 + step * 11 + k * 5) % V;
        tgt[n] = n == 3 ? -1 : (n * 53 + 7 * step + k) % V; /* one ignored */
    }
}

/* Evaluation and KV-cache decoding through the stages against one process. */
static void eval_decode(const variant *v, setup *s, int *tok, int *tgt, int T) {
    int V = s->r.model.vocab;
    char err[256], what[200];
    double le = tr_pipe_eval(s->pipe, tok, tgt, B, T),
           l1 = tr_model_forward(s->one, tok, tgt, B, T, 0);
    double e = fabs(le - l1) / fabs(l1);
    snprintf(what, sizeof(what), "%s: evaluation loss", v->name);
    check(e <= 1e-5, what, e, 1e-5);
    tr_kv_cache *c1 = NULL, *ct = NULL;
    float *a = malloc((size_t)V * sizeof(float)), *b = malloc((size_t)V * sizeof(float));
    if (tr_kv_cache_init(&c1, s->one, err, sizeof(err)) ||
        tr_kv_cache_init(&ct, s->part, err, sizeof(err)))
        exit(1);
    double worst = 0;
    tr_dp_hold_params(s->dt, 1);
    for (int pos = 0; pos < 5; pos++) {
        tr_model_decode(s->one, c1, tok[pos], pos, a);
        tr_pipe_decode(s->pipe, ct, tok[pos], pos, b);
        for (int i = 0; i < V; i++)
            worst = fmax(worst, fabs(a[i] - b[i]));
    }
    tr_dp_hold_params(s->dt, 0);
    snprintf(what, sizeof(what), "%s: decoded logits", v->name);
    check(worst <= 1e-4, what, worst, 1e-4);
    tr_kv_cache_free(c1), tr_kv_cache_free(ct);
    free(a), free(b);
}

/* What the stage boundaries carried per step (the pipe's bytes sent): each send of this
 * rank's list (a forward's output to the next chunk, an input gradient to the previous one)
 * to another rank moves the rank's stream (N x C floats; N / tp rows with sequence parallelism), or
 * with tp and no sequence parallelism its 1/tp slice, the next stage gathering the slices
 * (scatter-gather); the step's end adds its loss's all-reduce on the same group, a few doubles. */
static void boundary_bytes(const variant *v, setup *s, int T) {
    const tr_pp_schedule *sc = tr_pipe_schedule(s->pipe);
    int r = tr_comm_rank(s->pp), K = sc->P * sc->V, sends = 0;
    for (int i = 0; i < sc->n[r]; i++) {
        const tr_pp_action *a = &sc->list[r][i];
        int to = a->op == TR_ACT_FWD ? a->chunk + 1 : a->op != TR_ACT_BWD_W ? a->chunk - 1 : -1;
        /* nothing goes where one rank holds both chunks (zb-v's turn) */
        sends += to >= 0 && to < K && tr_pp_rank_of(sc, to) != r;
    }
    int slices = v->tp > 1 && !v->sp ? v->tp : 1;
    tr_pipe_stats st = tr_pipe_get_stats(s->pipe);
    double stream = (double)tr_model_stream_elems(s->part, B, T); /* N / tp rows with sp */
    double want = (double)sends * stream / slices * sizeof(float), got = st.bytes / st.steps;
    char what[200];
    snprintf(what, sizeof what,
             "%s: %.0f bytes a step between stages (%d sends of 1/%d stream: %.0f, and the "
             "loss's all-reduce)",
             v->name, got, sends, slices, want);
    check(got >= want && got - want < 64, what, fabs(got - want) / want, 64 / want);
}

static void run(tr_comm *world, const variant *v) {
    setup s;
    if (make(world, v, &s)) {
        g_fail++;
        release(&s);
        return;
    }
    int T = s.r.model.seq_len, N = B * T, V = s.r.model.vocab, d = tr_comm_rank(s.dp);
    int *tok[M], *tgt[M], *t1 = malloc((size_t)N * sizeof(int)), *g1 = malloc((size_t)N * 4);
    for (int k = 0; k < M; k++)
        tok[k] = malloc((size_t)N * 4), tgt[k] = malloc((size_t)N * 4);
    tr_adamw opt = {.lr = 1e-2f,
                    .beta1 = 0.9f,
                    .beta2 = 0.95f,
                    .eps = 1e-3f,
                    .weight_decay = 0.1f,
                    .grad_scale = 1.0f};
    char what[200];
    float scale = 1.0f / (float)(M * v->dp);
    for (int step = 0; step < 3; step++) {
        double l1 = 0;
        tr_model_zero_grad(s.one);
        tr_model_zero_grad(s.part);
        for (int k = 0; k < M * v->dp; k++) {
            batch(step, k, V, N, t1, g1);
            l1 += tr_model_forward(s.one, t1, g1, B, T, scale);
            tr_model_backward(s.one);
        }
        for (int k = 0; k < M; k++)
            batch(step, d * M + k, V, N, tok[k], tgt[k]);
        if (v->zero < 2) tr_dp_arm(s.dt); /* buckets reduced in the last backwards */
        double lp =
            tr_pipe_step(s.pipe, (const int *const *)tok, (const int *const *)tgt, B, T, scale);
        lp = tr_dp_sum(s.dt, lp);
        tr_dp_sync_grads(s.dt);
        double e = fabs(lp - l1) / fabs(l1);
        snprintf(what, sizeof(what), "%s: step %d loss", v->name, step);
        check(e <= 1e-5, what, e, 1e-5);
        double n1 = tr_dp_grad_norm(s.d1), nt = tr_dp_grad_norm(s.dt);
        snprintf(what, sizeof(what), "%s: step %d gradient norm", v->name, step);
        e = fabs(nt - n1) / n1;
        check(e <= 1e-5, what, e, 1e-5);
        /* ZeRO-2/3: every rank's pieces of the summed gradient, gathered over dp */
        float *held = NULL;
        if (v->zero >= 2) {
            held = malloc(tr_model_slab_elements(s.part) * sizeof(float));
            if (!held || tr_dp_gather_grads(s.dt, held)) exit(1);
        }
        snprintf(what, sizeof(what), "%s: step %d gradients", v->name, step);
        e = compare(s.one, s.part, 1, 1e-3, held);
        check(e <= 1e-5, what, e, 1e-5);
        free(held);
        tr_dp_step(s.d1, &opt);
        tr_dp_step(s.dt, &opt);
    }
    tr_dp_settle(s.d1); /* ZeRO-1/2: the other ranks' parts of the last update */
    tr_dp_settle(s.dt);
    /* ZeRO-3: the master parameters of every rank's pieces, gathered over dp */
    tr_dp_state st = {0};
    if (v->zero == 3 && tr_dp_gather_state(s.dt, &st)) exit(1);
    snprintf(what, sizeof(what), "%s: parameters after 3 AdamW steps", v->name);
    double e = compare(s.one, s.part, 0, 1, st.p);
    check(e <= 1e-5, what, e, 1e-5);
    tr_dp_state_free(&st);
    boundary_bytes(v, &s, T);
    eval_decode(v, &s, tok[0], tgt[0], T);
    for (int k = 0; k < M; k++)
        free(tok[k]), free(tgt[k]);
    free(t1), free(g1);
    release(&s);
}

/* A stage whose executor cannot be set up (here the last one, given another V than its model
 * has chunks for) fails, and so does every other stage, at once and saying why: before,
 * the others went on, to wait for it in their channels' setup or first step until the
 * timeout, while it waited for them in its caller's agreement. */
static void refused_init(tr_comm *world) {
    int W = tr_comm_size(world);
    variant v = {"gpt pp refused", gpt, 1, 1, W, 1, 0, 0, TR_PP_1F1B, 0};
    setup s;
    if (make(world, &v, &s)) {
        g_fail++;
        return;
    }
    tr_pipe_free(s.pipe);
    s.pipe = NULL;
    char err[256] = "";
    int last = tr_comm_rank(s.pp) == W - 1;
    int rc = tr_pipe_init(&s.pipe, s.part, s.pp, TR_PP_1F1B, last ? 2 : 1, M, err, sizeof err);
    const char *want = last ? "pipeline: the model has" : "pipeline: another stage failed";
    int ok = rc == -1 && !s.pipe && !strncmp(err, want, strlen(want));
    printf("%s rank %d: a stage that fails to set up its executor fails every stage: %s\n",
           ok ? "ok  " : "FAIL", g_rank, err);
    g_fail += !ok;
    release(&s);
}

int main(int argc, char **argv) {
    char err[256];
    tr_comm *world;
    if (tr_comm_init(&world, &argc, &argv, 60, err, sizeof(err))) {
        printf("FAIL comm: %s\n", err);
        return 1;
    }
    g_rank = tr_comm_rank(world);
    int W = tr_comm_size(world);
    if (W != 2 && W != 4) {
        printf("test_pp: run under mpirun -np 2 or 4 (skipped)\n");
        tr_comm_free(world);
        return 77;
    }
    refused_init(world);
    const tr_pp_kind all[] = {TR_PP_GPIPE, TR_PP_1F1B, TR_PP_INTERLEAVED, TR_PP_ZBH1, TR_PP_ZBV};
    const char *names[] = {"gpipe", "1f1b", "interleaved", "zb-h1", "zb-v"};
    /* (dp, tp, pp) layouts of this world, every schedule, both shapes */
    const int layouts[][3] = {{1, 1, 2}, {1, 1, 4}, {2, 1, 2}, {1, 2, 2}};
    for (size_t l = 0; l < 4; l++) {
        int dp = layouts[l][0], tp = layouts[l][1], pp = layouts[l][2];
        if (dp * tp * pp != W) continue;
        for (int k = 0; k < 5; k++)
            for (int shape = 0; shape < 2; shape++) {
                int V = all[k] == TR_PP_INTERLEAVED || all[k] == TR_PP_ZBV ? 2 : 1;
                if (pp * V > (shape ? 4 : 8)) continue; /* more chunks than blocks */
                char name[96];
                snprintf(name, sizeof(name), "%s dp %d tp %d pp %d %s%s", shape ? "llama" : "gpt",
                         dp, tp, pp, names[k], tp > 1 && shape ? " sp" : "");
                variant v = {name, shape ? llama : gpt, dp,     tp, pp, V,
                             0,    tp > 1 && shape,     all[k], 0};
                run(world, &v);
            }
    }
    /* ZeRO 1-3 over the dp group of a dp 2 x pp 2 layout (ZeRO-0: above), every schedule,
       the tied head (GPT: its pair of stages sums the embedding's gradient) and the untied */
    for (int zero = 1; zero <= 3 && W == 4; zero++)
        for (int k = 0; k < 5; k++)
            for (int shape = 0; shape < 2; shape++) {
                char name[96];
                snprintf(name, sizeof(name), "%s dp 2 pp 2 %s zero %d", shape ? "llama" : "gpt",
                         names[k], zero);
                int V = all[k] == TR_PP_INTERLEAVED || all[k] == TR_PP_ZBV ? 2 : 1;
                variant v = {name, shape ? llama : gpt, 2, 1, 2, V, zero, 0, all[k], 0};
                run(world, &v);
                if (zero == 2 + shape) { /* GPT at ZeRO-2, Llama at 3: the default buckets */
                    v.big = 1;
                    strncat(name, ", 4 MiB buckets", sizeof(name) - strlen(name) - 1);
                    run(world, &v);
                }
            }
    if (g_rank == 0)
        printf("%s: %d failure(s) on rank 0 (%d ranks)\n", g_fail ? "FAIL" : "PASS", g_fail, W);
    int bad = g_fail;
    tr_comm_all_reduce(world, &bad, 1, TR_COMM_I32);
    tr_comm_free(world);
    return bad ? 1 : 0;
}
