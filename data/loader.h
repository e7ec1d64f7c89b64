/* The data loader: micro-batches of (inputs, targets) for one rank of `world`. Training data
 * are token shards (memory-mapped; see data/shard.h), a blend of several sets of shards mixed
 * by weight, or one text file (byte-level: tokenized in memory; GPT-2: tokenized once into
 * cached shards). A background thread prepares the next micro-batches, so the step never
 * waits on I/O; what it prepares depends only on the position, never on timing.
 *
 * The stream: each source's epoch visits its shards in a shuffled order and, within a shard,
 * windows of T+1 tokens starting at phase + k*T (phase drawn per epoch and shard) in a
 * shuffled order; both shuffles come from the seed alone. A global micro-batch is the next
 * B*world windows (each drawn from a source picked by weight); rank r gets windows
 * [r*B, (r+1)*B) of it, so ranks read disjoint slices that together cover every window of an
 * epoch once. Validation windows are read in order, without shuffling. */
#ifndef TR_LOADER_H
#define TR_LOADER_H

#include <stddef.h>
#include <stdint.h>

#include "dsl/recipe.h"

typedef struct tr_loader tr_loader;

/* Where one source is: its epoch, the shard (index into that epoch's shard order) and the
 * offset (next window within the shard's shuffled order). */
typedef struct {
    long epoch, shard, offset;
} tr_loader_source_pos;

/* Where the loader is in the training stream; saving and restoring it resumes exactly. */
typedef struct {
    long batches;  /* global micro-batches served */
    uint64_t rng;  /* state of the generator that picks a source for each window of a mix */
    int n_sources;
    tr_loader_source_pos src[TR_MAX_MIX];
    uint64_t data; /* tr_loader_fingerprint of the data it is a position in: a resume onto
                      data that changed since is refused */
} tr_loader_pos;

/* Open the data of a recipe for `rank` of `world`, micro-batches of B sequences of T tokens.
 * `vocab` is the model's: every token id must be below it (checked as tokens are read).
 * A text corpus with the gpt2 tokenizer is read from its cached shards, which are made
 * first when missing or stale (see tr_corpus_cache in data/corpus.h). */
int tr_loader_open(tr_loader **out, const tr_data_desc *d, int vocab, int rank, int world, int B,
                   int T, unsigned long long seed, char *err, size_t errlen);

/* The next training micro-batch of this rank: inputs and targets, (B, T) each; targets are
 * the inputs shifted by one token. Returns 0, or -1 when the data are bad (a token outside
 * the vocabulary: tr_loader_error names the file and byte offset). */
int tr_loader_next(tr_loader *l, int *inputs, int *targets);

/* The i-th validation micro-batch of this rank (the same every evaluation). Returns 1, 0 when
 * there is no such batch, -1 on bad data (see tr_loader_error). */
int tr_loader_val_batch(tr_loader *l, long i, int *inputs, int *targets);

/* Number of validation micro-batches available to this rank (0: no validation data). */
long tr_loader_val_batches(const tr_loader *l);

const char *tr_loader_error(const tr_loader *l);
/* A 64-bit fingerprint of the data (every span's size and about 500 tokens sampled from each):
 * processes that must read the same data compare it at startup. */
uint64_t tr_loader_fingerprint(const tr_loader *l);
long tr_loader_train_tokens(const tr_loader *l);
long tr_loader_val_tokens(const tr_loader *l);
/* Windows of source `src` in epoch `epoch` (each epoch's phases differ slightly). */
long tr_loader_epoch_windows(const tr_loader *l, int src, long epoch);
/* Seconds tr_loader_next spent waiting for the prefetch thread so far. */
double tr_loader_wait_seconds(const tr_loader *l);

/* The position after the last micro-batch tr_loader_next returned. */
tr_loader_pos tr_loader_get_pos(const tr_loader *l);
/* Continue from pos (from tr_loader_get_pos of a loader over the same data and seed). */
int tr_loader_set_pos(tr_loader *l, tr_loader_pos pos, char *err, size_t errlen);

/* Uneven data-parallel shares (parallel/layout.h: dp_shares): a step is one global batch of
 * B x total windows, of which this rank's `count` calls of a step read micro-batches first ..
 * first + count - 1 (B windows each), instead of rank/world's slices of each call's global
 * batch; the position moves past the step at its last call, so it is always a step's start
 * between steps (checkpoints, the guard's skips). 0, or -1 with err. */
int tr_loader_set_share(tr_loader *l, int first, int count, int total, char *err, size_t errlen);

void tr_loader_free(tr_loader *l);

#endif
