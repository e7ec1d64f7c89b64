/* The JSON reader (see data/json.h): a strict cursor, and a tree built on it. Strings are
 * checked to be valid UTF-8 and \u escapes, surrogate pairs included, are decoded to UTF-8; a
 * lone surrogate is an error. Every error records a message and the byte offset. */
#include "data/json.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "parallel/comm/base.h"

#include "data/tokenizer_private.h"

#define MAX_DEPTH 64

int tr_utf8_decode(const unsigned char *s, size_t n, unsigned *cp)
{
    unsigned c = s[0];
    if (c < 0x80) {
        *cp = c;
        return 1;
    }
    int len;
    unsigned min;
    if (c >= 0xc2 && c <= 0xdf)
        len = 2, min = 0x80, c &= 0x1f;
    else if (c >= 0xe0 && c <= 0xef)
        len = 3, min = 0x800, c &= 0x0f;
    else if (c >= 0xf0 && c <= 0xf4)
        len = 4, min = 0x10000, c &= 0x07;
    else
        return 0;
    if ((size_t)len > n)
        return 0;
    for (int k = 1; k < len; k++) {
        if ((s[k] & 0xc0) != 0x80)
            return 0;
        c = (c << 6) | (s[k] & 0x3f);
    }
    if (c < min || c > 0x10ffff || (c >= 0xd800 && c <= 0xdfff))
        return 0;
    *cp = c;
    return len;
}

static int fail(tr_json_cur *j, size_t at, const char *msg)
{
    snprintf(j->err, sizeof j->err, "%s", msg);
    j->at = at;
    return -1;
}

void tr_json_ws(tr_json_cur *j)
{
    while (j->i < j->n && (j->s[j->i] == ' ' || j->s[j->i] == '\t' || j->s[j->i] == '\n' ||
                           j->s[j->i] == '\r'))
        j->i++;
}

int tr_json_expect(tr_json_cur *j, char c)
{
    tr_json_ws(j);
    if (j->i >= j->n || j->s[j->i] != c) {
        char msg[64];
        if (j->i >= j->n)
            snprintf(msg, sizeof msg, "expected '%c', got the end of the text", c);
        else
            snprintf(msg, sizeof msg, "expected '%c'", c);
        return fail(j, j->i, msg);
    }
    j->i++;
    return 0;
}

static int hex4(tr_json_cur *j, unsigned *v)
{
    if (j->i + 4 > j->n)
        return fail(j, j->i, "truncated \\u escape");
    *v = 0;
    for (int k = 0; k < 4; k++) {
        char c = j->s[j->i + (size_t)k];
        int d = c >= '0' && c <= '9' ? c - '0'
              : c >= 'a' && c <= 'f' ? c - 'a' + 10
              : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0)
            return fail(j, j->i + (size_t)k, "bad hex digit in \\u escape");
        *v = *v * 16 + (unsigned)d;
    }
    j->i += 4;
    return 0;
}

static size_t put_utf8(unsigned cp, char *o)
{
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xc0 | cp >> 6);
        o[1] = (char)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xe0 | cp >> 12);
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
        o[2] = (char)(0x80 | (cp & 0x3f));
        return 3;
    }
    o[0] = (char)(0xf0 | cp >> 18);
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3f));
    o[3] = (char)(0x80 | (cp & 0x3f));
    return 4;
}

int tr_json_string(tr_json_cur *j, char *out, size_t cap, size_t *len)
{
    if (tr_json_expect(j, '"'))
        return -1;
    size_t o = 0;
    char buf[4];
    for (;;) {
        if (j->i >= j->n)
            return fail(j, j->i, "unterminated string");
        const unsigned char *p = (const unsigned char *)j->s + j->i;
        size_t w;
        if (*p == '"') {
            j->i++;
            break;
        }
        if (*p < 0x20)
            return fail(j, j->i, "control character in a string (must be escaped)");
        if (*p == '\\') {
            size_t at = j->i;
            if (j->i + 1 >= j->n)
                return fail(j, at, "truncated escape");
            char e = j->s[j->i + 1];
            j->i += 2;
            const char *simple = strchr("\"\\/bfnrt", e);
            if (e && simple) {
                static const char map[] = "\"\\/\b\f\n\r\t";
                buf[0] = map[simple - "\"\\/bfnrt"];
                w = 1;
            } else if (e == 'u') {
                unsigned cp;
                if (hex4(j, &cp))
                    return -1;
                if (cp >= 0xdc00 && cp <= 0xdfff)
                    return fail(j, at, "lone low surrogate in \\u escape");
                if (cp >= 0xd800 && cp <= 0xdbff) {
                    unsigned lo;
                    if (j->i + 2 > j->n || j->s[j->i] != '\\' || j->s[j->i + 1] != 'u')
                        return fail(j, at, "high surrogate not followed by a low one");
                    j->i += 2;
                    if (hex4(j, &lo))
                        return -1;
                    if (lo < 0xdc00 || lo > 0xdfff)
                        return fail(j, at, "high surrogate not followed by a low one");
                    cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
                }
                w = put_utf8(cp, buf);
            } else {
                return fail(j, at, "unknown escape");
            }
            if (out) {
                if (o + w > cap)
                    return fail(j, at, "string too long");
                memcpy(out + o, buf, w);
            }
            o += w;
            continue;
        }
        unsigned cp;
        int l = tr_utf8_decode(p, j->n - j->i, &cp);
        if (l == 0)
            return fail(j, j->i, "invalid UTF-8 in a string");
        if (out) {
            if (o + (size_t)l > cap)
                return fail(j, j->i, "string too long");
            memcpy(out + o, p, (size_t)l);
        }
        o += (size_t)l;
        j->i += (size_t)l;
    }
    if (len)
        *len = o;
    return 0;
}

int tr_json_int(tr_json_cur *j, long *v)
{
    tr_json_ws(j);
    size_t at = j->i;
    long x = 0;
    int digits = 0;
    while (j->i < j->n && j->s[j->i] >= '0' && j->s[j->i] <= '9') {
        if (digits == 1 && x == 0)
            return fail(j, at, "leading zero in a number");
        x = x * 10 + (j->s[j->i] - '0');
        if (x > 0x7fffffffL)
            return fail(j, at, "number too large");
        j->i++;
        digits++;
    }
    if (!digits)
        return fail(j, at, "expected a non-negative integer");
    if (j->i < j->n && (j->s[j->i] == '.' || j->s[j->i] == 'e' || j->s[j->i] == 'E'))
        return fail(j, at, "expected an integer");
    *v = x;
    return 0;
}

static int skip_value(tr_json_cur *j, int depth)
{
    tr_json_ws(j);
    if (j->i >= j->n)
        return fail(j, j->i, "expected a value, got the end of the text");
    if (depth > MAX_DEPTH)
        return fail(j, j->i, "nested too deep");
    char c = j->s[j->i];
    if (c == '"')
        return tr_json_string(j, NULL, 0, NULL);
    if (c == '{' || c == '[') {
        char close = c == '{' ? '}' : ']';
        j->i++;
        tr_json_ws(j);
        if (j->i < j->n && j->s[j->i] == close) {
            j->i++;
            return 0;
        }
        for (;;) {
            if (c == '{') {
                if (tr_json_string(j, NULL, 0, NULL) || tr_json_expect(j, ':'))
                    return -1;
            }
            if (skip_value(j, depth + 1))
                return -1;
            tr_json_ws(j);
            if (j->i < j->n && j->s[j->i] == ',') {
                j->i++;
                continue;
            }
            return tr_json_expect(j, close);
        }
    }
    static const char *const words[] = {"true", "false", "null"};
    for (int k = 0; k < 3; k++) {
        size_t l = strlen(words[k]);
        if (j->n - j->i >= l && memcmp(j->s + j->i, words[k], l) == 0) {
            j->i += l;
            return 0;
        }
    }
    /* number: -?int frac? exp? */
    size_t at = j->i;
    if (j->s[j->i] == '-')
        j->i++;
    size_t d0 = j->i;
    while (j->i < j->n && j->s[j->i] >= '0' && j->s[j->i] <= '9')
        j->i++;
    if (j->i == d0)
        return fail(j, at, "expected a value");
    if (j->s[d0] == '0' && j->i - d0 > 1)
        return fail(j, at, "leading zero in a number");
    if (j->i < j->n && j->s[j->i] == '.') {
        size_t f0 = ++j->i;
        while (j->i < j->n && j->s[j->i] >= '0' && j->s[j->i] <= '9')
            j->i++;
        if (j->i == f0)
            return fail(j, at, "bad number");
    }
    if (j->i < j->n && (j->s[j->i] == 'e' || j->s[j->i] == 'E')) {
        j->i++;
        if (j->i < j->n && (j->s[j->i] == '+' || j->s[j->i] == '-'))
            j->i++;
        size_t e0 = j->i;
        while (j->i < j->n && j->s[j->i] >= '0' && j->s[j->i] <= '9')
            j->i++;
        if (j->i == e0)
            return fail(j, at, "bad number");
    }
    return 0;
}

int tr_json_skip(tr_json_cur *j)
{
    return skip_value(j, 0);
}

/* ---- the tree ------------------------------------------------------------------------------ */

static int tree_value(tr_json_cur *c, tr_json *v, int depth);

/* a string of any length: measured first, then read into a buffer of its size */
static int tree_string(tr_json_cur *c, char **out) {
    size_t at = c->i, len;
    if (tr_json_string(c, NULL, 0, &len)) return -1;
    c->i = at;
    char *b = malloc(len + 1);
    if (!b) return fail(c, at, "out of memory");
    if (tr_json_string(c, b, len, &len)) {
        free(b);
        return -1;
    }
    b[len] = 0;
    *out = b;
    return 0;
}

static int tree_container(tr_json_cur *c, tr_json *v, int obj, int depth) {
    v->type = obj ? TR_JSON_OBJ : TR_JSON_ARR;
    char close = obj ? '}' : ']';
    c->i++;
    tr_json_ws(c);
    if (c->i < c->n && c->s[c->i] == close) {
        c->i++;
        return 0;
    }
    int cap = 0;
    for (;;) {
        if (v->n == cap) {
            cap = cap ? 2 * cap : 8;
            tr_json *k = realloc(v->kids, (size_t)cap * sizeof(tr_json));
            if (!k) return fail(c, c->i, "out of memory");
            v->kids = k;
        }
        tr_json *k = &v->kids[v->n++];
        memset(k, 0, sizeof(*k));
        if (obj) {
            tr_json_ws(c);
            if (c->i >= c->n || c->s[c->i] != '"') return fail(c, c->i, "expected a member name");
            if (tree_string(c, &k->key) || tr_json_expect(c, ':')) return -1;
        }
        if (tree_value(c, k, depth + 1)) return -1;
        tr_json_ws(c);
        if (c->i < c->n && c->s[c->i] == ',') {
            c->i++;
            continue;
        }
        return tr_json_expect(c, close);
    }
}

static int tree_value(tr_json_cur *c, tr_json *v, int depth) {
    tr_json_ws(c);
    if (c->i >= c->n) return fail(c, c->i, "expected a value, got the end of the text");
    if (depth > MAX_DEPTH) return fail(c, c->i, "nested too deep");
    char ch = c->s[c->i];
    if (ch == '{' || ch == '[') return tree_container(c, v, ch == '{', depth);
    if (ch == '"') {
        v->type = TR_JSON_STR;
        return tree_string(c, &v->str);
    }
    size_t at = c->i;
    if (tr_json_skip(c)) return -1; /* true, false, null or a number, checked */
    if (ch == 't' || ch == 'f') {
        v->type = TR_JSON_BOOL;
        v->num = ch == 't';
    } else if (ch == 'n') {
        v->type = TR_JSON_NULL;
    } else {
        char buf[64];
        size_t l = c->i - at;
        if (l >= sizeof(buf)) return fail(c, at, "number too long");
        memcpy(buf, c->s + at, l);
        buf[l] = 0;
        v->type = TR_JSON_NUM;
        v->num = strtod(buf, NULL);
        /* 1e999 would become infinity, which no JSON can hold (tr_json_write would print
         * "inf"); underflow to 0 or a subnormal is only a loss of precision */
        if (!isfinite(v->num)) return fail(c, at, "number out of range (beyond 1.8e308)");
    }
    return 0;
}

void tr_json_free(tr_json *j) {
    if (!j) return;
    for (int i = 0; i < j->n; i++) tr_json_free(&j->kids[i]);
    free(j->kids);
    free(j->key);
    free(j->str);
    memset(j, 0, sizeof(*j));
}

int tr_json_parse(tr_json *out, const char *text, size_t len, char *err, size_t errlen) {
    memset(out, 0, sizeof(*out));
    tr_json_cur c = {.s = text, .n = len};
    int rc = tree_value(&c, out, 0);
    if (!rc) {
        tr_json_ws(&c);
        if (c.i < c.n && text[c.i] != 0) rc = fail(&c, c.i, "trailing characters");
    }
    if (rc) {
        snprintf(err, errlen, "JSON: %s at byte %zu", c.err, c.at);
        tr_json_free(out);
    }
    return rc;
}

const tr_json *tr_json_get(const tr_json *obj, const char *key) {
    if (!obj || obj->type != TR_JSON_OBJ) return NULL;
    for (int i = 0; i < obj->n; i++)
        if (!strcmp(obj->kids[i].key, key)) return &obj->kids[i];
    return NULL;
}

void tr_json_write_string(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"' || *s == '\\')
            fprintf(f, "\\%c", *s);
        else if ((unsigned char)*s < 0x20)
            fprintf(f, "\\u%04x", *s);
        else
            fputc(*s, f);
    }
    fputc('"', f);
}

void tr_json_fmt_num(char *buf, size_t n, double v, int digits) {
    if (!isfinite(v))
        snprintf(buf, n, "null");
    else if (digits > 0)
        snprintf(buf, n, "%.*g", digits, v);
    else if (digits < 0)
        snprintf(buf, n, "%.*f", -digits, v);
    else if (snprintf(buf, n, "%.15g", v), strtod(buf, NULL) != v)
        snprintf(buf, n, "%.17g", v);
}

void tr_json_write_num(FILE *f, double v, int digits) {
    char b[400]; /* %.Nf of the largest double has 309 digits before the point */
    tr_json_fmt_num(b, sizeof b, v, digits);
    fputs(b, f);
}

void tr_json_write(FILE *f, const tr_json *v) {
    switch (v->type) {
    case TR_JSON_NULL:
        fputs("null", f);
        break;
    case TR_JSON_BOOL:
        fputs(v->num ? "true" : "false", f);
        break;
    case TR_JSON_NUM:
        tr_json_write_num(f, v->num, 0);
        break;
    case TR_JSON_STR:
        tr_json_write_string(f, v->str);
        break;
    case TR_JSON_ARR:
    case TR_JSON_OBJ:
        fputc(v->type == TR_JSON_OBJ ? '{' : '[', f);
        for (int i = 0; i < v->n; i++) {
            if (i) fputc(',', f);
            if (v->type == TR_JSON_OBJ) {
                tr_json_write_string(f, v->kids[i].key);
                fputc(':', f);
            }
            tr_json_write(f, &v->kids[i]);
        }
        fputc(v->type == TR_JSON_OBJ ? '}' : ']', f);
        break;
    }
}

int tr_json_parse_file(tr_json *out, const char *path, char *err, size_t errlen) {
    size_t len;
    char *text = tr_read_file(path, 64u << 20, &len), jerr[160];
    if (!text) return tr_errf(err, errlen, "%s: cannot read: %s", path, strerror(errno));
    int rc = tr_json_parse(out, text, len, jerr, sizeof jerr);
    free(text);
    return rc ? tr_errf(err, errlen, "%s: %s", path, jerr) : 0;
}
