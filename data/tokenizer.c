/* Byte-level tokenizer: ids are the bytes of the text, so any input round-trips exactly
 * (including invalid UTF-8, which is just bytes). */
#include "data/tokenizer.h"

#include <stdio.h>

int tr_tokenizer_init(tr_tokenizer *t, tr_tokenizer_kind kind, char *err, size_t errlen) {
    switch (kind) {
    case TR_TOKENIZER_BYTE:
        t->kind = kind;
        t->vocab = 256;
        return 0;
    }
    snprintf(err, errlen, "unknown tokenizer kind %d", (int)kind);
    return -1;
}

size_t tr_tokenizer_encode(const tr_tokenizer *t, const char *text, size_t n, int *ids) {
    (void)t;
    const unsigned char *s = (const unsigned char *)text;
    for (size_t i = 0; i < n; i++) ids[i] = s[i];
    return n;
}

size_t tr_tokenizer_decode(const tr_tokenizer *t, int id, char *out) {
    (void)t;
    if (id < 0 || id > 255) return 0;
    out[0] = (char)id;
    return 1;
}
