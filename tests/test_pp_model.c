/* The model's pipeline chunks against the whole model, in one process: a model built with
 * every chunk held runs M micro-batches chunk by chunk through its slots, GPipe's order (every
 * forward, then every backward; the streams copied from one chunk to the next as the pipeline
 * would send them), with the backward whole or split into its input and weight parts (zb-h1);
 * its losses and gradients must equal the whole model's over the same micro-batches, and
 * decoding chunk by chunk its logits. Also a model holding some chunks only: its tensors are
 * those chunks', a tied embedding's replica marked. GPT (tied head, GELU) and Llama (RMSNorm,
 * rope, grouped-query attention, SwiGLU, untied) shapes, every recompute level. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsl/recipe.h"
#include "model/model.h"

static int g_fail;

static void check(int ok, const char *what, double got, double lim) {
    if (!ok) g_fail++;
    printf("%s %s (%.2e, limit %.0e)\n", ok ? "ok  " : "FAIL", what, got, lim);
}

static const char *gpt = "model { vocab = 61, dim = 32, seq_len = 8, embedding {}, positions {},\n"
                         "  stack { n = 3, residual { layernorm {}, attention { heads = 4 } },\n"
                         "                 residual { layernorm {}, mlp { hidden = 64 } } },\n"
                         "  layernorm {}, lm_head {} }\n"
                         "data { text = 'x' } train { batch_tokens = 32, steps = 1 }\n";

static const char *llama =
    "model { vocab = 61, dim = 32, seq_len = 8, embedding {}, rope { theta = 10000 },\n"
    "  stack { n = 3, residual { rmsnorm {}, attention { heads = 4, kv_heads = 2, bias = false } "
    "},\n"
    "    residual { rmsnorm {}, mlp { hidden = 48, activation = 'swiglu', bias = false } } },\n"
    "  rmsnorm {}, lm_head { tied = false } }\n"
    "data { text = 'x' } train { batch_tokens = 32, steps = 1 }\n";

enum { B = 2, T = 8, M = 3, N = B * T };

/* The largest |a - b| over every tensor's gradient, relative to the largest |b|. */
static double grad_diff(tr_model *a, tr_model *b) {
    double worst = 0, top = 0;
    for (int i = 0; i < tr_model_num_params(b); i++) {
        const tr_param *p = tr_model_param(b, i);
        float *x = malloc(p->numel * sizeof(float)), *y = malloc(p->numel * sizeof(float));
        tr_model_get_grad(a, i, x);
        tr_model_get_grad(b, i, y);
        for (size_t k = 0; k < p->numel; k++) {
            double d = fabs((double)x[k] - y[k]);
            if (d > worst) worst = d;
            if (fabs(y[k]) > top) top = fabs(y[k]);
        }
        free(x), free(y);
    }
    return top > 0 ? worst / top : worst;
}

static void copy_stream(tr_model *m, tr_buf *dst, const tr_buf *src) {
    memcpy(dst, src, tr_model_stream_elems(m, B, T) * sizeof(float));
}

/* GPipe through the chunks of `m` (all held): the mean loss over the micro-batches. */
static double run_chunks(tr_model *m, int tok[M][N], int tgt[M][N], int split) {
    int nc = tr_model_num_chunks(m);
    double loss = 0;
    for (int mb = 0; mb < M; mb++)
        for (int c = 0; c < nc; c++) {
            if (c > 0)
                copy_stream(m, tr_model_chunk_input(m, c, mb), tr_model_chunk_output(m, c - 1, mb));
            tr_model_chunk_forward(m, c, mb, c == 0 ? tok[mb] : NULL, NULL, B, T);
        }
    for (int mb = 0; mb < M; mb++)
        for (int c = nc - 1; c >= 0; c--) {
            if (c < nc - 1)
                copy_stream(m, tr_model_chunk_grad_output(m, c, mb),
                            tr_model_chunk_grad_input(m, c + 1, mb));
            loss += tr_model_chunk_backward(m, c, mb, c == 0 ? tok[mb] : NULL,
                                            c == nc - 1 ? tgt[mb] : NULL, B, T, 1.0f / M,
                                            split ? TR_BWD_INPUT : TR_BWD_ALL);
        }
    for (int mb = 0; split && mb < M; mb++) /* the deferred weight parts, in another order */
        for (int c = 0; c < nc; c++)
            tr_model_chunk_backward(m, c, mb, NULL, NULL, B, T, 1.0f / M, TR_BWD_WEIGHT);
    return loss / M;
}

/* Decoding a few tokens chunk by chunk against the whole model's decoding. */
static double decode_diff(tr_model *one, tr_model *m, const int *tok) {
    int V = tr_model_desc_of(one)->vocab, nc = tr_model_num_chunks(m);
    float *a = malloc((size_t)V * sizeof(float)), *b = malloc((size_t)V * sizeof(float));
    tr_kv_cache *ca, *cb;
    char err[256];
    double worst = 0;
    if (tr_kv_cache_init(&ca, one, err, sizeof(err)) || tr_kv_cache_init(&cb, m, err, sizeof(err)))
        return 1e9;
    for (int pos = 0; pos < 5; pos++) {
        tr_model_decode(one, ca, tok[pos], pos, a);
        for (int c = 0; c < nc; c++) {
            if (c > 0) /* one row */
                memcpy(tr_model_chunk_input(m, c, 0), tr_model_chunk_output(m, c - 1, 0),
                       (size_t)tr_model_desc_of(m)->dim * sizeof(float));
            tr_model_decode_chunk(m, cb, c, tok[pos], pos, b);
        }
        for (int v = 0; v < V; v++)
            if (fabs((double)a[v] - b[v]) > worst) worst = fabs((double)a[v] - b[v]);
    }
    tr_kv_cache_free(ca), tr_kv_cache_free(cb);
    free(a), free(b);
    return worst;
}

static void one_case(const char *name, const char *text, int nc, const int *starts, tr_recompute rc,
                     int split) {
    tr_recipe r;
    char err[512], what[200];
    if (tr_recipe_load_string(&r, text, name, ".", NULL, 0, err, sizeof(err))) {
        printf("FAIL %s: %s\n", name, err);
        g_fail++;
        return;
    }
    tr_model_opts o1 = {.B = B, .T = T, .recompute = rc}, oc = o1;
    oc.n_chunks = nc;
    oc.split_backward = split;
    for (int c = 0; c <= nc; c++)
        oc.chunk_start[c] = starts[c];
    for (int c = 0; c < nc; c++)
        oc.held[c] = 1, oc.slots[c] = M;
    tr_model *one, *m;
    if (tr_model_init_opts(&one, &r.model, tr_backend_cpu(), &o1, err, sizeof(err)) ||
        tr_model_init_opts(&m, &r.model, tr_backend_cpu(), &oc, err, sizeof(err))) {
        printf("FAIL %s: %s\n", name, err);
        g_fail++;
        tr_recipe_free(&r);
        return;
    }
    tr_model_init_params(one, 7);
    tr_model_init_params(m, 7);
    int tok[M][N], tgt[M][N];
    unsigned s = 12345;
    for (int mb = 0; mb < M; mb++)
        for (int i = 0; i < N; i++) {
            s = s * 1103515245u + 12345u;
            tok[mb][i] = (int)(s >> 16) % r.model.vocab;
            tgt[mb][i] = (int)(s >> 8) % r.model.vocab;
        }
    tr_model_zero_grad(one);
    tr_model_zero_grad(m);
    double l1 = 0;
    for (int mb = 0; mb < M; mb++) {
        l1 += tr_model_forward(one, tok[mb], tgt[mb], B, T, 1.0f / M);
        tr_model_backward(one);
    }
    l1 /= M;
    double lc = run_chunks(m, tok, tgt, split);
    const char *rcs[] = {"none", "selective", "full"};
    snprintf(what, sizeof(what), "%s, %d chunks, recompute %s%s: loss", name, nc, rcs[rc],
             split ? ", split backward" : "");
    check(fabs(lc - l1) <= 1e-6 * fabs(l1), what, fabs(lc - l1) / fabs(l1), 1e-6);
    double gd = grad_diff(m, one);
    snprintf(what, sizeof(what), "%s, %d chunks, recompute %s%s: gradients", name, nc, rcs[rc],
             split ? ", split backward" : "");
    check(gd <= 1e-5, what, gd, 1e-5);
    if (rc == TR_RECOMPUTE_NONE && !split) {
        double dd = decode_diff(one, m, tok[0]);
        snprintf(what, sizeof(what), "%s, %d chunks: decoding logits", name, nc);
        check(dd <= 1e-5, what, dd, 1e-5);
    }
    tr_model_free(one);
    tr_model_free(m);
    tr_recipe_free(&r);
}

/* A model holding chunks 1 and 2 of three only (the last stage of a tied GPT): its tensors are
 * those of blocks 1-2, the final norm and the embedding (for the head), marked as the replica. */
static void held_subset(void) {
    tr_recipe r;
    char err[512];
    if (tr_recipe_load_string(&r, gpt, "gpt", ".", NULL, 0, err, sizeof(err))) {
        g_fail++;
        return;
    }
    tr_model_opts o = {.B = B, .T = T, .n_chunks = 3, .chunk_start = {0, 1, 2, 3}};
    o.held[1] = o.held[2] = 1;
    o.slots[1] = o.slots[2] = 1;
    tr_model *m;
    if (tr_model_init_opts(&m, &r.model, tr_backend_cpu(), &o, err, sizeof(err))) {
        printf("FAIL subset: %s\n", err);
        g_fail++;
        tr_recipe_free(&r);
        return;
    }
    int np = tr_model_num_params(m), ok = np > 0, replica = 0;
    for (int i = 0; i < np; i++) {
        const tr_param *p = tr_model_param(m, i);
        ok &= strncmp(p->name, "stack.0.", 8) != 0 && strncmp(p->name, "positions", 9) != 0;
        if (!strcmp(p->name, "embedding.weight")) replica = p->pp_tied && p->pp_copy;
    }
    check(ok && replica && !tr_model_chunk_held(m, 0) && tr_model_chunk_held(m, 2),
          "the last stage holds blocks 1-2 and the head's replica of the embedding only", 0, 0);
    tr_model_free(m);
    tr_recipe_free(&r);
}

int main(void) {
    const int two[] = {0, 2, 3}, three[] = {0, 1, 2, 3};
    for (int rc = 0; rc < 3; rc++) {
        one_case("gpt", gpt, 2, two, (tr_recompute)rc, 0);
        one_case("llama", llama, 3, three, (tr_recompute)rc, 0);
    }
    for (int rc = 0; rc < 2; rc++) { /* the split backward: no full recompute */
        one_case("gpt", gpt, 3, three, (tr_recompute)rc, 1);
        one_case("llama", llama, 2, two, (tr_recompute)rc, 1);
    }
    held_subset();
    printf("%s\n", g_fail ? "FAILED" : "all passed");
    return g_fail ? 1 : 0;
}
