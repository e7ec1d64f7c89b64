/* The recipe's Lua sandbox: a fresh state per load with capped memory, instructions and time,
 * only the base, table, string, math and utf8 libraries (no io, os, require, bytecode or
 * __gc), and error messages that point at the recipe's line (`recipe.lua:LINE: message`). */
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <lualib.h>

#include "dsl/recipe_private.h"

#define MEM_LIMIT ((size_t)64 << 20)
#define MEM_LIMIT_MIB 64
/* The fuzz build (tests/fuzz/) lowers it so that an endless loop costs milliseconds. */
#ifndef TR_RECIPE_INSTR_LIMIT
#define TR_RECIPE_INSTR_LIMIT 100000000LL
#endif
#define INSTR_LIMIT TR_RECIPE_INSTR_LIMIT
#define HOOK_EVERY 1000
#define TIME_LIMIT 10 /* seconds; then TIME_GRACE more for a library call to return */
#define TIME_GRACE 5

recipe_ctx *dsl_ctx(lua_State *L) {
    void *ud = NULL;
    lua_getallocf(L, &ud);
    return ud;
}

/* ---- sandbox ------------------------------------------------------------------------------ */

/* Lua's allocator contract: nsize 0 frees; osize is the old size only when ptr is set. */
static void *sandbox_alloc(void *ud, void *ptr, size_t osize, size_t nsize) {
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
    if (p) c->mem_used = c->mem_used - old + nsize;
    return p;
}

static int is_recipe_source(const recipe_ctx *c, const char *source) {
    return source && source[0] == '=' && strcmp(source + 1, c->chunk) == 0;
}

/* Line of the nearest Lua function up the stack: the recipe line that called a constructor
 * (C functions in between, such as pcall, are skipped). *src names its chunk. */
int dsl_caller_line(lua_State *L, const char **src) {
    recipe_ctx *c = dsl_ctx(L);
    lua_Debug ar;
    for (int level = 1; lua_getstack(L, level, &ar); level++) {
        if (!lua_getinfo(L, "Sl", &ar) || ar.currentline <= 0) continue;
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
    if (src) *src = c->chunk;
    return 0;
}

/* Raise `chunk:line: message`; line <= 0 means the caller's line. */
void dsl_raise_at(lua_State *L, int line, const char *fmt, ...) {
    recipe_ctx *c = dsl_ctx(L);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->msg, sizeof c->msg, fmt, ap);
    va_end(ap);
    const char *src = c->chunk;
    if (line <= 0) line = dsl_caller_line(L, &src);
    if (line > 0)
        lua_pushfstring(L, "%s:%d: %s", src, line, c->msg);
    else
        lua_pushfstring(L, "%s: %s", src, c->msg);
    lua_error(L);
    abort(); /* lua_error does not return */
}

/* Stops runaway recipes. Once over the limit it fires on every instruction, so a recipe that
 * catches the error with pcall in a loop still stops at the next instruction outside pcall. */
static void instr_hook(lua_State *L, lua_Debug *ar) {
    recipe_ctx *c = dsl_ctx(L);
    c->instr += HOOK_EVERY;
    if (c->instr <= INSTR_LIMIT) return;
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

static void time_hook(lua_State *L, lua_Debug *ar) {
    recipe_ctx *c = dsl_ctx(L);
    lua_sethook(L, time_hook, LUA_MASKCOUNT, 1); /* as instr_hook: pcall cannot outlast it */
    lua_getinfo(L, "Sl", ar);
    const char *src = is_recipe_source(c, ar->source) ? c->chunk : ar->short_src;
    lua_pushfstring(L,
                    "%s:%d: recipe ran for more than %d s (an endless loop, or work too slow "
                    "for a recipe)",
                    src, ar->currentline, TIME_LIMIT);
    lua_error(L);
}

static void on_alarm(int sig) {
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
static int sandbox_load(lua_State *L) {
    int n = lua_gettop(L);
    if (n < 3) lua_settop(L, 3);
    lua_pushliteral(L, "t");
    lua_replace(L, 3);
    lua_pushvalue(L, lua_upvalueindex(1));
    lua_insert(L, 1);
    lua_call(L, lua_gettop(L) - 1, LUA_MULTRET);
    return lua_gettop(L);
}

/* setmetatable without __gc: Lua runs finalizers with hooks off, so an endless loop in one
 * (during a collection or at lua_close) would escape the instruction limit. */
static int sandbox_setmetatable(lua_State *L) {
    if (lua_type(L, 2) == LUA_TTABLE) {
        lua_pushliteral(L, "__gc");
        if (lua_rawget(L, 2) != LUA_TNIL)
            dsl_raise_at(L, 0, "setmetatable: __gc finalizers are not allowed in recipes");
        lua_pop(L, 1);
    }
    lua_pushvalue(L, lua_upvalueindex(1));
    lua_insert(L, 1);
    lua_call(L, lua_gettop(L) - 1, LUA_MULTRET);
    return lua_gettop(L);
}

/* print() writes to stderr: stdout may be carrying a resolved recipe or a run's log. */
static int sandbox_print(lua_State *L) {
    int n = lua_gettop(L);
    for (int i = 1; i <= n; i++) {
        size_t len;
        const char *s = luaL_tolstring(L, i, &len);
        if (i > 1) fputc('\t', stderr);
        fwrite(s, 1, len, stderr);
        lua_pop(L, 1);
    }
    fputc('\n', stderr);
    return 0;
}

/* Message handler: give errors that lack a position (error("x", 0), errors inside load()ed
 * chunks, non-string error values) the recipe line they happened under. */
static int message_handler(lua_State *L) {
    recipe_ctx *c = dsl_ctx(L);
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

/* ---- running a recipe --------------------------------------------------------------------- */

/* Runs protected: opens the allowed libraries, registers the constructors, compiles the
 * recipe (text only) and leaves the chunk on the stack. */
static int setup(lua_State *L) {
    recipe_ctx *c = dsl_ctx(L);
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
    lua_pushcfunction(L, dsl_layer_tostring);
    lua_setfield(L, -2, "__tostring");
    lua_pushliteral(L, "layer");
    lua_setfield(L, -2, "__metatable");
    lua_pop(L, 1);
    lua_pushglobaltable(L);
    luaL_setfuncs(L, dsl_layer_ctors, 0);
    luaL_setfuncs(L, dsl_section_ctors, 0);
    lua_pop(L, 1);

    lua_pushfstring(L, "=%s", c->chunk);
    if (luaL_loadbufferx(L, text, len, lua_tostring(L, -1), "t") != LUA_OK) lua_error(L);
    return 1;
}

/* Lua's "attempt to call a nil value (global 'flashblock')" after "FILE:LINE: ", said as what
 * it is: a name that is no layer or section, with the known ones. */
static void unknown_constructor(recipe_ctx *c, char *err, size_t errlen) {
    static const char what[] = "attempt to call a nil value (global '";
    char *at = strstr(err, what);
    size_t n = at ? strcspn(at + sizeof what - 1, "'") : 0;
    if (!at || n == 0 || n >= TR_NAME_MAX) return;
    char name[TR_NAME_MAX];
    snprintf(name, sizeof name, "%.*s", (int)n, at + sizeof what - 1);
    if (!strcmp(name, "require") || !strcmp(name, "dofile") || !strcmp(name, "loadfile")) {
        snprintf(at, errlen - (size_t)(at - err),
                 "'%s' is not available in recipes (a recipe reads no other file)", name);
        return;
    }
    const char *names[64];
    int k = 0;
    for (int i = 0; dsl_layer_ctors[i].name && k < 32; i++)
        if (strcmp(dsl_layer_ctors[i].name, "model")) names[k++] = dsl_layer_ctors[i].name;
    char layers[512], sections[256];
    dsl_sorted_list(layers, sizeof layers, names, k);
    k = 0;
    names[k++] = "model";
    for (int i = 0; dsl_section_ctors[i].name && k < 32; i++)
        names[k++] = dsl_section_ctors[i].name;
    dsl_sorted_list(sections, sizeof sections, names, k);
    snprintf(at, errlen - (size_t)(at - err), "unknown layer '%s' (layers: %s; sections: %s)",
             name, layers, sections);
}

/* Lua cuts "=name" chunk names to LUA_IDSIZE - 1 bytes in its own messages: restore the name. */
static void set_error(recipe_ctx *c, const char *msg, char *err, size_t errlen) {
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
    unknown_constructor(c, err, errlen);
}

/* Run the chunk under the instruction hook and the time limit (SIGALRM, restored after). */
static int run_timed(recipe_ctx *c, lua_State *L) {
    lua_pushcfunction(L, message_handler);
    lua_insert(L, 1);
    lua_sethook(L, instr_hook, LUA_MASKCOUNT, HOOK_EVERY);
    timed_msg_len = (size_t)snprintf(timed_msg, sizeof timed_msg,
                                     "%s: recipe ran for more than %d s inside one library "
                                     "call (a string pattern that backtracks without end?)\n",
                                     c->chunk, TIME_LIMIT + TIME_GRACE);
    if (timed_msg_len >= sizeof timed_msg) timed_msg_len = sizeof timed_msg - 1;
    struct sigaction sa, old_sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_alarm;
    sigemptyset(&sa.sa_mask);
    timed_fired = 0;
    timed_L = L;
    sigaction(SIGALRM, &sa, &old_sa);
    unsigned old_alarm = alarm(TIME_LIMIT);
    int status = lua_pcall(L, 0, 0, 1);
    alarm(0);
    sigaction(SIGALRM, &old_sa, NULL);
    timed_L = NULL;
    if (old_alarm) alarm(old_alarm);
    return status;
}

int dsl_run(recipe_ctx *c, const char *text, size_t len, char *err, size_t errlen) {
    const char *chunk = c->chunk;
    lua_State *L = lua_newstate(sandbox_alloc, c);
    if (!L) return tr_errf(err, errlen, "%s: cannot start Lua (out of memory)", chunk);
    lua_pushcfunction(L, setup);
    lua_pushlightuserdata(L, (void *)text);
    lua_pushinteger(L, (lua_Integer)len);
    int status = lua_pcall(L, 2, 1, 0);
    if (status == LUA_OK) status = run_timed(c, L);
    /* Nothing may declare anything from here on. setmetatable refuses __gc, so no recipe
     * code should run during lua_close; `done` makes sure of it. */
    c->done = 1;
    if (status != LUA_OK) {
        if (c->mem_exceeded && (status == LUA_ERRMEM || status == LUA_ERRERR))
            tr_errf(err, errlen, "%s: recipe used more than %d MiB", chunk, MEM_LIMIT_MIB);
        else if (lua_type(L, -1) == LUA_TSTRING)
            set_error(c, lua_tostring(L, -1), err, errlen);
        else
            tr_errf(err, errlen, "%s: recipe failed (error %d)", chunk, status);
        lua_close(L);
        return -1;
    }
    /* `init = hf "DIR"`, read raw: no metamethod (so no recipe code) runs here */
    lua_pushglobaltable(L);
    lua_pushliteral(L, "init");
    lua_rawget(L, -2);
    if (!lua_isnil(L, -1)) {
        const char *hf_path = luaL_testudata(L, -1, HF_MT);
        if (!hf_path) {
            tr_errf(err, errlen,
                    "%s: init must be hf \"path/to/model\" (a Hugging Face model directory)",
                    chunk);
            lua_close(L);
            return -1;
        }
        snprintf(c->r.init_hf, sizeof c->r.init_hf, "%s", hf_path);
    }
    lua_close(L);
    return 0;
}
