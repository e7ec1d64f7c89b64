/* Tokenizing corpora into shards: text files (one document each), folders of them, and JSONL
 * (one document per line, in a string field). Uses every core; the output does not depend on
 * the number of threads. GPT-2 puts <|endoftext|> before every document; byte-level
 * concatenates them. The tail val_fraction of the input bytes (from the first safe split point
 * after it; when the last document straddles that point without one, from the last one
 * before it) becomes the validation shards. Every shard is written atomically. */
#ifndef TR_CORPUS_H
#define TR_CORPUS_H

#include <stddef.h>

#include "data/tokenizer.h"

typedef struct {
    double bytes_done, bytes_total;
    double val_bytes; /* the input's tail that became validation data (where the cut fell) */
    long train_tokens, val_tokens;
    int train_shards, val_shards;
    double seconds;
} tr_corpus_stats;

typedef struct {
    const char *const *inputs; /* files or folders (folders: every regular file, sorted) */
    int n_inputs;
    const char *out_dir;       /* created; gets train_NNNNNN.bin and val_NNNNNN.bin */
    const tr_tokenizer *tok;
    double val_fraction;       /* 0 .. 0.5 */
    long shard_tokens;         /* tokens per shard (the last one may hold fewer) */
    const char *field;         /* JSONL field holding the text; "text" when NULL */
    int threads;               /* 0 = every core */
    /* called from the calling thread as work completes (may be NULL) */
    void (*progress)(void *ctx, const tr_corpus_stats *st);
    void *progress_ctx;
} tr_corpus_opts;

int tr_corpus_tokenize(const tr_corpus_opts *o, tr_corpus_stats *st, char *err, size_t errlen);

/* For a recipe whose data are a text file and the gpt2 tokenizer: the cache folder of its
 * shards, `FOLDER_OF_TEXT/cache/NAME.gpt2/`, made (tokenizing the text) when missing or when
 * the text, its size or val_fraction changed. *made is set when it tokenized. */
int tr_corpus_cache(const tr_data_desc *d, char *dir, size_t dirlen, int *made,
                    void (*progress)(void *ctx, const tr_corpus_stats *st), void *progress_ctx,
                    char *err, size_t errlen);

#endif
