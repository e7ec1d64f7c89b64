/* The resolved recipe written back as Lua (tr_recipe_write_lua): every default and override
 * made explicit, paths made absolute, numbers in the shortest form that reads back exactly, so
 * that the file loads to the same structs. Saved as OUT/recipe.lua and in every checkpoint. */
/* realpath() is XSI, not plain POSIX. */
#define _XOPEN_SOURCE 700
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dsl/recipe_private.h"

/* Shortest "%.Ng" that reads back as the same float: exact like "%.9g", but 1e-05, not
 * 9.99999975e-06. */
static void put_float(FILE *f, float v) {
    char buf[40];
    for (int p = 6; p <= 9; p++) {
        snprintf(buf, sizeof buf, "%.*g", p, (double)v);
        if ((float)strtod(buf, NULL) == v) break;
    }
    fputs(buf, f);
}

static void put_double(FILE *f, double v) {
    char buf[40];
    for (int p = 15; p <= 17; p++) {
        snprintf(buf, sizeof buf, "%.*g", p, v);
        if (strtod(buf, NULL) == v) break;
    }
    fputs(buf, f);
}

/* A Lua string literal: quotes, backslashes and control bytes escaped (\ddd is 3 digits so a
 * following digit is never read as part of it). */
static void put_string(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\')
            fprintf(f, "\\%c", ch);
        else if (ch == '\n')
            fputs("\\n", f);
        else if (ch < 32 || ch == 127)
            fprintf(f, "\\%03d", ch);
        else
            fputc(ch, f);
    }
    fputc('"', f);
}

static const char *lua_bool(int b) {
    return b ? "true" : "false";
}

static void put_node(FILE *f, const tr_node *n, int depth) {
    fprintf(f, "%*s%s {", 2 * depth, "", tr_node_kind_name(n->kind));
    switch (n->kind) {
    case TR_NODE_STACK:
    case TR_NODE_RESIDUAL:
        if (n->kind == TR_NODE_STACK) fprintf(f, " n = %d,", n->repeat);
        fputc('\n', f);
        for (int i = 0; i < n->n_children; i++)
            put_node(f, &n->children[i], depth + 1);
        fprintf(f, "%*s},\n", 2 * depth, "");
        return;
    case TR_NODE_ROPE:
        fputs(" theta = ", f);
        put_float(f, n->rope_theta);
        break;
    case TR_NODE_LAYERNORM:
        fputs(" eps = ", f);
        put_float(f, n->eps);
        fprintf(f, ", bias = %s", lua_bool(n->bias));
        break;
    case TR_NODE_RMSNORM:
        fputs(" eps = ", f);
        put_float(f, n->eps);
        break;
    case TR_NODE_ATTENTION:
        fprintf(f, " heads = %d, kv_heads = %d, bias = %s", n->heads, n->kv_heads,
                lua_bool(n->bias));
        break;
    case TR_NODE_MLP:
        fprintf(f, " hidden = %d, activation = \"%s\", bias = %s", n->hidden,
                dsl_activation_names[n->activation == TR_ACT_SWIGLU], lua_bool(n->bias));
        break;
    case TR_NODE_LM_HEAD:
        fprintf(f, " tied = %s", lua_bool(n->tied));
        break;
    default:
        break;
    }
    fputs(n->kind == TR_NODE_EMBEDDING || n->kind == TR_NODE_POSITIONS ? "},\n" : " },\n", f);
}

void tr_recipe_abs_path(const char *path, char *out, size_t len) {
    char *real = realpath(path, NULL);
    char cwd[TR_PATH_MAX], joined[2 * TR_PATH_MAX + 2];
    const char *use = path;
    if (real && strlen(real) < TR_PATH_MAX) {
        use = real;
    } else if (path[0] != '/' && getcwd(cwd, sizeof cwd)) {
        snprintf(joined, sizeof joined, "%s/%s", cwd, path);
        if (strlen(joined) < TR_PATH_MAX) use = joined;
    }
    snprintf(out, len, "%s", use);
    free(real);
}

/* The corpus as an absolute path, so the saved recipe loads from any folder. */
static void put_data_path(FILE *f, const char *text) {
    char abs[TR_PATH_MAX];
    tr_recipe_abs_path(text, abs, sizeof abs);
    put_string(f, abs);
}

/* ", name = { a, b, ... }", or ", name = \"auto\"" for an empty list */
static void put_list_auto(FILE *f, const char *name, const int *v, int n) {
    if (n <= 0) {
        fprintf(f, ", %s = \"auto\"", name);
        return;
    }
    fprintf(f, ", %s = {", name);
    for (int i = 0; i < n; i++)
        fprintf(f, "%s%d", i ? ", " : " ", v[i]);
    fputs(" }", f);
}

static void put_int_auto(FILE *f, const char *sep, const char *name, int v, int is_set) {
    if (is_set)
        fprintf(f, "%s%s = %d", sep, name, v);
    else
        fprintf(f, "%s%s = \"auto\"", sep, name);
}

/* parallel "auto", or every field with its value or "auto". */
static void put_parallel(FILE *f, const tr_parallel_desc *p) {
    if (p->is_auto) {
        fputs("parallel \"auto\"\n", f);
        return;
    }
    const char *names[4] = {"dp", "tp", "pp", "zero"};
    int vals[4] = {p->dp, p->tp, p->pp, p->zero};
    fputs("parallel {", f);
    for (int i = 0; i < 4; i++)
        put_int_auto(f, i ? ", " : " ", names[i], vals[i], vals[i] >= 0);
    fprintf(f, ", sequence_parallel = %s",
            p->sequence_parallel < 0 ? "\"auto\"" : lua_bool(p->sequence_parallel));
    put_int_auto(f, ", ", "bucket_kb", p->bucket_kb, p->bucket_kb > 0);
    int sched = p->schedule >= 0 && p->schedule <= 4 ? p->schedule : -1; /* zb-v: 4 */
    fprintf(f, ",\n           schedule = \"%s\"",
            sched < 0 ? "auto" : dsl_pp_schedule_names[sched]);
    put_int_auto(f, ", ", "microbatches", p->microbatches, p->microbatches > 0);
    put_int_auto(f, ", ", "virtual_stages", p->virtual_stages, p->virtual_stages > 0);
    put_list_auto(f, "stages", p->stages, p->n_stages);
    put_list_auto(f, "dp_shares", p->dp_shares, p->n_dp_shares);
    if (p->private_gradients >= 0)
        fprintf(f, ", private_gradients = %s", lua_bool(p->private_gradients));
    fputs(" }\n", f);
}

int tr_recipe_write_lua(const tr_recipe *r, FILE *f) {
    fputs("-- The fully resolved recipe of this run, written by trainer from ", f);
    put_string(f, r->path);
    fputs(".\n-- Loading it again gives the same model and settings.\n", f);
    if (r->n_knobs > 0) fputs("-- knobs (\"--set\" marks a value given on the command line):\n", f);
    for (int i = 0; i < r->n_knobs; i++) {
        const tr_knob *k = &r->knobs[i];
        fprintf(f, "--   %s = ", k->name);
        if (k->type == TR_KNOB_NUMBER)
            put_double(f, k->number);
        else if (k->type == TR_KNOB_BOOL)
            fputs(lua_bool(k->boolean), f);
        else
            put_string(f, k->string);
        fputs(k->overridden ? "  (--set)\n" : "\n", f);
    }
    const tr_model_desc *m = &r->model;
    fprintf(f, "\nmodel {\n  vocab = %d, dim = %d, seq_len = %d,\n", m->vocab, m->dim, m->seq_len);
    for (int i = 0; i < m->root.n_children; i++)
        put_node(f, &m->root.children[i], 1);
    fputs("}\n\n", f);

    const tr_data_desc *d = &r->data;
    fputs("data { ", f);
    if (d->text[0]) {
        fputs("text = ", f);
        put_data_path(f, d->text);
        fputs(", val_fraction = ", f);
        put_float(f, d->val_fraction);
    } else if (d->n_mix > 0) {
        fputs("mix = {", f);
        for (int i = 0; i < d->n_mix; i++) {
            fputs(i ? ", { shards = " : " { shards = ", f);
            put_data_path(f, d->mix[i].shards);
            fputs(", weight = ", f);
            put_float(f, d->mix[i].weight);
            fputs(" }", f);
        }
        fputs(" }", f);
    } else {
        fputs("shards = ", f);
        put_data_path(f, d->shards);
    }
    if (d->val_shards[0]) {
        fputs(", val_shards = ", f);
        put_data_path(f, d->val_shards);
    }
    int tk = d->tokenizer == TR_TOKENIZER_GPT2 ? 1 : 0;
    fprintf(f, ",\n       tokenizer = \"%s\"", dsl_tokenizer_names[tk]);
    if (tk) {
        fputs(", encoder = ", f);
        put_data_path(f, d->encoder);
        fputs(", merges = ", f);
        put_data_path(f, d->merges);
    }
    fputs(" }\n", f);

    const tr_optim_desc *o = &r->optim;
    fputs("optimizer { lr = ", f);
    put_float(f, o->lr);
    fputs(", betas = { ", f);
    put_float(f, o->beta1);
    fputs(", ", f);
    put_float(f, o->beta2);
    fputs(" }, eps = ", f);
    put_float(f, o->eps);
    fputs(", weight_decay = ", f);
    put_float(f, o->weight_decay);
    fputs(", grad_clip = ", f);
    put_float(f, o->grad_clip);
    fputs(" }\n", f);

    const tr_schedule_desc *s = &r->schedule;
    int decay = s->decay >= TR_DECAY_COSINE && s->decay <= TR_DECAY_WSD ? (int)s->decay : 0;
    fprintf(f, "schedule { warmup = %d, decay = \"%s\", min_lr = ", s->warmup,
            dsl_decay_names[decay]);
    put_float(f, s->min_lr);
    fputs(", decay_frac = ", f);
    put_float(f, s->decay_frac);
    fputs(" }\n", f);

    const tr_train_desc *t = &r->train;
    fprintf(f, "train { batch_tokens = %ld, micro_batch = ", t->batch_tokens);
    if (t->micro_batch)
        fprintf(f, "%d", t->micro_batch);
    else
        fputs("\"auto\"", f);
    fprintf(f, ", steps = %d, eval_every = %d, eval_tokens = %ld,\n        seed = %llu, out = ",
            t->steps, t->eval_every, t->eval_tokens, t->seed);
    put_string(f, t->out);
    fprintf(f,
            ", sample_tokens = %d, log_every = %d,\n        checkpoint_every = %d, "
            "keep_checkpoints = %d,",
            t->sample_tokens, t->log_every, t->checkpoint_every, t->keep_checkpoints);
    fprintf(f, " precision = \"%s\", recompute = ", dsl_precision_names[t->precision]);
    if (t->n_stage_recompute) { /* one level per pipeline rank */
        for (int k = 0; k < t->n_stage_recompute; k++)
            fprintf(f, "%s\"%s\"", k ? ", " : "{ ", tr_recompute_name(t->stage_recompute[k]));
        fputs(" }", f);
    } else {
        fprintf(f, "\"%s\"", tr_recompute_name(t->recompute));
    }
    fprintf(f, ", peak_tflops = %.17g,\n", t->peak_tflops);
    const tr_guard_desc *g = &t->guard;
    if (g->on) {
        fprintf(f, "        guard = { window = %d, z_loss = ", g->window);
        put_float(f, g->z_loss);
        fputs(", norm_ratio = ", f);
        put_float(f, g->norm_ratio);
        fprintf(f, ", warmup = %d, max_bad = %d } }\n", g->warmup, g->max_bad);
    } else {
        fputs("        guard = false }\n", f);
    }
    if (r->init_hf[0]) {
        fputs("init = hf ", f);
        put_data_path(f, r->init_hf);
        fputs("\n", f);
    }

    const tr_eval_desc *e = &r->eval;
    if (e->n_tasks) {
        fputs("eval { tasks = {", f);
        for (int i = 0; i < e->n_tasks; i++) {
            fputs(i ? ", " : " ", f);
            put_data_path(f, e->tasks[i]);
        }
        fputs(" }", f);
        if (e->every) fprintf(f, ", every = %d", e->every);
        if (e->max_examples) fprintf(f, ", max_examples = %ld", e->max_examples);
        fputs(" }\n", f);
    }

    put_parallel(f, &r->parallel);
    return ferror(f) ? -1 : 0;
}

char *tr_recipe_text(const tr_recipe *r, size_t *len) {
    char *text = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&text, &n);
    if (!f) return NULL;
    int bad = tr_recipe_write_lua(r, f);
    if (fclose(f) || bad) {
        free(text);
        return NULL;
    }
    if (len) *len = n;
    return text;
}
