/* The layer constructors (embedding {}, attention { heads = 4 }, stack { n = 6, ... }, ...)
 * and model { }, which copies the finished layer tree into C and checks what only the whole
 * model can tell (the order of layers, heads that divide dim, the mlp's default width). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsl/recipe_private.h"

static layer_ud *new_layer(lua_State *L, tr_node_kind kind) {
    layer_ud *u = lua_newuserdatauv(L, sizeof(layer_ud), 1);
    memset(u, 0, sizeof *u);
    u->node.kind = kind;
    u->node.line = dsl_caller_line(L, NULL);
    u->depth = 1;
    u->count = 1;
    luaL_setmetatable(L, LAYER_MT);
    return u;
}

/* What a non-layer child is, and the likely fix, for "item 2 is ..., not a layer (...)". */
static void describe_item(lua_State *L, int idx, char *what, size_t len, const char **hint) {
    char num[64];
    *hint = "a layer is made by a constructor such as mlp { ... }";
    switch (lua_type(L, idx)) {
    case LUA_TNUMBER:
        dsl_format_number(num, sizeof num, L, idx);
        snprintf(what, len, "a number (%s)", num);
        break;
    case LUA_TSTRING:
        snprintf(what, len, "a string ('%.40s')", lua_tostring(L, idx));
        break;
    case LUA_TBOOLEAN:
        snprintf(what, len, "a boolean (%s)", lua_toboolean(L, idx) ? "true" : "false");
        break;
    case LUA_TTABLE:
        snprintf(what, len, "a plain table");
        *hint = "name the layer before the braces, as in attention { heads = 4 }";
        break;
    case LUA_TFUNCTION:
        snprintf(what, len, "a function");
        *hint = "did you forget the braces, as in layernorm {}?";
        break;
    default:
        snprintf(what, len, "a %s", luaL_typename(L, idx));
        break;
    }
}

/* Check that items 1..max of the table at index 1 are layers; push them as a fresh table. */
static void collect_children(lua_State *L, const char *ctor, int n_items, lua_Integer max,
                             int *depth, long *count) {
    char what[160];
    if (max != n_items) {
        for (lua_Integer i = 1; i <= max; i++) {
            if (lua_rawgeti(L, 1, i) == LUA_TNIL)
                dsl_raise_at(L, 0, "%s: item %lld is nil (a misspelled or undefined variable?)",
                             ctor, (long long)i);
            lua_pop(L, 1);
        }
    }
    lua_createtable(L, n_items, 0);
    int t = lua_gettop(L);
    *depth = 0;
    *count = 0;
    for (int i = 1; i <= n_items; i++) {
        lua_rawgeti(L, 1, i);
        const layer_ud *u = luaL_testudata(L, -1, LAYER_MT);
        if (!u) {
            const char *hint;
            describe_item(L, -1, what, sizeof what, &hint);
            dsl_raise_at(L, 0, "%s: item %d is %s, not a layer (%s)", ctor, i, what, hint);
        }
        if (u->depth > *depth) *depth = u->depth;
        *count += u->count;
        if (*count > MAX_NODES)
            dsl_raise_at(L, 0, "%s: more than %ld layers in all (is a loop nesting layers?)", ctor,
                         MAX_NODES);
        lua_rawseti(L, t, i);
    }
    if (*depth + 1 > MAX_DEPTH)
        dsl_raise_at(L, 0, "%s: layers nested more than %d deep", ctor, MAX_DEPTH);
}

static const field_spec rope_fields[] = {{"theta", FK_NUM, OPT, LO_GT, 0, HI_NONE, 0, NULL}};
static const field_spec layernorm_fields[] = {{"bias", FK_BOOL, OPT, 0, 0, 0, 0, NULL},
                                              {"eps", FK_NUM, OPT, LO_GT, 0, HI_NONE, 0, NULL}};
static const field_spec rmsnorm_fields[] = {{"eps", FK_NUM, OPT, LO_GT, 0, HI_NONE, 0, NULL}};
static const field_spec attention_fields[] = {INT_FIELD_MAX("heads", REQ, 1, TR_MAX_HEADS),
                                              INT_FIELD_MAX("kv_heads", OPT, 1, TR_MAX_HEADS),
                                              {"bias", FK_BOOL, OPT, 0, 0, 0, 0, NULL}};
static const field_spec mlp_fields[] = {
    INT_FIELD_MAX("hidden", OPT, 1, TR_MAX_HIDDEN),
    {"activation", FK_ENUM, OPT, 0, 0, 0, 0, dsl_activation_names},
    {"bias", FK_BOOL, OPT, 0, 0, 0, 0, NULL}};
static const field_spec stack_fields[] = {INT_FIELD("n", REQ, 1)};
static const field_spec lm_head_fields[] = {{"tied", FK_BOOL, OPT, 0, 0, 0, 0, NULL}};

static int l_embedding(lua_State *L) {
    dsl_read_fields(L, "embedding", NULL, 0, NULL, NULL, NULL);
    new_layer(L, TR_NODE_EMBEDDING);
    return 1;
}

static int l_positions(lua_State *L) {
    dsl_read_fields(L, "positions", NULL, 0, NULL, NULL, NULL);
    new_layer(L, TR_NODE_POSITIONS);
    return 1;
}

static int l_rope(lua_State *L) {
    field_val v[1];
    dsl_read_fields(L, "rope", rope_fields, 1, v, NULL, NULL);
    new_layer(L, TR_NODE_ROPE)->node.rope_theta = v[0].present ? (float)v[0].n : 10000.0f;
    return 1;
}

static int l_layernorm(lua_State *L) {
    field_val v[2];
    dsl_read_fields(L, "layernorm", layernorm_fields, 2, v, NULL, NULL);
    tr_node *n = &new_layer(L, TR_NODE_LAYERNORM)->node;
    n->bias = v[0].present ? v[0].b : 1;
    n->eps = v[1].present ? (float)v[1].n : 1e-5f;
    return 1;
}

static int l_rmsnorm(lua_State *L) {
    field_val v[1];
    dsl_read_fields(L, "rmsnorm", rmsnorm_fields, 1, v, NULL, NULL);
    new_layer(L, TR_NODE_RMSNORM)->node.eps = v[0].present ? (float)v[0].n : 1e-5f;
    return 1;
}

static int l_attention(lua_State *L) {
    field_val v[3];
    dsl_read_fields(L, "attention", attention_fields, 3, v, NULL, NULL);
    tr_node *n = &new_layer(L, TR_NODE_ATTENTION)->node;
    n->heads = (int)v[0].i;
    n->kv_heads = v[1].present ? (int)v[1].i : n->heads;
    n->bias = v[2].present ? v[2].b : 1;
    return 1;
}

static int l_mlp(lua_State *L) {
    field_val v[3];
    dsl_read_fields(L, "mlp", mlp_fields, 3, v, NULL, NULL);
    tr_node *n = &new_layer(L, TR_NODE_MLP)->node;
    n->hidden = v[0].present ? (int)v[0].i : 0; /* 0: 4 * dim, resolved by model {} */
    n->activation = v[1].present ? (tr_activation)v[1].choice : TR_ACT_GELU;
    n->bias = v[2].present ? v[2].b : 1;
    return 1;
}

static int l_lm_head(lua_State *L) {
    field_val v[1];
    dsl_read_fields(L, "lm_head", lm_head_fields, 1, v, NULL, NULL);
    new_layer(L, TR_NODE_LM_HEAD)->node.tied = v[0].present ? v[0].b : 1;
    return 1;
}

static int container(lua_State *L, tr_node_kind kind, const field_spec *specs, int nspecs) {
    const char *ctor = dsl_kind_names[kind];
    field_val v[1];
    int n_items, depth;
    lua_Integer max;
    long count;
    dsl_read_fields(L, ctor, specs, nspecs, v, &n_items, &max);
    collect_children(L, ctor, n_items, max, &depth, &count);
    layer_ud *u = new_layer(L, kind);
    u->node.repeat = nspecs ? (int)v[0].i : 1;
    u->depth = depth + 1;
    u->count = count + 1;
    lua_insert(L, -2);
    lua_setiuservalue(L, -2, 1);
    return 1;
}

static int l_residual(lua_State *L) {
    return container(L, TR_NODE_RESIDUAL, NULL, 0);
}

static int l_stack(lua_State *L) {
    return container(L, TR_NODE_STACK, stack_fields, 1);
}

int dsl_layer_tostring(lua_State *L) {
    const layer_ud *u = luaL_checkudata(L, 1, LAYER_MT);
    lua_pushfstring(L, "%s (line %d)", tr_node_kind_name(u->node.kind), u->node.line);
    return 1;
}

/* ---- model -------------------------------------------------------------------------------- */

void dsl_free_node(tr_node *n) {
    for (int i = 0; i < n->n_children; i++)
        dsl_free_node(&n->children[i]);
    free(n->children);
    n->children = NULL;
    n->n_children = 0;
}

/* Copy the layers in the table at t into dst's children. Every allocation is attached to dst
 * at once, so dsl_free_node releases a partial copy. Does not raise Lua errors. */
static int copy_children(lua_State *L, int t, tr_node *dst) {
    int n = (int)lua_rawlen(L, t);
    dst->children = NULL;
    dst->n_children = 0;
    if (n == 0) return 0;
    dst->children = calloc((size_t)n, sizeof(tr_node));
    if (!dst->children) return -1;
    dst->n_children = n;
    for (int i = 0; i < n; i++) {
        lua_rawgeti(L, t, i + 1);
        const layer_ud *u = lua_touserdata(L, -1);
        tr_node *ch = &dst->children[i];
        *ch = u->node;
        ch->children = NULL;
        ch->n_children = 0;
        int rc = 0;
        if (ch->kind == TR_NODE_STACK || ch->kind == TR_NODE_RESIDUAL) {
            lua_getiuservalue(L, -1, 1);
            rc = copy_children(L, lua_gettop(L), ch);
            lua_pop(L, 1);
        }
        lua_pop(L, 1);
        if (rc) return -1;
    }
    return 0;
}

TR_PRINTF(3, 4) static int model_error(recipe_ctx *c, int line, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->check_msg, sizeof c->check_msg, fmt, ap);
    va_end(ap);
    c->check_line = line;
    return -1;
}

static int is_top_only(tr_node_kind k) {
    return k == TR_NODE_EMBEDDING || k == TR_NODE_POSITIONS || k == TR_NODE_ROPE ||
           k == TR_NODE_LM_HEAD;
}

/* Checks a node below the top level of the model, and resolves what depends on the model:
 * mlp's default hidden width and attention's rope_theta (from the rope before it). */
static int check_node(recipe_ctx *c, const tr_model_desc *m, tr_node *n, const tr_node *parent,
                      float theta) {
    const char *name = tr_node_kind_name(n->kind);
    if (is_top_only(n->kind))
        return model_error(c, n->line, "%s: only allowed at the top level of model, not inside %s",
                           name, tr_node_kind_name(parent->kind));
    switch (n->kind) {
    case TR_NODE_STACK:
    case TR_NODE_RESIDUAL:
        if (n->n_children == 0)
            return model_error(c, n->line, "%s: needs at least one layer inside it", name);
        for (int i = 0; i < n->n_children; i++)
            if (check_node(c, m, &n->children[i], n, theta)) return -1;
        break;
    case TR_NODE_ATTENTION:
        if (m->dim % n->heads != 0)
            return model_error(c, n->line, "attention: heads (%d) must divide dim (%d)", n->heads,
                               m->dim);
        if (n->heads % n->kv_heads != 0)
            return model_error(c, n->line, "attention: kv_heads (%d) must divide heads (%d)",
                               n->kv_heads, n->heads);
        if (theta > 0 && (m->dim / n->heads) % 2 != 0)
            return model_error(
                c, n->line,
                "attention: with rope, the head size dim/heads (%d/%d = %d) must be even", m->dim,
                n->heads, m->dim / n->heads);
        n->rope_theta = theta;
        break;
    case TR_NODE_MLP:
        if (n->hidden == 0) {
            if (m->dim > INT_MAX / 4)
                return model_error(c, n->line,
                                   "mlp: the default hidden (4 * dim) is too large; set hidden");
            n->hidden = 4 * m->dim;
        }
        break;
    default:
        break;
    }
    return 0;
}

static int check_model(recipe_ctx *c, tr_model_desc *m) {
    tr_node *root = &m->root;
    int n = root->n_children;
    if (n == 0)
        return model_error(
            c, root->line,
            "model: has no layers; it must start with embedding {} and end with lm_head {}");
    if (root->children[0].kind != TR_NODE_EMBEDDING)
        return model_error(c, root->children[0].line,
                           "model: the first layer must be embedding {}, got %s",
                           tr_node_kind_name(root->children[0].kind));
    int seen[TR_NODE_KIND_COUNT] = {0};
    float theta = 0;
    for (int i = 0; i < n; i++) {
        tr_node *ch = &root->children[i];
        tr_node_kind k = ch->kind;
        const char *name = tr_node_kind_name(k);
        if (!is_top_only(k)) {
            if (check_node(c, m, ch, root, theta)) return -1;
            continue;
        }
        if (seen[k])
            return model_error(c, ch->line, "%s: appears twice in model (first at line %d)", name,
                               seen[k]);
        seen[k] = ch->line;
        if (k == TR_NODE_POSITIONS && seen[TR_NODE_ROPE])
            return model_error(
                c, ch->line,
                "positions: a model has positions {} or rope {}, not both (rope at line %d)",
                seen[TR_NODE_ROPE]);
        if (k == TR_NODE_ROPE && seen[TR_NODE_POSITIONS])
            return model_error(
                c, ch->line,
                "rope: a model has positions {} or rope {}, not both (positions at line %d)",
                seen[TR_NODE_POSITIONS]);
        if (k == TR_NODE_ROPE) theta = ch->rope_theta;
        if (k == TR_NODE_LM_HEAD && i != n - 1)
            return model_error(
                c, ch->line,
                "lm_head: must be the last layer of model, but %s (line %d) follows it",
                tr_node_kind_name(root->children[i + 1].kind), root->children[i + 1].line);
    }
    if (root->children[n - 1].kind != TR_NODE_LM_HEAD)
        return model_error(c, root->children[n - 1].line,
                           "model: the last layer must be lm_head {}, got %s",
                           tr_node_kind_name(root->children[n - 1].kind));
    return 0;
}

static const field_spec model_fields[] = {INT_FIELD_MAX("vocab", REQ, 1, TR_MAX_VOCAB),
                                          INT_FIELD_MAX("dim", REQ, 1, TR_MAX_DIM),
                                          INT_FIELD_MAX("seq_len", REQ, 1, TR_MAX_SEQ_LEN)};

static int l_model(lua_State *L) {
    recipe_ctx *c = dsl_ctx(L);
    if (c->done)
        dsl_raise_at(L, 0, "model: called after the recipe finished (from a __gc finalizer?)");
    int line = dsl_caller_line(L, NULL);
    if (c->model_line)
        dsl_raise_at(L, line, "model: declared twice (first at line %d)", c->model_line);
    field_val v[3];
    int n_items, depth;
    lua_Integer max;
    long count;
    dsl_read_fields(L, "model", model_fields, 3, v, &n_items, &max);
    collect_children(L, "model", n_items, max, &depth, &count);
    luaL_checkstack(L, 2 * MAX_DEPTH + 8, "model: layers nested too deep");
    tr_model_desc m;
    memset(&m, 0, sizeof m);
    m.vocab = (int)v[0].i;
    m.dim = (int)v[1].i;
    m.seq_len = (int)v[2].i;
    m.root.kind = TR_NODE_SEQUENCE;
    m.root.line = line;
    m.root.repeat = 1;
    /* From here until m is handed to the recipe, nothing may raise: m owns malloc'ed nodes. */
    if (copy_children(L, lua_gettop(L), &m.root)) {
        dsl_free_node(&m.root);
        dsl_raise_at(L, line, "model: out of memory copying the layers");
    }
    if (check_model(c, &m)) {
        dsl_free_node(&m.root);
        dsl_raise_at(L, c->check_line, "%s", c->check_msg);
    }
    if (c->model_line) { /* a __gc finalizer run by an allocation above declared one */
        dsl_free_node(&m.root);
        dsl_raise_at(L, line, "model: declared twice (first at line %d)", c->model_line);
    }
    c->r.model = m;
    c->model_line = line;
    return 0;
}

const luaL_Reg dsl_layer_ctors[] = {{"model", l_model},         {"embedding", l_embedding},
                                    {"positions", l_positions}, {"rope", l_rope},
                                    {"layernorm", l_layernorm}, {"rmsnorm", l_rmsnorm},
                                    {"attention", l_attention}, {"mlp", l_mlp},
                                    {"residual", l_residual},   {"stack", l_stack},
                                    {"lm_head", l_lm_head},     {NULL, NULL}};
