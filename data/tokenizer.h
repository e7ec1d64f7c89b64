/* Tokenizers: text <-> token ids. Byte-level (vocab 256: a token is a byte) and GPT-2's
 * byte-level BPE read from the standard encoder.json + vocab.bpe pair, encoding exactly as
 * OpenAI's GPT-2 encoder does. Invalid UTF-8 is never rejected or replaced: each byte that is
 * not part of a valid UTF-8 sequence is a character of its own of class "other" (as Python's
 * surrogateescape decoding would make it), so every byte string round-trips exactly. */
#ifndef TR_TOKENIZER_H
#define TR_TOKENIZER_H

#include <stddef.h>

#include "dsl/recipe.h"

typedef struct tr_tokenizer tr_tokenizer;

/* Open a tokenizer. GPT-2 needs encoder (encoder.json) and merges (vocab.bpe); byte-level
 * ignores them (may be NULL). Errors name the file and byte offset (or line). */
int tr_tokenizer_open(tr_tokenizer **out, tr_tokenizer_kind kind, const char *encoder,
                      const char *merges, char *err, size_t errlen);
void tr_tokenizer_free(tr_tokenizer *t);

int tr_tokenizer_vocab(const tr_tokenizer *t);
/* The document separator <|endoftext|> (50256 for GPT-2), or -1 for byte-level. */
int tr_tokenizer_eot(const tr_tokenizer *t);
const char *tr_tokenizer_name(const tr_tokenizer *t);

/* Encode n bytes of text into ids; ids needs room for n ids (no tokenizer produces more).
 * Returns the number of ids. Never fails; thread-safe (the tokenizer is read-only). Text that
 * spells "<|endoftext|>" is encoded as ordinary text: separators are only added explicitly. */
size_t tr_tokenizer_encode(const tr_tokenizer *t, const char *text, size_t n, int *ids);

/* The bytes of token `id` (not NUL-terminated) and their count in *len; NULL when id is not
 * in the vocabulary. Decoding a sequence is the concatenation of its tokens' bytes. */
const char *tr_tokenizer_token(const tr_tokenizer *t, int id, size_t *len);

#endif
