/* In-memory loader: the corpus is read and tokenized once; the tail val_fraction is held out.
 * Training windows of T+1 tokens start at phase + k*T; each epoch draws a new phase and a new
 * permutation of the windows from the recipe's seed, so an epoch covers the split once and
 * the global batch is split into disjoint per-rank slices. */
#include "data/loader.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/tokenizer.h"

struct tr_loader {
    int *tokens; /* whole corpus */
    long n_train, n_val; /* train = tokens[0, n_train), val = tokens[n_train, n_train+n_val) */
    int rank, world, B, T;
    unsigned long long seed;
    tr_loader_pos pos;
    long n_windows; /* windows of the current epoch */
    long phase;
    long *perm;
    long perm_epoch; /* epoch perm was built for; -1 = none */
};

/* splitmix64: a tiny, well-mixed generator; the state is a plain counter. */
static uint64_t splitmix64(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static void build_epoch(tr_loader *l, long epoch) {
    uint64_t s = l->seed * 0x2545f4914f6cdd1dULL + (uint64_t)epoch * 0x9e3779b97f4a7c15ULL + 1;
    l->phase = (long)(splitmix64(&s) % (uint64_t)l->T);
    l->n_windows = (l->n_train - 1 - l->phase) / l->T;
    for (long i = 0; i < l->n_windows; i++) l->perm[i] = i;
    for (long i = l->n_windows - 1; i > 0; i--) { /* Fisher-Yates */
        long j = (long)(splitmix64(&s) % (uint64_t)(i + 1));
        long t = l->perm[i];
        l->perm[i] = l->perm[j];
        l->perm[j] = t;
    }
    l->perm_epoch = epoch;
}

int tr_loader_open(tr_loader **out, const tr_data_desc *d, int vocab, int rank, int world, int B,
                   int T, unsigned long long seed, char *err, size_t errlen) {
    *out = NULL;
    tr_tokenizer tok;
    if (tr_tokenizer_init(&tok, d->tokenizer, err, errlen)) return -1;
    if (vocab < tok.vocab) {
        snprintf(err, errlen, "model vocab %d is smaller than the tokenizer's %d", vocab,
                 tok.vocab);
        return -1;
    }
    FILE *f = fopen(d->text, "rb");
    if (!f) {
        snprintf(err, errlen, "data: cannot read '%s': %s", d->text, strerror(errno));
        return -1;
    }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *text = malloc(n > 0 ? (size_t)n : 1);
    if (!text || (n > 0 && fread(text, 1, (size_t)n, f) != (size_t)n)) {
        snprintf(err, errlen, "data: cannot read '%s'", d->text);
        free(text);
        fclose(f);
        return -1;
    }
    fclose(f);
    tr_loader *l = calloc(1, sizeof(*l));
    l->tokens = malloc((size_t)(n > 0 ? n : 1) * sizeof(int));
    long ntok = (long)tr_tokenizer_encode(&tok, text, (size_t)n, l->tokens);
    free(text);
    l->n_val = (long)(ntok * (double)d->val_fraction);
    l->n_train = ntok - l->n_val;
    l->rank = rank;
    l->world = world;
    l->B = B;
    l->T = T;
    l->seed = seed;
    long need_train = 2L * T * B * world + 1, need_val = (long)T * B * world + 1;
    if (l->n_train < need_train || l->n_val < need_val) {
        snprintf(err, errlen,
                 "data: '%s' has %ld tokens (%ld train, %ld validation); need at least %ld "
                 "train and %ld validation for batches of %d x %d on %d rank(s)",
                 d->text, ntok, l->n_train, l->n_val, need_train, need_val, B, T, world);
        tr_loader_free(l);
        return -1;
    }
    l->perm = malloc((size_t)(l->n_train / T + 1) * sizeof(long));
    l->perm_epoch = -1;
    build_epoch(l, 0);
    *out = l;
    return 0;
}

static void copy_window(const tr_loader *l, long start, int *inputs, int *targets) {
    memcpy(inputs, l->tokens + start, (size_t)l->T * sizeof(int));
    memcpy(targets, l->tokens + start + 1, (size_t)l->T * sizeof(int));
}

void tr_loader_next(tr_loader *l, int *inputs, int *targets) {
    long global = (long)l->B * l->world;
    if (l->perm_epoch != l->pos.epoch) build_epoch(l, l->pos.epoch);
    if (l->pos.cursor + global > l->n_windows) { /* drop the ragged end of the epoch */
        l->pos.epoch++;
        l->pos.cursor = 0;
        build_epoch(l, l->pos.epoch);
    }
    for (int b = 0; b < l->B; b++) {
        long w = l->perm[l->pos.cursor + (long)l->rank * l->B + b];
        copy_window(l, l->phase + w * l->T, inputs + (size_t)b * l->T, targets + (size_t)b * l->T);
    }
    l->pos.cursor += global;
}

long tr_loader_val_batches(const tr_loader *l) {
    long windows = (l->n_val - 1) / l->T;
    return windows / ((long)l->B * l->world);
}

int tr_loader_val_batch(tr_loader *l, long i, int *inputs, int *targets) {
    if (i < 0 || i >= tr_loader_val_batches(l)) return 0;
    for (int b = 0; b < l->B; b++) {
        long w = (i * l->world + l->rank) * l->B + b;
        copy_window(l, l->n_train + w * l->T, inputs + (size_t)b * l->T,
                    targets + (size_t)b * l->T);
    }
    return 1;
}

long tr_loader_train_tokens(const tr_loader *l) {
    return l->n_train;
}
long tr_loader_val_tokens(const tr_loader *l) {
    return l->n_val;
}
tr_loader_pos tr_loader_get_pos(const tr_loader *l) {
    return l->pos;
}
void tr_loader_set_pos(tr_loader *l, tr_loader_pos pos) {
    l->pos = pos;
}

void tr_loader_free(tr_loader *l) {
    if (!l) return;
    free(l->tokens);
    free(l->perm);
    free(l);
}
