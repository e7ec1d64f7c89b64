/* Fuzz target: data/json.h, both ways of reading. The tree (tr_json_parse, then written back
 * and parsed again, which must succeed), and the cursor as its users drive it: values skipped
 * one after another (JSONL), and an object of strings to integers read with a short string
 * buffer (encoder.json). */
#include <stdio.h>
#include <stdlib.h>

#include "data/json.h"
#include "fuzz.h"

static void tree(const uint8_t *data, size_t size) {
    tr_json v;
    char err[200];
    if (tr_json_parse(&v, (const char *)data, size, err, sizeof err)) {
        fz_note("json", err);
        return;
    }
    /* what tr_json_write prints must read back */
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (f) {
        tr_json_write(f, &v);
        fclose(f);
        tr_json w;
        if (tr_json_parse(&w, buf, len, err, sizeof err)) {
            fprintf(stderr, "tr_json_write wrote JSON that does not parse: %s\n", err);
            abort();
        }
        tr_json_free(&w);
    }
    free(buf);
    tr_json_free(&v);
}

static void values(const uint8_t *data, size_t size) {
    tr_json_cur j = {.s = (const char *)data, .n = size};
    for (int k = 0; k < 10000; k++) {
        tr_json_ws(&j);
        if (j.i >= j.n || tr_json_skip(&j)) break;
    }
}

static void string_to_int(const uint8_t *data, size_t size) {
    tr_json_cur j = {.s = (const char *)data, .n = size};
    char key[16];
    size_t len;
    long v;
    if (tr_json_expect(&j, '{')) return;
    for (int k = 0; k < 10000; k++) {
        if (tr_json_string(&j, key, sizeof key, &len) || tr_json_expect(&j, ':')) return;
        tr_json_ws(&j);
        if (j.i < j.n && j.s[j.i] >= '0' && j.s[j.i] <= '9') {
            if (tr_json_int(&j, &v)) return;
        } else if (tr_json_skip(&j)) {
            return;
        }
        tr_json_ws(&j);
        if (j.i < j.n && j.s[j.i] == ',') {
            j.i++;
            tr_json_ws(&j);
            continue;
        }
        tr_json_expect(&j, '}');
        return;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    tree(data, size);
    values(data, size);
    string_to_int(data, size);
    return 0;
}
