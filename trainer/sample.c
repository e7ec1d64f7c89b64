/* Sampling from a model with the KV cache: each new token costs one token's forward. When the
 * context reaches seq_len, the cache restarts from the last half of the context (the only
 * time a prefix is recomputed). Temperature 0 is greedy; top_k 0 keeps the whole vocabulary.
 * A backend without incremental decoding recomputes the window for every token instead. */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/tokenizer.h"
#include "trainer/checkpoint/checkpoint.h"
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
    for (int v = 0; v < V; v++)
        scratch[v] = (cand){logits[v], v};
    if (top_k > 0 && top_k < V) {
        qsort(scratch, (size_t)V, sizeof(cand), by_logit_desc);
        n = top_k;
    }
    double sum = 0, mx = logits[best];
    for (int i = 0; i < n; i++)
        sum += exp((scratch[i].logit - mx) / temperature);
    *rng ^= *rng << 13, *rng ^= *rng >> 7, *rng ^= *rng << 17; /* xorshift64 */
    double u = (double)(*rng >> 11) / 9007199254740992.0 * sum, acc = 0;
    for (int i = 0; i < n; i++) {
        acc += exp((scratch[i].logit - mx) / temperature);
        if (acc > u) return scratch[i].id;
    }
    return scratch[n - 1].id;
}

static void model_decode(void *m, tr_kv_cache *c, int token, int pos, float *logits) {
    tr_model_decode(m, c, token, pos, logits);
}

int tr_sample_tokens(tr_model *m, const int *prompt, int n_prompt, int n_new, float temperature,
                     int top_k, unsigned long long seed, int *out, char *err, size_t errlen) {
    return tr_sample_tokens_via(m, NULL, NULL, prompt, n_prompt, n_new, temperature, top_k, seed,
                                out, err, errlen);
}

int tr_sample_tokens_via(tr_model *m, tr_decode_fn decode, void *dctx, const int *prompt,
                         int n_prompt, int n_new, float temperature, int top_k,
                         unsigned long long seed, int *out, char *err, size_t errlen) {
    const tr_model_desc *d = tr_model_desc_of(m);
    if (!decode) {
        decode = model_decode;
        dctx = m;
    }
    int V = d->vocab, T = d->seq_len;
    if (n_prompt < 1) {
        snprintf(err, errlen, "sampling needs a prompt of at least one token");
        return -1;
    }
    tr_kv_cache *c = NULL;
    char why[256];
    int cached = tr_kv_cache_init(&c, m, why, sizeof(why)) == 0;
    if (!cached && decode != model_decode) { /* no other way through a pipeline */
        snprintf(err, errlen, "%s", why);
        return -1;
    }
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
        for (int i = start; i < n_prompt; i++)
            decode(dctx, c, ctx[i], pos++, logits);
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
            for (int j = i + 1 - T / 2; j < i; j++)
                decode(dctx, c, ctx[j], pos++, logits);
        }
        decode(dctx, c, next, pos++, logits);
    }
    free(ctx);
    free(logits);
    free(scratch);
    tr_kv_cache_free(c);
    return 0;
}

/* ---- trainer sample ------------------------------------------------------------------- */

static const char *sample_help =
    "usage: trainer sample CKPT [--prompt TEXT] [--tokens N] [--temperature T] [--top-k K]\n"
    "                           [--seed S] [--device auto|cpu|cuda]\n"
    "                           [--logits K] [--logits-out FILE]\n"
    "\n"
    "Generate text from a checkpoint (a step folder, or a run folder: the one its `latest`\n"
    "names), with the run's tokenizer and a KV cache (each new token costs one token's\n"
    "forward; the prompt is not recomputed).\n"
    "\n"
    "  --prompt TEXT     text to continue (default: a new document, or a newline for bytes)\n"
    "  --tokens N        tokens to generate (default 200)\n"
    "  --temperature T   softmax temperature, 0 = greedy (default 1)\n"
    "  --top-k K         sample among the K likeliest tokens, 0 = all (default 0)\n"
    "  --seed S          random seed (default 1337): the same seed gives the same text\n"
    "  --logits K        instead of sampling: the model's logits at each position of the\n"
    "                    prompt (its last seq_len tokens), one line per position: the position,\n"
    "                    the token there (id and text, JSON-quoted), then the K largest logits\n"
    "                    as id \"text\" logit, largest first\n"
    "  --logits-out FILE instead of sampling: every logit of those positions into FILE, as\n"
    "                    float32 little-endian, row-major (positions, vocab), no header; stdout\n"
    "                    says the shape and the prompt's ids (numpy: np.fromfile(FILE, \"<f4\")\n"
    "                    .reshape(N, V))\n";

/* A token's bytes as a JSON string (what --logits prints). */
static void put_token(const tr_tokenizer *tok, int id) {
    size_t n = 0;
    const unsigned char *b = (const unsigned char *)tr_tokenizer_token(tok, id, &n);
    putchar('"');
    for (size_t i = 0; b && i < n; i++) {
        if (b[i] == '"' || b[i] == '\\')
            printf("\\%c", b[i]);
        else if (b[i] < 0x20 || b[i] == 0x7f)
            printf("\\u%04x", b[i]);
        else
            putchar(b[i]);
    }
    putchar('"');
}

/* --logits K and --logits-out FILE: the logits of the prompt's last seq_len positions. */
static int show_logits(tr_model *m, const tr_tokenizer *tok, const int *ids, int n, int top,
                       const char *path) {
    const tr_model_desc *d = tr_model_desc_of(m);
    int V = d->vocab, from = n > d->seq_len ? n - d->seq_len : 0, N = n - from;
    float *logits = malloc((size_t)N * (size_t)V * sizeof(float));
    cand *c = malloc((size_t)V * sizeof(cand));
    if (!logits || !c) {
        free(logits), free(c);
        fprintf(stderr, "trainer sample: out of memory for %d x %d logits\n", N, V);
        return -1;
    }
    tr_model_all_logits(m, ids + from, 1, N, logits);
    int rc = 0;
    if (path) {
        FILE *f = fopen(path, "wb");
        size_t k = (size_t)N * (size_t)V;
        if (!f || fwrite(logits, sizeof(float), k, f) != k || fclose(f)) { /* hosts are LE */
            fprintf(stderr, "trainer sample: cannot write '%s': %s\n", path, strerror(errno));
            rc = -1;
        } else {
            printf("logits: %d positions x %d ids, float32 little-endian, row-major, in %s; "
                   "prompt ids:",
                   N, V, path);
            for (int t = 0; t < N; t++)
                printf(" %d", ids[from + t]);
            printf("\n");
        }
    }
    for (int t = 0; t < N && top > 0 && !rc; t++) {
        const float *row = logits + (size_t)t * V;
        for (int v = 0; v < V; v++)
            c[v] = (cand){row[v], v};
        qsort(c, (size_t)V, sizeof(cand), by_logit_desc);
        printf("%d %d ", t, ids[from + t]);
        put_token(tok, ids[from + t]);
        for (int k = 0; k < top && k < V; k++) {
            printf("%s%d ", k ? " | " : "  ", c[k].id);
            put_token(tok, c[k].id);
            printf(" %.6g", (double)c[k].logit);
        }
        printf("\n");
    }
    free(logits);
    free(c);
    return rc;
}

/* ---- a checkpoint loaded for inference (sample, eval) ------------------------------------ */

int tr_load_checkpoint(tr_loaded *L, const char *arg, const char *device, char *err,
                       size_t errlen) {
    memset(L, 0, sizeof(*L));
    if (tr_ckpt_open_arg(arg, &L->ckpt, 0, stderr, err, errlen)) return -1;
    char chunk[TR_PATH_MAX + 32], why[1024], desc[512];
    snprintf(chunk, sizeof(chunk), "%s/manifest.yaml", L->ckpt.dir);
    if (tr_recipe_load_string(&L->recipe, L->ckpt.recipe, chunk, ".", NULL, 0, why, sizeof(why))) {
        snprintf(err, errlen, "the checkpoint's recipe: %s", why);
        return -1;
    }
    L->have_recipe = 1;
    tr_options o;
    memset(&o, 0, sizeof(o));
    o.device = device;
    double peak;
    const tr_data_desc *d = &L->recipe.data;
    L->be = tr_choose_backend(&o, &L->recipe, &peak, desc, sizeof(desc), err, errlen);
    if (!L->be || tr_tokenizer_open(&L->tok, d->tokenizer, d->encoder, d->merges, err, errlen))
        return -1;
    if (tr_model_init(&L->model, &L->recipe.model, L->be, 1, L->recipe.model.seq_len, err,
                      errlen))
        return -1;
    return tr_ckpt_apply(&L->ckpt, L->model, err, errlen);
}

void tr_loaded_free(tr_loaded *L) {
    if (!L) return;
    tr_model_free(L->model);
    tr_tokenizer_free(L->tok);
    if (L->have_recipe) tr_recipe_free(&L->recipe);
    tr_ckpt_free(&L->ckpt);
    memset(L, 0, sizeof(*L));
}

int tr_cmd_sample(int argc, char **argv) {
    const char *ckpt = NULL, *prompt = NULL;
    double tokens = 200, temperature = 1, top_k = 0, seed = 1337, show = 0;
    const char *logits_out = NULL;
    tr_options o;
    memset(&o, 0, sizeof(o));
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(sample_help, stdout);
            return 0;
        }
        int known = !strcmp(a, "--prompt") || !strcmp(a, "--tokens") ||
                    !strcmp(a, "--temperature") || !strcmp(a, "--top-k") || !strcmp(a, "--seed") ||
                    !strcmp(a, "--device") || !strcmp(a, "--logits") || !strcmp(a, "--logits-out");
        if (known && i + 1 >= argc) {
            fprintf(stderr, "trainer sample: %s needs a value (see trainer sample --help)\n", a);
            return 2;
        }
        if (!strcmp(a, "--prompt")) {
            prompt = argv[++i];
        } else if (!strcmp(a, "--device")) {
            o.device = argv[++i];
            if (strcmp(o.device, "auto") && strcmp(o.device, "cpu") && strcmp(o.device, "cuda")) {
                fprintf(stderr, "trainer sample: --device must be auto, cpu or cuda, got '%s'\n",
                        o.device);
                return 2;
            }
        } else if (!strcmp(a, "--tokens")) {
            if (tr_number_arg("sample", a, argv[++i], 1, 1e7, &tokens)) return 2;
        } else if (!strcmp(a, "--temperature")) {
            if (tr_number_arg("sample", a, argv[++i], 0, 100, &temperature)) return 2;
        } else if (!strcmp(a, "--top-k")) {
            if (tr_number_arg("sample", a, argv[++i], 0, 1e9, &top_k)) return 2;
        } else if (!strcmp(a, "--seed")) {
            if (tr_number_arg("sample", a, argv[++i], 0, 9e15, &seed)) return 2;
        } else if (!strcmp(a, "--logits")) {
            if (tr_number_arg("sample", a, argv[++i], 1, 1e6, &show)) return 2;
        } else if (!strcmp(a, "--logits-out")) {
            logits_out = argv[++i];
        } else if (a[0] == '-') {
            fprintf(stderr, "trainer sample: unknown option '%s' (see trainer sample --help)\n", a);
            return 2;
        } else if (!ckpt) {
            ckpt = a;
        } else {
            fprintf(stderr, "trainer sample: unexpected argument '%s' (one checkpoint only)\n", a);
            return 2;
        }
    }
    if (!ckpt) {
        fprintf(stderr, "trainer sample: no checkpoint given (see trainer sample --help)\n");
        return 2;
    }
    char err[1024];
    int status = 1;
    tr_loaded L;
    if (tr_load_checkpoint(&L, ckpt, o.device, err, sizeof(err))) {
        fprintf(stderr, "trainer sample: %s\n", err);
        tr_loaded_free(&L);
        return 1;
    }
    tr_model *m = L.model;
    const tr_tokenizer *tok = L.tok;
    const tr_recipe *rp = &L.recipe;
    int *ids = NULL, *out = NULL;
    size_t plen = prompt ? strlen(prompt) : 0;
    ids = malloc((plen + 1) * sizeof(int));
    int n = prompt && plen ? (int)tr_tokenizer_encode(tok, prompt, plen, ids) : 0;
    if (n == 0) { /* no prompt: a new document, or a newline for byte-level models */
        ids[0] = tr_tokenizer_eot(tok);
        n = ids[0] >= 0 ? 1 : (int)tr_tokenizer_encode(tok, "\n", 1, ids);
    }
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= rp->model.vocab) {
            fprintf(stderr,
                    "trainer sample: the prompt's token %d is outside the model's "
                    "vocabulary of %d\n",
                    ids[i], rp->model.vocab);
            goto done;
        }
    if (show > 0 || logits_out) {
        status = show_logits(m, tok, ids, n, (int)show, logits_out) ? 1 : 0;
        goto done;
    }
    out = malloc((size_t)tokens * sizeof(int));
    if (tr_sample_tokens(m, ids, n, (int)tokens, (float)temperature, (int)top_k,
                         (unsigned long long)seed, out, err, sizeof(err))) {
        fprintf(stderr, "trainer sample: %s\n", err);
        goto done;
    }
    fprintf(stderr, "sampled %d tokens from %s (step %ld) on the %s backend\n", (int)tokens,
            L.ckpt.dir, L.ckpt.step, L.be->name);
    if (prompt) fputs(prompt, stdout);
    for (int i = 0; i < (int)tokens; i++) {
        size_t nb = 0;
        const char *bytes = tr_tokenizer_token(tok, out[i], &nb);
        if (bytes) fwrite(bytes, 1, nb, stdout);
    }
    fputc('\n', stdout);
    status = 0;
done:
    free(ids);
    free(out);
    tr_loaded_free(&L);
    return status;
}
