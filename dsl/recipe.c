/* The recipe DSL: runs a Lua recipe once in a sandboxed state (capped memory and instructions,
 * no io/os/require/bytecode) and copies what it declares into the structs of dsl/recipe.h.
 * Every field is checked against a schema; every mistake is one line `recipe.lua:LINE: msg`. */
/* realpath() is XSI, not plain POSIX. */
#define _XOPEN_SOURCE 700
#include "dsl/recipe.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>

#define MEM_LIMIT ((size_t)64 << 20)
#define MEM_LIMIT_MIB 64
#define INSTR_LIMIT 100000000LL
#define HOOK_EVERY 1000
#define TIME_LIMIT 10 /* seconds; then TIME_GRACE more for a library call to return */
#define TIME_GRACE 5
#define FILE_LIMIT ((size_t)16 << 20)
/* Copying layers to C recurses once per level, and a loop that nests shared subtrees can
 * describe exponentially many nodes: both are bounded while the recipe runs. */
#define MAX_DEPTH 32
#define MAX_NODES 100000L
#define LAYER_MT "tr.layer"

#ifdef __GNUC__
#define TR_PRINTF(a, b) __attribute__((format(printf, a, b)))
#define TR_NORETURN __attribute__((noreturn))
#else
#define TR_PRINTF(a, b)
#define TR_NORETURN
#endif

/* Everything one load needs; reached from Lua through the allocator's user pointer. */
typedef struct {
    tr_recipe r;                /* filled while the recipe runs, handed out on success */
    const char *chunk;          /* the recipe's name in messages */
    const char *basedir;        /* data paths resolve against it */
    char stem[TR_NAME_MAX];     /* file name without .lua, for the default train.out */
    const tr_knob_set *sets;
    int n_sets;
    size_t mem_used;
    int mem_exceeded;
    long long instr;
    int knobs_line, model_line, data_line, optim_line, sched_line, train_line, parallel_line;
    int min_lr_set;
    int done;                   /* the chunk has finished: constructors refuse to run */
    int check_line;             /* model-time check that failed: where, and what */
    char check_msg[1024];
    char where[LUA_IDSIZE];     /* source of a caller outside the recipe chunk (a load()ed one) */
    char msg[8192];             /* formatting scratch for messages */
    char list[TR_MAX_KNOBS * (TR_NAME_MAX + 2) + 64];
} recipe_ctx;

/* A layer while the recipe runs: a userdata holding the node, children in its user value. */
typedef struct {
    tr_node node;
    int depth;  /* levels of layers below and including this one */
    long count; /* nodes in this subtree, shared subtrees counted each time they appear */
} layer_ud;

static const char *const kind_names[TR_NODE_KIND_COUNT] = {
    "model", "stack",     "residual", "embedding", "positions", "rope",
    "layernorm", "rmsnorm", "attention", "mlp",  "lm_head"};
static const char *const activation_names[] = {"gelu", "swiglu", NULL};
static const char *const tokenizer_names[] = {"byte", "gpt2", NULL};
static const char *const decay_names[] = {"cosine", "linear", "constant", "wsd", NULL};
static const char *const precision_names[] = {"bf16", "fp32", NULL};
static const char *const recompute_names[] = {"none", "selective", "full", NULL};

const char *tr_node_kind_name(tr_node_kind k)
{
    return (k >= 0 && k < TR_NODE_KIND_COUNT) ? kind_names[k] : "?";
}

static recipe_ctx *get_ctx(lua_State *L)
{
    void *ud = NULL;
    lua_getallocf(L, &ud);
    return ud;
}

/* ---- sandbox ------------------------------------------------------------------------------ */

/* Lua's allocator contract: nsize 0 frees; osize is the old size only when ptr is set. */
static void *sandbox_alloc(void *ud, void *ptr, size_t osize, size_t nsize)
{
    recipe_ctx *c = ud;
    size_t old = ptr ? osize : 0;
    if (nsize == 0) {
        c->mem_used -= old;
        free(ptr);
        return NULL;
    }
    if (nsize > old && c->mem_used - old + nsize > MEM_LIMIT) {
        c->mem_exceeded = 1;
        return NULL;
    }
    void *p = realloc(ptr, nsize);
    if (p)
        c->mem_used = c->mem_used - old + nsize;
    return p;
}

static int is_recipe_source(const recipe_ctx *c, const char *source)
{
    return source && source[0] == '=' && strcmp(source + 1, c->chunk) == 0;
}

/* Line of the nearest Lua function up the stack: the recipe line that called a constructor
 * (C functions in between, such as pcall, are skipped). *src names its chunk. */
static int caller_line(lua_State *L, const char **src)
{
    recipe_ctx *c = get_ctx(L);
    lua_Debug ar;
    for (int level = 1; lua_getstack(L, level, &ar); level++) {
        if (!lua_getinfo(L, "Sl", &ar) || ar.currentline <= 0)
            continue;
        if (src) {
            if (is_recipe_source(c, ar.source)) {
                *src = c->chunk;
            } else {
                snprintf(c->where, sizeof c->where, "%s", ar.short_src);
                *src = c->where;
            }
        }
        return ar.currentline;
    }
    if (src)
        *src = c->chunk;
    return 0;
}

/* Raise `chunk:line: message`; line <= 0 means the caller's line. */
TR_PRINTF(3, 4) TR_NORETURN static void raise_at(lua_State *L, int line, const char *fmt, ...)
{
    recipe_ctx *c = get_ctx(L);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->msg, sizeof c->msg, fmt, ap);
    va_end(ap);
    const char *src = c->chunk;
    if (line <= 0)
        line = caller_line(L, &src);
    if (line > 0)
        lua_pushfstring(L, "%s:%d: %s", src, line, c->msg);
    else
        lua_pushfstring(L, "%s: %s", src, c->msg);
    lua_error(L);
    abort(); /* lua_error does not return */
}

/* Stops runaway recipes. Once over the limit it fires on every instruction, so a recipe that
 * catches the error with pcall in a loop still stops at the next instruction outside pcall. */
static void instr_hook(lua_State *L, lua_Debug *ar)
{
    recipe_ctx *c = get_ctx(L);
    c->instr += HOOK_EVERY;
    if (c->instr <= INSTR_LIMIT)
        return;
    lua_sethook(L, instr_hook, LUA_MASKCOUNT, 1);
    lua_getinfo(L, "Sl", ar);
    const char *src = is_recipe_source(c, ar->source) ? c->chunk : ar->short_src;
    lua_pushfstring(L, "%s:%d: recipe did not finish within %d instructions (an endless loop?)",
                    src, ar->currentline, (int)INSTR_LIMIT);
    lua_error(L);
}

/* The instruction count does not see work done inside one library call (a backtracking
 * string.find, a loop over huge strings), so a recipe's run is bounded in time as well: after
 * TIME_LIMIT seconds SIGALRM sets a hook that stops the recipe at its next instruction, with
 * its line; if no instruction comes within TIME_GRACE more (a call that does not return), the
 * process prints one line and exits. Nothing has been built or written yet at that point. */
static lua_State *volatile timed_L;
static volatile sig_atomic_t timed_fired;
static char timed_msg[TR_PATH_MAX + 160];
static size_t timed_msg_len;

static void time_hook(lua_State *L, lua_Debug *ar)
{
    recipe_ctx *c = get_ctx(L);
    lua_sethook(L, time_hook, LUA_MASKCOUNT, 1); /* as instr_hook: pcall cannot outlast it */
    lua_getinfo(L, "Sl", ar);
    const char *src = is_recipe_source(c, ar->source) ? c->chunk : ar->short_src;
    lua_pushfstring(L, "%s:%d: recipe ran for more than %d s (an endless loop, or work too slow "
                       "for a recipe)", src, ar->currentline, TIME_LIMIT);
    lua_error(L);
}

static void on_alarm(int sig)
{
    (void)sig;
    if (!timed_fired && timed_L) {
        timed_fired = 1;
        lua_sethook(timed_L, time_hook, LUA_MASKCOUNT, 1); /* async-signal-safe, as lua.c uses it */
        alarm(TIME_GRACE);
        return;
    }
    ssize_t w = write(2, timed_msg, timed_msg_len);
    (void)w;
    _exit(2);
}

/* `load` that only accepts text: bytecode can crash the VM. Arguments pass through unchanged
 * except mode, whose count matters (an explicit nil env differs from no env). */
static int sandbox_load(lua_State *L)
{
    int n = lua_gettop(L);
    if (n < 3)
        lua_settop(L, 3);
    lua_pushliteral(L, "t");
    lua_replace(L, 3);
    lua_pushvalue(L, lua_upvalueindex(1));
    lua_insert(L, 1);
    lua_call(L, lua_gettop(L) - 1, LUA_MULTRET);
    return lua_gettop(L);
}

/* setmetatable without __gc: Lua runs finalizers with hooks off, so an endless loop in one
 * (during a collection or at lua_close) would escape the instruction limit. */
static int sandbox_setmetatable(lua_State *L)
{
    if (lua_type(L, 2) == LUA_TTABLE) {
        lua_pushliteral(L, "__gc");
        if (lua_rawget(L, 2) != LUA_TNIL)
            raise_at(L, 0, "setmetatable: __gc finalizers are not allowed in recipes");
        lua_pop(L, 1);
    }
    lua_pushvalue(L, lua_upvalueindex(1));
    lua_insert(L, 1);
    lua_call(L, lua_gettop(L) - 1, LUA_MULTRET);
    return lua_gettop(L);
}

/* print() writes to stderr: stdout may be carrying a resolved recipe or a run's log. */
static int sandbox_print(lua_State *L)
{
    int n = lua_gettop(L);
    for (int i = 1; i <= n; i++) {
        size_t len;
        const char *s = luaL_tolstring(L, i, &len);
        if (i > 1)
            fputc('\t', stderr);
        fwrite(s, 1, len, stderr);
        lua_pop(L, 1);
    }
    fputc('\n', stderr);
    return 0;
}

/* Message handler: give errors that lack a position (error("x", 0), errors inside load()ed
 * chunks, non-string error values) the recipe line they happened under. */
static int message_handler(lua_State *L)
{
    recipe_ctx *c = get_ctx(L);
    const char *msg;
    if (lua_type(L, 1) == LUA_TSTRING || lua_type(L, 1) == LUA_TNUMBER)
        msg = lua_tostring(L, 1);
    else
        msg = lua_pushfstring(L, "recipe raised a %s as an error (error() takes a message string)",
                              luaL_typename(L, 1));
    size_t n = strlen(c->chunk);
    if (strncmp(msg, c->chunk, n) == 0 && msg[n] == ':') {
        lua_pushstring(L, msg);
        return 1;
    }
    lua_Debug ar;
    for (int level = 1; lua_getstack(L, level, &ar); level++) {
        if (lua_getinfo(L, "Sl", &ar) && ar.currentline > 0 && is_recipe_source(c, ar.source)) {
            lua_pushfstring(L, "%s:%d: %s", c->chunk, ar.currentline, msg);
            return 1;
        }
    }
    lua_pushfstring(L, "%s: %s", c->chunk, msg);
    return 1;
}

/* ---- field schema ------------------------------------------------------------------------- */

typedef enum { FK_INT, FK_NUM, FK_BOOL, FK_STR, FK_ENUM, FK_INT_AUTO, FK_PAIR, FK_TABLE } field_kind;
enum { LO_NONE = 0, LO_GE, LO_GT };
enum { HI_NONE = 0, HI_LE, HI_LT };

typedef struct {
    const char *name;
    field_kind kind;
    int required;
    int lo_kind;
    double lo;
    int hi_kind;
    double hi;
    const char *const *choices; /* FK_ENUM, NULL-terminated */
} field_spec;

typedef struct {
    int present;
    lua_Integer i; /* FK_INT, FK_INT_AUTO (0 = auto) */
    double n;      /* FK_NUM */
    int b;         /* FK_BOOL */
    const char *s; /* FK_STR: owned by the argument table, which outlives the read */
    int choice;    /* FK_ENUM: index into choices */
    int is_auto;   /* FK_INT_AUTO */
    double pair[2];
} field_val;

#define REQ 1
#define OPT 0
#define INT_FIELD(nm, req, lo) {nm, FK_INT, req, LO_GE, lo, HI_LE, INT_MAX, NULL}
#define LONG_FIELD(nm, req, lo) {nm, FK_INT, req, LO_GE, lo, HI_LE, (double)LONG_MAX, NULL}

static const char *kind_phrase(field_kind k)
{
    switch (k) {
    case FK_INT: return "an integer";
    case FK_NUM: return "a number";
    case FK_BOOL: return "a boolean";
    case FK_STR: return "a string";
    case FK_INT_AUTO: return "an integer or \"auto\"";
    default: return "a value";
    }
}

/* A value's type for messages: Lua's name, except that layers are called layers. */
static const char *type_word(lua_State *L, int idx)
{
    if (lua_type(L, idx) == LUA_TUSERDATA && luaL_testudata(L, idx, LAYER_MT))
        return "layer";
    return luaL_typename(L, idx);
}

static void format_number(char *buf, size_t len, lua_State *L, int idx)
{
    if (lua_isinteger(L, idx))
        snprintf(buf, len, "%lld", (long long)lua_tointeger(L, idx));
    else
        snprintf(buf, len, "%.14g", (double)lua_tonumber(L, idx));
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* "a, b, c": names sorted, written into buf. */
static const char *sorted_list(char *buf, size_t len, const char **names, int n)
{
    qsort(names, (size_t)n, sizeof *names, cmp_str);
    buf[0] = 0;
    size_t used = 0;
    for (int i = 0; i < n && used < len; i++)
        used += (size_t)snprintf(buf + used, len - used, "%s%s", i ? ", " : "", names[i]);
    return buf;
}

static void check_bounds(lua_State *L, const char *ctor, const char *field, const field_spec *fs,
                         double v, const char *shown)
{
    if (fs->lo_kind == LO_GE && !(v >= fs->lo))
        raise_at(L, 0, "%s: field '%s' must be >= %.14g, got %s", ctor, field, fs->lo, shown);
    if (fs->lo_kind == LO_GT && !(v > fs->lo))
        raise_at(L, 0, "%s: field '%s' must be > %.14g, got %s", ctor, field, fs->lo, shown);
    if (fs->hi_kind == HI_LE && !(v <= fs->hi))
        raise_at(L, 0, "%s: field '%s' must be <= %.14g, got %s", ctor, field, fs->hi, shown);
    if (fs->hi_kind == HI_LT && !(v < fs->hi))
        raise_at(L, 0, "%s: field '%s' must be < %.14g, got %s", ctor, field, fs->hi, shown);
}

/* A number that will live in a C float: finite, in range, and still in range once rounded. */
static double read_float(lua_State *L, int idx, const char *ctor, const char *field,
                         const field_spec *fs)
{
    char shown[64];
    if (lua_type(L, idx) != LUA_TNUMBER)
        raise_at(L, 0, "%s: field '%s' must be a number, got %s", ctor, field, type_word(L, idx));
    double v = lua_tonumber(L, idx);
    format_number(shown, sizeof shown, L, idx);
    if (!isfinite(v))
        raise_at(L, 0, "%s: field '%s' must be a finite number, got %s", ctor, field, shown);
    check_bounds(L, ctor, field, fs, v, shown);
    float f = (float)v;
    if (!isfinite(f))
        raise_at(L, 0, "%s: field '%s' is too large for a 32-bit float, got %s", ctor, field,
                 shown);
    char shown_f[128];
    snprintf(shown_f, sizeof shown_f, "%s (%.9g as a 32-bit float)", shown, (double)f);
    check_bounds(L, ctor, field, fs, (double)f, shown_f);
    return v;
}

/* Check the value on top of the stack against fs and store it in *out. */
static void read_value(lua_State *L, const char *ctor, const field_spec *fs, field_val *out)
{
    int idx = lua_gettop(L);
    int t = lua_type(L, idx);
    char shown[64];
    out->present = 1;
    switch (fs->kind) {
    case FK_INT_AUTO:
        if (t == LUA_TSTRING) {
            if (strcmp(lua_tostring(L, idx), "auto") != 0)
                raise_at(L, 0, "%s: field '%s' must be an integer or \"auto\", got '%s'", ctor,
                         fs->name, lua_tostring(L, idx));
            out->is_auto = 1;
            out->i = 0;
            return;
        }
        /* fall through */
    case FK_INT: {
        if (t != LUA_TNUMBER)
            raise_at(L, 0, "%s: field '%s' must be %s, got %s", ctor, fs->name,
                     kind_phrase(fs->kind), type_word(L, idx));
        int isint = 0;
        lua_Integer i = lua_tointegerx(L, idx, &isint);
        format_number(shown, sizeof shown, L, idx);
        if (!isint)
            raise_at(L, 0, "%s: field '%s' must be an integer, got %s", ctor, fs->name, shown);
        check_bounds(L, ctor, fs->name, fs, (double)i, shown);
        out->i = i;
        return;
    }
    case FK_NUM:
        out->n = read_float(L, idx, ctor, fs->name, fs);
        return;
    case FK_BOOL:
        if (t != LUA_TBOOLEAN)
            raise_at(L, 0, "%s: field '%s' must be a boolean (true or false), got %s", ctor,
                     fs->name, type_word(L, idx));
        out->b = lua_toboolean(L, idx);
        return;
    case FK_STR: {
        if (t != LUA_TSTRING)
            raise_at(L, 0, "%s: field '%s' must be a string, got %s", ctor, fs->name,
                     type_word(L, idx));
        size_t len = 0;
        out->s = lua_tolstring(L, idx, &len);
        if (len == 0)
            raise_at(L, 0, "%s: field '%s' must not be empty", ctor, fs->name);
        if (strlen(out->s) != len)
            raise_at(L, 0, "%s: field '%s' must not contain a NUL byte", ctor, fs->name);
        return;
    }
    case FK_ENUM: {
        const char *names[8];
        int n = 0;
        while (fs->choices[n])
            names[n] = fs->choices[n], n++;
        char list[256];
        list[0] = 0;
        for (int k = 0; k < n; k++) /* in declaration order, which reads best */
            snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", k ? ", " : "",
                     names[k]);
        if (t != LUA_TSTRING)
            raise_at(L, 0, "%s: field '%s' must be one of %s, got %s", ctor, fs->name, list,
                     type_word(L, idx));
        const char *s = lua_tostring(L, idx);
        for (int k = 0; k < n; k++) {
            if (strcmp(s, names[k]) == 0) {
                out->choice = k;
                return;
            }
        }
        raise_at(L, 0, "%s: field '%s' must be one of %s, got '%s'", ctor, fs->name, list, s);
    }
    case FK_TABLE: /* checked by the constructor, which reads it from its argument */
        if (t != LUA_TTABLE)
            raise_at(L, 0, "%s: field '%s' must be a table, got %s", ctor, fs->name,
                     type_word(L, idx));
        return;
    case FK_PAIR: {
        int ok = t == LUA_TTABLE;
        if (ok) {
            int count = 0;
            lua_pushnil(L);
            while (lua_next(L, idx)) {
                count++;
                lua_pop(L, 1);
            }
            ok = count == 2 && lua_rawlen(L, idx) == 2;
        }
        if (!ok)
            raise_at(L, 0, "%s: field '%s' must be a table of two numbers, as in %s = { 0.9, 0.95 }, got %s",
                     ctor, fs->name, fs->name, t == LUA_TTABLE ? "another table" : type_word(L, idx));
        for (int k = 0; k < 2; k++) {
            char name[64];
            snprintf(name, sizeof name, "%s[%d]", fs->name, k + 1);
            lua_rawgeti(L, idx, k + 1);
            out->pair[k] = read_float(L, lua_gettop(L), ctor, name, fs);
            lua_pop(L, 1);
        }
        return;
    }
    }
}

TR_NORETURN static void unknown_field(lua_State *L, const char *ctor, const field_spec *specs,
                                      int nspecs, const char *key)
{
    recipe_ctx *c = get_ctx(L);
    if (nspecs == 0)
        raise_at(L, 0, "%s: unknown field '%s' (%s takes no fields)", ctor, key, ctor);
    const char *names[16];
    for (int i = 0; i < nspecs && i < 16; i++)
        names[i] = specs[i].name;
    sorted_list(c->list, sizeof c->list, names, nspecs < 16 ? nspecs : 16);
    raise_at(L, 0, "%s: unknown field '%s' (fields: %s)", ctor, key, c->list);
}

/* Read the fields of the table at index 1 into vals (one per spec). Array items are children:
 * their count and the largest index go to *n_items / *max_item when those are non-NULL, and
 * are an error otherwise. */
static void read_fields(lua_State *L, const char *ctor, const field_spec *specs, int nspecs,
                        field_val *vals, int *n_items, lua_Integer *max_item)
{
    if (lua_type(L, 1) != LUA_TTABLE)
        raise_at(L, 0, "%s: expected a table of fields, as in %s { ... }, got %s", ctor, ctor,
                 lua_isnone(L, 1) ? "no value" : type_word(L, 1));
    lua_settop(L, 1);
    int items = 0;
    lua_Integer max = 0;
    lua_pushnil(L);
    while (lua_next(L, 1)) {
        int kt = lua_type(L, -2);
        if (kt == LUA_TSTRING) {
            const char *key = lua_tostring(L, -2);
            int found = 0;
            for (int i = 0; i < nspecs && !found; i++)
                found = strcmp(specs[i].name, key) == 0;
            if (!found)
                unknown_field(L, ctor, specs, nspecs, key);
        } else if (kt == LUA_TNUMBER && lua_isinteger(L, -2) && lua_tointeger(L, -2) >= 1) {
            if (!n_items)
                raise_at(L, 0, "%s: unexpected %s at position %lld; fields are written name = value",
                         ctor, type_word(L, -1), (long long)lua_tointeger(L, -2));
            items++;
            if (lua_tointeger(L, -2) > max)
                max = lua_tointeger(L, -2);
        } else {
            char shown[64] = "";
            if (kt == LUA_TNUMBER)
                format_number(shown, sizeof shown, L, -2);
            raise_at(L, 0, "%s: unexpected key [%s]; fields are written name = value", ctor,
                     kt == LUA_TNUMBER ? shown : type_word(L, -2));
        }
        lua_pop(L, 1);
    }
    for (int i = 0; i < nspecs; i++) {
        memset(&vals[i], 0, sizeof vals[i]);
        lua_pushstring(L, specs[i].name);
        lua_rawget(L, 1);
        if (lua_isnil(L, -1)) {
            if (specs[i].required)
                raise_at(L, 0, "%s: field '%s' is required", ctor, specs[i].name);
        } else {
            read_value(L, ctor, &specs[i], &vals[i]);
        }
        lua_pop(L, 1);
    }
    if (n_items) {
        *n_items = items;
        *max_item = max;
    }
}

/* Copy a checked string field into a fixed buffer. */
static void copy_field(lua_State *L, char *dst, size_t cap, const char *ctor, const char *field,
                       const char *s)
{
    if (strlen(s) >= cap)
        raise_at(L, 0, "%s: field '%s' is longer than %zu bytes", ctor, field, cap - 1);
    memcpy(dst, s, strlen(s) + 1);
}

/* ---- layers ------------------------------------------------------------------------------- */

static layer_ud *new_layer(lua_State *L, tr_node_kind kind)
{
    layer_ud *u = lua_newuserdatauv(L, sizeof(layer_ud), 1);
    memset(u, 0, sizeof *u);
    u->node.kind = kind;
    u->node.line = caller_line(L, NULL);
    u->depth = 1;
    u->count = 1;
    luaL_setmetatable(L, LAYER_MT);
    return u;
}

/* What a non-layer child is, and the likely fix, for "item 2 is ..., not a layer (...)". */
static void describe_item(lua_State *L, int idx, char *what, size_t len, const char **hint)
{
    char num[64];
    *hint = "a layer is made by a constructor such as mlp { ... }";
    switch (lua_type(L, idx)) {
    case LUA_TNUMBER:
        format_number(num, sizeof num, L, idx);
        snprintf(what, len, "a number (%s)", num);
        break;
    case LUA_TSTRING: snprintf(what, len, "a string ('%.40s')", lua_tostring(L, idx)); break;
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
    default: snprintf(what, len, "a %s", luaL_typename(L, idx)); break;
    }
}

/* Check that items 1..max of the table at index 1 are layers; push them as a fresh table. */
static void collect_children(lua_State *L, const char *ctor, int n_items, lua_Integer max,
                             int *depth, long *count)
{
    char what[160];
    if (max != n_items) {
        for (lua_Integer i = 1; i <= max; i++) {
            if (lua_rawgeti(L, 1, i) == LUA_TNIL)
                raise_at(L, 0, "%s: item %lld is nil (a misspelled or undefined variable?)", ctor,
                         (long long)i);
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
            raise_at(L, 0, "%s: item %d is %s, not a layer (%s)", ctor, i, what, hint);
        }
        if (u->depth > *depth)
            *depth = u->depth;
        *count += u->count;
        if (*count > MAX_NODES)
            raise_at(L, 0, "%s: more than %ld layers in all (is a loop nesting layers?)", ctor,
                     MAX_NODES);
        lua_rawseti(L, t, i);
    }
    if (*depth + 1 > MAX_DEPTH)
        raise_at(L, 0, "%s: layers nested more than %d deep", ctor, MAX_DEPTH);
}

static const field_spec rope_fields[] = {{"theta", FK_NUM, OPT, LO_GT, 0, HI_NONE, 0, NULL}};
static const field_spec layernorm_fields[] = {{"bias", FK_BOOL, OPT, 0, 0, 0, 0, NULL},
                                              {"eps", FK_NUM, OPT, LO_GT, 0, HI_NONE, 0, NULL}};
static const field_spec rmsnorm_fields[] = {{"eps", FK_NUM, OPT, LO_GT, 0, HI_NONE, 0, NULL}};
static const field_spec attention_fields[] = {INT_FIELD("heads", REQ, 1),
                                              INT_FIELD("kv_heads", OPT, 1),
                                              {"bias", FK_BOOL, OPT, 0, 0, 0, 0, NULL}};
static const field_spec mlp_fields[] = {INT_FIELD("hidden", OPT, 1),
                                        {"activation", FK_ENUM, OPT, 0, 0, 0, 0, activation_names},
                                        {"bias", FK_BOOL, OPT, 0, 0, 0, 0, NULL}};
static const field_spec stack_fields[] = {INT_FIELD("n", REQ, 1)};
static const field_spec lm_head_fields[] = {{"tied", FK_BOOL, OPT, 0, 0, 0, 0, NULL}};

#define NSPECS(a) ((int)(sizeof(a) / sizeof((a)[0])))

static int l_embedding(lua_State *L)
{
    read_fields(L, "embedding", NULL, 0, NULL, NULL, NULL);
    new_layer(L, TR_NODE_EMBEDDING);
    return 1;
}

static int l_positions(lua_State *L)
{
    read_fields(L, "positions", NULL, 0, NULL, NULL, NULL);
    new_layer(L, TR_NODE_POSITIONS);
    return 1;
}

static int l_rope(lua_State *L)
{
    field_val v[1];
    read_fields(L, "rope", rope_fields, 1, v, NULL, NULL);
    new_layer(L, TR_NODE_ROPE)->node.rope_theta = v[0].present ? (float)v[0].n : 10000.0f;
    return 1;
}

static int l_layernorm(lua_State *L)
{
    field_val v[2];
    read_fields(L, "layernorm", layernorm_fields, 2, v, NULL, NULL);
    tr_node *n = &new_layer(L, TR_NODE_LAYERNORM)->node;
    n->bias = v[0].present ? v[0].b : 1;
    n->eps = v[1].present ? (float)v[1].n : 1e-5f;
    return 1;
}

static int l_rmsnorm(lua_State *L)
{
    field_val v[1];
    read_fields(L, "rmsnorm", rmsnorm_fields, 1, v, NULL, NULL);
    new_layer(L, TR_NODE_RMSNORM)->node.eps = v[0].present ? (float)v[0].n : 1e-5f;
    return 1;
}

static int l_attention(lua_State *L)
{
    field_val v[3];
    read_fields(L, "attention", attention_fields, 3, v, NULL, NULL);
    tr_node *n = &new_layer(L, TR_NODE_ATTENTION)->node;
    n->heads = (int)v[0].i;
    n->kv_heads = v[1].present ? (int)v[1].i : n->heads;
    n->bias = v[2].present ? v[2].b : 1;
    return 1;
}

static int l_mlp(lua_State *L)
{
    field_val v[3];
    read_fields(L, "mlp", mlp_fields, 3, v, NULL, NULL);
    tr_node *n = &new_layer(L, TR_NODE_MLP)->node;
    n->hidden = v[0].present ? (int)v[0].i : 0; /* 0: 4 * dim, resolved by model {} */
    n->activation = v[1].present ? (tr_activation)v[1].choice : TR_ACT_GELU;
    n->bias = v[2].present ? v[2].b : 1;
    return 1;
}

static int l_lm_head(lua_State *L)
{
    field_val v[1];
    read_fields(L, "lm_head", lm_head_fields, 1, v, NULL, NULL);
    new_layer(L, TR_NODE_LM_HEAD)->node.tied = v[0].present ? v[0].b : 1;
    return 1;
}

static int container(lua_State *L, tr_node_kind kind, const field_spec *specs, int nspecs)
{
    const char *ctor = kind_names[kind];
    field_val v[1];
    int n_items, depth;
    lua_Integer max;
    long count;
    read_fields(L, ctor, specs, nspecs, v, &n_items, &max);
    collect_children(L, ctor, n_items, max, &depth, &count);
    layer_ud *u = new_layer(L, kind);
    u->node.repeat = nspecs ? (int)v[0].i : 1;
    u->depth = depth + 1;
    u->count = count + 1;
    lua_insert(L, -2);
    lua_setiuservalue(L, -2, 1);
    return 1;
}

static int l_residual(lua_State *L)
{
    return container(L, TR_NODE_RESIDUAL, NULL, 0);
}

static int l_stack(lua_State *L)
{
    return container(L, TR_NODE_STACK, stack_fields, 1);
}

static int layer_tostring(lua_State *L)
{
    const layer_ud *u = luaL_checkudata(L, 1, LAYER_MT);
    lua_pushfstring(L, "%s (line %d)", tr_node_kind_name(u->node.kind), u->node.line);
    return 1;
}

/* ---- model -------------------------------------------------------------------------------- */

static void free_node(tr_node *n)
{
    for (int i = 0; i < n->n_children; i++)
        free_node(&n->children[i]);
    free(n->children);
    n->children = NULL;
    n->n_children = 0;
}

/* Copy the layers in the table at t into dst's children. Every allocation is attached to dst
 * at once, so free_node releases a partial copy. Does not raise Lua errors. */
static int copy_children(lua_State *L, int t, tr_node *dst)
{
    int n = (int)lua_rawlen(L, t);
    dst->children = NULL;
    dst->n_children = 0;
    if (n == 0)
        return 0;
    dst->children = calloc((size_t)n, sizeof(tr_node));
    if (!dst->children)
        return -1;
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
        if (rc)
            return -1;
    }
    return 0;
}

TR_PRINTF(3, 4) static int model_error(recipe_ctx *c, int line, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->check_msg, sizeof c->check_msg, fmt, ap);
    va_end(ap);
    c->check_line = line;
    return -1;
}

static int is_top_only(tr_node_kind k)
{
    return k == TR_NODE_EMBEDDING || k == TR_NODE_POSITIONS || k == TR_NODE_ROPE ||
           k == TR_NODE_LM_HEAD;
}

/* Checks a node below the top level of the model, and resolves what depends on the model:
 * mlp's default hidden width and attention's rope_theta (from the rope before it). */
static int check_node(recipe_ctx *c, const tr_model_desc *m, tr_node *n, const tr_node *parent,
                      float theta)
{
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
            if (check_node(c, m, &n->children[i], n, theta))
                return -1;
        break;
    case TR_NODE_ATTENTION:
        if (m->dim % n->heads != 0)
            return model_error(c, n->line, "attention: heads (%d) must divide dim (%d)", n->heads,
                               m->dim);
        if (n->heads % n->kv_heads != 0)
            return model_error(c, n->line, "attention: kv_heads (%d) must divide heads (%d)",
                               n->kv_heads, n->heads);
        if (theta > 0 && (m->dim / n->heads) % 2 != 0)
            return model_error(c, n->line,
                               "attention: with rope, the head size dim/heads (%d/%d = %d) must be even",
                               m->dim, n->heads, m->dim / n->heads);
        n->rope_theta = theta;
        break;
    case TR_NODE_MLP:
        if (n->hidden == 0) {
            if (m->dim > INT_MAX / 4)
                return model_error(c, n->line, "mlp: the default hidden (4 * dim) is too large; set hidden");
            n->hidden = 4 * m->dim;
        }
        break;
    default: break;
    }
    return 0;
}

static int check_model(recipe_ctx *c, tr_model_desc *m)
{
    tr_node *root = &m->root;
    int n = root->n_children;
    if (n == 0)
        return model_error(c, root->line,
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
            if (check_node(c, m, ch, root, theta))
                return -1;
            continue;
        }
        if (seen[k])
            return model_error(c, ch->line, "%s: appears twice in model (first at line %d)", name,
                               seen[k]);
        seen[k] = ch->line;
        if (k == TR_NODE_POSITIONS && seen[TR_NODE_ROPE])
            return model_error(c, ch->line,
                               "positions: a model has positions {} or rope {}, not both (rope at line %d)",
                               seen[TR_NODE_ROPE]);
        if (k == TR_NODE_ROPE && seen[TR_NODE_POSITIONS])
            return model_error(c, ch->line,
                               "rope: a model has positions {} or rope {}, not both (positions at line %d)",
                               seen[TR_NODE_POSITIONS]);
        if (k == TR_NODE_ROPE)
            theta = ch->rope_theta;
        if (k == TR_NODE_LM_HEAD && i != n - 1)
            return model_error(c, ch->line,
                               "lm_head: must be the last layer of model, but %s (line %d) follows it",
                               tr_node_kind_name(root->children[i + 1].kind),
                               root->children[i + 1].line);
    }
    if (root->children[n - 1].kind != TR_NODE_LM_HEAD)
        return model_error(c, root->children[n - 1].line,
                           "model: the last layer must be lm_head {}, got %s",
                           tr_node_kind_name(root->children[n - 1].kind));
    return 0;
}

static const field_spec model_fields[] = {INT_FIELD("vocab", REQ, 1), INT_FIELD("dim", REQ, 1),
                                          INT_FIELD("seq_len", REQ, 1)};

static int l_model(lua_State *L)
{
    recipe_ctx *c = get_ctx(L);
    if (c->done)
        raise_at(L, 0, "model: called after the recipe finished (from a __gc finalizer?)");
    int line = caller_line(L, NULL);
    if (c->model_line)
        raise_at(L, line, "model: declared twice (first at line %d)", c->model_line);
    field_val v[3];
    int n_items, depth;
    lua_Integer max;
    long count;
    read_fields(L, "model", model_fields, 3, v, &n_items, &max);
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
        free_node(&m.root);
        raise_at(L, line, "model: out of memory copying the layers");
    }
    if (check_model(c, &m)) {
        free_node(&m.root);
        raise_at(L, c->check_line, "%s", c->check_msg);
    }
    if (c->model_line) { /* a __gc finalizer run by an allocation above declared one */
        free_node(&m.root);
        raise_at(L, line, "model: declared twice (first at line %d)", c->model_line);
    }
    c->r.model = m;
    c->model_line = line;
    return 0;
}

/* ---- sections ----------------------------------------------------------------------------- */

static int section_start(lua_State *L, int *line_slot, const char *name)
{
    if (get_ctx(L)->done)
        raise_at(L, 0, "%s: called after the recipe finished (from a __gc finalizer?)", name);
    int line = caller_line(L, NULL);
    if (*line_slot)
        raise_at(L, line, "%s: declared twice (first at line %d)", name, *line_slot);
    return line;
}

static const field_spec data_fields[] = {
    {"text", FK_STR, OPT, 0, 0, 0, 0, NULL},
    {"tokenizer", FK_ENUM, OPT, 0, 0, 0, 0, tokenizer_names},
    {"val_fraction", FK_NUM, OPT, LO_GT, 0, HI_LE, 0.5, NULL},
    {"shards", FK_STR, OPT, 0, 0, 0, 0, NULL},
    {"val_shards", FK_STR, OPT, 0, 0, 0, 0, NULL},
    {"mix", FK_TABLE, OPT, 0, 0, 0, 0, NULL},
    {"encoder", FK_STR, OPT, 0, 0, 0, 0, NULL},
    {"merges", FK_STR, OPT, 0, 0, 0, 0, NULL}};
enum { D_TEXT, D_TOKENIZER, D_VAL_FRACTION, D_SHARDS, D_VAL_SHARDS, D_MIX, D_ENCODER, D_MERGES,
       D_COUNT };

static const field_spec mix_fields[] = {
    {"shards", FK_STR, REQ, 0, 0, 0, 0, NULL},
    {"weight", FK_NUM, REQ, LO_GT, 0, HI_NONE, 0, NULL}};

#ifndef TR_DATA_DIR
#define TR_DATA_DIR "data"
#endif

/* A data path as written in the recipe, resolved against the recipe's folder. */
static void resolve_path(lua_State *L, char *dst, size_t cap, const char *src, const char *what)
{
    const char *base = get_ctx(L)->basedir;
    int n;
    if (src[0] == '/' || !base || !base[0] || strcmp(base, ".") == 0)
        n = snprintf(dst, cap, "%s", src);
    else
        n = snprintf(dst, cap, "%s%s%s", base, base[strlen(base) - 1] == '/' ? "" : "/", src);
    if (n < 0 || (size_t)n >= cap)
        raise_at(L, 0, "data: the path of '%s' is longer than %zu bytes", what, cap - 1);
}

/* mix = { { shards = "...", weight = w }, ... }: the table is field `mix` of argument 1. */
static void read_mix(lua_State *L, tr_data_desc *d)
{
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
            raise_at(L, 0, "data: 'mix' must be a list of { shards = \"...\", weight = w }, "
                           "without named fields or gaps");
    }
    if (count == 0 || count != len)
        raise_at(L, 0, "data: 'mix' needs at least one { shards = \"...\", weight = w }");
    if (count > TR_MAX_MIX)
        raise_at(L, 0, "data: 'mix' has %d sources; at most %d are supported", count, TR_MAX_MIX);
    for (int k = 1; k <= count; k++) {
        char ctor[32];
        snprintf(ctor, sizeof ctor, "data: mix[%d]", k);
        lua_rawgeti(L, idx, k);
        int e = lua_gettop(L);
        if (lua_type(L, e) != LUA_TTABLE)
            raise_at(L, 0, "%s: expected a table { shards = \"...\", weight = w }, got %s", ctor,
                     type_word(L, e));
        lua_pushnil(L);
        while (lua_next(L, e)) {
            const char *key = lua_type(L, -2) == LUA_TSTRING ? lua_tostring(L, -2) : NULL;
            if (!key || (strcmp(key, "shards") != 0 && strcmp(key, "weight") != 0))
                raise_at(L, 0, "%s: unknown field '%s' (fields: shards, weight)", ctor,
                         key ? key : type_word(L, -2));
            lua_pop(L, 1);
        }
        field_val v[2];
        for (int f = 0; f < 2; f++) {
            memset(&v[f], 0, sizeof v[f]);
            lua_getfield(L, e, mix_fields[f].name);
            if (lua_isnil(L, -1))
                raise_at(L, 0, "%s: field '%s' is required", ctor, mix_fields[f].name);
            read_value(L, ctor, &mix_fields[f], &v[f]);
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

static int l_data(lua_State *L)
{
    recipe_ctx *c = get_ctx(L);
    int line = section_start(L, &c->data_line, "data");
    field_val v[D_COUNT];
    read_fields(L, "data", data_fields, D_COUNT, v, NULL, NULL);
    tr_data_desc *d = &c->r.data;
    int sources = v[D_TEXT].present + v[D_SHARDS].present + v[D_MIX].present;
    if (sources == 0)
        raise_at(L, 0, "data: one of 'text', 'shards' or 'mix' is required");
    if (sources > 1)
        raise_at(L, 0, "data: give only one of 'text', 'shards' and 'mix'");
    d->tokenizer = v[D_TOKENIZER].present ? (tr_tokenizer_kind)v[D_TOKENIZER].choice
                                          : TR_TOKENIZER_BYTE;
    if (v[D_TEXT].present && v[D_VAL_SHARDS].present)
        raise_at(L, 0, "data: 'val_shards' goes with 'shards' or 'mix'; a 'text' corpus is "
                       "split by val_fraction");
    if (!v[D_TEXT].present && v[D_VAL_FRACTION].present)
        raise_at(L, 0, "data: 'val_fraction' goes with 'text'; shards take 'val_shards'");
    if (d->tokenizer != TR_TOKENIZER_GPT2 && (v[D_ENCODER].present || v[D_MERGES].present))
        raise_at(L, 0, "data: '%s' goes with tokenizer = \"gpt2\"",
                 v[D_ENCODER].present ? "encoder" : "merges");
    if (v[D_TEXT].present)
        resolve_path(L, d->text, sizeof d->text, v[D_TEXT].s, "text");
    if (v[D_SHARDS].present)
        resolve_path(L, d->shards, sizeof d->shards, v[D_SHARDS].s, "shards");
    if (v[D_VAL_SHARDS].present)
        resolve_path(L, d->val_shards, sizeof d->val_shards, v[D_VAL_SHARDS].s, "val_shards");
    if (v[D_MIX].present)
        read_mix(L, d);
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

static int l_optimizer(lua_State *L)
{
    recipe_ctx *c = get_ctx(L);
    int line = section_start(L, &c->optim_line, "optimizer");
    field_val v[5];
    read_fields(L, "optimizer", optimizer_fields, 5, v, NULL, NULL);
    tr_optim_desc *o = &c->r.optim;
    if (v[0].present)
        o->lr = (float)v[0].n;
    if (v[1].present) {
        o->beta1 = (float)v[1].pair[0];
        o->beta2 = (float)v[1].pair[1];
    }
    if (v[2].present)
        o->eps = (float)v[2].n;
    if (v[3].present)
        o->weight_decay = (float)v[3].n;
    if (v[4].present)
        o->grad_clip = (float)v[4].n;
    c->optim_line = line;
    return 0;
}

static const field_spec schedule_fields[] = {
    INT_FIELD("warmup", OPT, 0),
    {"decay", FK_ENUM, OPT, 0, 0, 0, 0, decay_names},
    {"min_lr", FK_NUM, OPT, LO_GE, 0, HI_NONE, 0, NULL},
    {"decay_frac", FK_NUM, OPT, LO_GT, 0, HI_LE, 1, NULL}};

static int l_schedule(lua_State *L)
{
    recipe_ctx *c = get_ctx(L);
    int line = section_start(L, &c->sched_line, "schedule");
    field_val v[4];
    read_fields(L, "schedule", schedule_fields, 4, v, NULL, NULL);
    tr_schedule_desc *s = &c->r.schedule;
    if (v[0].present)
        s->warmup = (int)v[0].i;
    if (v[1].present)
        s->decay = (tr_decay_kind)v[1].choice;
    if (v[2].present) {
        s->min_lr = (float)v[2].n;
        c->min_lr_set = 1;
    }
    if (v[3].present)
        s->decay_frac = (float)v[3].n;
    c->sched_line = line;
    return 0;
}

static const field_spec train_fields[] = {
    LONG_FIELD("batch_tokens", REQ, 1),
    {"micro_batch", FK_INT_AUTO, OPT, LO_GE, 1, HI_LE, INT_MAX, NULL},
    INT_FIELD("steps", REQ, 1),
    INT_FIELD("eval_every", OPT, 0),
    LONG_FIELD("eval_tokens", OPT, 0),
    {"seed", FK_INT, OPT, LO_GE, 0, HI_NONE, 0, NULL},
    {"out", FK_STR, OPT, 0, 0, 0, 0, NULL},
    INT_FIELD("sample_tokens", OPT, 0),
    INT_FIELD("log_every", OPT, 1),
    INT_FIELD("checkpoint_every", OPT, 0),
    INT_FIELD("keep_checkpoints", OPT, 1),
    {"precision", FK_ENUM, OPT, 0, 0, 0, 0, precision_names},
    {"recompute", FK_ENUM, OPT, 0, 0, 0, 0, recompute_names},
    {"peak_tflops", FK_NUM, OPT, LO_GE, 0, HI_NONE, 0, NULL}};

static int l_train(lua_State *L)
{
    recipe_ctx *c = get_ctx(L);
    int line = section_start(L, &c->train_line, "train");
    field_val v[14];
    read_fields(L, "train", train_fields, 14, v, NULL, NULL);
    tr_train_desc *t = &c->r.train;
    t->batch_tokens = (long)v[0].i;
    t->micro_batch = v[1].present ? (int)v[1].i : 0;
    t->steps = (int)v[2].i;
    t->eval_every = v[3].present ? (int)v[3].i : 0;
    t->eval_tokens = v[4].present ? (long)v[4].i : 0;
    t->seed = v[5].present ? (unsigned long long)v[5].i : 1337;
    if (v[6].present)
        copy_field(L, t->out, sizeof t->out, "train", "out", v[6].s);
    else
        snprintf(t->out, sizeof t->out, "runs/%s", c->stem);
    t->sample_tokens = v[7].present ? (int)v[7].i : 200;
    t->log_every = v[8].present ? (int)v[8].i : 10;
    t->checkpoint_every = v[9].present ? (int)v[9].i : 0;
    t->keep_checkpoints = v[10].present ? (int)v[10].i : 3;
    t->precision = v[11].present ? (tr_precision)v[11].choice : TR_PRECISION_BF16;
    t->recompute = v[12].present ? v[12].choice : 0;
    t->peak_tflops = v[13].present ? v[13].n : 0;
    c->train_line = line;
    return 0;
}

static const field_spec parallel_fields[] = {
    {"dp", FK_INT_AUTO, OPT, LO_GE, 1, HI_LE, INT_MAX, NULL},
    {"tp", FK_INT_AUTO, OPT, LO_GE, 1, HI_LE, INT_MAX, NULL},
    {"pp", FK_INT_AUTO, OPT, LO_GE, 1, HI_LE, INT_MAX, NULL},
    {"zero", FK_INT_AUTO, OPT, LO_GE, 0, HI_LE, 3, NULL},
    INT_FIELD("bucket_kb", OPT, 1)};

static int l_parallel(lua_State *L)
{
    recipe_ctx *c = get_ctx(L);
    int line = section_start(L, &c->parallel_line, "parallel");
    tr_parallel_desc *p = &c->r.parallel;
    if (lua_type(L, 1) == LUA_TSTRING) {
        if (strcmp(lua_tostring(L, 1), "auto") != 0)
            raise_at(L, 0, "parallel: expected \"auto\" or a table { dp = ..., tp = ..., pp = ..., zero = ... }, got '%s'",
                     lua_tostring(L, 1));
        *p = (tr_parallel_desc){.is_auto = 1, .dp = -1, .tp = -1, .pp = -1, .zero = -1, .sequence_parallel = -1};
    } else {
        if (lua_type(L, 1) != LUA_TTABLE)
            raise_at(L, 0, "parallel: expected \"auto\" or a table { dp = ..., tp = ..., pp = ..., zero = ... }, got %s",
                     lua_isnone(L, 1) ? "no value" : type_word(L, 1));
        field_val v[5];
        read_fields(L, "parallel", parallel_fields, 5, v, NULL, NULL);
        p->bucket_kb = v[4].present ? (int)v[4].i : 0;
        /* -1 = auto (absent or "auto"): zero = 0 is a real choice, "don't shard" */
        int *dst[4] = {&p->dp, &p->tp, &p->pp, &p->zero};
        for (int i = 0; i < 4; i++) *dst[i] = v[i].present && !v[i].is_auto ? (int)v[i].i : -1;
        /* everything left to "auto" is the same plan as parallel "auto" */
        p->is_auto = p->dp < 0 && p->tp < 0 && p->pp < 0 && p->zero < 0 && p->bucket_kb == 0;
    }
    c->parallel_line = line;
    return 0;
}

/* ---- knobs -------------------------------------------------------------------------------- */

static const char *knob_list(recipe_ctx *c)
{
    const char *names[TR_MAX_KNOBS];
    for (int i = 0; i < c->r.n_knobs; i++)
        names[i] = c->r.knobs[i].name;
    if (c->r.n_knobs == 0)
        return "none declared";
    return sorted_list(c->list, sizeof c->list, names, c->r.n_knobs);
}

static int knob_index(lua_State *L)
{
    lua_settop(L, 2);
    lua_pushvalue(L, 2);
    if (lua_rawget(L, lua_upvalueindex(1)) != LUA_TNIL)
        return 1;
    recipe_ctx *c = get_ctx(L);
    if (lua_type(L, 2) == LUA_TSTRING)
        raise_at(L, 0, "unknown knob '%s' (knobs: %s)", lua_tostring(L, 2), knob_list(c));
    raise_at(L, 0, "unknown knob [%s] (knobs: %s)", type_word(L, 2), knob_list(c));
}

static int knob_newindex(lua_State *L)
{
    const char *name = lua_type(L, 2) == LUA_TSTRING ? lua_tostring(L, 2) : "?";
    raise_at(L, 0, "knobs are read-only: change '%s' with --set %s=VALUE or in knobs { ... }",
             name, name);
}

/* pairs(k) walks the hidden table without handing it out (the state passed is the proxy). */
static int knob_next(lua_State *L)
{
    lua_settop(L, 2);
    if (lua_next(L, lua_upvalueindex(1)))
        return 2;
    lua_pushnil(L);
    return 1;
}

static int knob_pairs(lua_State *L)
{
    lua_pushvalue(L, lua_upvalueindex(1));
    lua_pushcclosure(L, knob_next, 1);
    lua_pushvalue(L, 1);
    lua_pushnil(L);
    return 3;
}

static int cmp_knob(const void *a, const void *b)
{
    return strcmp(((const tr_knob *)a)->name, ((const tr_knob *)b)->name);
}

static int is_name(const char *s)
{
    if (!(s[0] == '_' || (s[0] >= 'a' && s[0] <= 'z') || (s[0] >= 'A' && s[0] <= 'Z')))
        return 0;
    for (; *s; s++)
        if (!(*s == '_' || (*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') ||
              (*s >= '0' && *s <= '9')))
            return 0;
    return 1;
}

/* Apply one --set to knob k, pushing the new Lua value. */
static void apply_set(lua_State *L, int line, tr_knob *k, const tr_knob_set *s)
{
    char dflt[160];
    switch (k->type) {
    case TR_KNOB_NUMBER:
        snprintf(dflt, sizeof dflt, "%.14g", k->number);
        if (lua_stringtonumber(L, s->value) == 0)
            raise_at(L, line, "--set %s=%s: '%s' is not a number (knob '%s' defaults to %s)",
                     s->name, s->value, s->value, s->name, dflt);
        k->number = lua_tonumber(L, -1);
        if (!isfinite(k->number))
            raise_at(L, line, "--set %s=%s: '%s' is not a finite number", s->name, s->value,
                     s->value);
        break;
    case TR_KNOB_BOOL:
        if (strcmp(s->value, "true") == 0 || strcmp(s->value, "false") == 0) {
            k->boolean = s->value[0] == 't';
            lua_pushboolean(L, k->boolean);
        } else {
            raise_at(L, line, "--set %s=%s: '%s' is not a boolean; use true or false (knob '%s' defaults to %s)",
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

static int l_knobs(lua_State *L)
{
    recipe_ctx *c = get_ctx(L);
    int line = section_start(L, &c->knobs_line, "knobs");
    if (lua_type(L, 1) != LUA_TTABLE)
        raise_at(L, 0, "knobs: expected a table, as in knobs { layers = 4, lr = 3e-4 }, got %s",
                 lua_isnone(L, 1) ? "no value" : type_word(L, 1));
    lua_settop(L, 1);
    int n = 0;
    tr_knob *ks = c->r.knobs;
    lua_pushnil(L);
    while (lua_next(L, 1)) {
        if (lua_type(L, -2) != LUA_TSTRING || !is_name(lua_tostring(L, -2)))
            raise_at(L, 0, "knobs: knobs are written name = default, as in layers = 4; got a key of type %s",
                     lua_type(L, -2) == LUA_TSTRING ? "string that is not a name" : type_word(L, -2));
        const char *name = lua_tostring(L, -2);
        if (n == TR_MAX_KNOBS)
            raise_at(L, 0, "knobs: more than %d knobs", TR_MAX_KNOBS);
        if (strlen(name) >= TR_NAME_MAX)
            raise_at(L, 0, "knobs: knob name '%s' is longer than %d bytes", name, TR_NAME_MAX - 1);
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
                raise_at(L, 0, "knobs: the value of '%s' is longer than %zu bytes", name,
                         sizeof k->string - 1);
            memcpy(k->string, lua_tostring(L, -1), strlen(lua_tostring(L, -1)) + 1);
            break;
        default:
            raise_at(L, 0, "knobs: knob '%s' must be a number, string or boolean, got %s", name,
                     type_word(L, -1));
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
            if (strcmp(ks[j].name, s->name) == 0)
                k = &ks[j];
        if (!k)
            raise_at(L, line, "--set %s: unknown knob (knobs: %s)", s->name, knob_list(c));
        apply_set(L, line, k, s);
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
#define HF_MT "tr.hf"

static int l_hf(lua_State *L)
{
    recipe_ctx *c = get_ctx(L);
    if (c->done)
        return 0;
    if (lua_gettop(L) != 1 || lua_type(L, 1) != LUA_TSTRING)
        raise_at(L, 0, "hf: expects a directory path, as in init = hf \"path/to/model\"");
    const char *dir = lua_tostring(L, 1), *base = c->basedir;
    char *path = lua_newuserdatauv(L, TR_PATH_MAX, 0);
    int n;
    if (dir[0] == '/' || !base || !base[0] || strcmp(base, ".") == 0)
        n = snprintf(path, TR_PATH_MAX, "%s", dir);
    else
        n = snprintf(path, TR_PATH_MAX, "%s%s%s", base, base[strlen(base) - 1] == '/' ? "" : "/",
                     dir);
    if (n < 0 || n >= TR_PATH_MAX)
        raise_at(L, 0, "hf: the path is longer than %d bytes", TR_PATH_MAX - 1);
    luaL_setmetatable(L, HF_MT);
    return 1;
}

/* ---- load --------------------------------------------------------------------------------- */

static const luaL_Reg constructors[] = {
    {"knobs", l_knobs},         {"model", l_model},         {"embedding", l_embedding},
    {"positions", l_positions}, {"rope", l_rope},           {"layernorm", l_layernorm},
    {"rmsnorm", l_rmsnorm},     {"attention", l_attention}, {"mlp", l_mlp},
    {"residual", l_residual},   {"stack", l_stack},         {"lm_head", l_lm_head},
    {"data", l_data},           {"optimizer", l_optimizer}, {"schedule", l_schedule},
    {"train", l_train},         {"parallel", l_parallel},   {"hf", l_hf},
    {NULL, NULL}};

/* Runs protected: opens the allowed libraries, registers the constructors, compiles the
 * recipe (text only) and leaves the chunk on the stack. */
static int setup(lua_State *L)
{
    recipe_ctx *c = get_ctx(L);
    const char *text = lua_touserdata(L, 1);
    size_t len = (size_t)lua_tointeger(L, 2);
    lua_settop(L, 0);
    static const luaL_Reg libs[] = {{LUA_GNAME, luaopen_base},
                                    {LUA_TABLIBNAME, luaopen_table},
                                    {LUA_STRLIBNAME, luaopen_string},
                                    {LUA_MATHLIBNAME, luaopen_math},
                                    {LUA_UTF8LIBNAME, luaopen_utf8}};
    for (size_t i = 0; i < sizeof libs / sizeof libs[0]; i++) {
        luaL_requiref(L, libs[i].name, libs[i].func, 1);
        lua_pop(L, 1);
    }
    lua_pushnil(L);
    lua_setglobal(L, "dofile");
    lua_pushnil(L);
    lua_setglobal(L, "loadfile");
    lua_pushnil(L);
    lua_setglobal(L, "require");
    lua_getglobal(L, "string");
    lua_pushnil(L);
    lua_setfield(L, -2, "dump"); /* makes bytecode, which nothing here may load */
    lua_pop(L, 1);
    lua_getglobal(L, "setmetatable");
    lua_pushcclosure(L, sandbox_setmetatable, 1);
    lua_setglobal(L, "setmetatable");
    lua_pushcfunction(L, sandbox_print);
    lua_setglobal(L, "print");
    lua_getglobal(L, "load");
    lua_pushcclosure(L, sandbox_load, 1);
    lua_setglobal(L, "load");

    luaL_newmetatable(L, HF_MT);
    lua_pushliteral(L, "hf");
    lua_setfield(L, -2, "__metatable");
    lua_pop(L, 1);
    luaL_newmetatable(L, LAYER_MT);
    lua_pushcfunction(L, layer_tostring);
    lua_setfield(L, -2, "__tostring");
    lua_pushliteral(L, "layer");
    lua_setfield(L, -2, "__metatable");
    lua_pop(L, 1);
    lua_pushglobaltable(L);
    luaL_setfuncs(L, constructors, 0);
    lua_pop(L, 1);

    lua_pushfstring(L, "=%s", c->chunk);
    if (luaL_loadbufferx(L, text, len, lua_tostring(L, -1), "t") != LUA_OK)
        lua_error(L);
    return 1;
}

/* Lua cuts "=name" chunk names to LUA_IDSIZE - 1 bytes in its own messages: restore the name. */
static void set_error(recipe_ctx *c, const char *msg, char *err, size_t errlen)
{
    size_t n = strlen(c->chunk), cut = LUA_IDSIZE - 1;
    const char *rest = msg;
    if (n > cut && strncmp(msg, c->chunk, cut) == 0 && msg[cut] == ':')
        rest = msg + cut;
    else if (strncmp(msg, c->chunk, n) == 0 && msg[n] == ':')
        rest = msg + n;
    else
        rest = NULL;
    size_t line_len = strcspn(rest ? rest : msg, "\r\n");
    if (rest)
        snprintf(err, errlen, "%s%.*s", c->chunk, (int)line_len, rest);
    else
        snprintf(err, errlen, "%s: %.*s", c->chunk, (int)line_len, msg);
}

TR_PRINTF(3, 4) static int fail(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
    return -1;
}

/* What is only known once the whole recipe ran: missing sections and cross-section values. */
static int finish(recipe_ctx *c, char *err, size_t errlen)
{
    tr_recipe *r = &c->r;
    if (c->n_sets > 0 && !c->knobs_line)
        return fail(err, errlen, "%s: --set given but the recipe declares no knobs", c->chunk);
    if (!c->model_line)
        return fail(err, errlen, "%s: no model { ... } declared", c->chunk);
    if (!c->data_line)
        return fail(err, errlen, "%s: no data { ... } declared", c->chunk);
    if (!c->train_line)
        return fail(err, errlen, "%s: no train { ... } declared", c->chunk);
    if (r->train.batch_tokens % r->model.seq_len != 0)
        return fail(err, errlen,
                    "%s:%d: train: batch_tokens (%ld) must be a multiple of the model's seq_len (%d)",
                    c->chunk, c->train_line, r->train.batch_tokens, r->model.seq_len);
    if (r->data.tokenizer == TR_TOKENIZER_GPT2 && r->model.vocab < 50257)
        return fail(err, errlen,
                    "%s:%d: data: the gpt2 tokenizer has 50257 tokens but model.vocab is %d",
                    c->chunk, c->data_line, r->model.vocab);
    if (!c->min_lr_set)
        r->schedule.min_lr = 0.1f * r->optim.lr;
    else if (r->schedule.min_lr > r->optim.lr) /* the "decay" would raise the rate */
        return fail(err, errlen, "%s:%d: schedule: min_lr (%g) must not exceed optimizer.lr (%g)",
                    c->chunk, c->sched_line, (double)r->schedule.min_lr, (double)r->optim.lr);
    return 0;
}

static int load_text(tr_recipe *out, const char *text, size_t len, const char *chunk,
                     const char *basedir, const tr_knob_set *sets, int n_sets, char *err,
                     size_t errlen)
{
    recipe_ctx *c = calloc(1, sizeof *c); /* ~20 KiB of message scratch: keep it off the stack */
    if (!c)
        return fail(err, errlen, "%s: out of memory", chunk);
    int rc = -1;
    c->chunk = chunk;
    c->basedir = basedir;
    c->sets = sets;
    c->n_sets = sets ? n_sets : 0;
    const char *slash = strrchr(chunk, '/');
    const char *base = slash ? slash + 1 : chunk;
    size_t stem = strlen(base);
    if (stem > 4 && strcmp(base + stem - 4, ".lua") == 0)
        stem -= 4;
    if (stem == 0 || stem >= sizeof c->stem)
        snprintf(c->stem, sizeof c->stem, "recipe");
    else
        snprintf(c->stem, sizeof c->stem, "%.*s", (int)stem, base);

    tr_recipe *r = &c->r;
    snprintf(r->path, sizeof r->path, "%s", chunk);
    r->data.tokenizer = TR_TOKENIZER_BYTE;
    r->data.val_fraction = 0.1f;
    r->optim = (tr_optim_desc){.lr = 3e-4f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
                               .weight_decay = 0.1f, .grad_clip = 1.0f};
    r->schedule = (tr_schedule_desc){.warmup = 0, .decay = TR_DECAY_COSINE, .decay_frac = 0.2f};
    r->parallel = (tr_parallel_desc){.is_auto = 1, .dp = -1, .tp = -1, .pp = -1, .zero = -1, .sequence_parallel = -1};

    if (strlen(chunk) >= TR_PATH_MAX) {
        fail(err, errlen, "%.64s...: recipe path is longer than %d bytes", chunk,
             TR_PATH_MAX - 1);
        goto done;
    }
    if (len > 0 && text[0] == LUA_SIGNATURE[0]) {
        fail(err, errlen, "%s: binary (precompiled) recipes are not allowed", chunk);
        goto done;
    }
    lua_State *L = lua_newstate(sandbox_alloc, c);
    if (!L) {
        fail(err, errlen, "%s: cannot start Lua (out of memory)", chunk);
        goto done;
    }
    lua_pushcfunction(L, setup);
    lua_pushlightuserdata(L, (void *)text);
    lua_pushinteger(L, (lua_Integer)len);
    int status = lua_pcall(L, 2, 1, 0);
    if (status == LUA_OK) {
        lua_pushcfunction(L, message_handler);
        lua_insert(L, 1);
        lua_sethook(L, instr_hook, LUA_MASKCOUNT, HOOK_EVERY);
        timed_msg_len = (size_t)snprintf(timed_msg, sizeof timed_msg,
                                         "%s: recipe ran for more than %d s inside one library "
                                         "call (a string pattern that backtracks without end?)\n",
                                         chunk, TIME_LIMIT + TIME_GRACE);
        if (timed_msg_len >= sizeof timed_msg)
            timed_msg_len = sizeof timed_msg - 1;
        struct sigaction sa, old_sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_alarm;
        sigemptyset(&sa.sa_mask);
        timed_fired = 0;
        timed_L = L;
        sigaction(SIGALRM, &sa, &old_sa);
        unsigned old_alarm = alarm(TIME_LIMIT);
        status = lua_pcall(L, 0, 0, 1);
        alarm(0);
        sigaction(SIGALRM, &old_sa, NULL);
        timed_L = NULL;
        if (old_alarm)
            alarm(old_alarm);
    }
    /* Nothing may declare anything from here on. setmetatable refuses __gc, so no recipe
     * code should run during lua_close; `done` makes sure of it. */
    c->done = 1;
    if (status != LUA_OK) {
        if (c->mem_exceeded && (status == LUA_ERRMEM || status == LUA_ERRERR))
            fail(err, errlen, "%s: recipe used more than %d MiB", chunk, MEM_LIMIT_MIB);
        else if (lua_type(L, -1) == LUA_TSTRING)
            set_error(c, lua_tostring(L, -1), err, errlen);
        else
            fail(err, errlen, "%s: recipe failed (error %d)", chunk, status);
        lua_close(L);
        goto done;
    }
    /* `init = hf "DIR"`, read raw: no metamethod (so no recipe code) runs here */
    lua_pushglobaltable(L);
    lua_pushliteral(L, "init");
    lua_rawget(L, -2);
    if (!lua_isnil(L, -1)) {
        const char *hf_path = luaL_testudata(L, -1, HF_MT);
        if (!hf_path) {
            fail(err, errlen, "%s: init must be hf \"path/to/model\" (a Hugging Face model directory)",
                 chunk);
            lua_close(L);
            goto done;
        }
        snprintf(c->r.init_hf, sizeof c->r.init_hf, "%s", hf_path);
    }
    lua_close(L);
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

static void clear_out(tr_recipe *out, char *err, size_t errlen)
{
    if (out)
        memset(out, 0, sizeof *out);
    if (err && errlen)
        err[0] = 0;
}

int tr_recipe_load_string(tr_recipe *out, const char *text, const char *chunkname,
                          const char *basedir, const tr_knob_set *sets, int n_sets, char *err,
                          size_t errlen)
{
    clear_out(out, err, errlen);
    return load_text(out, text, strlen(text), chunkname ? chunkname : "recipe", basedir, sets,
                     n_sets, err, errlen);
}

int tr_recipe_load(tr_recipe *out, const char *path, const tr_knob_set *sets, int n_sets,
                   char *err, size_t errlen)
{
    clear_out(out, err, errlen);
    FILE *f = fopen(path, "rb");
    if (!f)
        return fail(err, errlen, "%s: cannot read recipe: %s", path, strerror(errno));
    size_t cap = 1 << 16, len = 0;
    char *text = malloc(cap + 1);
    int rc = 0;
    while (text) {
        len += fread(text + len, 1, cap - len, f);
        if (ferror(f)) {
            rc = fail(err, errlen, "%s: cannot read recipe: %s", path, strerror(errno));
            break;
        }
        if (feof(f))
            break;
        if (cap >= FILE_LIMIT) {
            rc = fail(err, errlen, "%s: cannot read recipe: larger than %zu MiB", path,
                      FILE_LIMIT >> 20);
            break;
        }
        char *grown = realloc(text, 2 * cap + 1);
        if (!grown)
            free(text);
        text = grown;
        cap *= 2;
    }
    fclose(f);
    if (!text)
        return fail(err, errlen, "%s: cannot read recipe: out of memory", path);
    if (rc == 0) {
        text[len] = 0;
        char dir[TR_PATH_MAX];
        const char *slash = strrchr(path, '/');
        if (!slash)
            snprintf(dir, sizeof dir, ".");
        else if (slash == path)
            snprintf(dir, sizeof dir, "/");
        else
            snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path);
        rc = load_text(out, text, len, path, dir, sets, n_sets, err, errlen);
    }
    free(text);
    return rc;
}

int tr_knob_set_parse(tr_knob_set *out, const char *arg, char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    const char *eq = strchr(arg, '=');
    if (!eq)
        return fail(err, errlen, "--set %s: expected name=value, as in --set lr=1e-3", arg);
    size_t n = (size_t)(eq - arg);
    if (n == 0)
        return fail(err, errlen, "--set %s: the knob name before '=' is empty", arg);
    if (n >= sizeof out->name)
        return fail(err, errlen, "--set %.*s: knob name is longer than %zu bytes", (int)n,
                    arg, sizeof out->name - 1);
    if (strlen(eq + 1) >= sizeof out->value)
        return fail(err, errlen, "--set %.*s: value is longer than %zu bytes", (int)n, arg,
                    sizeof out->value - 1);
    memcpy(out->name, arg, n);
    out->name[n] = 0;
    memcpy(out->value, eq + 1, strlen(eq + 1) + 1);
    return 0;
}

void tr_recipe_free(tr_recipe *r)
{
    if (r)
        free_node(&r->model.root);
}

/* ---- writing ------------------------------------------------------------------------------ */

/* Shortest "%.Ng" that reads back as the same float: exact like "%.9g", but 1e-05, not
 * 9.99999975e-06. */
static void put_float(FILE *f, float v)
{
    char buf[40];
    for (int p = 6; p <= 9; p++) {
        snprintf(buf, sizeof buf, "%.*g", p, (double)v);
        if ((float)strtod(buf, NULL) == v)
            break;
    }
    fputs(buf, f);
}

static void put_double(FILE *f, double v)
{
    char buf[40];
    for (int p = 15; p <= 17; p++) {
        snprintf(buf, sizeof buf, "%.*g", p, v);
        if (strtod(buf, NULL) == v)
            break;
    }
    fputs(buf, f);
}

/* A Lua string literal: quotes, backslashes and control bytes escaped (\ddd is 3 digits so a
 * following digit is never read as part of it). */
static void put_string(FILE *f, const char *s)
{
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

static const char *lua_bool(int b)
{
    return b ? "true" : "false";
}

static void put_node(FILE *f, const tr_node *n, int depth)
{
    fprintf(f, "%*s%s {", 2 * depth, "", tr_node_kind_name(n->kind));
    switch (n->kind) {
    case TR_NODE_STACK:
    case TR_NODE_RESIDUAL:
        if (n->kind == TR_NODE_STACK)
            fprintf(f, " n = %d,", n->repeat);
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
                activation_names[n->activation == TR_ACT_SWIGLU], lua_bool(n->bias));
        break;
    case TR_NODE_LM_HEAD: fprintf(f, " tied = %s", lua_bool(n->tied)); break;
    default: break;
    }
    fputs(n->kind == TR_NODE_EMBEDDING || n->kind == TR_NODE_POSITIONS ? "},\n" : " },\n", f);
}

/* The corpus as an absolute path, so the saved recipe loads from any folder. */
static void put_data_path(FILE *f, const char *text)
{
    char *real = realpath(text, NULL);
    if (real && strlen(real) < TR_PATH_MAX) {
        put_string(f, real);
    } else {
        char cwd[TR_PATH_MAX], joined[2 * TR_PATH_MAX + 2];
        if (text[0] != '/' && getcwd(cwd, sizeof cwd)) {
            snprintf(joined, sizeof joined, "%s/%s", cwd, text);
            put_string(f, strlen(joined) < TR_PATH_MAX ? joined : text);
        } else {
            put_string(f, text);
        }
    }
    free(real);
}

int tr_recipe_write_lua(const tr_recipe *r, FILE *f)
{
    fputs("-- The fully resolved recipe of this run, written by trainer from ", f);
    put_string(f, r->path);
    fputs(".\n-- Loading it again gives the same model and settings.\n", f);
    if (r->n_knobs > 0)
        fputs("-- knobs (\"--set\" marks a value given on the command line):\n", f);
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
    fprintf(f, ",\n       tokenizer = \"%s\"", tokenizer_names[tk]);
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
    fprintf(f, "schedule { warmup = %d, decay = \"%s\", min_lr = ", s->warmup, decay_names[decay]);
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
    fprintf(f, ", sample_tokens = %d, log_every = %d,\n        checkpoint_every = %d, keep_checkpoints = %d,",
            t->sample_tokens, t->log_every, t->checkpoint_every, t->keep_checkpoints);
    fprintf(f, " precision = \"%s\", recompute = \"%s\", peak_tflops = %.17g }\n",
            precision_names[t->precision], recompute_names[t->recompute], t->peak_tflops);
    if (r->init_hf[0]) {
        fputs("init = hf ", f);
        put_data_path(f, r->init_hf);
        fputs("\n", f);
    }

    const tr_parallel_desc *p = &r->parallel;
    if (p->is_auto) {
        fputs("parallel \"auto\"\n", f);
    } else {
        const char *names[4] = {"dp", "tp", "pp", "zero"};
        int vals[4] = {p->dp, p->tp, p->pp, p->zero};
        fputs("parallel {", f);
        for (int i = 0; i < 4; i++) {
            if (vals[i] >= 0)
                fprintf(f, "%s %s = %d", i ? "," : "", names[i], vals[i]);
            else
                fprintf(f, "%s %s = \"auto\"", i ? "," : "", names[i]);
        }
        if (p->bucket_kb) fprintf(f, ", bucket_kb = %d", p->bucket_kb);
        fputs(" }\n", f);
    }
    return ferror(f) ? -1 : 0;
}
