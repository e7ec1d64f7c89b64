/* The recipe's sections: knobs { } (the tunable values and their --set overrides), data,
 * optimizer, schedule, train and parallel { }, `init = hf "DIR"`, eval { } (tasks scored
 * during training), and sweep { } (the experiment `trainer sweep` runs, ignored by the
 * other commands). Each may appear once;
 * its fields are read through the schema (recipe_schema.c). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsl/recipe_private.h"

/* ---- sections ----------------------------------------------------------------------------- */

static int section_start(lua_State *L, int *line_slot, const char *name) {
    if (dsl_ctx(L)->done)
        dsl_raise_at(L, 0, "%s: called after the recipe finished (from a __gc finalizer?)", name);
    int line = dsl_caller_line(L, NULL);
    if (*line_slot)
        dsl_raise_at(L, line, "%s: declared twice (first at line %d)", name, *line_slot);
    return line;
}

static const field_spec data_fields[] = {
    {"text", FK_STR, OPT, 0, 0, 0, 0, NULL},
    {"tokenizer", FK_ENUM, OPT, 0, 0, 0, 0, dsl_tokenizer_names},
    {"val_fraction", FK_NUM, OPT, LO_GT, 0, HI_LE, 0.5, NULL},
    {"shards", FK_STR, OPT, 0, 0, 0, 0, NULL},
    {"val_shards", FK_STR, OPT, 0, 0, 0, 0, NULL},
    {"mix", FK_TABLE, OPT, 0, 0, 0, 0, NULL},
    {"encoder", FK_STR, OPT, 0, 0, 0, 0, NULL},
    {"merges", FK_STR, OPT, 0, 0, 0, 0, NULL}};
enum {
    D_TEXT,
    D_TOKENIZER,
    D_VAL_FRACTION,
    D_SHARDS,
    D_VAL_SHARDS,
    D_MIX,
    D_ENCODER,
    D_MERGES,
    D_COUNT
};

static const field_spec mix_fields[] = {{"shards", FK_STR, REQ, 0, 0, 0, 0, NULL},
                                        {"weight", FK_NUM, REQ, LO_GT, 0, HI_NONE, 0, NULL}};

#ifndef TR_DATA_DIR
#define TR_DATA_DIR "data"
#endif

/* A data path as written in the recipe, resolved against the recipe's folder. */
static void resolve_path(lua_State *L, char *dst, size_t cap, const char *src, const char *what) {
    const char *base = dsl_ctx(L)->basedir;
    int n;
    if (src[0] == '/' || !base || !base[0] || strcmp(base, ".") == 0)
        n = snprintf(dst, cap, "%s", src);
    else
        n = snprintf(dst, cap, "%s%s%s", base, base[strlen(base) - 1] == '/' ? "" : "/", src);
    if (n < 0 || (size_t)n >= cap)
        dsl_raise_at(L, 0, "data: the path of '%s' is longer than %zu bytes", what, cap - 1);
}

/* mix = { { shards = "...", weight = w }, ... }: the table is field `mix` of argument 1. */
static void read_mix(lua_State *L, tr_data_desc *d) {
    lua_getfield(L, 1, "mix");
    int idx = lua_gettop(L);
    lua_Integer len = (lua_Integer)lua_rawlen(L, idx);
    int count = 0;
    lua_pushnil(L);
    while (lua_next(L, idx)) {
        count++;
        int ok = lua_type(L, -2) == LUA_TNUMBER && lua_isinteger(L, -2) &&
                 lua_tointeger(L, -2) >= 1 && lua_tointeger(L, -2) <= len;
        lua_pop(L, 1);
        if (!ok)
            dsl_raise_at(L, 0,
                         "data: 'mix' must be a list of { shards = \"...\", weight = w }, "
                         "without named fields or gaps");
    }
    if (count == 0 || count != len)
        dsl_raise_at(L, 0, "data: 'mix' needs at least one { shards = \"...\", weight = w }");
    if (count > TR_MAX_MIX)
        dsl_raise_at(L, 0, "data: 'mix' has %d sources; at most %d are supported", count,
                     TR_MAX_MIX);
    for (int k = 1; k <= count; k++) {
        char ctor[32];
        snprintf(ctor, sizeof ctor, "data: mix[%d]", k);
        lua_rawgeti(L, idx, k);
        int e = lua_gettop(L);
        if (lua_type(L, e) != LUA_TTABLE)
            dsl_raise_at(L, 0, "%s: expected a table { shards = \"...\", weight = w }, got %s",
                         ctor, dsl_type_word(L, e));
        lua_pushnil(L);
        while (lua_next(L, e)) {
            const char *key = lua_type(L, -2) == LUA_TSTRING ? lua_tostring(L, -2) : NULL;
            if (!key || (strcmp(key, "shards") != 0 && strcmp(key, "weight") != 0))
                dsl_raise_at(L, 0, "%s: unknown field '%s' (fields: shards, weight)", ctor,
                             key ? key : dsl_type_word(L, -2));
            lua_pop(L, 1);
        }
        field_val v[2];
        for (int f = 0; f < 2; f++) {
            memset(&v[f], 0, sizeof v[f]);
            lua_getfield(L, e, mix_fields[f].name);
            if (lua_isnil(L, -1))
                dsl_raise_at(L, 0, "%s: field '%s' is required", ctor, mix_fields[f].name);
            dsl_read_value(L, ctor, &mix_fields[f], &v[f]);
            if (f == 0)
                resolve_path(L, d->mix[k - 1].shards, sizeof d->mix[k - 1].shards, v[0].s,
                             "shards");
            lua_pop(L, 1);
        }
        d->mix[k - 1].weight = (float)v[1].n;
        lua_pop(L, 1);
    }
    d->n_mix = count;
    lua_pop(L, 1);
}

static int l_data(lua_State *L) {
    recipe_ctx *c = dsl_ctx(L);
    int line = section_start(L, &c->data_line, "data");
    field_val v[D_COUNT];
    dsl_read_fields(L, "data", data_fields, D_COUNT, v, NULL, NULL);
    tr_data_desc *d = &c->r.data;
    int sources = v[D_TEXT].present + v[D_SHARDS].present + v[D_MIX].present;
    if (sources == 0) dsl_raise_at(L, 0, "data: one of 'text', 'shards' or 'mix' is required");
    if (sources > 1) dsl_raise_at(L, 0, "data: give only one of 'text', 'shards' and 'mix'");
    d->tokenizer =
        v[D_TOKENIZER].present ? (tr_tokenizer_kind)v[D_TOKENIZER].choice : TR_TOKENIZER_BYTE;
    if (v[D_TEXT].present && v[D_VAL_SHARDS].present)
        dsl_raise_at(L, 0,
                     "data: 'val_shards' goes with 'shards' or 'mix'; a 'text' corpus is "
                     "split by val_fraction");
    if (!v[D_TEXT].present && v[D_VAL_FRACTION].present)
        dsl_raise_at(L, 0, "data: 'val_fraction' goes with 'text'; shards take 'val_shards'");
    if (d->tokenizer != TR_TOKENIZER_GPT2 && (v[D_ENCODER].present || v[D_MERGES].present))
        dsl_raise_at(L, 0, "data: '%s' goes with tokenizer = \"gpt2\"",
                     v[D_ENCODER].present ? "encoder" : "merges");
    if (v[D_TEXT].present) resolve_path(L, d->text, sizeof d->text, v[D_TEXT].s, "text");
    if (v[D_SHARDS].present) resolve_path(L, d->shards, sizeof d->shards, v[D_SHARDS].s, "shards");
    if (v[D_VAL_SHARDS].present)
        resolve_path(L, d->val_shards, sizeof d->val_shards, v[D_VAL_SHARDS].s, "val_shards");
    if (v[D_MIX].present) read_mix(L, d);
    if (d->tokenizer == TR_TOKENIZER_GPT2) {
        if (v[D_ENCODER].present)
            resolve_path(L, d->encoder, sizeof d->encoder, v[D_ENCODER].s, "encoder");
        else
            snprintf(d->encoder, sizeof d->encoder, "%s", TR_DATA_DIR "/gpt2/encoder.json");
        if (v[D_MERGES].present)
            resolve_path(L, d->merges, sizeof d->merges, v[D_MERGES].s, "merges");
        else
            snprintf(d->merges, sizeof d->merges, "%s", TR_DATA_DIR "/gpt2/vocab.bpe");
    }
    d->val_fraction = v[D_VAL_FRACTION].present ? (float)v[D_VAL_FRACTION].n : 0.1f;
    c->data_line = line;
    return 0;
}

static const field_spec optimizer_fields[] = {
    {"lr", FK_NUM, OPT, LO_GT, 0, HI_NONE, 0, NULL},
    {"betas", FK_PAIR, OPT, LO_GE, 0, HI_LT, 1, NULL},
    {"eps", FK_NUM, OPT, LO_GT, 0, HI_NONE, 0, NULL},
    {"weight_decay", FK_NUM, OPT, LO_GE, 0, HI_NONE, 0, NULL},
    {"grad_clip", FK_NUM, OPT, LO_GE, 0, HI_NONE, 0, NULL}};

static int l_optimizer(lua_State *L) {
    recipe_ctx *c = dsl_ctx(L);
    int line = section_start(L, &c->optim_line, "optimizer");
    field_val v[5];
    dsl_read_fields(L, "optimizer", optimizer_fields, 5, v, NULL, NULL);
    tr_optim_desc *o = &c->r.optim;
    if (v[0].present) o->lr = (float)v[0].n;
    if (v[1].present) {
        o->beta1 = (float)v[1].pair[0];
        o->beta2 = (float)v[1].pair[1];
    }
    if (v[2].present) o->eps = (float)v[2].n;
    if (v[3].present) o->weight_decay = (float)v[3].n;
    if (v[4].present) o->grad_clip = (float)v[4].n;
    c->optim_line = line;
    return 0;
}

static const field_spec schedule_fields[] = {INT_FIELD("warmup", OPT, 0),
                                             {"decay", FK_ENUM, OPT, 0, 0, 0, 0, dsl_decay_names},
                                             {"min_lr", FK_NUM, OPT, LO_GE, 0, HI_NONE, 0, NULL},
                                             {"decay_frac", FK_NUM, OPT, LO_GT, 0, HI_LE, 1, NULL}};

static int l_schedule(lua_State *L) {
    recipe_ctx *c = dsl_ctx(L);
    int line = section_start(L, &c->sched_line, "schedule");
    field_val v[4];
    dsl_read_fields(L, "schedule", schedule_fields, 4, v, NULL, NULL);
    tr_schedule_desc *s = &c->r.schedule;
    if (v[0].present) s->warmup = (int)v[0].i;
    if (v[1].present) s->decay = (tr_decay_kind)v[1].choice;
    if (v[2].present) {
        s->min_lr = (float)v[2].n;
        c->min_lr_set = 1;
    }
    if (v[3].present) s->decay_frac = (float)v[3].n;
    c->sched_line = line;
    return 0;
}

static const field_spec train_fields[] = {
    {"batch_tokens", FK_INT, REQ, LO_GE, 1, HI_LE, (double)TR_MAX_BATCH_TOKENS, NULL},
    {"micro_batch", FK_INT_AUTO, OPT, LO_GE, 1, HI_LE, INT_MAX, NULL},
    INT_FIELD("steps", REQ, 1),
    INT_FIELD("eval_every", OPT, 0),
    LONG_FIELD("eval_tokens", OPT, 0),
    {"seed", FK_INT, OPT, LO_GE, 0, HI_NONE, 0, NULL},
    {"out", FK_STR, OPT, 0, 0, 0, 0, NULL},
    INT_FIELD_MAX("sample_tokens", OPT, 0, TR_MAX_SAMPLE_TOKENS),
    INT_FIELD("log_every", OPT, 1),
    INT_FIELD("checkpoint_every", OPT, 0),
    INT_FIELD("keep_checkpoints", OPT, 1),
    {"precision", FK_ENUM, OPT, 0, 0, 0, 0, dsl_precision_names},
    {"recompute", FK_ENUM_LIST, OPT, 0, 0, HI_LE, TR_MAX_STAGES, dsl_recompute_names},
    {"peak_tflops", FK_NUM, OPT, LO_GE, 0, HI_NONE, 0, NULL},
    {"guard", FK_TABLE_BOOL, OPT, 0, 0, 0, 0, NULL}};

/* train { recompute = { "full", "none", ... } }: one level per pipeline rank, in order (the
 * schema checked that each is a level's name, not "auto"); the layout checks the count
 * against pp. */
static void read_stage_recompute(lua_State *L, tr_train_desc *t, int n) {
    lua_getfield(L, 1, "recompute");
    t->n_stage_recompute = n;
    t->recompute = 0;
    for (int k = 0; k < n; k++) {
        lua_rawgeti(L, -1, k + 1);
        const char *s = lua_tostring(L, -1);
        int level = 0; /* a level's name: the schema checked it (not "auto") */
        while (level < 2 && strcmp(dsl_recompute_names[level], s)) level++;
        t->stage_recompute[k] = (signed char)level;
        if (level > t->recompute) t->recompute = level;
        lua_pop(L, 1);
    }
    lua_pop(L, 1);
}

static const field_spec guard_fields[] = {{"window", FK_INT, OPT, LO_GE, 2, HI_LE, 10000, NULL},
                                          {"z_loss", FK_NUM, OPT, LO_GT, 0, HI_NONE, 0, NULL},
                                          {"norm_ratio", FK_NUM, OPT, LO_GT, 1, HI_NONE, 0, NULL},
                                          INT_FIELD("warmup", OPT, 0),
                                          {"max_bad", FK_INT, OPT, LO_GE, 1, HI_LE, 1000000, NULL},
                                          /* replaced by norm_ratio: read (older recipes and
                                             checkpoints name it) and said to be unused */
                                          {"z_norm", FK_NUM, OPT, LO_GT, 0, HI_NONE, 0, NULL}};
enum { G_WINDOW, G_Z_LOSS, G_NORM_RATIO, G_WARMUP, G_MAX_BAD, G_Z_NORM, G_COUNT };

/* train { guard = { ... } }: called with the guard table as its only argument, so that the
 * schema reads it like a section's; the fields not given keep their defaults. */
static int l_guard_fields(lua_State *L) {
    tr_guard_desc *g = &dsl_ctx(L)->r.train.guard;
    field_val v[G_COUNT];
    dsl_read_fields(L, "train: guard", guard_fields, G_COUNT, v, NULL, NULL);
    if (v[G_WINDOW].present) g->window = (int)v[G_WINDOW].i;
    if (v[G_Z_LOSS].present) g->z_loss = (float)v[G_Z_LOSS].n;
    if (v[G_NORM_RATIO].present) g->norm_ratio = (float)v[G_NORM_RATIO].n;
    if (v[G_WARMUP].present) g->warmup = (int)v[G_WARMUP].i;
    if (v[G_MAX_BAD].present) g->max_bad = (int)v[G_MAX_BAD].i;
    g->z_norm_unused = v[G_Z_NORM].present;
    return 0;
}

/* The guard's defaults, then what train { guard = ... } says: false turns it off, true or a
 * table of fields keeps it on. The defaults were measured (bench/guard_stats.sh): no healthy run
 * of the shipped recipes skips a step, the divergent ones are caught (README). */
static void read_guard(lua_State *L, tr_guard_desc *g, const field_val *v) {
    *g = (tr_guard_desc){
        .on = 1, .window = 50, .z_loss = 8.0f, .norm_ratio = 20.0f, .warmup = 100, .max_bad = 3};
    if (!v->present) return;
    g->on = v->b;
    if (!v->i) return;
    lua_pushcfunction(L, l_guard_fields);
    lua_pushliteral(L, "guard");
    lua_rawget(L, 1);
    lua_call(L, 1, 0);
}

static const field_spec *train_field(const char *name) {
    for (int i = 0; i < NSPECS(train_fields); i++)
        if (strcmp(train_fields[i].name, name) == 0) return &train_fields[i];
    return NULL;
}

const char *dsl_train_field_list(void) {
    static char list[512];
    const char *names[NSPECS(train_fields)];
    for (int i = 0; i < NSPECS(train_fields); i++)
        names[i] = train_fields[i].name;
    return dsl_sorted_list(list, sizeof list, names, NSPECS(train_fields));
}

/* --set train.NAME=VALUE, and --set NAME=VALUE for a NAME no knob took: written into train's
 * table (argument 1) as the recipe would have written it, checked by the field's schema. */
static void apply_train_sets(lua_State *L, recipe_ctx *c) {
    if (lua_type(L, 1) != LUA_TTABLE) return; /* dsl_read_fields says so */
    for (int i = 0; i < c->n_sets; i++) {
        const tr_knob_set *s = &c->sets[i];
        int prefixed = strncmp(s->name, "train.", 6) == 0;
        const char *name = prefixed ? s->name + 6 : s->name;
        const field_spec *fs = train_field(name);
        if (!prefixed && (c->set_target[i] == SET_KNOB || !fs)) continue;
        if (!fs)
            dsl_raise_at(L, 0, "--set %s: train has no field '%s' (fields: %s)", s->name, name,
                         dsl_train_field_list());
        lua_pushstring(L, name);
        if (fs->kind == FK_STR || fs->kind == FK_ENUM || fs->kind == FK_ENUM_AUTO)
            lua_pushstring(L, s->value);
        else if (strcmp(s->value, "true") == 0 || strcmp(s->value, "false") == 0)
            lua_pushboolean(L, s->value[0] == 't');
        else if (lua_stringtonumber(L, s->value) == 0)
            lua_pushstring(L, s->value);
        char ctor[sizeof s->name + sizeof s->value + 8];
        snprintf(ctor, sizeof ctor, "--set %s=%s", s->name, s->value);
        field_val v;
        memset(&v, 0, sizeof v);
        dsl_read_value(L, ctor, fs, &v);
        lua_rawset(L, 1);
        c->set_target[i] = SET_TRAIN;
    }
}

static int l_train(lua_State *L) {
    recipe_ctx *c = dsl_ctx(L);
    int line = section_start(L, &c->train_line, "train");
    apply_train_sets(L, c);
    field_val v[15];
    dsl_read_fields(L, "train", train_fields, 15, v, NULL, NULL);
    tr_train_desc *t = &c->r.train;
    t->batch_tokens = (long)v[0].i;
    t->micro_batch = v[1].present ? (int)v[1].i : 0;
    t->steps = (int)v[2].i;
    t->eval_every = v[3].present ? (int)v[3].i : 0;
    t->eval_tokens = v[4].present ? (long)v[4].i : 0;
    t->seed = v[5].present ? (unsigned long long)v[5].i : 1337;
    if (v[6].present)
        dsl_copy_field(L, t->out, sizeof t->out, "train", "out", v[6].s);
    else
        snprintf(t->out, sizeof t->out, "runs/%s", c->stem);
    t->sample_tokens = v[7].present ? (int)v[7].i : 200;
    t->log_every = v[8].present ? (int)v[8].i : 10;
    t->checkpoint_every = v[9].present ? (int)v[9].i : 0;
    t->keep_checkpoints = v[10].present ? (int)v[10].i : 3;
    t->precision = v[11].present ? (tr_precision)v[11].choice : TR_PRECISION_BF16;
    /* "auto" (the default, -1): the planner chooses, else "none" */
    t->recompute = v[12].present && !v[12].i && v[12].choice < 3 ? v[12].choice : -1;
    if (v[12].present && v[12].i) read_stage_recompute(L, t, (int)v[12].i);
    t->peak_tflops = v[13].present ? v[13].n : 0;
    read_guard(L, &t->guard, &v[14]);
    c->train_line = line;
    c->r.train_line = line;
    return 0;
}

static const field_spec parallel_fields[] = {
    {"dp", FK_INT_AUTO, OPT, LO_GE, 1, HI_LE, INT_MAX, NULL},
    {"tp", FK_INT_AUTO, OPT, LO_GE, 1, HI_LE, INT_MAX, NULL},
    {"pp", FK_INT_AUTO, OPT, LO_GE, 1, HI_LE, INT_MAX, NULL},
    {"zero", FK_INT_AUTO, OPT, LO_GE, 0, HI_LE, 3, NULL},
    {"sequence_parallel", FK_BOOL_AUTO, OPT, 0, 0, 0, 0, NULL},
    {"bucket_kb", FK_INT_AUTO, OPT, LO_GE, 1, HI_LE, INT_MAX, NULL},
    {"schedule", FK_ENUM_AUTO, OPT, 0, 0, 0, 0, dsl_pp_schedule_names},
    {"microbatches", FK_INT_AUTO, OPT, LO_GE, 1, HI_LE, INT_MAX, NULL},
    {"virtual_stages", FK_INT_AUTO, OPT, LO_GE, 1, HI_LE, TR_MAX_STAGES, NULL},
    {"stages", FK_LIST_AUTO, OPT, LO_GE, 0, HI_LE, TR_MAX_STAGES, NULL},
    {"dp_shares", FK_LIST_AUTO, OPT, LO_GE, 1, HI_LE, TR_MAX_DP_SHARES, NULL},
    {"private_gradients", FK_BOOL_AUTO, OPT, 0, 0, 0, 0, NULL}};
enum {
    P_DP,
    P_TP,
    P_PP,
    P_ZERO,
    P_SP,
    P_BUCKET,
    P_SCHEDULE,
    P_MICROBATCHES,
    P_VIRTUAL,
    P_STAGES,
    P_SHARES,
    P_PRIVATE,
    P_COUNT
};

/* The n integers of the list field `name` of the table at index 1 into out; returns n. */
static int int_list(lua_State *L, const char *name, int n, int *out) {
    lua_getfield(L, 1, name);
    for (int k = 0; k < n; k++) {
        lua_rawgeti(L, -1, k + 1);
        out[k] = (int)lua_tointeger(L, -1);
        lua_pop(L, 1);
    }
    lua_pop(L, 1);
    return n;
}

/* The fields of parallel { ... } that are not "auto" into p. */
static void parallel_values(lua_State *L, tr_parallel_desc *p, const field_val *v) {
    /* zero = 0 is a real choice ("don't shard"), so auto is -1 */
    int *dst[4] = {&p->dp, &p->tp, &p->pp, &p->zero};
    for (int i = P_DP; i <= P_ZERO; i++)
        if (v[i].present && !v[i].is_auto) *dst[i] = (int)v[i].i;
    if (v[P_SP].present && !v[P_SP].is_auto) p->sequence_parallel = v[P_SP].b;
    if (v[P_BUCKET].present && !v[P_BUCKET].is_auto) p->bucket_kb = (int)v[P_BUCKET].i;
    if (v[P_SCHEDULE].present && !v[P_SCHEDULE].is_auto) p->schedule = v[P_SCHEDULE].choice;
    if (v[P_MICROBATCHES].present && !v[P_MICROBATCHES].is_auto)
        p->microbatches = (int)v[P_MICROBATCHES].i;
    if (v[P_VIRTUAL].present && !v[P_VIRTUAL].is_auto) p->virtual_stages = (int)v[P_VIRTUAL].i;
    /* checked by the schema: integers >= 0 (stages), >= 1 (dp_shares) */
    if (v[P_STAGES].present && !v[P_STAGES].is_auto)
        p->n_stages = int_list(L, "stages", (int)v[P_STAGES].i, p->stages);
    if (v[P_SHARES].present && !v[P_SHARES].is_auto)
        p->n_dp_shares = int_list(L, "dp_shares", (int)v[P_SHARES].i, p->dp_shares);
    if (v[P_PRIVATE].present && !v[P_PRIVATE].is_auto) p->private_gradients = v[P_PRIVATE].b;
}

/* parallel "auto" or parallel { dp, tp, pp, zero, sequence_parallel, bucket_kb, schedule,
 * microbatches, virtual_stages, stages, dp_shares, private_gradients }, each field also "auto"
 * (or absent; private_gradients asks for masked sums and leaves the layout to plan): -1
 * (bucket_kb, microbatches, virtual_stages 0, stages and dp_shares none), left to the layout
 * (parallel/layout.h). */
static int l_parallel(lua_State *L) {
    recipe_ctx *c = dsl_ctx(L);
    int line = section_start(L, &c->parallel_line, "parallel");
    tr_parallel_desc *p = &c->r.parallel;
    *p = (tr_parallel_desc){.is_auto = 1,
                            .dp = -1,
                            .tp = -1,
                            .pp = -1,
                            .zero = -1,
                            .sequence_parallel = -1,
                            .schedule = -1,
                            .private_gradients = -1};
    if (lua_type(L, 1) == LUA_TSTRING) {
        if (strcmp(lua_tostring(L, 1), "auto") != 0)
            dsl_raise_at(L, 0,
                         "parallel: expected \"auto\" or a table { dp = ..., tp = ..., pp = ..., "
                         "zero = ... }, got '%s'",
                         lua_tostring(L, 1));
    } else {
        if (lua_type(L, 1) != LUA_TTABLE)
            dsl_raise_at(L, 0,
                         "parallel: expected \"auto\" or a table { dp = ..., tp = ..., pp = ..., "
                         "zero = ... }, got %s",
                         lua_isnone(L, 1) ? "no value" : dsl_type_word(L, 1));
        field_val v[P_COUNT];
        dsl_read_fields(L, "parallel", parallel_fields, P_COUNT, v, NULL, NULL);
        parallel_values(L, p, v);
        /* everything left to "auto" is the same layout as parallel "auto" */
        p->is_auto = p->dp < 0 && p->tp < 0 && p->pp < 0 && p->zero < 0 &&
                     p->sequence_parallel < 0 && p->bucket_kb == 0 && p->schedule < 0 &&
                     p->microbatches == 0 && p->virtual_stages == 0 && p->n_stages == 0 &&
                     p->n_dp_shares == 0;
    }
    c->parallel_line = line;
    c->r.parallel_line = line;
    return 0;
}

/* ---- knobs -------------------------------------------------------------------------------- */

static const char *knob_list(recipe_ctx *c) {
    const char *names[TR_MAX_KNOBS];
    for (int i = 0; i < c->r.n_knobs; i++)
        names[i] = c->r.knobs[i].name;
    if (c->r.n_knobs == 0) return "none declared";
    return dsl_sorted_list(c->list, sizeof c->list, names, c->r.n_knobs);
}

static int knob_index(lua_State *L) {
    lua_settop(L, 2);
    lua_pushvalue(L, 2);
    recipe_ctx *c = dsl_ctx(L);
    if (lua_rawget(L, lua_upvalueindex(1)) != LUA_TNIL) {
        for (int i = 0; i < c->n_sets && i < 64; i++) /* an overridden knob: remembered */
            if (lua_type(L, 2) == LUA_TSTRING && !strcmp(c->sets[i].name, lua_tostring(L, 2)))
                c->sets_read |= 1ull << i, c->sets_ever |= 1ull << i;
        return 1;
    }
    if (lua_type(L, 2) == LUA_TSTRING)
        dsl_raise_at(L, 0, "unknown knob '%s' (knobs: %s)", lua_tostring(L, 2), knob_list(c));
    dsl_raise_at(L, 0, "unknown knob [%s] (knobs: %s)", dsl_type_word(L, 2), knob_list(c));
}

static int knob_newindex(lua_State *L) {
    const char *name = lua_type(L, 2) == LUA_TSTRING ? lua_tostring(L, 2) : "?";
    dsl_raise_at(L, 0, "knobs are read-only: change '%s' with --set %s=VALUE or in knobs { ... }",
                 name, name);
}

/* pairs(k) walks the hidden table without handing it out (the state passed is the proxy). */
static int knob_next(lua_State *L) {
    lua_settop(L, 2);
    if (lua_next(L, lua_upvalueindex(1))) return 2;
    lua_pushnil(L);
    return 1;
}

static int knob_pairs(lua_State *L) {
    lua_pushvalue(L, lua_upvalueindex(1));
    lua_pushcclosure(L, knob_next, 1);
    lua_pushvalue(L, 1);
    lua_pushnil(L);
    return 3;
}

static int cmp_knob(const void *a, const void *b) {
    return strcmp(((const tr_knob *)a)->name, ((const tr_knob *)b)->name);
}

static int is_name(const char *s) {
    if (!(s[0] == '_' || (s[0] >= 'a' && s[0] <= 'z') || (s[0] >= 'A' && s[0] <= 'Z'))) return 0;
    for (; *s; s++)
        if (!(*s == '_' || (*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') ||
              (*s >= '0' && *s <= '9')))
            return 0;
    return 1;
}

/* Apply one --set to knob k, pushing the new Lua value. */
static void apply_set(lua_State *L, int line, tr_knob *k, const tr_knob_set *s) {
    char dflt[160];
    switch (k->type) {
    case TR_KNOB_NUMBER:
        snprintf(dflt, sizeof dflt, "%.14g", k->number);
        if (lua_stringtonumber(L, s->value) == 0)
            dsl_raise_at(L, line, "--set %s=%s: '%s' is not a number (knob '%s' defaults to %s)",
                         s->name, s->value, s->value, s->name, dflt);
        k->number = lua_tonumber(L, -1);
        if (!isfinite(k->number))
            dsl_raise_at(L, line, "--set %s=%s: '%s' is not a finite number", s->name, s->value,
                         s->value);
        break;
    case TR_KNOB_BOOL:
        if (strcmp(s->value, "true") == 0 || strcmp(s->value, "false") == 0) {
            k->boolean = s->value[0] == 't';
            lua_pushboolean(L, k->boolean);
        } else {
            dsl_raise_at(
                L, line,
                "--set %s=%s: '%s' is not a boolean; use true or false (knob '%s' defaults to %s)",
                s->name, s->value, s->value, s->name, k->boolean ? "true" : "false");
        }
        break;
    case TR_KNOB_STRING:
        snprintf(k->string, sizeof k->string, "%s", s->value);
        lua_pushstring(L, k->string);
        break;
    }
    k->overridden = 1;
}

static int l_knobs(lua_State *L) {
    recipe_ctx *c = dsl_ctx(L);
    int line = section_start(L, &c->knobs_line, "knobs");
    if (lua_type(L, 1) != LUA_TTABLE)
        dsl_raise_at(L, 0, "knobs: expected a table, as in knobs { layers = 4, lr = 3e-4 }, got %s",
                     lua_isnone(L, 1) ? "no value" : dsl_type_word(L, 1));
    lua_settop(L, 1);
    int n = 0;
    tr_knob *ks = c->r.knobs;
    lua_pushnil(L);
    while (lua_next(L, 1)) {
        if (lua_type(L, -2) != LUA_TSTRING || !is_name(lua_tostring(L, -2)))
            dsl_raise_at(
                L, 0,
                "knobs: knobs are written name = default, as in layers = 4; got a key of type %s",
                lua_type(L, -2) == LUA_TSTRING ? "string that is not a name"
                                               : dsl_type_word(L, -2));
        const char *name = lua_tostring(L, -2);
        if (n == TR_MAX_KNOBS) dsl_raise_at(L, 0, "knobs: more than %d knobs", TR_MAX_KNOBS);
        if (strlen(name) >= TR_NAME_MAX)
            dsl_raise_at(L, 0, "knobs: knob name '%s' is longer than %d bytes", name,
                         TR_NAME_MAX - 1);
        tr_knob *k = &ks[n];
        memset(k, 0, sizeof *k);
        memcpy(k->name, name, strlen(name) + 1);
        switch (lua_type(L, -1)) {
        case LUA_TNUMBER:
            k->type = TR_KNOB_NUMBER;
            k->number = lua_tonumber(L, -1);
            break;
        case LUA_TBOOLEAN:
            k->type = TR_KNOB_BOOL;
            k->boolean = lua_toboolean(L, -1);
            break;
        case LUA_TSTRING:
            k->type = TR_KNOB_STRING;
            if (strlen(lua_tostring(L, -1)) >= sizeof k->string)
                dsl_raise_at(L, 0, "knobs: the value of '%s' is longer than %zu bytes", name,
                             sizeof k->string - 1);
            memcpy(k->string, lua_tostring(L, -1), strlen(lua_tostring(L, -1)) + 1);
            break;
        default:
            dsl_raise_at(L, 0, "knobs: knob '%s' must be a number, string or boolean, got %s", name,
                         dsl_type_word(L, -1));
        }
        n++;
        lua_pop(L, 1);
    }
    qsort(ks, (size_t)n, sizeof *ks, cmp_knob);
    c->r.n_knobs = n;
    lua_newtable(L); /* 2: the values the recipe reads */
    for (int i = 0; i < n; i++) {
        lua_getfield(L, 1, ks[i].name);
        lua_setfield(L, 2, ks[i].name);
    }
    for (int i = 0; i < c->n_sets; i++) {
        const tr_knob_set *s = &c->sets[i];
        tr_knob *k = NULL;
        for (int j = 0; j < n && !k; j++)
            if (strcmp(ks[j].name, s->name) == 0) k = &ks[j];
        if (!k && (strncmp(s->name, "train.", 6) == 0 || train_field(s->name)))
            continue; /* train { }'s field (apply_train_sets) */
        if (!k)
            dsl_raise_at(L, line, "--set %s: unknown knob (knobs: %s) or train field (%s)", s->name,
                         knob_list(c), dsl_train_field_list());
        if (c->set_target[i] == SET_TRAIN)
            dsl_raise_at(L, line,
                         "--set %s: both a knob and a field of train { } (line %d), which took "
                         "it first; write --set train.%s for the field, or declare knobs first",
                         s->name, c->train_line, s->name);
        apply_set(L, line, k, s);
        c->set_target[i] = SET_KNOB;
        lua_setfield(L, 2, k->name);
    }
    lua_newtable(L); /* 3: the read-only proxy handed to the recipe */
    lua_createtable(L, 0, 4);
    lua_pushvalue(L, 2);
    lua_pushcclosure(L, knob_index, 1);
    lua_setfield(L, -2, "__index");
    lua_pushcfunction(L, knob_newindex);
    lua_setfield(L, -2, "__newindex");
    lua_pushvalue(L, 2);
    lua_pushcclosure(L, knob_pairs, 1);
    lua_setfield(L, -2, "__pairs");
    lua_pushliteral(L, "knobs");
    lua_setfield(L, -2, "__metatable");
    lua_setmetatable(L, 3);
    c->knobs_line = line;
    return 1;
}

/* `init = hf "DIR"`: a Hugging Face model directory to start from, resolved against the
 * recipe's folder. hf returns a marker that load_text finds in the global `init`. */
static int l_hf(lua_State *L) {
    recipe_ctx *c = dsl_ctx(L);
    if (c->done) return 0;
    if (lua_gettop(L) != 1 || lua_type(L, 1) != LUA_TSTRING)
        dsl_raise_at(L, 0, "hf: expects a directory path, as in init = hf \"path/to/model\"");
    const char *dir = lua_tostring(L, 1), *base = c->basedir;
    char *path = lua_newuserdatauv(L, TR_PATH_MAX, 0);
    int n;
    if (dir[0] == '/' || !base || !base[0] || strcmp(base, ".") == 0)
        n = snprintf(path, TR_PATH_MAX, "%s", dir);
    else
        n = snprintf(path, TR_PATH_MAX, "%s%s%s", base, base[strlen(base) - 1] == '/' ? "" : "/",
                     dir);
    if (n < 0 || n >= TR_PATH_MAX)
        dsl_raise_at(L, 0, "hf: the path is longer than %d bytes", TR_PATH_MAX - 1);
    luaL_setmetatable(L, HF_MT);
    return 1;
}

/* ---- sweep { } ---------------------------------------------------------------------------- */

/* The value on top of the stack as text: a number in the fewest of 15 or 17 digits that read
 * back to the same double (3e-3 is "0.003"), true/false, or the string. */
static void sweep_value(lua_State *L, const char *axis, int k, char *buf, size_t n) {
    int t = lua_type(L, -1);
    if (t == LUA_TNUMBER) {
        double v = lua_tonumber(L, -1);
        snprintf(buf, n, "%.15g", v);
        if (strtod(buf, NULL) != v) snprintf(buf, n, "%.17g", v);
    } else if (t == LUA_TBOOLEAN) {
        snprintf(buf, n, "%s", lua_toboolean(L, -1) ? "true" : "false");
    } else if (t == LUA_TSTRING && lua_rawlen(L, -1) > 0 && lua_rawlen(L, -1) < n) {
        snprintf(buf, n, "%s", lua_tostring(L, -1));
    } else {
        dsl_raise_at(L, 0, "sweep: grid.%s[%d] must be a number, a boolean or a string of 1 to "
                           "%zu bytes",
                     axis, k, n - 1);
    }
}

/* grid.NAME = { V1, ... } (the value at the top of the stack) as axis a */
static void sweep_axis(lua_State *L, tr_sweep_desc *w, int a, const char *name) {
    if (lua_type(L, -1) != LUA_TTABLE || lua_rawlen(L, -1) < 1)
        dsl_raise_at(L, 0, "sweep: grid.%s must be a list of values, as in %s = { 1, 2 }", name,
                     name);
    int n = (int)lua_rawlen(L, -1);
    if (n > TR_SWEEP_MAX_VALUES)
        dsl_raise_at(L, 0, "sweep: grid.%s has %d values; at most %d", name, n,
                     TR_SWEEP_MAX_VALUES);
    snprintf(w->names[a], sizeof w->names[a], "%s", name);
    w->n_values[a] = n;
    for (int k = 1; k <= n; k++) {
        lua_rawgeti(L, -1, k);
        sweep_value(L, name, k, w->values[a][k - 1], sizeof w->values[a][k - 1]);
        lua_pop(L, 1);
    }
}

static int by_name(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* grid = { ... } (field of argument 1), its axes in the order of their names */
static void sweep_grid(lua_State *L, tr_sweep_desc *w) {
    lua_getfield(L, 1, "grid");
    if (lua_isnil(L, -1)) return (void)lua_pop(L, 1);
    if (lua_type(L, -1) != LUA_TTABLE)
        dsl_raise_at(L, 0, "sweep: 'grid' must be a table of lists, as in grid = { lr = { 1e-3, "
                           "3e-3 } }");
    const char *names[TR_SWEEP_MAX_AXES];
    int n = 0;
    for (lua_pushnil(L); lua_next(L, -2); lua_pop(L, 1)) {
        if (lua_type(L, -2) != LUA_TSTRING || lua_rawlen(L, -2) >= TR_NAME_MAX)
            dsl_raise_at(L, 0, "sweep: grid's keys are knob or train field names");
        if (n == TR_SWEEP_MAX_AXES)
            dsl_raise_at(L, 0, "sweep: grid has more than %d axes", TR_SWEEP_MAX_AXES);
        names[n++] = lua_tostring(L, -2); /* the key stays in the table: the pointer lives */
    }
    qsort(names, (size_t)n, sizeof names[0], by_name);
    for (int a = 0; a < n; a++) {
        lua_getfield(L, -1, names[a]);
        sweep_axis(L, w, a, names[a]);
        lua_pop(L, 1);
    }
    w->n_axes = n;
    lua_pop(L, 1);
}

int dsl_l_sweep(lua_State *L) {
    recipe_ctx *c = dsl_ctx(L);
    int line = section_start(L, &c->sweep_line, "sweep");
    if (lua_gettop(L) != 1 || lua_type(L, 1) != LUA_TTABLE)
        dsl_raise_at(L, line, "sweep: expects a table: sweep { grid = { lr = { 1e-3, 3e-3 } }, "
                              "seeds = 3 }");
    for (lua_pushnil(L); lua_next(L, 1); lua_pop(L, 1))
        if (lua_type(L, -2) != LUA_TSTRING ||
            (strcmp(lua_tostring(L, -2), "grid") && strcmp(lua_tostring(L, -2), "seeds")))
            dsl_raise_at(L, line, "sweep: unknown field (fields: grid, seeds)");
    tr_sweep_desc *w = &c->r.sweep;
    sweep_grid(L, w);
    lua_getfield(L, 1, "seeds");
    if (!lua_isnil(L, -1)) {
        int ok = 0;
        lua_Integer s = lua_tointegerx(L, -1, &ok);
        if (!ok || s < 1 || s > TR_SWEEP_MAX_VALUES)
            dsl_raise_at(L, line, "sweep: seeds must be an integer from 1 to %d",
                         TR_SWEEP_MAX_VALUES);
        w->seeds = (int)s;
    }
    lua_pop(L, 1);
    w->line = c->sweep_line = line;
    return 0;
}

/* ---- eval { } ----------------------------------------------------------------------------- */

static const field_spec eval_fields[] = {{"tasks", FK_TABLE, REQ, 0, 0, 0, 0, NULL},
                                         INT_FIELD("every", OPT, 1),
                                         LONG_FIELD("max_examples", OPT, 1)};

int dsl_l_eval(lua_State *L) {
    recipe_ctx *c = dsl_ctx(L);
    int line = section_start(L, &c->eval_line, "eval");
    field_val v[3];
    dsl_read_fields(L, "eval", eval_fields, 3, v, NULL, NULL);
    tr_eval_desc *e = &c->r.eval;
    lua_getfield(L, 1, "tasks");
    int n = (int)lua_rawlen(L, -1);
    if (n < 1 || n > TR_EVAL_MAX_TASKS)
        dsl_raise_at(L, line, "eval: 'tasks' must list 1 to %d task files, as in tasks = { "
                              "\"hellaswag_val.jsonl\" }",
                     TR_EVAL_MAX_TASKS);
    for (int k = 1; k <= n; k++) {
        lua_rawgeti(L, -1, k);
        if (lua_type(L, -1) != LUA_TSTRING || lua_rawlen(L, -1) == 0)
            dsl_raise_at(L, line, "eval: tasks[%d] must be a file name", k);
        resolve_path(L, e->tasks[k - 1], sizeof e->tasks[0], lua_tostring(L, -1), "tasks");
        lua_pop(L, 1);
    }
    lua_pop(L, 1);
    e->n_tasks = n;
    if (v[1].present) e->every = (int)v[1].i;
    if (v[2].present) e->max_examples = (long)v[2].i;
    e->line = c->eval_line = line;
    return 0;
}

const luaL_Reg dsl_section_ctors[] = {{"knobs", l_knobs},
                                      {"data", l_data},
                                      {"optimizer", l_optimizer},
                                      {"schedule", l_schedule},
                                      {"train", l_train},
                                      {"parallel", l_parallel},
                                      {"hf", l_hf},
                                      {"sweep", dsl_l_sweep},
                                      {"eval", dsl_l_eval},
                                      {NULL, NULL}};
