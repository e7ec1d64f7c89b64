/* A small, strict JSON reader: enough for GPT-2's encoder.json (one object of string keys to
 * integers) and JSONL corpora (one object per line with a text field). Strings are checked to
 * be valid UTF-8 and \u escapes, surrogate pairs included, are decoded to UTF-8; a lone
 * surrogate is an error. Every error records a message and the byte offset. */
#include <stdio.h>
#include <string.h>

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

static int fail(tr_json *j, size_t at, const char *msg)
{
    snprintf(j->err, sizeof j->err, "%s", msg);
    j->at = at;
    return -1;
}

void tr_json_ws(tr_json *j)
{
    while (j->i < j->n && (j->s[j->i] == ' ' || j->s[j->i] == '\t' || j->s[j->i] == '\n' ||
                           j->s[j->i] == '\r'))
        j->i++;
}

int tr_json_expect(tr_json *j, char c)
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

static int hex4(tr_json *j, unsigned *v)
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

int tr_json_string(tr_json *j, char *out, size_t cap, size_t *len)
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

int tr_json_int(tr_json *j, long *v)
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

static int skip_value(tr_json *j, int depth)
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

int tr_json_skip(tr_json *j)
{
    return skip_value(j, 0);
}
