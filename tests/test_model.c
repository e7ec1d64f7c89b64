/* The model executor: finite-difference gradients through unusual structures (nested
 * residuals, stacks, GQA, untied heads), gradient accumulation over micro-batches, bitwise
 * determinism, and the cost model agreeing with what is allocated. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsl/recipe.h"
#include "model/model.h"

static int failures;

/* what: the check, with the two figures it compares */
static void check(int ok, const char *what, double a, double b) {
    if (!ok) failures++;
    printf("%s %s: %.9g vs %.9g\n", ok ? "ok  " : "FAIL", what, a, b);
}

static const char *nested =
    "model { vocab = 40, dim = 24, seq_len = 12,\n"
    "  embedding {}, positions {},\n"
    "  stack { n = 2,\n"
    "    residual { layernorm { bias = false }, attention { heads = 6, kv_heads = 2 } },\n"
    "    residual { rmsnorm {}, residual { mlp { hidden = 20, activation = 'swiglu' } },\n"
    "               mlp { hidden = 36, bias = false } },\n"
    "  },\n"
    "  layernorm {}, lm_head { tied = false } }\n"
    "data { text = 'x' } train { batch_tokens = 36, steps = 1 }\n";

static const char *roped =
    "model { vocab = 33, dim = 16, seq_len = 9, embedding {}, rope { theta = 100 },\n"
    "  residual { rmsnorm {}, attention { heads = 4, kv_heads = 1, bias = false } },\n"
    "  residual { rmsnorm {}, mlp { hidden = 24, activation = 'swiglu' } },\n"
    "  rmsnorm {}, lm_head {} }\n"
    "data { text = 'x' } train { batch_tokens = 27, steps = 1 }\n";

static tr_model *make(tr_recipe *r, const char *text, int B, int T) {
    char err[512];
    if (tr_recipe_load_string(r, text, "test", ".", NULL, 0, err, sizeof(err))) {
        fprintf(stderr, "FAIL recipe: %s\n", err);
        exit(1);
    }
    tr_model *m;
    if (tr_model_init(&m, &r->model, tr_backend_cpu(), B, T, err, sizeof(err))) {
        fprintf(stderr, "FAIL model: %s\n", err);
        exit(1);
    }
    /* larger than GPT-2's init so that every path carries a visible gradient */
    tr_model_init_params(m, 7);
    for (int i = 0; i < tr_model_num_params(m); i++) {
        const tr_param *q = tr_model_param(m, i);
        float *p = malloc(q->numel * sizeof(float));
        tr_model_get_param(m, i, p);
        for (size_t j = 0; j < q->numel; j++)
            p[j] = q->init_one ? 1.0f + 0.1f * sinf((float)j)
                               : p[j] * 10.0f + 0.05f * cosf((float)j * 1.3f);
        tr_model_set_param(m, i, p);
        free(p);
    }
    return m;
}

static void tokens_for(int *tok, int *tgt, int n, int V, unsigned seed) {
    for (int i = 0; i < n; i++) {
        seed = seed * 1103515245u + 12345u;
        tok[i] = (int)((seed >> 8) % (unsigned)V);
        seed = seed * 1103515245u + 12345u;
        tgt[i] = (int)((seed >> 8) % (unsigned)V);
    }
}

/* Central differences in fp32 on the elements with the largest gradients of every tensor.
 * fp32 losses limit this to ~1e-2 relative; the exact check is test_reference's. */
static void fd_check(const char *text, const char *label) {
    tr_recipe r;
    int B = 3, T = text == nested ? 12 : 9;
    tr_model *m = make(&r, text, B, T);
    int V = r.model.vocab, N = B * T;
    int *tok = malloc(N * sizeof(int)), *tgt = malloc(N * sizeof(int));
    tokens_for(tok, tgt, N, V, 11);
    tr_model_zero_grad(m);
    tr_model_forward(m, tok, tgt, B, T, 1.0f);
    tr_model_backward(m);
    double worst = 0;
    for (int i = 0; i < tr_model_num_params(m); i++) {
        const tr_param *q = tr_model_param(m, i);
        float *p = malloc(q->numel * sizeof(float)), *g = malloc(q->numel * sizeof(float));
        tr_model_get_param(m, i, p);
        tr_model_get_grad(m, i, g);
        for (int pick = 0; pick < 3; pick++) { /* the 3 largest |grad| elements */
            size_t best = 0;
            double bv = -1;
            for (size_t j = 0; j < q->numel; j++) {
                double v = fabs(g[j]);
                if (v > bv && v < 1e30) {
                    bv = v;
                    best = j;
                }
            }
            float saved = p[best], h = 1e-2f * (fabsf(saved) > 1 ? fabsf(saved) : 1);
            p[best] = saved + h;
            tr_model_set_param(m, i, p);
            double lp = tr_model_forward(m, tok, tgt, B, T, 0);
            p[best] = saved - h;
            tr_model_set_param(m, i, p);
            double lm = tr_model_forward(m, tok, tgt, B, T, 0);
            p[best] = saved;
            tr_model_set_param(m, i, p);
            double fd = (lp - lm) / (2.0 * h), an = g[best];
            double err = fabs(fd - an) / (fabs(an) + 1e-3);
            if (err > worst) worst = err;
            if (err > 3e-2)
                printf("     %s %s[%zu]: analytic %.6g, finite difference %.6g\n", label, q->name,
                       best, an, fd);
            g[best] = 1e31f; /* exclude from the next pick */
        }
        free(p);
        free(g);
    }
    char what[128];
    snprintf(what, sizeof(what), "fd gradients (%s): worst rel err vs tol", label);
    check(worst <= 3e-2, what, worst, 3e-2);
    free(tok);
    free(tgt);
    tr_model_free(m);
    tr_recipe_free(&r);
}

/* Two micro-batches with grad_scale 1/2 give the gradient of one batch of both. */
static void accumulation(void) {
    tr_recipe r1, r2;
    int T = 12;
    tr_model *one = make(&r1, nested, 4, T), *two = make(&r2, nested, 2, T);
    int N = 4 * T, V = r1.model.vocab;
    int *tok = malloc(N * sizeof(int)), *tgt = malloc(N * sizeof(int));
    tokens_for(tok, tgt, N, V, 5);
    tr_model_zero_grad(one);
    float l1 = tr_model_forward(one, tok, tgt, 4, T, 1.0f);
    tr_model_backward(one);
    tr_model_zero_grad(two);
    float la = tr_model_forward(two, tok, tgt, 2, T, 0.5f);
    tr_model_backward(two);
    float lb = tr_model_forward(two, tok + N / 2, tgt + N / 2, 2, T, 0.5f);
    tr_model_backward(two);
    double num = 0, den = 0;
    for (int i = 0; i < tr_model_num_params(one); i++) {
        const tr_param *q = tr_model_param(one, i);
        float *ga = malloc(q->numel * sizeof(float)), *gb = malloc(q->numel * sizeof(float));
        tr_model_get_grad(one, i, ga);
        tr_model_get_grad(two, i, gb);
        for (size_t j = 0; j < q->numel; j++) {
            if (fabs((double)ga[j] - gb[j]) > num) num = fabs((double)ga[j] - gb[j]);
            if (fabs((double)ga[j]) > den) den = fabs((double)ga[j]);
        }
        free(ga);
        free(gb);
    }
    check(fabs(l1 - 0.5 * (la + lb)) < 1e-5, "accumulation: loss vs mean of the halves", l1,
          0.5 * (la + lb));
    check(num / den < 1e-5, "accumulation: gradients rel err vs tol", num / den, 1e-5);
    free(tok);
    free(tgt);
    tr_model_free(one);
    tr_model_free(two);
    tr_recipe_free(&r1);
    tr_recipe_free(&r2);
}

/* Same inputs, same seed: bitwise-identical losses and gradients over a few steps. */
static void determinism(void) {
    float loss[2][4];
    double gsum[2];
    for (int run = 0; run < 2; run++) {
        tr_recipe r;
        tr_model *m = make(&r, nested, 3, 12);
        int N = 36, V = r.model.vocab;
        int tok[36], tgt[36];
        for (int s = 0; s < 4; s++) {
            tokens_for(tok, tgt, N, V, 100 + (unsigned)s);
            tr_model_zero_grad(m);
            loss[run][s] = tr_model_forward(m, tok, tgt, 3, 12, 1.0f);
            tr_model_backward(m);
            tr_adamw o = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
                          .weight_decay = 0.1f, .grad_scale = 1.0f};
            tr_model_adamw_step(m, &o);
        }
        gsum[run] = tr_model_grad_norm(m);
        tr_model_free(m);
        tr_recipe_free(&r);
    }
    check(!memcmp(loss[0], loss[1], sizeof(loss[0])) && gsum[0] == gsum[1],
          "determinism: two runs bitwise equal, last losses", loss[0][3], loss[1][3]);
}

/* Recomputation changes memory, never the numbers: losses and every gradient are bitwise
 * equal at every level, and the activation memory shrinks. */
static void recompute(void) {
    const char *levels[3] = {"none", "selective", "full"};
    float *grads[3] = {0};
    size_t act[3];
    float loss[3];
    int T = 12, B = 3, N = B * T;
    for (int lv = 0; lv < 3; lv++) {
        tr_recipe r;
        char err[512];
        if (tr_recipe_load_string(&r, nested, "test", ".", NULL, 0, err, sizeof(err))) exit(1);
        tr_model_opts o = {.B = B, .T = T, .recompute = (tr_recompute)lv};
        tr_model *m;
        if (tr_model_init_opts(&m, &r.model, tr_backend_cpu(), &o, err, sizeof(err))) {
            fprintf(stderr, "FAIL %s\n", err);
            exit(1);
        }
        tr_model_init_params(m, 3);
        int tok[36], tgt[36];
        tokens_for(tok, tgt, N, r.model.vocab, 77);
        tr_model_zero_grad(m);
        loss[lv] = tr_model_forward(m, tok, tgt, B, T, 1.0f);
        tr_model_backward(m);
        size_t n = tr_model_num_elements(m), at = 0;
        grads[lv] = malloc(n * sizeof(float));
        for (int i = 0; i < tr_model_num_params(m); i++) {
            tr_model_get_grad(m, i, grads[lv] + at);
            at += tr_model_param(m, i)->numel;
        }
        act[lv] = tr_model_memory(m).activations;
        if (lv > 0) {
            char what[160];
            snprintf(what, sizeof(what), "recompute %s: loss and gradients bitwise equal to none",
                     levels[lv]);
            check(loss[lv] == loss[0] && !memcmp(grads[lv], grads[0], n * sizeof(float)), what,
                  loss[lv], loss[0]);
            snprintf(what, sizeof(what), "recompute %s: activation bytes below the previous level",
                     levels[lv]);
            check(act[lv] < act[lv - 1], what, (double)act[lv], (double)act[lv - 1]);
        }
        tr_model_free(m);
        tr_recipe_free(&r);
    }
    for (int lv = 0; lv < 3; lv++) free(grads[lv]);
}

/* A vocabulary padded for the head's products (pad_vocab) changes nothing a user sees: loss,
 * gradients, logits, the logits of decoding and 3 AdamW steps match the unpadded model (the
 * products have more columns, so BLAS may round differently: 1e-5), and the padding rows of
 * the slab stay zero. */
static void padded_vocab(const char *text, const char *label) {
    int T = 9, B = 2, N = B * T;
    float loss[2], *grads[2], *logits[2], *dec[2], *params[2];
    size_t n = 0;
    int V = 0;
    for (int pv = 0; pv < 2; pv++) {
        tr_recipe r;
        char err[512];
        if (tr_recipe_load_string(&r, text, "test", ".", NULL, 0, err, sizeof(err))) exit(1);
        V = r.model.vocab;
        tr_model_opts o = {.B = B, .T = T, .pad_vocab = pv ? 64 : 1};
        tr_model *m;
        if (tr_model_init_opts(&m, &r.model, tr_backend_cpu(), &o, err, sizeof(err))) {
            fprintf(stderr, "FAIL %s\n", err);
            exit(1);
        }
        tr_model_init_params(m, 5);
        int tok[18], tgt[18];
        tokens_for(tok, tgt, N, V, 91);
        tr_model_zero_grad(m);
        loss[pv] = tr_model_forward(m, tok, tgt, B, T, 1.0f);
        tr_model_backward(m);
        n = tr_model_num_elements(m);
        grads[pv] = malloc(n * sizeof(float));
        params[pv] = malloc(n * sizeof(float));
        size_t at = 0;
        for (int i = 0; i < tr_model_num_params(m); i++) {
            tr_model_get_grad(m, i, grads[pv] + at);
            at += tr_model_param(m, i)->numel;
        }
        logits[pv] = malloc((size_t)N * V * sizeof(float));
        tr_model_all_logits(m, tok, B, T, logits[pv]);
        dec[pv] = malloc((size_t)T * V * sizeof(float));
        tr_kv_cache *kv;
        if (tr_kv_cache_init(&kv, m, err, sizeof(err))) exit(1);
        for (int t = 0; t < T; t++) tr_model_decode(m, kv, tok[t], t, dec[pv] + (size_t)t * V);
        tr_kv_cache_free(kv);
        /* eps 1e-6, as the layout tests' recipes (tests/lib.sh): AdamW's lr g / (|g| + eps)
           swings through 2 lr as g crosses zero, so with eps 1e-8 an element whose gradient
           nearly cancels moves by what its rounding says (padded and unpadded products round
           differently on some machines' BLAS kernels) */
        tr_adamw opt = {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-6f,
                        .weight_decay = 0.1f, .grad_scale = 1.0f};
        for (int s = 0; s < 3; s++) {
            tr_model_zero_grad(m);
            tr_model_forward(m, tok, tgt, B, T, 1.0f);
            tr_model_backward(m);
            tr_model_adamw_step(m, &opt);
        }
        at = 0;
        for (int i = 0; i < tr_model_num_params(m); i++) {
            tr_model_get_param(m, i, params[pv] + at);
            at += tr_model_param(m, i)->numel;
        }
        if (pv) { /* the padding rows of every padded matrix: still zero */
            const float *slab = tr_model_param_slab(m);
            int zero = 1, padded = 0;
            for (int i = 0; i < tr_model_num_params(m); i++) {
                const tr_param *q = tr_model_param(m, i);
                padded += q->extent > q->numel;
                for (size_t j = q->numel; j < q->extent; j++) zero &= slab[q->offset + j] == 0.0f;
            }
            char what[160];
            snprintf(what, sizeof(what), "%s: vocabulary padded to 64 (%d matrices), padding rows "
                     "still zero after 3 steps", label, padded);
            check(zero && padded > 0, what, padded, 0);
        }
        tr_model_free(m);
        tr_recipe_free(&r);
    }
    double dl = fabs(loss[1] - loss[0]), dg = 0, dlg = 0, dd = 0, dp = 0, mg = 0;
    for (size_t i = 0; i < n; i++) {
        dg = fmax(dg, fabs(grads[1][i] - grads[0][i]));
        mg = fmax(mg, fabs(grads[0][i]));
        dp = fmax(dp, fabs(params[1][i] - params[0][i]));
    }
    for (size_t i = 0; i < (size_t)N * V; i++) dlg = fmax(dlg, fabs(logits[1][i] - logits[0][i]));
    for (size_t i = 0; i < (size_t)T * V; i++) dd = fmax(dd, fabs(dec[1][i] - dec[0][i]));
    char what[160];
    snprintf(what, sizeof(what), "%s: padded vocabulary: loss", label);
    check(dl <= 1e-5 * fabs(loss[0]), what, loss[1], loss[0]);
    snprintf(what, sizeof(what), "%s: padded vocabulary: gradients (max diff vs max |g|)", label);
    check(dg <= 1e-5 * mg, what, dg, mg);
    snprintf(what, sizeof(what), "%s: padded vocabulary: all logits, decode logits (max diff)", label);
    check(dlg <= 1e-5 && dd <= 1e-5, what, dlg, dd);
    snprintf(what, sizeof(what), "%s: padded vocabulary: parameters after 3 AdamW steps", label);
    /* tests/lib.sh's rule: both start bitwise equal and every difference came in through an
       update of about lr, so 2^-10 of the path length (3 steps of lr 1e-2) */
    check(dp <= 0x1p-10 * 3 * 1e-2, what, dp, 0x1p-10 * 3 * 1e-2);
    for (int pv = 0; pv < 2; pv++) {
        free(grads[pv]), free(logits[pv]), free(dec[pv]), free(params[pv]);
    }
}

/* Decoding with the KV cache gives, token by token, the logits of the full forward. */
static void decode(const char *text, const char *label) {
    tr_recipe r;
    int T = text == nested ? 12 : 9;
    tr_model *m = make(&r, text, 1, T);
    int V = r.model.vocab, tok[16], tgt[16];
    tokens_for(tok, tgt, T, V, 21);
    float *all = malloc((size_t)T * V * sizeof(float)), *one = malloc((size_t)V * sizeof(float));
    tr_model_all_logits(m, tok, 1, T, all);
    tr_kv_cache *c;
    char err[256];
    if (tr_kv_cache_init(&c, m, err, sizeof(err))) {
        fprintf(stderr, "FAIL %s\n", err);
        exit(1);
    }
    double num = 0, den = 0;
    for (int t = 0; t < T; t++) {
        tr_model_decode(m, c, tok[t], t, one);
        for (int v = 0; v < V; v++) {
            double d = fabs((double)one[v] - all[(size_t)t * V + v]);
            if (!(d <= num)) num = d;
            if (fabs(all[(size_t)t * V + v]) > den) den = fabs(all[(size_t)t * V + v]);
        }
    }
    char what[160];
    snprintf(what, sizeof(what), "decode (%s): KV-cache logits vs full forward, rel err vs tol",
             label);
    check(num / den < 1e-5, what, num / den, 1e-5);
    tr_kv_cache_free(c);
    free(all);
    free(one);
    tr_model_free(m);
    tr_recipe_free(&r);
}

/* Parameter counts from the cost model equal what the model allocates, for every recipe. */
static void costs(void) {
    const char *recipes[] = {"../recipes/shakespeare_char.lua", "../recipes/llama_tiny.lua",
                             "../recipes/gpt2_124m.lua"};
    for (int i = 0; i < 3; i++) {
        tr_recipe r;
        char err[512];
        if (tr_recipe_load(&r, recipes[i], NULL, 0, err, sizeof(err))) {
            fprintf(stderr, "FAIL %s\n", err);
            failures++;
            continue;
        }
        tr_model *m;
        if (tr_model_init(&m, &r.model, tr_backend_cpu(), 1, 8, err, sizeof(err))) {
            fprintf(stderr, "FAIL %s\n", err);
            failures++;
            tr_recipe_free(&r);
            continue;
        }
        tr_cost c;
        tr_cost_model(&r.model, r.model.seq_len, &c);
        char what[256];
        snprintf(what, sizeof(what), "cost: %s parameters (cost model vs allocated)",
                 recipes[i]);
        check(c.params == (double)tr_model_num_elements(m), what, c.params,
              (double)tr_model_num_elements(m));
        tr_model_free(m);
        tr_recipe_free(&r);
    }
    /* GPT-2 small has 124,439,808 parameters with its tied head */
    tr_recipe r;
    char err[512];
    if (!tr_recipe_load(&r, "../recipes/gpt2_124m.lua", NULL, 0, err, sizeof(err))) {
        tr_cost c;
        tr_cost_model(&r.model, 1024, &c);
        check(c.params == 124439808.0, "cost: GPT-2 small parameters vs 124,439,808",
              c.params, 124439808.0);
        tr_recipe_free(&r);
    }
}

int main(void) {
    fd_check(nested, "nested residuals, GQA, untied");
    fd_check(roped, "rope, kv_heads 1, tied");
    accumulation();
    determinism();
    recompute();
    decode(nested, "learned positions, GQA");
    decode(roped, "rope, kv_heads 1");
    costs();
    padded_vocab(nested, "untied head");
    padded_vocab(roped, "tied head");
    printf("%s: %d failure(s)\n", failures ? "FAIL" : "PASS", failures);
    return failures ? 1 : 0;
}
