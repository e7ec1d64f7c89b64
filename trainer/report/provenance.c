/* Comparing two runs' provenance (trainer/report/provenance.h): the fields that differ, flattened,
 * each marked by whether it can change the numbers, and a one-line verdict. Used by `trainer
 * report --compare` and by tests; the document itself is written by provenance_write.c. */
#include "trainer/report/provenance.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

unsigned long long tr_fnv1a(unsigned long long h, const void *p, size_t n) {
    const unsigned char *s = p;
    for (size_t i = 0; i < n; i++) {
        h ^= s[i];
        h *= 0x100000001b3ULL;
    }
    return h;
}

/* Fields whose differences cannot change the numbers (a prefix matches its sub-fields). */
static const char *const informational[] = {"trainer.built", "recipe.file", "command", "cwd",
                                            "hosts",         "time",        "resume",  "attempt"};
/* Fields that make two runs different experiments rather than one run done two ways. */
static const char *const experiment[] = {"recipe.training", "seeds", "data"};

/* Is `field` `name` or inside it ("layout" holds "layout.tp")? */
static int under(const char *field, const char *name) {
    size_t n = strlen(name);
    return !strncmp(field, name, n) && (field[n] == 0 || field[n] == '.');
}

static int in_list(const char *field, const char *const *list, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (under(field, list[i])) return 1;
    return 0;
}

/* v as compact JSON into buf (cut to fit), or "(absent)". */
static void value_text(const tr_json *v, char *buf, size_t len) {
    if (!v) {
        snprintf(buf, len, "(absent)");
        return;
    }
    char *text = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&text, &n);
    if (!f) {
        snprintf(buf, len, "(out of memory)");
        return;
    }
    tr_json_write(f, v);
    fclose(f);
    snprintf(buf, len, "%s", text ? text : "");
    free(text);
}

/* Are a and b the same value? (By their text: arrays and numbers compared whole.) */
static int same_value(const tr_json *a, const tr_json *b) {
    char *ta = NULL, *tb = NULL;
    size_t na = 0, nb = 0;
    FILE *fa = open_memstream(&ta, &na), *fb = open_memstream(&tb, &nb);
    if (fa) {
        tr_json_write(fa, a);
        fclose(fa);
    }
    if (fb) {
        tr_json_write(fb, b);
        fclose(fb);
    }
    int same = ta && tb && na == nb && !memcmp(ta, tb, na);
    free(ta);
    free(tb);
    return same;
}

typedef struct {
    tr_prov_diff *out;
    int max, n;
} diff_list;

static void add(diff_list *l, const char *field, const tr_json *a, const tr_json *b) {
    if (l->n < l->max) {
        tr_prov_diff *d = &l->out[l->n];
        snprintf(d->field, sizeof(d->field), "%s", field);
        value_text(a, d->a, sizeof(d->a));
        value_text(b, d->b, sizeof(d->b));
        d->numbers = !in_list(field, informational, sizeof informational / sizeof *informational);
    }
    l->n++;
}

/* a and b at the dotted name `prefix` ("" at the top); either may be NULL (absent). Two
 * objects are compared member by member; anything else whole. */
static void diff_at(diff_list *l, const char *prefix, const tr_json *a, const tr_json *b) {
    if (!a && !b) return;
    int a_obj = a && a->type == TR_JSON_OBJ, b_obj = b && b->type == TR_JSON_OBJ;
    if (!(a_obj && b_obj) && !(a_obj && !b) && !(b_obj && !a)) {
        if (!a || !b || !same_value(a, b)) add(l, prefix, a, b);
        return;
    }
    char name[96];
    for (int pass = 0; pass < 2; pass++) { /* a's members, then those only b has */
        const tr_json *from = pass ? b : a, *other = pass ? a : b;
        for (int i = 0; from && i < from->n; i++) {
            const char *k = from->kids[i].key;
            const tr_json *o = tr_json_get(other, k);
            if (pass && o) continue;
            snprintf(name, sizeof(name), "%s%s%s", prefix, *prefix ? "." : "", k);
            diff_at(l, name, pass ? o : &from->kids[i], pass ? &from->kids[i] : o);
        }
    }
}

int tr_provenance_diff(const tr_json *a, const tr_json *b, tr_prov_diff *out, int max) {
    diff_list l = {.out = out, .max = out ? max : 0};
    diff_at(&l, "", a, b);
    return l.n;
}

/* 0: cannot change the numbers; 1: the same experiment done another way; 2: another
 * experiment. */
static int kind_of(const tr_prov_diff *d) {
    if (!d->numbers) return 0;
    return in_list(d->field, experiment, sizeof experiment / sizeof *experiment) ? 2 : 1;
}

/* ", "-separated names of the differences that `pick` selects, into buf at *at. */
static void list_fields(const tr_prov_diff *d, int n, int pick, char *buf, size_t len, size_t *at) {
    int shown = 0, left = 0;
    for (int i = 0; i < n; i++) {
        if (kind_of(&d[i]) != pick) continue;
        if (shown == 8) {
            left++;
            continue;
        }
        if (*at < len)
            *at += (size_t)snprintf(buf + *at, len - *at, "%s%s", shown ? ", " : "", d[i].field);
        shown++;
    }
    if (left && *at < len) *at += (size_t)snprintf(buf + *at, len - *at, " and %d more", left);
}

static int count_kind(const tr_prov_diff *d, int n, int pick) {
    int c = 0;
    for (int i = 0; i < n; i++) {
        c += kind_of(&d[i]) == pick;
    }
    return c;
}

void tr_provenance_verdict(const tr_prov_diff *d, int n, char *buf, size_t len) {
    if (!len) return;
    size_t at = 0;
    int pick = count_kind(d, n, 2) ? 2 : count_kind(d, n, 1) ? 1 : 0;
    static const char *const head[] = {"bitwise comparable",
                                       "comparable within tolerance: differ in ",
                                       "different experiments: differ in "};
    at = (size_t)snprintf(buf, len, "%s", head[pick]);
    if (pick == 0 && count_kind(d, n, 0)) {
        if (at < len) at += (size_t)snprintf(buf + at, len - at, " (differ only in ");
        list_fields(d, n, 0, buf, len, &at);
        if (at < len) snprintf(buf + at, len - at, ")");
        return;
    }
    if (pick) list_fields(d, n, pick, buf, len, &at);
}
