/* Multiple-choice tasks from JSONL (data/task.h): each line parsed with the program's one JSON
 * reader (data/json.h) into an example of context, completions and answer. */
#include "data/task.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/json.h"
#include "parallel/comm/base.h"

#define TASK_FILE_MAX ((size_t)1 << 32) /* 4 GiB: far above any published task */

/* Where a line's mistake is reported: "FILE:LINE: ". */
typedef struct {
    const char *path;
    int line;
    char *err;
    size_t errlen;
} where;

TR_PRINTF(2, 3) static int bad(const where *w, const char *fmt, ...) {
    char what[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof(what), fmt, ap);
    va_end(ap);
    return tr_errf(w->err, w->errlen, "%s:%d: %s", w->path, w->line, what);
}

static const char *type_name(tr_json_type t) {
    static const char *names[] = {"null",     "a boolean", "a number",
                                  "a string", "an array",  "an object"};
    return names[t];
}

/* Field `key` of obj, which must be a string: its text, or NULL after the error. */
static const char *str_field(const tr_json *obj, const char *key, const where *w) {
    const tr_json *v = tr_json_get(obj, key);
    if (!v) return bad(w, "no field \"%s\"", key), NULL;
    if (v->type != TR_JSON_STR)
        return bad(w, "\"%s\" is %s, not a string", key, type_name(v->type)), NULL;
    return v->str;
}

/* The answer: an integer, or (HellaSwag's label on the Hugging Face hub) a string of one. */
static int int_field(const tr_json *obj, const char *key, int *out, const where *w) {
    const tr_json *v = tr_json_get(obj, key);
    if (!v) return bad(w, "no field \"%s\"", key);
    char *end = NULL;
    double x = v->type == TR_JSON_NUM ? v->num : v->type == TR_JSON_STR ? strtod(v->str, &end) : 0;
    int ok = v->type == TR_JSON_NUM || (v->type == TR_JSON_STR && end != v->str && !*end);
    if (!ok || !(x >= -1e9 && x <= 1e9) || x != floor(x)) /* in range before any cast */
        return v->type == TR_JSON_NUM
                   ? bad(w, "\"%s\" must be an integer, got %g", key, x)
                   : bad(w, "\"%s\" must be an integer, got %s", key,
                         v->type == TR_JSON_STR ? "a string that is not one" : type_name(v->type));
    *out = (int)x;
    return 0;
}

/* Characters of UTF-8 text (what Python's len counts: lm-evaluation-harness's acc_norm). */
static double utf8_chars(const char *s) {
    double n = 0;
    for (; *s; s++)
        n += ((unsigned char)*s & 0xc0) != 0x80;
    return n;
}

static char *joined(const char *a, const char *b) {
    size_t na = strlen(a), nb = strlen(b);
    char *s = malloc(na + nb + 1);
    if (s) memcpy(s, a, na), memcpy(s + na, b, nb + 1);
    return s;
}

/* The example's context and its choices (the array `key`, `prefix` before each completion). */
static int fill_choices(tr_task_example *e, const tr_json *obj, const char *key, const char *prefix,
                        const where *w) {
    const tr_json *c = tr_json_get(obj, key);
    if (!c) return bad(w, "no field \"%s\"", key);
    if (c->type != TR_JSON_ARR)
        return bad(w, "\"%s\" is %s, not an array", key, type_name(c->type));
    if (c->n < 1) return bad(w, "\"%s\" is empty: an example needs at least one choice", key);
    e->completion = calloc((size_t)c->n, sizeof(char *));
    e->norm_len = calloc((size_t)c->n, sizeof(double));
    if (!e->completion || !e->norm_len) return bad(w, "out of memory");
    e->n_choices = c->n;
    for (int k = 0; k < c->n; k++) {
        const tr_json *s = &c->kids[k];
        if (s->type != TR_JSON_STR)
            return bad(w, "\"%s\"[%d] is %s, not a string", key, k, type_name(s->type));
        if (!s->str[0]) return bad(w, "\"%s\"[%d] is empty: nothing to score", key, k);
        if (!(e->completion[k] = joined(prefix, s->str))) return bad(w, "out of memory");
        e->norm_len[k] = utf8_chars(s->str); /* the choice as given, without the prefix */
    }
    return 0;
}

static int read_hellaswag(tr_task_example *e, const tr_json *obj, const where *w) {
    const char *ctx = tr_json_get(obj, "ctx") ? str_field(obj, "ctx", w) : NULL;
    if (tr_json_get(obj, "ctx") && !ctx) return -1;
    if (!ctx) { /* the published files have both; ctx is ctx_a + " " + ctx_b */
        const char *a = str_field(obj, "ctx_a", w), *b = a ? str_field(obj, "ctx_b", w) : NULL;
        if (!a || !b) return -1;
        char *sp = joined(a, " ");
        e->context = sp ? joined(sp, b) : NULL;
        free(sp);
    } else {
        e->context = joined(ctx, "");
    }
    if (!e->context) return bad(w, "out of memory");
    e->format = TR_TASK_HELLASWAG;
    return fill_choices(e, obj, "endings", " ", w) || int_field(obj, "label", &e->answer, w);
}

static int read_simple(tr_task_example *e, const tr_json *obj, const where *w) {
    const char *ctx = str_field(obj, "context", w);
    if (!ctx) return -1;
    if (!(e->context = joined(ctx, ""))) return bad(w, "out of memory");
    e->format = TR_TASK_SIMPLE;
    return fill_choices(e, obj, "choices", "", w) || int_field(obj, "answer", &e->answer, w);
}

/* One line of JSON into e. */
static int read_line(tr_task_example *e, const char *text, size_t len, const where *w) {
    tr_json obj;
    char why[256];
    if (tr_json_parse(&obj, text, len, why, sizeof(why))) return bad(w, "not JSON: %s", why);
    int rc;
    if (obj.type != TR_JSON_OBJ)
        rc = bad(w, "a line must be a JSON object, this is %s", type_name(obj.type));
    else if (tr_json_get(&obj, "endings"))
        rc = read_hellaswag(e, &obj, w);
    else if (tr_json_get(&obj, "choices"))
        rc = read_simple(e, &obj, w);
    else
        rc = bad(w, "neither \"endings\" (HellaSwag) nor \"choices\" (the simple format)");
    if (!rc && (e->answer < 0 || e->answer >= e->n_choices))
        rc = bad(w, "the answer %d is out of range: the choices are 0 to %d", e->answer,
                 e->n_choices - 1);
    tr_json_free(&obj);
    return rc;
}

static void example_free(tr_task_example *e) {
    for (int k = 0; e->completion && k < e->n_choices; k++)
        free(e->completion[k]);
    free(e->completion);
    free(e->norm_len);
    free(e->context);
}

static void set_name(tr_task *t, const char *path) {
    const char *base = strrchr(path, '/');
    snprintf(t->name, sizeof(t->name), "%s", base ? base + 1 : path);
    char *dot = strrchr(t->name, '.');
    if (dot && dot != t->name) *dot = '\0';
}

/* Split text into lines and read each that is not blank. */
static int read_lines(tr_task *t, char *text, size_t len, long max, char *err, size_t errlen) {
    where w = {t->path, 0, err, errlen};
    int cap = 0;
    for (size_t i = 0; i < len && (max <= 0 || t->n < max);) {
        size_t j = i;
        while (j < len && text[j] != '\n')
            j++;
        w.line++;
        size_t k = i;
        while (k < j && (text[k] == ' ' || text[k] == '\t' || text[k] == '\r'))
            k++;
        if (k < j) {
            if (t->n == cap) {
                cap = cap ? 2 * cap : 64;
                tr_task_example *ex = realloc(t->ex, (size_t)cap * sizeof(*ex));
                if (!ex) return bad(&w, "out of memory");
                t->ex = ex;
            }
            tr_task_example *e = &t->ex[t->n++];
            memset(e, 0, sizeof(*e));
            e->line = w.line;
            if (read_line(e, text + i, j - i, &w)) return -1;
            t->formats |= (int)e->format;
        }
        i = j + 1;
    }
    return t->n ? 0 : tr_errf(err, errlen, "%s: no examples (the file is empty)", t->path);
}

int tr_task_read(tr_task *t, const char *path, long max, char *err, size_t errlen) {
    memset(t, 0, sizeof(*t));
    snprintf(t->path, sizeof(t->path), "%s", path);
    set_name(t, path);
    size_t len = 0;
    char *text = tr_read_file(path, TASK_FILE_MAX, &len);
    if (!text) return tr_errf(err, errlen, "cannot read task '%s': %s", path, strerror(errno));
    int rc = read_lines(t, text, len, max, err, errlen);
    free(text);
    return rc;
}

void tr_task_free(tr_task *t) {
    if (!t) return;
    for (int i = 0; i < t->n; i++)
        example_free(&t->ex[i]);
    free(t->ex);
    memset(t, 0, sizeof(*t));
}

const char *tr_task_format_name(int formats) {
    return formats == TR_TASK_HELLASWAG ? "hellaswag"
           : formats == TR_TASK_SIMPLE  ? "simple"
                                        : "mixed";
}
