/* Hugging Face interchange: `trainer export CKPT --format hf --out DIR` writes config.json and
 * model.safetensors for GPT-2-shaped models (GPT2LMHeadModel) and Llama-shaped ones
 * (LlamaForCausalLM); `init = hf "DIR"` in a recipe loads such a folder into the model.
 * Both directions use one name map from our parameters (model/model.c names, nn.Linear
 * (out, in) layout) to Hugging Face's: GPT-2's Conv1D weights are stored transposed (in, out),
 * our fused qkv rows [q | k | v] and SwiGLU fc rows [gate | up] are split row-wise. RoPE is
 * the rotate-half convention in both, so no permutation is needed. */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "data/tokenizer.h"
#include "parallel/comm/base.h"
#include "trainer/checkpoint/checkpoint.h"
#include "trainer/trainer.h"

typedef enum { HF_GPT2 = 0, HF_LLAMA } hf_kind;

/* What the model description says, once recognized. */
typedef struct {
    hf_kind kind;
    int layers, heads, kv_heads, hidden, tied;
    int attn_bias, mlp_bias, ln_bias;
    float eps, theta;
    long vocab; /* rows of the embedding and the head in the files: the model's, or fewer
                   when the padding rows (ids no tokenizer makes) are left out */
    int eot;    /* the tokenizer's end of text (GPT-2's 50256) for bos/eos_token_id; -1: none */
} hf_shape;

static int is_norm(const tr_node *n, tr_node_kind k) {
    return n->kind == k && n->n_children == 0;
}

static int recognize(const tr_model_desc *d, hf_shape *s, char *err, size_t errlen) {
    memset(s, 0, sizeof(*s));
    const tr_node *c = d->root.children;
    int n = d->root.n_children;
    const char *want = "embedding, positions or rope, stack { residual { norm, attention }, "
                       "residual { norm, mlp } }, norm, lm_head";
    if (n != 5 || c[0].kind != TR_NODE_EMBEDDING || c[4].kind != TR_NODE_LM_HEAD ||
        (c[1].kind != TR_NODE_POSITIONS && c[1].kind != TR_NODE_ROPE) ||
        c[2].kind != TR_NODE_STACK || c[2].n_children != 2)
        return tr_errf(err, errlen, "the model is neither GPT-2- nor Llama-shaped (expected %s)",
                       want);
    s->kind = c[1].kind == TR_NODE_POSITIONS ? HF_GPT2 : HF_LLAMA;
    s->vocab = d->vocab;
    s->eot = -1;
    tr_node_kind norm = s->kind == HF_GPT2 ? TR_NODE_LAYERNORM : TR_NODE_RMSNORM;
    const char *arch = s->kind == HF_GPT2 ? "GPT-2" : "Llama";
    const char *norm_name = s->kind == HF_GPT2 ? "layernorm" : "rmsnorm";
    const tr_node *r0 = &c[2].children[0], *r1 = &c[2].children[1];
    if (r0->kind != TR_NODE_RESIDUAL || r1->kind != TR_NODE_RESIDUAL || r0->n_children != 2 ||
        r1->n_children != 2 || r0->children[1].kind != TR_NODE_ATTENTION ||
        r1->children[1].kind != TR_NODE_MLP)
        return tr_errf(err, errlen, "the model is neither GPT-2- nor Llama-shaped (expected %s)",
                       want);
    if (!is_norm(&r0->children[0], norm) || !is_norm(&r1->children[0], norm) ||
        !is_norm(&c[3], norm))
        return tr_errf(err, errlen, "a %s-shaped model (%s) uses %s everywhere", arch,
                       s->kind == HF_GPT2 ? "learned positions" : "rope", norm_name);
    const tr_node *at = &r0->children[1], *mlp = &r1->children[1];
    s->eps = c[3].eps;
    if (r0->children[0].eps != s->eps || r1->children[0].eps != s->eps)
        return tr_errf(err, errlen, "every norm of a %s-shaped model needs the same eps", arch);
    s->layers = c[2].repeat;
    s->heads = at->heads;
    s->kv_heads = at->kv_heads;
    s->hidden = mlp->hidden;
    s->tied = c[4].tied;
    s->attn_bias = at->bias;
    s->mlp_bias = mlp->bias;
    s->ln_bias = s->kind == HF_GPT2 && c[3].bias;
    if (s->kind == HF_GPT2) {
        if (at->kv_heads != at->heads)
            return tr_errf(err, errlen,
                           "GPT-2 has no grouped-query attention (kv_heads %d, heads %d)",
                           at->kv_heads, at->heads);
        if (mlp->activation != TR_ACT_GELU)
            return tr_errf(err, errlen, "a GPT-2-shaped model's mlp uses gelu");
        if (c[3].bias != r0->children[0].bias || c[3].bias != r1->children[0].bias)
            return tr_errf(err, errlen, "every layernorm needs the same bias setting");
    } else {
        s->theta = c[1].rope_theta;
        if (mlp->activation != TR_ACT_SWIGLU)
            return tr_errf(err, errlen, "a Llama-shaped model's mlp uses swiglu");
        if (at->bias || mlp->bias)
            return tr_errf(err, errlen,
                           "a Llama-shaped model has no biases (attention and mlp "
                           "need bias = false)");
    }
    return 0;
}

const char *tr_hf_arch(const tr_model_desc *d, int *n_layers, char *err, size_t errlen) {
    hf_shape s;
    if (recognize(d, &s, err, errlen)) return NULL;
    if (n_layers) *n_layers = s.layers;
    return s.kind == HF_GPT2 ? "GPT2LMHeadModel" : "LlamaForCausalLM";
}

/* One Hugging Face tensor: rows [row0, row0 + rows) of our tensor `ours` (cols columns; 1-D
 * when cols == 0), transposed for GPT-2's Conv1D. ours[0] == 0: no such parameter here (a bias
 * the model does not learn): zeros on export, must be zeros on import. */
typedef struct {
    char ours[TR_PARAM_NAME_MAX];
    char hf[TR_PARAM_NAME_MAX];
    long row0, rows, cols;
    int transpose;
} hf_map;

typedef struct {
    hf_map *m;
    int n, cap;
} map_list;

static void add(map_list *l, const char *ours, const char *hf, long row0, long rows, long cols,
                int transpose) {
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 64;
        l->m = realloc(l->m, (size_t)l->cap * sizeof(hf_map));
    }
    hf_map *e = &l->m[l->n++];
    snprintf(e->ours, sizeof(e->ours), "%s", ours ? ours : "");
    snprintf(e->hf, sizeof(e->hf), "%s", hf);
    e->row0 = row0, e->rows = rows, e->cols = cols, e->transpose = transpose;
}

static void build_map(const tr_model_desc *d, const hf_shape *s, map_list *l) {
    long C = d->dim, V = s->vocab, T = d->seq_len, H = s->heads, KV = s->kv_heads,
         hd = d->dim / s->heads, F = s->hidden;
    char o[TR_PARAM_NAME_MAX], h[TR_PARAM_NAME_MAX];
#define NAMES(ofmt, hfmt) (snprintf(o, sizeof o, ofmt, i), snprintf(h, sizeof h, hfmt, i))
    if (s->kind == HF_GPT2) {
        add(l, "embedding.weight", "transformer.wte.weight", 0, V, C, 0);
        add(l, "positions.weight", "transformer.wpe.weight", 0, T, C, 0);
        for (int i = 0; i < s->layers; i++) {
            NAMES("stack.%d.residual0.layernorm.weight", "transformer.h.%d.ln_1.weight");
            add(l, o, h, 0, C, 0, 0);
            NAMES("stack.%d.residual0.layernorm.bias", "transformer.h.%d.ln_1.bias");
            add(l, s->ln_bias ? o : NULL, h, 0, C, 0, 0);
            NAMES("stack.%d.residual0.attention.qkv.weight", "transformer.h.%d.attn.c_attn.weight");
            add(l, o, h, 0, 3 * C, C, 1);
            NAMES("stack.%d.residual0.attention.qkv.bias", "transformer.h.%d.attn.c_attn.bias");
            add(l, s->attn_bias ? o : NULL, h, 0, 3 * C, 0, 0);
            NAMES("stack.%d.residual0.attention.out.weight", "transformer.h.%d.attn.c_proj.weight");
            add(l, o, h, 0, C, C, 1);
            NAMES("stack.%d.residual0.attention.out.bias", "transformer.h.%d.attn.c_proj.bias");
            add(l, s->attn_bias ? o : NULL, h, 0, C, 0, 0);
            NAMES("stack.%d.residual1.layernorm.weight", "transformer.h.%d.ln_2.weight");
            add(l, o, h, 0, C, 0, 0);
            NAMES("stack.%d.residual1.layernorm.bias", "transformer.h.%d.ln_2.bias");
            add(l, s->ln_bias ? o : NULL, h, 0, C, 0, 0);
            NAMES("stack.%d.residual1.mlp.fc.weight", "transformer.h.%d.mlp.c_fc.weight");
            add(l, o, h, 0, F, C, 1);
            NAMES("stack.%d.residual1.mlp.fc.bias", "transformer.h.%d.mlp.c_fc.bias");
            add(l, s->mlp_bias ? o : NULL, h, 0, F, 0, 0);
            NAMES("stack.%d.residual1.mlp.proj.weight", "transformer.h.%d.mlp.c_proj.weight");
            add(l, o, h, 0, C, F, 1);
            NAMES("stack.%d.residual1.mlp.proj.bias", "transformer.h.%d.mlp.c_proj.bias");
            add(l, s->mlp_bias ? o : NULL, h, 0, C, 0, 0);
        }
        add(l, "layernorm.weight", "transformer.ln_f.weight", 0, C, 0, 0);
        add(l, s->ln_bias ? "layernorm.bias" : NULL, "transformer.ln_f.bias", 0, C, 0, 0);
    } else {
        add(l, "embedding.weight", "model.embed_tokens.weight", 0, V, C, 0);
        for (int i = 0; i < s->layers; i++) {
            NAMES("stack.%d.residual0.rmsnorm.weight", "model.layers.%d.input_layernorm.weight");
            add(l, o, h, 0, C, 0, 0);
            NAMES("stack.%d.residual0.attention.qkv.weight", "model.layers.%d.self_attn.q_proj.weight");
            add(l, o, h, 0, H * hd, C, 0);
            NAMES("stack.%d.residual0.attention.qkv.weight", "model.layers.%d.self_attn.k_proj.weight");
            add(l, o, h, H * hd, KV * hd, C, 0);
            NAMES("stack.%d.residual0.attention.qkv.weight", "model.layers.%d.self_attn.v_proj.weight");
            add(l, o, h, (H + KV) * hd, KV * hd, C, 0);
            NAMES("stack.%d.residual0.attention.out.weight", "model.layers.%d.self_attn.o_proj.weight");
            add(l, o, h, 0, C, H * hd, 0);
            NAMES("stack.%d.residual1.rmsnorm.weight",
                  "model.layers.%d.post_attention_layernorm.weight");
            add(l, o, h, 0, C, 0, 0);
            NAMES("stack.%d.residual1.mlp.fc.weight", "model.layers.%d.mlp.gate_proj.weight");
            add(l, o, h, 0, F, C, 0);
            NAMES("stack.%d.residual1.mlp.fc.weight", "model.layers.%d.mlp.up_proj.weight");
            add(l, o, h, F, F, C, 0);
            NAMES("stack.%d.residual1.mlp.proj.weight", "model.layers.%d.mlp.down_proj.weight");
            add(l, o, h, 0, C, F, 0);
        }
        add(l, "rmsnorm.weight", "model.norm.weight", 0, C, 0, 0);
    }
#undef NAMES
    if (!s->tied) add(l, "lm_head.weight", "lm_head.weight", 0, V, C, 0);
}

/* bos_token_id and eos_token_id, the config's last lines: the tokenizer's end of text, or null
 * (transformers' GPT-2 defaults are 50256 whatever the vocabulary). */
static void put_token_ids(FILE *f, int eot) {
    char id[16] = "null";
    if (eot >= 0) snprintf(id, sizeof(id), "%d", eot);
    fprintf(f, "  \"bos_token_id\": %s,\n  \"eos_token_id\": %s\n}\n", id, id);
}

/* The shortest decimal that reads back as the same float (null, as tr_json_write_num, when it
 * is not finite). */
static void put_float(FILE *f, float x) {
    char buf[32];
    for (int p = 6; p <= 9; p++) {
        tr_json_fmt_num(buf, sizeof(buf), (double)x, p);
        if (!isfinite(x) || strtof(buf, NULL) == x) break;
    }
    fputs(buf, f);
}

static int write_config(const char *path, const tr_model_desc *d, const hf_shape *s, char *err,
                        size_t errlen) {
    FILE *f = fopen(path, "w");
    if (!f) return tr_errf(err, errlen, "cannot write '%s': %s", path, strerror(errno));
    if (s->kind == HF_GPT2) {
        fprintf(f,
                "{\n  \"architectures\": [\"GPT2LMHeadModel\"],\n  \"model_type\": \"gpt2\",\n"
                "  \"vocab_size\": %d,\n  \"n_positions\": %d,\n  \"n_ctx\": %d,\n"
                "  \"n_embd\": %d,\n  \"n_layer\": %d,\n  \"n_head\": %d,\n  \"n_inner\": %d,\n"
                "  \"activation_function\": \"gelu_new\",\n  \"layer_norm_epsilon\": ",
                (int)s->vocab, d->seq_len, d->seq_len, d->dim, s->layers, s->heads, s->hidden);
        put_float(f, s->eps);
        fprintf(f, ",\n  \"resid_pdrop\": 0.0,\n  \"embd_pdrop\": 0.0,\n  \"attn_pdrop\": 0.0,\n"
                   "  \"scale_attn_weights\": true,\n  \"tie_word_embeddings\": %s,\n"
                   "  \"torch_dtype\": \"float32\",\n",
                s->tied ? "true" : "false");
        put_token_ids(f, s->eot);
    } else {
        fprintf(f,
                "{\n  \"architectures\": [\"LlamaForCausalLM\"],\n  \"model_type\": \"llama\",\n"
                "  \"vocab_size\": %d,\n  \"hidden_size\": %d,\n  \"intermediate_size\": %d,\n"
                "  \"num_hidden_layers\": %d,\n  \"num_attention_heads\": %d,\n"
                "  \"num_key_value_heads\": %d,\n  \"head_dim\": %d,\n  \"hidden_act\": \"silu\",\n"
                "  \"max_position_embeddings\": %d,\n  \"rms_norm_eps\": ",
                (int)s->vocab, d->dim, s->hidden, s->layers, s->heads, s->kv_heads, d->dim / s->heads,
                d->seq_len);
        put_float(f, s->eps);
        fputs(",\n  \"rope_theta\": ", f);
        put_float(f, s->theta);
        fprintf(f, ",\n  \"attention_bias\": false,\n  \"mlp_bias\": false,\n"
                   "  \"tie_word_embeddings\": %s,\n  \"torch_dtype\": \"float32\",\n",
                s->tied ? "true" : "false");
        put_token_ids(f, s->eot);
    }
    if (fclose(f)) return tr_errf(err, errlen, "cannot write '%s': %s", path, strerror(errno));
    return 0;
}

int tr_hf_export(const tr_ckpt *c, const tr_model_desc *d, int vocab, const char *out_dir,
                 char *err, size_t errlen) {
    hf_shape s;
    char why[256];
    if (recognize(d, &s, why, sizeof(why)))
        return tr_errf(err, errlen, "cannot export to Hugging Face: %s", why);
    if (vocab > 0 && vocab < d->vocab) s.vocab = vocab;
    if (vocab == 50257) s.eot = 50256; /* GPT-2's tokenizer: <|endoftext|> */
    map_list l = {0};
    build_map(d, &s, &l);
    tr_st_tensor *t = calloc((size_t)l.n, sizeof(tr_st_tensor));
    float **owned = calloc((size_t)l.n, sizeof(float *));
    int rc = 0;
    for (int i = 0; i < l.n && !rc; i++) {
        const hf_map *e = &l.m[i];
        long cols = e->cols ? e->cols : 1;
        size_t numel = (size_t)e->rows * (size_t)cols;
        t[i].name = e->hf;
        t[i].ndim = e->cols ? 2 : 1;
        t[i].shape[0] = e->transpose ? cols : e->rows;
        t[i].shape[1] = e->transpose ? e->rows : cols;
        if (!e->ours[0]) {
            owned[i] = calloc(numel, sizeof(float));
            t[i].data = owned[i];
            continue;
        }
        const tr_ckpt_tensor *src = tr_ckpt_find(c, e->ours);
        if (!src || src->shape[1] != cols || src->shape[0] < e->row0 + e->rows) {
            rc = tr_errf(err, errlen, "%s: tensor '%s' missing or not %ld x %ld", c->dir, e->ours,
                         e->row0 + e->rows, cols);
            break;
        }
        size_t lo = (size_t)e->row0 * (size_t)cols;
        const float *p = src->data ? src->data + lo : NULL;
        float *blk = NULL;
        if (!p) { /* a tensor saved in blocks by several ranks: just these rows */
            blk = malloc(numel * sizeof(float) + 1);
            if (!blk) {
                rc = tr_errf(err, errlen, "out of memory exporting '%s'", e->ours);
                break;
            }
            if (tr_ckpt_read_elems(src, lo, lo + numel, blk, err, errlen)) {
                free(blk);
                rc = -1;
                break;
            }
            p = blk;
        }
        if (!e->transpose) {
            owned[i] = blk;
            t[i].data = p;
            continue;
        }
        owned[i] = malloc(numel * sizeof(float));
        for (long r = 0; r < e->rows; r++)
            for (long k = 0; k < cols; k++)
                owned[i][(size_t)k * (size_t)e->rows + (size_t)r] = p[(size_t)r * (size_t)cols + (size_t)k];
        free(blk);
        t[i].data = owned[i];
    }
    char path[TR_PATH_MAX + 32];
    if (!rc) rc = tr_mkdirs(out_dir, err, errlen);
    if (!rc) {
        snprintf(path, sizeof(path), "%s/config.json", out_dir);
        rc = write_config(path, d, &s, err, errlen);
    }
    if (!rc) {
        snprintf(path, sizeof(path), "%s/model.safetensors", out_dir);
        const char *meta[] = {"format", "pt", NULL};
        rc = tr_st_write(path, t, l.n, meta, err, errlen);
    }
    for (int i = 0; i < l.n; i++) free(owned[i]);
    free(owned);
    free(t);
    free(l.m);
    return rc;
}

/* ---- import ---------------------------------------------------------------------------------- */

static int cfg_num(const tr_json *cfg, const char *key, double *out) {
    const tr_json *v = tr_json_get(cfg, key);
    if (!v || (v->type != TR_JSON_NUM && v->type != TR_JSON_BOOL)) return 0;
    *out = v->num;
    return 1;
}

/* A config value against the recipe's; missing keys take `dflt` (NAN: must be present). */
static int cfg_check(const tr_json *cfg, const char *dir, const char *key, double dflt, double ours,
                     const char *what, int is_float, char *err, size_t errlen) {
    double v = dflt;
    if (!cfg_num(cfg, key, &v) && isnan(dflt))
        return tr_errf(err, errlen, "%s/config.json: no '%s'", dir, key);
    int same = is_float ? fabs(v - ours) <= 1e-6 * fabs(ours) + 1e-12 : v == ours;
    if (!same)
        return tr_errf(err, errlen, "%s/config.json: %s is %g but the recipe's %s is %g", dir, key,
                       v, what, ours);
    return 0;
}

int tr_hf_import(tr_model *m, const char *dir, int real_vocab, char *err, size_t errlen) {
    const tr_model_desc *d = tr_model_desc_of(m);
    hf_shape s;
    char why[256];
    if (recognize(d, &s, why, sizeof(why)))
        return tr_errf(err, errlen, "init = hf \"%s\": %s", dir, why);
    char path[TR_PATH_MAX + 64];
    snprintf(path, sizeof(path), "%s/config.json", dir);
    size_t len;
    char *text = tr_read_file(path, SIZE_MAX, &len);
    if (!text) return tr_errf(err, errlen, "%s: cannot read: %s", path, strerror(errno));
    tr_json cfg;
    char jerr[128];
    if (tr_json_parse(&cfg, text, len, jerr, sizeof(jerr))) {
        free(text);
        return tr_errf(err, errlen, "%s: %s", path, jerr);
    }
    free(text);
    int rc = 0;
    const tr_json *mt = tr_json_get(&cfg, "model_type");
    const char *want = s.kind == HF_GPT2 ? "gpt2" : "llama";
    if (!mt || mt->type != TR_JSON_STR || strcmp(mt->str, want))
        rc = tr_errf(err, errlen, "%s: model_type '%s', but the recipe's model is %s-shaped", path,
                     mt && mt->type == TR_JSON_STR ? mt->str : "?", want);
    double npos = 0, tied = 1, file_vocab = 0;
    cfg_num(&cfg, "tie_word_embeddings", &tied);
    /* an export without the padding rows: its rows fill the first ones, the rest are zero */
    if (real_vocab > 0 && cfg_num(&cfg, "vocab_size", &file_vocab) && file_vocab >= real_vocab &&
        file_vocab < d->vocab && file_vocab == (long)file_vocab)
        s.vocab = (long)file_vocab;
    if (!rc && s.kind == HF_GPT2) {
        rc = cfg_check(&cfg, dir, "vocab_size", NAN, s.vocab, "model.vocab", 0, err, errlen);
        if (!rc) rc = cfg_check(&cfg, dir, "n_embd", NAN, d->dim, "model.dim", 0, err, errlen);
        if (!rc) rc = cfg_check(&cfg, dir, "n_layer", NAN, s.layers, "stack n", 0, err, errlen);
        if (!rc) rc = cfg_check(&cfg, dir, "n_head", NAN, s.heads, "attention heads", 0, err, errlen);
        if (!rc)
            rc = cfg_check(&cfg, dir, "layer_norm_epsilon", 1e-5, s.eps, "layernorm eps", 1, err,
                           errlen);
        if (!rc && cfg_num(&cfg, "n_positions", &npos) && npos < d->seq_len)
            rc = tr_errf(err, errlen, "%s: n_positions %g is shorter than the recipe's seq_len %d",
                         path, npos, d->seq_len);
        const tr_json *act = tr_json_get(&cfg, "activation_function");
        if (!rc && act && act->type == TR_JSON_STR && strcmp(act->str, "gelu_new") &&
            strcmp(act->str, "gelu_pytorch_tanh"))
            rc = tr_errf(err, errlen,
                         "%s: activation_function '%s'; the model's GELU is the tanh "
                         "approximation (gelu_new)",
                         path, act->str);
    } else if (!rc) {
        rc = cfg_check(&cfg, dir, "vocab_size", NAN, s.vocab, "model.vocab", 0, err, errlen);
        if (!rc) rc = cfg_check(&cfg, dir, "hidden_size", NAN, d->dim, "model.dim", 0, err, errlen);
        if (!rc)
            rc = cfg_check(&cfg, dir, "num_hidden_layers", NAN, s.layers, "stack n", 0, err, errlen);
        if (!rc)
            rc = cfg_check(&cfg, dir, "num_attention_heads", NAN, s.heads, "attention heads", 0,
                           err, errlen);
        if (!rc)
            rc = cfg_check(&cfg, dir, "num_key_value_heads", s.heads, s.kv_heads,
                           "attention kv_heads", 0, err, errlen);
        if (!rc)
            rc = cfg_check(&cfg, dir, "intermediate_size", NAN, s.hidden, "mlp hidden", 0, err,
                           errlen);
        if (!rc)
            rc = cfg_check(&cfg, dir, "head_dim", d->dim / s.heads, d->dim / s.heads, "head width",
                           0, err, errlen);
        if (!rc)
            rc = cfg_check(&cfg, dir, "rms_norm_eps", 1e-6, s.eps, "rmsnorm eps", 1, err, errlen);
        if (!rc)
            rc = cfg_check(&cfg, dir, "rope_theta", 10000, s.theta, "rope theta", 1, err, errlen);
        double ab = 0;
        if (!rc && cfg_num(&cfg, "attention_bias", &ab) && ab)
            rc = tr_errf(err, errlen,
                         "%s: attention_bias is true; the recipe's attention has no bias", path);
        const tr_json *rs = tr_json_get(&cfg, "rope_scaling");
        if (!rc && rs && rs->type != TR_JSON_NULL)
            rc = tr_errf(err, errlen, "%s: rope_scaling is not supported", path);
    }
    if (!rc && s.tied && !tied)
        rc = tr_errf(err, errlen,
                     "%s: the checkpoint has its own lm_head but the recipe's lm_head is tied",
                     path);
    tr_json_free(&cfg);
    if (rc) return rc;

    snprintf(path, sizeof(path), "%s/model.safetensors", dir);
    struct stat st;
    if (stat(path, &st)) {
        snprintf(path, sizeof(path), "%s/model.safetensors.index.json", dir);
        if (!stat(path, &st))
            return tr_errf(err, errlen,
                           "%s: sharded checkpoints are not supported (merge them "
                           "into one model.safetensors)",
                           dir);
        snprintf(path, sizeof(path), "%s/model.safetensors", dir);
    }
    tr_st_file sf;
    if (tr_st_open(&sf, path, err, errlen)) return -1;
    map_list l = {0};
    build_map(d, &s, &l);
    if (!s.tied && tied) /* the file ties its head: ours starts from the embedding */
        snprintf(l.m[l.n - 1].hf, sizeof(l.m[l.n - 1].hf), "%s",
                 s.kind == HF_GPT2 ? "transformer.wte.weight" : "model.embed_tokens.weight");
    int np = tr_model_num_params(m), holds_all = 1; /* a pipeline stage holds a part */
    for (int c = 0; c < tr_model_num_chunks(m); c++)
        holds_all = holds_all && tr_model_chunk_held(m, c);
    float **full = calloc((size_t)np, sizeof(float *));
    float *tmp = NULL;
    for (int i = 0; i < l.n && !rc; i++) {
        const hf_map *e = &l.m[i];
        const tr_st_entry *te = tr_st_find(&sf, e->hf);
        if (!te && !strncmp(e->hf, "transformer.", 12)) te = tr_st_find(&sf, e->hf + 12);
        if (!te) {
            if (!e->ours[0]) continue; /* a bias the file does not have either */
            rc = tr_errf(err, errlen, "%s: no tensor '%s'", path, e->hf);
            break;
        }
        long cols = e->cols ? e->cols : 1;
        long want0 = e->transpose ? cols : e->rows, want1 = e->transpose ? e->rows : cols;
        long rows_have = te->ndim >= 1 ? te->shape[0] : 0;
        int pos = !strcmp(e->hf, "transformer.wpe.weight");
        int ok = te->ndim == (e->cols ? 2 : 1) && (e->cols ? te->shape[1] == want1 : 1) &&
                 (pos ? rows_have >= want0 : rows_have == want0);
        if (!ok) {
            char sh[64];
            if (te->ndim == 2)
                snprintf(sh, sizeof(sh), "%ld x %ld", te->shape[0], te->shape[1]);
            else
                snprintf(sh, sizeof(sh), "%ld", te->ndim ? te->shape[0] : 0);
            char need[64];
            if (e->cols)
                snprintf(need, sizeof(need), "%ld x %ld", want0, want1);
            else
                snprintf(need, sizeof(need), "%ld", want0);
            rc = tr_errf(err, errlen, "%s: tensor '%s' is %s; the recipe's model needs %s", path,
                         e->hf, sh, need);
            break;
        }
        size_t have = (size_t)rows_have * (size_t)(e->cols ? te->shape[1] : 1);
        tmp = realloc(tmp, have * sizeof(float));
        if (tr_st_read_f32(&sf, te, tmp, err, errlen)) {
            rc = -1;
            break;
        }
        for (size_t k = 0; k < have && !rc; k++) /* HF files carry no checksum: see to it here */
            if (!isfinite(tmp[k]))
                rc = tr_errf(err, errlen,
                             "%s: tensor '%s' holds %g at element %zu (the weights must be finite)",
                             path, e->hf, (double)tmp[k], k);
        if (rc) break;
        if (!e->ours[0]) {
            for (size_t k = 0; k < have; k++)
                if (tmp[k] != 0) {
                    rc = tr_errf(err, errlen,
                                 "%s: '%s' is not zero but the recipe's model has no "
                                 "such bias (set bias = true)",
                                 path, e->hf);
                    break;
                }
            continue;
        }
        int pi = -1;
        for (int k = 0; k < np; k++)
            if (!strcmp(tr_model_param(m, k)->name, e->ours)) pi = k;
        if (pi < 0 && !holds_all) continue; /* another pipeline stage's tensor */
        if (pi < 0) {
            rc = tr_errf(err, errlen, "internal: no parameter '%s'", e->ours);
            break;
        }
        const tr_param *p = tr_model_param(m, pi);
        size_t gnumel = (size_t)p->gshape[0] * (size_t)p->gshape[1]; /* the global tensor */
        if (!full[pi]) full[pi] = calloc(gnumel, sizeof(float));
        if (!full[pi]) {
            rc = tr_errf(err, errlen, "out of memory importing '%s'", e->hf);
            break;
        }
        float *dst = full[pi] + (size_t)e->row0 * (size_t)cols;
        if (e->transpose) {
            for (long r = 0; r < e->rows; r++)
                for (long k = 0; k < cols; k++)
                    dst[(size_t)r * (size_t)cols + (size_t)k] = tmp[(size_t)k * (size_t)e->rows + (size_t)r];
        } else {
            memcpy(dst, tmp, (size_t)e->rows * (size_t)cols * sizeof(float)); /* wpe: first rows */
        }
    }
    for (int i = 0; i < np && !rc; i++)
        if (!full[i])
            rc = tr_errf(err, errlen, "%s: nothing in the file maps to parameter '%s'", path,
                         tr_model_param(m, i)->name);
    if (!rc) /* this process's part of each global tensor */
        for (int i = 0; i < np; i++) tr_model_set_param_global(m, i, full[i]);
    for (int i = 0; i < np; i++) free(full[i]);
    free(full);
    free(tmp);
    free(l.m);
    tr_st_close(&sf);
    return rc;
}

/* ---- `trainer export` -------------------------------------------------------------------------- */

static const char *export_help =
    "usage: trainer export CKPT --format hf --out DIR\n"
    "\n"
    "Write a Hugging Face model folder (config.json + model.safetensors) from a checkpoint:\n"
    "GPT2LMHeadModel for GPT-2-shaped models (learned positions, LayerNorm, GELU), and\n"
    "LlamaForCausalLM for Llama-shaped ones (rope, RMSNorm, SwiGLU, no biases), with the\n"
    "run's tokenizer beside them for AutoTokenizer (gpt2: vocab.json, merges.txt,\n"
    "tokenizer_config.json, special_tokens_map.json; byte: tokenizer.json, a byte-level BPE\n"
    "of 256 symbols without merges, and tokenizer_config.json). A vocabulary padded beyond\n"
    "the tokenizer's (GPT-2's 50257 to 50304) is exported at the tokenizer's size: the\n"
    "padding rows, ids no text encodes to, are left out (init = hf puts them back as zeros).\n"
    "\n"
    "  CKPT          a checkpoint folder (OUT/checkpoints/step_NNNNNNNN) or a run folder (the\n"
    "                checkpoint its checkpoints/latest names)\n"
    "  --format hf   the output format (only hf today)\n"
    "  --out DIR     the folder to write\n";

int tr_cmd_export(int argc, char **argv) {
    const char *ckpt = NULL, *format = NULL, *out = NULL;
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(export_help, stdout);
            return 0;
        }
        if (!strcmp(a, "--format") || !strcmp(a, "--out")) {
            if (i + 1 >= argc) {
                fprintf(stderr, "trainer export: %s needs a value (see trainer export --help)\n", a);
                return 2;
            }
            if (a[2] == 'f')
                format = argv[++i];
            else
                out = argv[++i];
        } else if (a[0] == '-') {
            fprintf(stderr, "trainer export: unknown option '%s' (see trainer export --help)\n", a);
            return 2;
        } else if (!ckpt) {
            ckpt = a;
        } else {
            fprintf(stderr, "trainer export: unexpected argument '%s' (one checkpoint only)\n", a);
            return 2;
        }
    }
    if (!ckpt || !out) {
        fprintf(stderr, "trainer export: %s (see trainer export --help)\n",
                !ckpt ? "no checkpoint given" : "--out DIR is required");
        return 2;
    }
    if (!format || strcmp(format, "hf")) {
        fprintf(stderr, "trainer export: --format must be hf, got '%s'\n", format ? format : "");
        return 2;
    }
    char err[1024];
    tr_ckpt c;
    if (tr_ckpt_open_arg(ckpt, &c, 0, stderr, err, sizeof(err))) {
        fprintf(stderr, "trainer export: %s\n", err);
        return 1;
    }
    tr_recipe r;
    char chunk[TR_PATH_MAX + 32];
    snprintf(chunk, sizeof(chunk), "%s/manifest.yaml", c.dir);
    if (tr_recipe_load_string(&r, c.recipe, chunk, ".", NULL, 0, err, sizeof(err))) {
        fprintf(stderr, "trainer export: the checkpoint's recipe: %s\n", err);
        tr_ckpt_free(&c);
        return 1;
    }
    tr_tokenizer *tok = NULL;
    int rc = tr_tokenizer_open(&tok, r.data.tokenizer, r.data.encoder, r.data.merges, err,
                               sizeof(err));
    int vocab = rc ? 0 : tr_tokenizer_vocab(tok);
    tr_tokenizer_free(tok);
    const char *names = "";
    if (!rc) rc = tr_hf_export(&c, &r.model, vocab, out, err, sizeof(err));
    if (!rc) rc = tr_hf_export_tokenizer(&r.data, r.model.seq_len, out, &names, err, sizeof(err));
    char rows[128] = "";
    if (vocab < r.model.vocab)
        snprintf(rows, sizeof(rows), "; vocabulary %d of the model's %d: the padding rows left out",
                 vocab, r.model.vocab);
    if (rc)
        fprintf(stderr, "trainer export: %s\n", err);
    else
        printf("wrote %s/config.json, model.safetensors and the %s tokenizer (%s) (%s, step %ld "
               "of %s%s)\n",
               out, r.data.tokenizer == TR_TOKENIZER_GPT2 ? "gpt2" : "byte", names,
               tr_hf_arch(&r.model, NULL, err, sizeof(err)), c.step, c.dir, rows);
    tr_recipe_free(&r);
    tr_ckpt_free(&c);
    return rc ? 1 : 0;
}
