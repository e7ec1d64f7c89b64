/* One JSON reader for the whole program (data/json.c): strict (valid UTF-8 in strings, \u
 * escapes with surrogate pairs decoded, no leading zeros, nesting bounded), with every error
 * naming its byte offset. Two ways to use it:
 *  - a cursor that reads values in place, for large regular files (GPT-2's encoder.json, JSONL
 *    corpora): no tree is built;
 *  - a tree (tr_json_parse) for small documents (safetensors headers, config.json). */
#ifndef TR_JSON_H
#define TR_JSON_H

#include <stddef.h>
#include <stdio.h>

/* ---- the cursor ------------------------------------------------------------------------- */

/* A cursor over JSON text s[0..n) at i. On error, err holds the message and `at` the offset. */
typedef struct {
    const char *s;
    size_t n, i;
    char err[160];
    size_t at;
} tr_json_cur;

void tr_json_ws(tr_json_cur *j);
/* Expect the byte c (after whitespace); 0 or -1 with an error. */
int tr_json_expect(tr_json_cur *j, char c);
/* Read a string at the cursor into out (decoded UTF-8, cap bytes; *len gets its length);
 * -1 on a malformed string or one longer than cap. out may be NULL to only measure it. */
int tr_json_string(tr_json_cur *j, char *out, size_t cap, size_t *len);
/* Read a non-negative integer that fits an int. */
int tr_json_int(tr_json_cur *j, long *v);
/* Skip one value of any type. */
int tr_json_skip(tr_json_cur *j);

/* ---- the tree ----------------------------------------------------------------------------- */

typedef enum { TR_JSON_NULL = 0, TR_JSON_BOOL, TR_JSON_NUM, TR_JSON_STR, TR_JSON_ARR, TR_JSON_OBJ } tr_json_type;

typedef struct tr_json {
    tr_json_type type;
    char *key;  /* member name inside an object */
    char *str;  /* STR */
    double num; /* NUM, BOOL */
    int n;      /* ARR, OBJ: members */
    struct tr_json *kids;
} tr_json;

/* Parse text[0..len) into *out; -1 with "JSON: <what> at byte <offset>" in err. */
int tr_json_parse(tr_json *out, const char *text, size_t len, char *err, size_t errlen);
/* The file at path (at most 64 MiB) parsed into *out: 0, or -1 with "PATH: cannot read: why"
 * or "PATH: JSON: ..." in err. */
int tr_json_parse_file(tr_json *out, const char *path, char *err, size_t errlen);
const tr_json *tr_json_get(const tr_json *obj, const char *key);
void tr_json_free(tr_json *j);

/* s as a JSON string literal (quotes and escapes) on f. */
void tr_json_write_string(FILE *f, const char *s);
/* The one way a double is written into JSON (every .json and .jsonl writer uses it): null
 * when v is not finite (JSON has no inf or nan), else with `digits` significant digits
 * (%.*g), -digits decimals when negative (%.*f), or with 0 the fewest of 15 or 17 digits that
 * read back to the same double. tr_json_fmt_num: the same into buf. */
void tr_json_write_num(FILE *f, double v, int digits);
void tr_json_fmt_num(char *buf, size_t n, double v, int digits);
/* A tree value as compact JSON on f (numbers in the fewest of 15 or 17 digits that read back to
 * the same double). */
void tr_json_write(FILE *f, const tr_json *v);

#endif
