/* The recipe DSL: runs a Lua recipe once in a sandboxed state (capped memory and instructions,
 * no io/os/require/bytecode) and copies what it declares into the structs of dsl/recipe.h.
 * Every field is checked against a schema; every mistake is one line `recipe.lua:LINE: msg`.
 * This file loads (defaults, the run, what only the whole recipe can check) and frees; see
 * recipe_private.h for the other files of the DSL. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsl/recipe_private.h"

#define FILE_LIMIT ((size_t)16 << 20) /* a recipe of this many bytes or more is refused */

const char *const dsl_kind_names[TR_NODE_KIND_COUNT] = {
    "model",     "stack",   "residual",  "embedding", "positions", "rope",
    "layernorm", "rmsnorm", "attention", "mlp",       "lm_head"};
const char *const dsl_activation_names[] = {"gelu", "swiglu", NULL};
const char *const dsl_tokenizer_names[] = {"byte", "gpt2", NULL};
const char *const dsl_decay_names[] = {"cosine", "linear", "constant", "wsd", NULL};
const char *const dsl_precision_names[] = {"bf16", "fp32", NULL};
const char *const dsl_recompute_names[] = {"none", "selective", "full", "auto", NULL};
/* in the order of tr_pp_kind (parallel/schedule.h) */
const char *const dsl_pp_schedule_names[] = {"gpipe", "1f1b", "interleaved", "zb-h1", "zb-v", NULL};

const char *tr_node_kind_name(tr_node_kind k) {
    return (k >= 0 && k < TR_NODE_KIND_COUNT) ? dsl_kind_names[k] : "?";
}

const char *tr_recompute_name(int level) {
    return dsl_recompute_names[level >= 0 && level <= 2 ? level : 3];
}

/* What is only known once the whole recipe ran: missing sections and cross-section values. */
static int finish(recipe_ctx *c, char *err, size_t errlen) {
    tr_recipe *r = &c->r;
    if (!c->model_line) return tr_errf(err, errlen, "%s: no model { ... } declared", c->chunk);
    if (!c->data_line) return tr_errf(err, errlen, "%s: no data { ... } declared", c->chunk);
    if (!c->train_line) return tr_errf(err, errlen, "%s: no train { ... } declared", c->chunk);
    for (int i = 0; i < c->n_sets; i++) /* knobs { } and train { } took the others */
        if (c->set_target[i] == SET_FREE)
            return tr_errf(
                err, errlen,
                "%s: --set %s: the recipe declares no knobs, and train has no field '%s' "
                "(fields: %s)",
                c->chunk, c->sets[i].name, c->sets[i].name, dsl_train_field_list());
    if (r->train.batch_tokens % r->model.seq_len != 0)
        return tr_errf(
            err, errlen,
            "%s:%d: train: batch_tokens (%ld) must be a multiple of the model's seq_len (%d)",
            c->chunk, c->train_line, r->train.batch_tokens, r->model.seq_len);
    if (r->data.tokenizer == TR_TOKENIZER_GPT2 && r->model.vocab < 50257)
        return tr_errf(err, errlen,
                       "%s:%d: data: the gpt2 tokenizer has 50257 tokens but model.vocab is %d",
                       c->chunk, c->data_line, r->model.vocab);
    if (!c->min_lr_set)
        r->schedule.min_lr = 0.1f * r->optim.lr;
    else if (r->schedule.min_lr > r->optim.lr) /* the "decay" would raise the rate */
        return tr_errf(err, errlen,
                       "%s:%d: schedule: min_lr (%g) must not exceed optimizer.lr (%g)", c->chunk,
                       c->sched_line, (double)r->schedule.min_lr, (double)r->optim.lr);
    return 0;
}

static int load_text(tr_recipe *out, const char *text, size_t len, const char *chunk,
                     const char *basedir, const tr_knob_set *sets, int n_sets, char *err,
                     size_t errlen) {
    recipe_ctx *c = calloc(1, sizeof *c); /* ~20 KiB of message scratch: keep it off the stack */
    if (!c) return tr_errf(err, errlen, "%s: out of memory", chunk);
    int rc = -1;
    c->chunk = chunk;
    c->basedir = basedir;
    c->sets = sets;
    c->n_sets = sets ? n_sets : 0;
    const char *slash = strrchr(chunk, '/');
    const char *base = slash ? slash + 1 : chunk;
    size_t stem = strlen(base);
    if (stem > 4 && strcmp(base + stem - 4, ".lua") == 0) stem -= 4;
    if (stem == 0 || stem >= sizeof c->stem)
        snprintf(c->stem, sizeof c->stem, "recipe");
    else
        snprintf(c->stem, sizeof c->stem, "%.*s", (int)stem, base);

    tr_recipe *r = &c->r;
    snprintf(r->path, sizeof r->path, "%s", chunk);
    r->data.tokenizer = TR_TOKENIZER_BYTE;
    r->data.val_fraction = 0.1f;
    r->optim = (tr_optim_desc){.lr = 3e-4f,
                               .beta1 = 0.9f,
                               .beta2 = 0.95f,
                               .eps = 1e-8f,
                               .weight_decay = 0.1f,
                               .grad_clip = 1.0f};
    r->schedule = (tr_schedule_desc){.warmup = 0, .decay = TR_DECAY_COSINE, .decay_frac = 0.2f};
    r->parallel = (tr_parallel_desc){.is_auto = 1,
                                     .dp = -1,
                                     .tp = -1,
                                     .pp = -1,
                                     .zero = -1,
                                     .sequence_parallel = -1,
                                     .schedule = -1,
                                     .private_gradients = -1};

    if (c->n_sets > TR_MAX_SETS) {
        tr_errf(err, errlen, "%s: more than %d --set options", chunk, TR_MAX_SETS);
        goto done;
    }
    if (strlen(chunk) >= TR_PATH_MAX) {
        tr_errf(err, errlen, "%.64s...: recipe path is longer than %d bytes", chunk,
                TR_PATH_MAX - 1);
        goto done;
    }
    if (len > 0 && text[0] == LUA_SIGNATURE[0]) {
        tr_errf(err, errlen, "%s: binary (precompiled) recipes are not allowed", chunk);
        goto done;
    }
    if (dsl_run(c, text, len, err, errlen)) goto done;
    rc = finish(c, err, errlen);
done:
    if (rc == 0) {
        *out = c->r;
    } else {
        tr_recipe_free(&c->r);
    }
    free(c);
    return rc;
}

static void clear_out(tr_recipe *out, char *err, size_t errlen) {
    if (out) memset(out, 0, sizeof *out);
    if (err && errlen) err[0] = 0;
}

int tr_recipe_load_string(tr_recipe *out, const char *text, const char *chunkname,
                          const char *basedir, const tr_knob_set *sets, int n_sets, char *err,
                          size_t errlen) {
    clear_out(out, err, errlen);
    return load_text(out, text, strlen(text), chunkname ? chunkname : "recipe", basedir, sets,
                     n_sets, err, errlen);
}

int tr_recipe_load(tr_recipe *out, const char *path, const tr_knob_set *sets, int n_sets, char *err,
                   size_t errlen) {
    clear_out(out, err, errlen);
    FILE *f = fopen(path, "rb");
    if (!f) return tr_errf(err, errlen, "%s: cannot read recipe: %s", path, strerror(errno));
    char *text;
    size_t len;
    int rc = tr_read_all(f, FILE_LIMIT - 1, &text, &len), e = errno;
    fclose(f);
    if (rc && e == EFBIG)
        return tr_errf(err, errlen, "%s: cannot read recipe: larger than %zu MiB", path,
                       FILE_LIMIT >> 20);
    if (rc)
        return tr_errf(err, errlen, "%s: cannot read recipe: %s", path,
                       e == ENOMEM ? "out of memory" : strerror(e));
    char dir[TR_PATH_MAX];
    const char *slash = strrchr(path, '/');
    if (!slash)
        snprintf(dir, sizeof dir, ".");
    else if (slash == path)
        snprintf(dir, sizeof dir, "/");
    else
        snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path);
    rc = load_text(out, text, len, path, dir, sets, n_sets, err, errlen);
    free(text);
    return rc;
}

int tr_knob_set_parse(tr_knob_set *out, const char *arg, char *err, size_t errlen) {
    memset(out, 0, sizeof *out);
    const char *eq = strchr(arg, '=');
    if (!eq) return tr_errf(err, errlen, "--set %s: expected name=value, as in --set lr=1e-3", arg);
    size_t n = (size_t)(eq - arg);
    if (n == 0) return tr_errf(err, errlen, "--set %s: the knob name before '=' is empty", arg);
    if (n >= sizeof out->name)
        return tr_errf(err, errlen, "--set %.*s: knob name is longer than %zu bytes", (int)n, arg,
                       sizeof out->name - 1);
    if (strlen(eq + 1) >= sizeof out->value)
        return tr_errf(err, errlen, "--set %.*s: value is longer than %zu bytes", (int)n, arg,
                       sizeof out->value - 1);
    memcpy(out->name, arg, n);
    out->name[n] = 0;
    memcpy(out->value, eq + 1, strlen(eq + 1) + 1);
    return 0;
}

void tr_recipe_free(tr_recipe *r) {
    if (r) dsl_free_node(&r->model.root);
}
