/* Sampling from a model with the KV cache: each new token costs one token's forward. When the
 * context reaches seq_len, the cache restarts from the last half of the context (the only
 * time a prefix is recomputed). Temperature 0 is greedy; top_k 0 keeps the whole vocabulary.
 * A backend without incremental decoding recomputes the window for every token instead. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "trainer/trainer.h"

typedef struct {
    float logit;
    int id;
} cand;

static int by_logit_desc(const void *a, const void *b) {
    const cand *x = a, *y = b;
    if (x->logit != y->logit) return x->logit < y->logit ? 1 : -1;
    return x->id - y->id; /* ties: the smaller id first, so the order is total */
}

static int pick(const float *logits, int V, float temperature, int top_k, uint64_t *rng,
                cand *scratch) {
    int best = 0;
    for (int v = 1; v < V; v++)
        if (logits[v] > logits[best]) best = v;
    if (temperature <= 0) return best;
    int n = V;
    for (int v = 0; v < V; v++) scratch[v] = (cand){logits[v], v};
    if (top_k > 0 && top_k < V) {
        qsort(scratch, (size_t)V, sizeof(cand), by_logit_desc);
        n = top_k;
    }
    double sum = 0, mx = logits[best];
    for (int i = 0; i < n; i++) sum += exp((scratch[i].logit - mx) / temperature);
    *rng ^= *rng << 13, *rng ^= *rng >> 7, *rng ^= *rng << 17; /* xorshift64 */
    double u = (double)(*rng >> 11) / 9007199254740992.0 * sum, acc = 0;
    for (int i = 0; i < n; i++) {
        acc += exp((scratch[i].logit - mx) / temperature);
        if (acc > u) return scratch[i].id;
    }
    return scratch[n - 1].id;
}

int tr_sample_tokens(tr_model *m, const int *prompt, int n_prompt, int n_new, float temperature,
                     int top_k, unsigned long long seed, int *out, char *err, size_t errlen) {
    const tr_model_desc *d = tr_model_desc_of(m);
    int V = d->vocab, T = d->seq_len;
    if (n_prompt < 1) {
        snprintf(err, errlen, "sampling needs a prompt of at least one token");
        return -1;
    }
    tr_kv_cache *c = NULL;
    char why[256];
    int cached = tr_kv_cache_init(&c, m, why, sizeof(why)) == 0;
    int total = n_prompt + n_new;
    int *ctx = malloc((size_t)total * sizeof(int));
    float *logits = malloc((size_t)V * sizeof(float));
    cand *scratch = malloc((size_t)V * sizeof(cand));
    memcpy(ctx, prompt, (size_t)n_prompt * sizeof(int));
    uint64_t rng = seed * 0x9e3779b97f4a7c15ULL + 0x2545f4914f6cdd1dULL;
    if (!rng) rng = 1;
    /* the prompt: only its last T-1 tokens fit with room for one more */
    int start = n_prompt > T - 1 ? n_prompt - (T - 1) : 0, pos = 0;
    if (cached)
        for (int i = start; i < n_prompt; i++) tr_model_decode(m, c, ctx[i], pos++, logits);
    else
        tr_model_last_logits(m, ctx + start, 1, n_prompt - start, logits);
    for (int i = n_prompt; i < total; i++) {
        int next = pick(logits, V, temperature, top_k, &rng, scratch);
        ctx[i] = next;
        out[i - n_prompt] = next;
        if (i + 1 == total) break;
        if (!cached) {
            int from = i + 1 > T ? i + 1 - T : 0;
            tr_model_last_logits(m, ctx + from, 1, i + 1 - from, logits);
            continue;
        }
        if (pos == T) { /* the window is full: restart from its last half */
            pos = 0;
            for (int j = i + 1 - T / 2; j < i; j++) tr_model_decode(m, c, ctx[j], pos++, logits);
        }
        tr_model_decode(m, c, next, pos++, logits);
    }
    free(ctx);
    free(logits);
    free(scratch);
    tr_kv_cache_free(c);
    return 0;
}
