/* Fuzz target: the GPT-2 tokenizer (data/tokenizer.h). The input is three parts separated by
 * FZ_SEP lines: encoder.json, vocab.bpe and text. When the pair loads, the text is encoded and
 * its tokens' bytes must give the text back (the header promises every byte string
 * round-trips). The text alone also goes through the byte-level tokenizer. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/tokenizer.h"
#include "fuzz.h"

static void round_trip(const tr_tokenizer *t, const uint8_t *text, size_t n) {
    int *ids = malloc((n ? n : 1) * sizeof(int));
    if (!ids) return;
    size_t k = tr_tokenizer_encode(t, (const char *)text, n, ids), at = 0;
    if (k > n) {
        fprintf(stderr, "%zu bytes encoded into %zu ids\n", n, k);
        abort();
    }
    for (size_t i = 0; i < k; i++) {
        size_t len;
        const char *b = tr_tokenizer_token(t, ids[i], &len);
        if (!b || len > n - at || memcmp(b, text + at, len)) {
            fprintf(stderr, "%s: id %d (position %zu) does not decode to the text at byte %zu\n",
                    tr_tokenizer_name(t), ids[i], i, at);
            abort();
        }
        at += len;
    }
    if (at != n) {
        fprintf(stderr, "%s: decoding gives %zu bytes of %zu\n", tr_tokenizer_name(t), at, n);
        abort();
    }
    free(ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const uint8_t *part[3];
    size_t len[3];
    int n = fz_split(data, size, part, len, 3);
    char enc[512], mer[512], err[1200];
    tr_tokenizer *t = NULL;
    if (tr_tokenizer_open(&t, TR_TOKENIZER_BYTE, NULL, NULL, err, sizeof err)) abort();
    round_trip(t, part[n - 1], len[n - 1]);
    tr_tokenizer_free(t);
    if (n < 3) return 0;
    fz_write("encoder.json", part[0], len[0], enc, sizeof enc);
    fz_write("vocab.bpe", part[1], len[1], mer, sizeof mer);
    if (tr_tokenizer_open(&t, TR_TOKENIZER_GPT2, enc, mer, err, sizeof err)) {
        fz_note("tokenizer", err);
        return 0;
    }
    round_trip(t, part[2], len[2]);
    tr_tokenizer_free(t);
    return 0;
}
