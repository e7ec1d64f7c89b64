/* The recipe schema: every constructor declares its fields (type, bounds, allowed values,
 * required or not) and reads them here, so that a mistake is one line naming the constructor,
 * the field and what it must be: `train: field 'steps' must be >= 1, got 0`. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsl/recipe_private.h"

static const char *kind_phrase(field_kind k) {
    switch (k) {
    case FK_INT:
        return "an integer";
    case FK_NUM:
        return "a number";
    case FK_BOOL:
        return "a boolean";
    case FK_STR:
        return "a string";
    case FK_INT_AUTO:
        return "an integer or \"auto\"";
    case FK_BOOL_AUTO:
        return "true, false or \"auto\"";
    case FK_LIST_AUTO:
        return "a list of integers or \"auto\"";
    case FK_TABLE_BOOL:
        return "a table of fields or a boolean";
    case FK_ENUM_LIST:
        return "a name or a list of names";
    default:
        return "a value";
    }
}

/* A value's type for messages: Lua's name, except that layers are called layers. */
const char *dsl_type_word(lua_State *L, int idx) {
    if (lua_type(L, idx) == LUA_TUSERDATA && luaL_testudata(L, idx, LAYER_MT)) return "layer";
    return luaL_typename(L, idx);
}

void dsl_format_number(char *buf, size_t len, lua_State *L, int idx) {
    if (lua_isinteger(L, idx))
        snprintf(buf, len, "%lld", (long long)lua_tointeger(L, idx));
    else
        snprintf(buf, len, "%.14g", (double)lua_tonumber(L, idx));
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* "a, b, c": names sorted, written into buf. */
const char *dsl_sorted_list(char *buf, size_t len, const char **names, int n) {
    qsort(names, (size_t)n, sizeof *names, cmp_str);
    buf[0] = 0;
    size_t used = 0;
    for (int i = 0; i < n && used < len; i++)
        used += (size_t)snprintf(buf + used, len - used, "%s%s", i ? ", " : "", names[i]);
    return buf;
}

/* " (from --set width=0)": the --set knobs read since the last constructor, or read before
 * and of the value `shown`, where the value out of bounds most likely comes from; "" when
 * none. */
static const char *from_sets(recipe_ctx *c, const char *shown, char *buf, size_t len) {
    size_t used = 0;
    buf[0] = 0;
    for (int i = 0; i < c->n_sets && i < 64 && used < len; i++)
        if ((c->sets_read >> i & 1) || ((c->sets_ever >> i & 1) && !strcmp(c->sets[i].value, shown)))
            used += (size_t)snprintf(buf + used, len - used, "%s--set %s=%s",
                                     used ? ", " : " (from ", c->sets[i].name, c->sets[i].value);
    if (used && used + 1 < len) snprintf(buf + used, len - used, ")");
    return buf;
}

static void check_bounds(lua_State *L, const char *ctor, const char *field, const field_spec *fs,
                         double v, const char *shown) {
    const char *rel = fs->lo_kind == LO_GE && !(v >= fs->lo)   ? ">="
                      : fs->lo_kind == LO_GT && !(v > fs->lo)  ? ">"
                      : fs->hi_kind == HI_LE && !(v <= fs->hi) ? "<="
                      : fs->hi_kind == HI_LT && !(v < fs->hi)  ? "<"
                                                               : NULL;
    if (!rel) return;
    char from[512];
    dsl_raise_at(L, 0, "%s: field '%s' must be %s %.14g, got %s%s", ctor, field, rel,
                 rel[0] == '>' ? fs->lo : fs->hi, shown,
                 from_sets(dsl_ctx(L), shown, from, sizeof from));
}

/* A number that will live in a C float: finite, in range, and still in range once rounded. */
static double read_float(lua_State *L, int idx, const char *ctor, const char *field,
                         const field_spec *fs) {
    char shown[64];
    if (lua_type(L, idx) != LUA_TNUMBER)
        dsl_raise_at(L, 0, "%s: field '%s' must be a number, got %s", ctor, field,
                     dsl_type_word(L, idx));
    double v = lua_tonumber(L, idx);
    dsl_format_number(shown, sizeof shown, L, idx);
    if (!isfinite(v))
        dsl_raise_at(L, 0, "%s: field '%s' must be a finite number, got %s", ctor, field, shown);
    check_bounds(L, ctor, field, fs, v, shown);
    float f = (float)v;
    if (!isfinite(f))
        dsl_raise_at(L, 0, "%s: field '%s' is too large for a 32-bit float, got %s", ctor, field,
                     shown);
    char shown_f[128];
    snprintf(shown_f, sizeof shown_f, "%s (%.9g as a 32-bit float)", shown, (double)f);
    check_bounds(L, ctor, field, fs, (double)f, shown_f);
    return v;
}

/* "auto" or { i1, i2, ... }: integers >= fs->lo (FK_ENUM_LIST: names of fs->choices), a plain
 * list of 1 to fs->hi items. The count goes to out->i; the constructor copies the items
 * (lua_rawgeti) from its argument. */
static void read_list(lua_State *L, const char *ctor, const field_spec *fs, field_val *out) {
    int idx = lua_gettop(L), t = lua_type(L, idx);
    if (t == LUA_TSTRING && strcmp(lua_tostring(L, idx), "auto") == 0) {
        out->is_auto = 1;
        return;
    }
    if (t == LUA_TSTRING)
        dsl_raise_at(L, 0, "%s: field '%s' must be %s, got '%s'", ctor, fs->name,
                     kind_phrase(fs->kind), lua_tostring(L, idx));
    if (t != LUA_TTABLE)
        dsl_raise_at(L, 0, "%s: field '%s' must be %s, got %s", ctor, fs->name,
                     kind_phrase(fs->kind), dsl_type_word(L, idx));
    lua_Integer len = (lua_Integer)lua_rawlen(L, idx), count = 0;
    int ok = 1;
    lua_pushnil(L);
    while (lua_next(L, idx)) {
        count++;
        ok = ok && lua_type(L, -2) == LUA_TNUMBER && lua_isinteger(L, -2) &&
             lua_tointeger(L, -2) >= 1 && lua_tointeger(L, -2) <= len;
        lua_pop(L, 1);
    }
    int names = fs->kind == FK_ENUM_LIST;
    if (!ok || count != len)
        dsl_raise_at(L, 0, "%s: field '%s' must be a list of %s, as in %s = { %s }, without named "
                     "fields or gaps",
                     ctor, fs->name, names ? "names" : "integers", fs->name,
                     names ? "\"full\", \"none\"" : "0, 6, 12, 18");
    if (count == 0)
        dsl_raise_at(L, 0, "%s: field '%s' must not be empty (or \"auto\")", ctor, fs->name);
    if ((double)count > fs->hi)
        dsl_raise_at(L, 0, "%s: field '%s' has %lld entries; at most %.14g are supported", ctor,
                     fs->name, (long long)count, fs->hi);
    field_spec item = {fs->name, FK_INT, REQ, fs->lo_kind, fs->lo, HI_LE, INT_MAX, NULL};
    const char *each[16] = {NULL}; /* a list's items: its choices but "auto" (the whole's) */
    for (int k = 0, j = 0; names && fs->choices[k] && j < 15; k++)
        if (strcmp(fs->choices[k], "auto")) each[j++] = fs->choices[k];
    if (names) item = (field_spec){fs->name, FK_ENUM, REQ, 0, 0, 0, 0, each};
    char name[64];
    for (lua_Integer k = 1; k <= count; k++) {
        snprintf(name, sizeof name, "%s[%lld]", fs->name, (long long)k);
        item.name = name;
        field_val v;
        memset(&v, 0, sizeof v);
        lua_rawgeti(L, idx, k);
        dsl_read_value(L, ctor, &item, &v);
        lua_pop(L, 1);
    }
    out->i = count;
}

/* Check the value on top of the stack against fs and store it in *out. */
void dsl_read_value(lua_State *L, const char *ctor, const field_spec *fs, field_val *out) {
    int idx = lua_gettop(L);
    int t = lua_type(L, idx);
    char shown[64];
    out->present = 1;
    switch (fs->kind) {
    case FK_INT_AUTO:
    case FK_BOOL_AUTO:
        if (t == LUA_TSTRING) {
            if (strcmp(lua_tostring(L, idx), "auto") != 0)
                dsl_raise_at(L, 0, "%s: field '%s' must be %s, got '%s'", ctor, fs->name,
                             kind_phrase(fs->kind), lua_tostring(L, idx));
            out->is_auto = 1;
            out->i = 0;
            return;
        }
        if (fs->kind == FK_BOOL_AUTO) {
            if (t != LUA_TBOOLEAN)
                dsl_raise_at(L, 0, "%s: field '%s' must be %s, got %s", ctor, fs->name,
                             kind_phrase(fs->kind), dsl_type_word(L, idx));
            out->b = lua_toboolean(L, idx);
            return;
        }
        /* fall through */
    case FK_INT: {
        if (t != LUA_TNUMBER)
            dsl_raise_at(L, 0, "%s: field '%s' must be %s, got %s", ctor, fs->name,
                         kind_phrase(fs->kind), dsl_type_word(L, idx));
        int isint = 0;
        lua_Integer i = lua_tointegerx(L, idx, &isint);
        dsl_format_number(shown, sizeof shown, L, idx);
        if (!isint)
            dsl_raise_at(L, 0, "%s: field '%s' must be an integer, got %s", ctor, fs->name, shown);
        check_bounds(L, ctor, fs->name, fs, (double)i, shown);
        out->i = i;
        return;
    }
    case FK_NUM:
        out->n = read_float(L, idx, ctor, fs->name, fs);
        return;
    case FK_BOOL:
        if (t != LUA_TBOOLEAN)
            dsl_raise_at(L, 0, "%s: field '%s' must be a boolean (true or false), got %s", ctor,
                         fs->name, dsl_type_word(L, idx));
        out->b = lua_toboolean(L, idx);
        return;
    case FK_STR: {
        if (t != LUA_TSTRING)
            dsl_raise_at(L, 0, "%s: field '%s' must be a string, got %s", ctor, fs->name,
                         dsl_type_word(L, idx));
        size_t len = 0;
        out->s = lua_tolstring(L, idx, &len);
        if (len == 0) dsl_raise_at(L, 0, "%s: field '%s' must not be empty", ctor, fs->name);
        if (strlen(out->s) != len)
            dsl_raise_at(L, 0, "%s: field '%s' must not contain a NUL byte", ctor, fs->name);
        return;
    }
    case FK_ENUM_LIST:
        if (t == LUA_TTABLE) {
            read_list(L, ctor, fs, out);
            return;
        }
        /* one name: */
        /* fall through */
    case FK_ENUM:
    case FK_ENUM_AUTO: {
        if (fs->kind == FK_ENUM_AUTO && t == LUA_TSTRING &&
            strcmp(lua_tostring(L, idx), "auto") == 0) {
            out->is_auto = 1;
            return;
        }
        const char *names[8];
        int n = 0;
        while (fs->choices[n])
            names[n] = fs->choices[n], n++;
        char list[256];
        list[0] = 0;
        for (int k = 0; k < n; k++) /* in declaration order, which reads best */
            snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", k ? ", " : "",
                     names[k]);
        if (fs->kind == FK_ENUM_AUTO)
            snprintf(list + strlen(list), sizeof list - strlen(list), " or \"auto\"");
        if (t != LUA_TSTRING)
            dsl_raise_at(L, 0, "%s: field '%s' must be one of %s, got %s", ctor, fs->name, list,
                         dsl_type_word(L, idx));
        const char *s = lua_tostring(L, idx);
        for (int k = 0; k < n; k++) {
            if (strcmp(s, names[k]) == 0) {
                out->choice = k;
                return;
            }
        }
        dsl_raise_at(L, 0, "%s: field '%s' must be one of %s, got '%s'", ctor, fs->name, list, s);
    }
    case FK_LIST_AUTO:
        read_list(L, ctor, fs, out);
        return;
    case FK_TABLE_BOOL:
        if (t == LUA_TBOOLEAN) {
            out->b = lua_toboolean(L, idx);
            return;
        }
        if (t != LUA_TTABLE)
            dsl_raise_at(
                L, 0, "%s: field '%s' must be %s, as in %s = { ... } or %s = false, got %s", ctor,
                fs->name, kind_phrase(fs->kind), fs->name, fs->name, dsl_type_word(L, idx));
        out->b = 1;
        out->i = 1;
        return;
    case FK_TABLE: /* checked by the constructor, which reads it from its argument */
        if (t != LUA_TTABLE)
            dsl_raise_at(L, 0, "%s: field '%s' must be a table, got %s", ctor, fs->name,
                         dsl_type_word(L, idx));
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
            dsl_raise_at(
                L, 0,
                "%s: field '%s' must be a table of two numbers, as in %s = { 0.9, 0.95 }, got %s",
                ctor, fs->name, fs->name,
                t == LUA_TTABLE ? "another table" : dsl_type_word(L, idx));
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
                                      int nspecs, const char *key) {
    recipe_ctx *c = dsl_ctx(L);
    if (nspecs == 0)
        dsl_raise_at(L, 0, "%s: unknown field '%s' (%s takes no fields)", ctor, key, ctor);
    const char *names[16];
    for (int i = 0; i < nspecs && i < 16; i++)
        names[i] = specs[i].name;
    dsl_sorted_list(c->list, sizeof c->list, names, nspecs < 16 ? nspecs : 16);
    dsl_raise_at(L, 0, "%s: unknown field '%s' (fields: %s)", ctor, key, c->list);
}

/* Read the fields of the table at index 1 into vals (one per spec). Array items are children:
 * their count and the largest index go to *n_items / *max_item when those are non-NULL, and
 * are an error otherwise. */
void dsl_read_fields(lua_State *L, const char *ctor, const field_spec *specs, int nspecs,
                     field_val *vals, int *n_items, lua_Integer *max_item) {
    if (lua_type(L, 1) != LUA_TTABLE)
        dsl_raise_at(L, 0, "%s: expected a table of fields, as in %s { ... }, got %s", ctor, ctor,
                     lua_isnone(L, 1) ? "no value" : dsl_type_word(L, 1));
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
            if (!found) unknown_field(L, ctor, specs, nspecs, key);
        } else if (kt == LUA_TNUMBER && lua_isinteger(L, -2) && lua_tointeger(L, -2) >= 1) {
            if (!n_items)
                dsl_raise_at(L, 0,
                             "%s: unexpected %s at position %lld; fields are written name = value",
                             ctor, dsl_type_word(L, -1), (long long)lua_tointeger(L, -2));
            items++;
            if (lua_tointeger(L, -2) > max) max = lua_tointeger(L, -2);
        } else {
            char shown[64] = "";
            if (kt == LUA_TNUMBER) dsl_format_number(shown, sizeof shown, L, -2);
            dsl_raise_at(L, 0, "%s: unexpected key [%s]; fields are written name = value", ctor,
                         kt == LUA_TNUMBER ? shown : dsl_type_word(L, -2));
        }
        lua_pop(L, 1);
    }
    for (int i = 0; i < nspecs; i++) {
        memset(&vals[i], 0, sizeof vals[i]);
        lua_pushstring(L, specs[i].name);
        lua_rawget(L, 1);
        if (lua_isnil(L, -1)) {
            if (specs[i].required)
                dsl_raise_at(L, 0, "%s: field '%s' is required", ctor, specs[i].name);
        } else {
            dsl_read_value(L, ctor, &specs[i], &vals[i]);
        }
        lua_pop(L, 1);
    }
    if (n_items) {
        *n_items = items;
        *max_item = max;
    }
    dsl_ctx(L)->sets_read = 0; /* the next constructor's arguments are read after this one */
}

/* Copy a checked string field into a fixed buffer. */
void dsl_copy_field(lua_State *L, char *dst, size_t cap, const char *ctor, const char *field,
                    const char *s) {
    if (strlen(s) >= cap)
        dsl_raise_at(L, 0, "%s: field '%s' is longer than %zu bytes", ctor, field, cap - 1);
    memcpy(dst, s, strlen(s) + 1);
}
