/* The loader: shards (or an in-memory byte-level corpus) as spans of tokens, a deterministic
 * per-epoch shuffle of shards and of windows within them, a weighted mix of sources, per-rank
 * slices of each global micro-batch, and a prefetch thread that fills a small ring of
 * micro-batches ahead of the training loop. The batch at a position is a pure function of the
 * data, the seed and that position, so prefetching never changes what training sees. */
#include "data/loader.h"

#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "data/corpus.h"
#include "data/shard.h"
#include "data/tokenizer.h"
#include "parallel/comm/base.h"

#define NSLOT 4 /* micro-batches prepared ahead */

typedef struct {
    const void *tokens;
    int width;      /* bytes per token */
    long n;         /* tokens */
    const char *path;
    long file_off;  /* byte offset of token 0 in the file, for messages */
} span;

typedef struct {
    span *spans;
    int n_spans;
    double cum; /* cumulative normalized weight: the source is picked when u < cum */
    /* the producer's caches: shard order of one epoch, window order of one shard */
    int *order;
    long order_epoch;
    long *perm, perm_cap, perm_n, perm_phase, perm_epoch;
    int perm_span;
} source;

typedef struct {
    int *in, *tg;
    tr_loader_pos after; /* position once this batch is consumed */
    int bad;             /* the batch hit bad data: msg says where */
    char msg[512];
} slot;

struct tr_loader {
    int rank, world, B, T, vocab;
    /* uneven shares (tr_loader_set_share): this rank's micro-batches of a step's share_total,
       from share_first, share_n of them (0: rank and world's slices); the producer's call
       within the step */
    int share_first, share_n, share_total, prod_j;
    unsigned long long seed;
    tr_shard *shards;
    int n_shards;
    uint16_t *mem; /* in-memory byte-level corpus */
    source src[TR_MAX_MIX];
    int n_src;
    span *val;
    int n_val;
    long *val_prefix; /* windows before each validation span */
    long val_windows;
    long train_tokens, val_tokens;
    char err[512];
    /* prefetch: the producer owns prod and the slots from head+filled on; the consumer owns
     * pos and the slot at head once filled > 0 */
    pthread_t thread;
    int running;
    pthread_mutex_t mu;
    pthread_cond_t not_empty, not_full;
    int stop, halted, head, filled;
    slot slots[NSLOT];
    tr_loader_pos prod, pos;
    double waited;
};

/* ---- deterministic randomness --------------------------------------------------------------- */

static uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static uint64_t splitmix64(uint64_t *s)
{
    return mix64(*s += 0x9e3779b97f4a7c15ULL);
}

/* A stream key for (source, epoch, shard, what): the shuffles depend on nothing else. */
static uint64_t key(const tr_loader *l, int s, long epoch, long shard, int what)
{
    uint64_t k = mix64(l->seed + 0x9e3779b97f4a7c15ULL);
    k = mix64(k ^ ((uint64_t)s << 56) ^ ((uint64_t)what << 48) ^ (uint64_t)epoch);
    return mix64(k ^ (uint64_t)shard * 0xd1b54a32d192ed03ULL);
}

static void shuffle_long(long *a, long n, uint64_t st)
{
    for (long i = n - 1; i > 0; i--) { /* Fisher-Yates */
        long j = (long)(splitmix64(&st) % (uint64_t)(i + 1));
        long t = a[i];
        a[i] = a[j];
        a[j] = t;
    }
}

static long phase_of(const tr_loader *l, int s, long epoch, int span_id)
{
    return (long)(key(l, s, epoch, span_id, 2) % (uint64_t)l->T);
}

static long windows_of(long n, long phase, int T)
{
    return n - 1 - phase >= T ? (n - 1 - phase) / T : 0;
}

long tr_loader_epoch_windows(const tr_loader *l, int s, long epoch)
{
    long w = 0;
    for (int i = 0; i < l->src[s].n_spans; i++)
        w += windows_of(l->src[s].spans[i].n, phase_of(l, s, epoch, i), l->T);
    return w;
}

static int ensure_order(tr_loader *l, int s, long epoch)
{
    source *src = &l->src[s];
    if (src->order_epoch == epoch)
        return 0;
    long *tmp = malloc((size_t)src->n_spans * sizeof(long));
    if (!tmp)
        return -1;
    for (int i = 0; i < src->n_spans; i++)
        tmp[i] = i;
    shuffle_long(tmp, src->n_spans, key(l, s, epoch, -1, 1));
    for (int i = 0; i < src->n_spans; i++)
        src->order[i] = (int)tmp[i];
    free(tmp);
    src->order_epoch = epoch;
    return 0;
}

static int ensure_perm(tr_loader *l, int s, long epoch, int span_id)
{
    source *src = &l->src[s];
    if (src->perm_epoch == epoch && src->perm_span == span_id)
        return 0;
    long phase = phase_of(l, s, epoch, span_id);
    long n = windows_of(src->spans[span_id].n, phase, l->T);
    if (n > src->perm_cap) {
        long *p = realloc(src->perm, (size_t)n * sizeof(long));
        if (!p)
            return -1;
        src->perm = p;
        src->perm_cap = n;
    }
    for (long i = 0; i < n; i++)
        src->perm[i] = i;
    shuffle_long(src->perm, n, key(l, s, epoch, span_id, 3));
    src->perm_n = n;
    src->perm_phase = phase;
    src->perm_epoch = epoch;
    src->perm_span = span_id;
    return 0;
}

/* The next window of source s at *p (advancing it): its span and first token. */
static int next_window(tr_loader *l, int s, tr_loader_source_pos *p, const span **sp, long *start)
{
    source *src = &l->src[s];
    for (;;) {
        if (p->shard >= src->n_spans) {
            p->epoch++;
            p->shard = 0;
            p->offset = 0;
        }
        if (ensure_order(l, s, p->epoch))
            return -1;
        int id = src->order[p->shard];
        if (ensure_perm(l, s, p->epoch, id))
            return -1;
        if (p->offset >= src->perm_n) {
            p->shard++;
            p->offset = 0;
            continue;
        }
        *sp = &src->spans[id];
        *start = src->perm_phase + src->perm[p->offset] * l->T;
        p->offset++;
        return 0;
    }
}

/* ---- the data's fingerprint: its sizes and a sample of tokens from every span ---------- */

static uint64_t fingerprint_span(uint64_t h, const span *sp)
{
    h = mix64(h ^ (uint64_t)sp->n ^ ((uint64_t)sp->width << 56));
    long step = sp->n / 509 + 1;
    for (long i = 0; i < sp->n; i += step) {
        uint32_t v = sp->width == 2 ? ((const uint16_t *)sp->tokens)[i]
                                    : ((const uint32_t *)sp->tokens)[i];
        h = mix64(h ^ v ^ ((uint64_t)i << 32));
    }
    return h;
}

uint64_t tr_loader_fingerprint(const tr_loader *l)
{
    uint64_t h = mix64(0x7472646174610000ULL ^ (uint64_t)l->n_src);
    for (int s = 0; s < l->n_src; s++)
        for (int i = 0; i < l->src[s].n_spans; i++)
            h = fingerprint_span(h, &l->src[s].spans[i]);
    for (int i = 0; i < l->n_val; i++)
        h = fingerprint_span(h, &l->val[i]);
    return h;
}

/* Copy window [start, start+T] of sp into (T) inputs and targets, checking the ids. */
static int copy_window(const tr_loader *l, const span *sp, long start, int *in, int *tg,
                       char *msg, size_t msglen)
{
    int T = l->T;
    unsigned bad = 0, vocab = (unsigned)l->vocab;
    if (sp->width == 2) {
        const uint16_t *t = (const uint16_t *)sp->tokens + start;
        for (int i = 0; i <= T; i++) {
            unsigned v = t[i];
            bad |= v >= vocab;
            if (i < T)
                in[i] = (int)v;
            if (i > 0)
                tg[i - 1] = (int)v;
        }
    } else {
        const uint32_t *t = (const uint32_t *)sp->tokens + start;
        for (int i = 0; i <= T; i++) {
            unsigned v = t[i];
            bad |= v >= vocab;
            if (i < T)
                in[i] = (int)v;
            if (i > 0)
                tg[i - 1] = (int)v;
        }
    }
    if (!bad)
        return 0;
    for (int i = 0; i <= T; i++) {
        unsigned v = tr_shard_token(sp->tokens, sp->width, start + i);
        if (v >= vocab) {
            snprintf(msg, msglen, "%s: byte %ld: token id %u is outside the model's vocabulary (%d)",
                     sp->path, sp->file_off + (start + i) * sp->width, v, l->vocab);
            break;
        }
    }
    return -1;
}

/* Produce the micro-batch of this rank at position *p and advance *p past the global batch.
 * With shares, a step is one global batch of B x share_total windows: each of this rank's
 * share_n calls walks it from the step's start for its own B windows, and only the last one
 * moves *p past it. */
static int produce(tr_loader *l, tr_loader_pos *p, int *in, int *tg, char *msg, size_t msglen)
{
    int shared = l->share_n > 0, last = !shared || l->prod_j == l->share_n - 1;
    long G = shared ? (long)l->B * l->share_total : (long)l->B * l->world;
    long lo = (long)(shared ? l->share_first + l->prod_j : l->rank) * l->B;
    tr_loader_pos walk = *p;
    for (long g = 0; g < G; g++) {
        int s = 0;
        if (l->n_src > 1) {
            double u = (double)(splitmix64(&walk.rng) >> 11) * (1.0 / 9007199254740992.0);
            while (s < l->n_src - 1 && u >= l->src[s].cum)
                s++;
        }
        const span *sp;
        long start;
        if (next_window(l, s, &walk.src[s], &sp, &start)) {
            snprintf(msg, msglen, "data: out of memory");
            return -1;
        }
        if (g >= lo && g < lo + l->B) {
            size_t b = (size_t)(g - lo) * (size_t)l->T;
            if (copy_window(l, sp, start, in + b, tg + b, msg, msglen))
                return -1;
        }
    }
    walk.batches++;
    if (shared)
        l->prod_j = last ? 0 : l->prod_j + 1;
    if (last)
        *p = walk;
    return 0;
}

/* ---- prefetch thread ------------------------------------------------------------------------ */

static void *prefetch_main(void *arg)
{
    tr_loader *l = arg;
    pthread_mutex_lock(&l->mu);
    for (;;) {
        while (!l->stop && (l->filled == NSLOT || l->halted))
            pthread_cond_wait(&l->not_full, &l->mu);
        if (l->stop)
            break;
        slot *sl = &l->slots[(l->head + l->filled) % NSLOT];
        pthread_mutex_unlock(&l->mu);
        sl->bad = produce(l, &l->prod, sl->in, sl->tg, sl->msg, sizeof sl->msg) != 0;
        sl->after = l->prod;
        pthread_mutex_lock(&l->mu);
        if (sl->bad)
            l->halted = 1; /* bad data: stop here; the consumer reports it */
        l->filled++;
        pthread_cond_signal(&l->not_empty);
    }
    pthread_mutex_unlock(&l->mu);
    return NULL;
}

static int start_prefetch(tr_loader *l)
{
    l->stop = l->halted = 0;
    l->head = l->filled = 0;
    l->prod = l->pos;
    l->prod_j = 0; /* a position is always a step's start */
    if (pthread_create(&l->thread, NULL, prefetch_main, l))
        return -1;
    l->running = 1;
    return 0;
}

static void stop_prefetch(tr_loader *l)
{
    if (!l->running)
        return;
    pthread_mutex_lock(&l->mu);
    l->stop = 1;
    pthread_cond_broadcast(&l->not_full);
    pthread_mutex_unlock(&l->mu);
    pthread_join(l->thread, NULL);
    l->running = 0;
}

int tr_loader_next(tr_loader *l, int *inputs, int *targets)
{
    if (!l->running)
        return -1;
    pthread_mutex_lock(&l->mu);
    if (!l->filled) {
        double t0 = tr_now();
        while (!l->filled)
            pthread_cond_wait(&l->not_empty, &l->mu);
        l->waited += tr_now() - t0;
    }
    slot *sl = &l->slots[l->head];
    int rc = 0;
    if (sl->bad) {
        snprintf(l->err, sizeof l->err, "%s", sl->msg);
        rc = -1; /* leave the slot: every later call reports the same */
    } else {
        size_t n = (size_t)l->B * (size_t)l->T * sizeof(int);
        memcpy(inputs, sl->in, n);
        memcpy(targets, sl->tg, n);
        l->pos = sl->after;
        l->head = (l->head + 1) % NSLOT;
        l->filled--;
        pthread_cond_signal(&l->not_full);
    }
    pthread_mutex_unlock(&l->mu);
    return rc;
}

/* ---- validation ----------------------------------------------------------------------------- */

long tr_loader_val_batches(const tr_loader *l)
{
    return l->val_windows / ((long)l->B * l->world);
}

int tr_loader_val_batch(tr_loader *l, long i, int *inputs, int *targets)
{
    if (i < 0 || i >= tr_loader_val_batches(l))
        return 0;
    for (int b = 0; b < l->B; b++) {
        long w = (i * l->world + l->rank) * l->B + b;
        int k = 0;
        while (k + 1 < l->n_val && l->val_prefix[k + 1] <= w)
            k++;
        long start = (w - l->val_prefix[k]) * l->T;
        size_t o = (size_t)b * (size_t)l->T;
        if (copy_window(l, &l->val[k], start, inputs + o, targets + o, l->err, sizeof l->err))
            return -1;
    }
    return 1;
}

/* ---- opening ------------------------------------------------------------------------------- */

/* Map every shard matching pattern into spans appended to *spans. */
static int add_glob(tr_loader *l, const char *pattern, span **spans, int *n, char *err,
                    size_t errlen)
{
    glob_t g;
    int rc = glob(pattern, 0, NULL, &g);
    if (rc == GLOB_NOMATCH || (rc == 0 && g.gl_pathc == 0)) {
        snprintf(err, errlen, "data: '%s' matches no file", pattern);
        if (rc == 0)
            globfree(&g);
        return -1;
    }
    if (rc != 0) {
        snprintf(err, errlen, "data: cannot read the files of '%s'", pattern);
        return -1;
    }
    tr_shard *sh = realloc(l->shards, (size_t)(l->n_shards + (int)g.gl_pathc) * sizeof *sh);
    span *sp = realloc(*spans, (size_t)(*n + (int)g.gl_pathc) * sizeof *sp);
    if (sh)
        l->shards = sh;
    if (sp)
        *spans = sp;
    if (!sh || !sp) {
        snprintf(err, errlen, "data: out of memory");
        globfree(&g);
        return -1;
    }
    for (size_t i = 0; i < g.gl_pathc; i++) {
        tr_shard *s = &l->shards[l->n_shards];
        if (tr_shard_open(s, g.gl_pathv[i], err, errlen)) {
            globfree(&g);
            return -1;
        }
        l->n_shards++;
        (*spans)[(*n)++] = (span){s->tokens, s->width, s->n, s->path, TR_SHARD_HEADER_BYTES};
    }
    globfree(&g);
    return 0;
}

static int read_text(const char *path, char **text, size_t *n, char *err, size_t errlen)
{
    /* not blocking: a FIFO (or a device) is refused, not waited on */
    int fd = open(path, O_RDONLY | O_NONBLOCK);
    struct stat st;
    if (fd < 0) {
        snprintf(err, errlen, "data: cannot read '%s': %s", path, strerror(errno));
        return -1;
    }
    if (fstat(fd, &st) || !S_ISREG(st.st_mode)) {
        snprintf(err, errlen, "data: '%s' is not a regular file", path);
        close(fd);
        return -1;
    }
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        snprintf(err, errlen, "data: cannot read '%s': %s", path, strerror(errno));
        close(fd);
        return -1;
    }
    int rc = tr_read_all(f, SIZE_MAX, text, n);
    fclose(f);
    if (rc) {
        *text = NULL;
        snprintf(err, errlen, "data: cannot read '%s'", path);
    }
    return rc;
}

static int open_text_bytes(tr_loader *l, const tr_data_desc *d, char *err, size_t errlen)
{
    char *text;
    size_t n;
    if (read_text(d->text, &text, &n, err, errlen))
        return -1;
    l->mem = malloc((n ? n : 1) * sizeof(uint16_t));
    l->src[0].spans = malloc(sizeof(span));
    l->val = malloc(sizeof(span));
    if (!l->mem || !l->src[0].spans || !l->val) {
        free(text);
        snprintf(err, errlen, "data: out of memory");
        return -1;
    }
    for (size_t i = 0; i < n; i++)
        l->mem[i] = (unsigned char)text[i];
    free(text);
    long ntok = (long)n, n_val = (long)((double)ntok * (double)d->val_fraction);
    long n_train = ntok - n_val;
    long G = (long)l->B * l->world;
    long need_train = 2L * l->T * G + 1, need_val = (long)l->T * G + 1;
    if (n_train < need_train || n_val < need_val) {
        snprintf(err, errlen,
                 "data: '%s' has %ld tokens (%ld train, %ld validation); need at least %ld "
                 "train and %ld validation for batches of %d x %d on %d rank(s)",
                 d->text, ntok, n_train, n_val, need_train, need_val, l->B, l->T, l->world);
        return -1;
    }
    l->src[0].spans[0] = (span){l->mem, 2, n_train, d->text, 0};
    l->src[0].n_spans = 1;
    l->val[0] = (span){l->mem + n_train, 2, n_val, d->text, n_train};
    l->n_val = 1;
    return 0;
}

int tr_loader_open(tr_loader **out, const tr_data_desc *d, int vocab, int rank, int world, int B,
                   int T, unsigned long long seed, char *err, size_t errlen)
{
    *out = NULL;
    if (world < 1 || rank < 0 || rank >= world || B < 1 || T < 1) {
        snprintf(err, errlen, "data: bad loader shape (rank %d of %d, %d x %d)", rank, world, B, T);
        return -1;
    }
    tr_loader *l = calloc(1, sizeof *l);
    if (!l) {
        snprintf(err, errlen, "data: out of memory");
        return -1;
    }
    l->rank = rank;
    l->world = world;
    l->B = B;
    l->T = T;
    l->vocab = vocab;
    l->seed = seed;
    pthread_mutex_init(&l->mu, NULL);
    pthread_cond_init(&l->not_empty, NULL);
    pthread_cond_init(&l->not_full, NULL);

    int tok_vocab = d->tokenizer == TR_TOKENIZER_GPT2 ? 50257 : 256;
    if (d->tokenizer == TR_TOKENIZER_GPT2 || d->tokenizer == TR_TOKENIZER_BYTE) {
        if (vocab < tok_vocab) {
            snprintf(err, errlen, "model vocab %d is smaller than the %s tokenizer's %d", vocab,
                     d->tokenizer == TR_TOKENIZER_GPT2 ? "gpt2" : "byte", tok_vocab);
            goto fail;
        }
    }
    /* Shards are opened in two passes (train globs, then validation) into one array; spans
     * keep indices until the array stops growing. */
    struct { int first, count; } ranges[TR_MAX_MIX];
    int val_first = 0, val_count = 0;
    span *tmp = NULL;
    int ntmp = 0;
    if (d->text[0] && d->tokenizer == TR_TOKENIZER_BYTE) {
        if (open_text_bytes(l, d, err, errlen))
            goto fail;
        l->n_src = 1;
        l->src[0].cum = 1.0;
    } else {
        char dir[TR_PATH_MAX + 64], pat[TR_PATH_MAX + 96], vpat[TR_PATH_MAX + 96];
        const char *globs[TR_MAX_MIX];
        double w[TR_MAX_MIX], wsum = 0;
        const char *vglob = d->val_shards[0] ? d->val_shards : NULL;
        if (d->text[0]) {
            int made;
            if (tr_corpus_cache(d, dir, sizeof dir, &made, NULL, NULL, err, errlen))
                goto fail;
            snprintf(pat, sizeof pat, "%s/train_*.bin", dir);
            snprintf(vpat, sizeof vpat, "%s/val_*.bin", dir);
            globs[0] = pat;
            w[0] = 1;
            l->n_src = 1;
            vglob = vpat;
        } else if (d->n_mix > 0) {
            l->n_src = d->n_mix;
            for (int s = 0; s < d->n_mix; s++) {
                globs[s] = d->mix[s].shards;
                w[s] = d->mix[s].weight;
            }
        } else if (d->shards[0]) {
            globs[0] = d->shards;
            w[0] = 1;
            l->n_src = 1;
        } else {
            snprintf(err, errlen, "data: no text, shards or mix given");
            goto fail;
        }
        for (int s = 0; s < l->n_src; s++) {
            ranges[s].first = ntmp;
            if (add_glob(l, globs[s], &tmp, &ntmp, err, errlen)) {
                free(tmp);
                goto fail;
            }
            ranges[s].count = ntmp - ranges[s].first;
            wsum += w[s];
        }
        val_first = ntmp;
        if (vglob && add_glob(l, vglob, &tmp, &ntmp, err, errlen)) {
            free(tmp);
            goto fail;
        }
        val_count = ntmp - val_first;
        /* l->shards is final: point the spans at it */
        for (int i = 0; i < ntmp; i++) {
            const tr_shard *s = &l->shards[i];
            tmp[i] = (span){s->tokens, s->width, s->n, s->path, TR_SHARD_HEADER_BYTES};
        }
        double acc = 0;
        for (int s = 0; s < l->n_src; s++) {
            l->src[s].spans = malloc((size_t)ranges[s].count * sizeof(span));
            if (!l->src[s].spans) {
                free(tmp);
                snprintf(err, errlen, "data: out of memory");
                goto fail;
            }
            memcpy(l->src[s].spans, tmp + ranges[s].first, (size_t)ranges[s].count * sizeof(span));
            l->src[s].n_spans = ranges[s].count;
            acc += w[s] / wsum;
            l->src[s].cum = s == l->n_src - 1 ? 1.0 : acc;
        }
        l->val = malloc((size_t)(val_count ? val_count : 1) * sizeof(span));
        if (!l->val) {
            free(tmp);
            snprintf(err, errlen, "data: out of memory");
            goto fail;
        }
        memcpy(l->val, tmp + val_first, (size_t)val_count * sizeof(span));
        l->n_val = val_count;
        free(tmp);
    }
    /* every source needs a window in every epoch (whatever the phase), validation a batch */
    long G = (long)B * world;
    for (int s = 0; s < l->n_src; s++) {
        long worst = 0, tokens = 0;
        for (int i = 0; i < l->src[s].n_spans; i++) {
            worst += windows_of(l->src[s].spans[i].n, T - 1, T);
            tokens += l->src[s].spans[i].n;
        }
        l->train_tokens += tokens;
        if (worst < 1) {
            snprintf(err, errlen,
                     "data: '%s' holds %ld tokens: too few for one sequence of %d tokens "
                     "(need a shard of at least %d)",
                     l->src[s].n_spans ? l->src[s].spans[0].path : "?", tokens, T, 2 * T);
            goto fail;
        }
        l->src[s].order = malloc((size_t)l->src[s].n_spans * sizeof(int));
        if (!l->src[s].order) {
            snprintf(err, errlen, "data: out of memory");
            goto fail;
        }
        l->src[s].order_epoch = -1;
        l->src[s].perm_epoch = -1;
    }
    l->val_prefix = malloc((size_t)(l->n_val + 1) * sizeof(long));
    if (!l->val_prefix) {
        snprintf(err, errlen, "data: out of memory");
        goto fail;
    }
    for (int i = 0; i < l->n_val; i++) {
        l->val_prefix[i] = l->val_windows;
        l->val_windows += windows_of(l->val[i].n, 0, T);
        l->val_tokens += l->val[i].n;
    }
    if (l->n_val > 0 && l->val_windows < G) {
        snprintf(err, errlen,
                 "data: the validation data ('%s', ...) hold %ld tokens: too few for one batch "
                 "of %d x %d on %d rank(s)",
                 l->val[0].path, l->val_tokens, B, T, world);
        goto fail;
    }
    for (int k = 0; k < NSLOT; k++) {
        l->slots[k].in = malloc((size_t)B * (size_t)T * sizeof(int));
        l->slots[k].tg = malloc((size_t)B * (size_t)T * sizeof(int));
        if (!l->slots[k].in || !l->slots[k].tg) {
            snprintf(err, errlen, "data: out of memory");
            goto fail;
        }
    }
    l->pos.n_sources = l->n_src;
    l->pos.data = tr_loader_fingerprint(l);
    l->pos.rng = mix64(seed ^ 0x6d69786d69786d69ULL);
    if (start_prefetch(l)) {
        snprintf(err, errlen, "data: cannot start the prefetch thread");
        goto fail;
    }
    *out = l;
    return 0;
fail:
    tr_loader_free(l);
    return -1;
}

const char *tr_loader_error(const tr_loader *l)
{
    return l->err;
}

long tr_loader_train_tokens(const tr_loader *l)
{
    return l->train_tokens;
}

long tr_loader_val_tokens(const tr_loader *l)
{
    return l->val_tokens;
}

double tr_loader_wait_seconds(const tr_loader *l)
{
    return l->waited;
}

tr_loader_pos tr_loader_get_pos(const tr_loader *l)
{
    return l->pos;
}

int tr_loader_set_pos(tr_loader *l, tr_loader_pos pos, char *err, size_t errlen)
{
    if (pos.n_sources != l->n_src || pos.batches < 0) {
        snprintf(err, errlen, "data: the saved position has %d source(s), the data %d",
                 pos.n_sources, l->n_src);
        return -1;
    }
    if (pos.data != l->pos.data) {
        snprintf(err, errlen, "data: the data differ from those the checkpoint was saved on "
                 "(their sizes or sampled tokens changed; fingerprint %016llx, saved %016llx)",
                 (unsigned long long)l->pos.data, (unsigned long long)pos.data);
        return -1;
    }
    for (int s = 0; s < l->n_src; s++) {
        const tr_loader_source_pos *p = &pos.src[s];
        if (p->epoch < 0 || p->shard < 0 || p->shard > l->src[s].n_spans || p->offset < 0) {
            snprintf(err, errlen, "data: the saved position of source %d (epoch %ld, shard %ld, "
                     "offset %ld) does not fit its %d shard(s)",
                     s, p->epoch, p->shard, p->offset, l->src[s].n_spans);
            return -1;
        }
    }
    stop_prefetch(l);
    l->pos = pos;
    if (start_prefetch(l)) {
        snprintf(err, errlen, "data: cannot start the prefetch thread");
        return -1;
    }
    return 0;
}

int tr_loader_set_share(tr_loader *l, int first, int count, int total, char *err, size_t errlen)
{
    if (first < 0 || count < 1 || total < first + count) {
        snprintf(err, errlen, "data: bad share (micro-batches %d..%d of %d)", first,
                 first + count - 1, total);
        return -1;
    }
    stop_prefetch(l);
    l->share_first = first, l->share_n = count, l->share_total = total;
    if (start_prefetch(l)) {
        snprintf(err, errlen, "data: cannot start the prefetch thread");
        return -1;
    }
    return 0;
}

void tr_loader_free(tr_loader *l)
{
    if (!l)
        return;
    stop_prefetch(l);
    for (int s = 0; s < TR_MAX_MIX; s++) {
        free(l->src[s].spans);
        free(l->src[s].order);
        free(l->src[s].perm);
    }
    for (int i = 0; i < l->n_shards; i++)
        tr_shard_close(&l->shards[i]);
    free(l->shards);
    free(l->mem);
    free(l->val);
    free(l->val_prefix);
    for (int k = 0; k < NSLOT; k++) {
        free(l->slots[k].in);
        free(l->slots[k].tg);
    }
    pthread_mutex_destroy(&l->mu);
    pthread_cond_destroy(&l->not_empty);
    pthread_cond_destroy(&l->not_full);
    free(l);
}
