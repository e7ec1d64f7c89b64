/* The data loader: batches of (inputs, targets) for one rank. Today an in-memory loader over
 * one text file tokenized at open; the sharded, prefetching loader replaces it behind these
 * same functions. Every rank reads a disjoint slice of each global batch. */
#ifndef TR_LOADER_H
#define TR_LOADER_H

#include <stddef.h>

#include "dsl/recipe.h"

typedef struct tr_loader tr_loader;

/* Where the loader is in the training stream; saving and restoring it resumes exactly. */
typedef struct {
    long epoch;
    long cursor; /* next window of this epoch's permutation (global batch order) */
} tr_loader_pos;

/* Open the data of a recipe for `rank` of `world`, micro-batches of B sequences of T tokens.
 * `vocab` is the model's: every token id must be below it. */
int tr_loader_open(tr_loader **out, const tr_data_desc *d, int vocab, int rank, int world, int B,
                   int T, unsigned long long seed, char *err, size_t errlen);

/* The next training micro-batch of this rank: inputs and targets, (B, T) each; targets are
 * the inputs shifted by one token. Epochs wrap around, each with a new shuffle. */
void tr_loader_next(tr_loader *l, int *inputs, int *targets);

/* The i-th validation micro-batch of this rank (the same every evaluation). Returns 0 and
 * fills nothing when the validation split has no such batch. */
int tr_loader_val_batch(tr_loader *l, long i, int *inputs, int *targets);

/* Number of validation micro-batches available to this rank. */
long tr_loader_val_batches(const tr_loader *l);

long tr_loader_train_tokens(const tr_loader *l);
long tr_loader_val_tokens(const tr_loader *l);
tr_loader_pos tr_loader_get_pos(const tr_loader *l);
void tr_loader_set_pos(tr_loader *l, tr_loader_pos pos);

void tr_loader_free(tr_loader *l);

#endif
