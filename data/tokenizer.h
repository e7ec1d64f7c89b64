/* Tokenizers: text <-> token ids. Today the byte-level tokenizer (vocab 256: a token is a
 * byte); GPT-2 BPE comes with the data pipeline behind the same functions. */
#ifndef TR_TOKENIZER_H
#define TR_TOKENIZER_H

#include <stddef.h>

#include "dsl/recipe.h"

typedef struct tr_tokenizer {
    tr_tokenizer_kind kind;
    int vocab;
} tr_tokenizer;

int tr_tokenizer_init(tr_tokenizer *t, tr_tokenizer_kind kind, char *err, size_t errlen);

/* Encode n bytes of text into ids (room for n ids: byte-level never produces more);
 * returns the number of ids. */
size_t tr_tokenizer_encode(const tr_tokenizer *t, const char *text, size_t n, int *ids);

/* Decode one id into out (room for 8 bytes); returns the number of bytes written. */
size_t tr_tokenizer_decode(const tr_tokenizer *t, int id, char *out);

#endif
