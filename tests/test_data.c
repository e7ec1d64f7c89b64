/* The in-memory loader and the byte tokenizer: per-rank slices of every global batch are
 * disjoint and together cover an epoch once, for several world sizes; the same seed gives
 * the same batches; a saved position resumes the identical stream; bad input is refused. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/loader.h"
#include "data/tokenizer.h"

static int failures;

static void check(int ok, const char *what) {
    if (!ok) failures++;
    printf("%s %s\n", ok ? "ok  " : "FAIL", what);
}

static const char *corpus = "/tmp/tr_test_data.txt";

/* Random bytes: a window of 16 tokens is then (almost surely) unique, so windows can be
 * identified by their content. */
static void write_corpus(long n) {
    FILE *f = fopen(corpus, "wb");
    unsigned s = 12345;
    for (long i = 0; i < n; i++) {
        s = s * 1103515245u + 12345u;
        fputc((int)((s >> 16) & 255), f);
    }
    fclose(f);
}

static int cmp_key(const void *a, const void *b) {
    return memcmp(a, b, 16 * sizeof(int));
}

static void coverage(int world) {
    tr_data_desc d = {.tokenizer = TR_TOKENIZER_BYTE, .val_fraction = 0.1f};
    snprintf(d.text, sizeof(d.text), "%s", corpus);
    int B = 3, T = 16;
    tr_loader *l[8];
    char err[256];
    for (int r = 0; r < world; r++) {
        if (tr_loader_open(&l[r], &d, 256, r, world, B, T, 42, err, sizeof(err))) {
            printf("FAIL open: %s\n", err);
            failures++;
            return;
        }
    }
    long train = tr_loader_train_tokens(l[0]);
    long windows_max = train / T, steps = 0;
    int *keys = malloc((size_t)(windows_max + 8) * 16 * sizeof(int));
    int *in = malloc((size_t)B * T * sizeof(int)), *tg = malloc((size_t)B * T * sizeof(int));
    long nkeys = 0;
    int shifted = 1;
    /* one epoch: until any loader moves to epoch 1 */
    while (1) {
        tr_loader_pos p0 = tr_loader_get_pos(l[0]);
        tr_loader_next(l[0], in, tg);
        if (tr_loader_get_pos(l[0]).epoch != p0.epoch && steps > 0) break;
        for (int r = 0; r < world; r++) {
            if (r > 0) tr_loader_next(l[r], in, tg);
            for (int b = 0; b < B; b++) {
                memcpy(keys + nkeys * 16, in + b * T, 16 * sizeof(int));
                shifted &= !memcmp(in + b * T + 1, tg + b * T, (T - 1) * sizeof(int));
                nkeys++;
            }
        }
        steps++;
    }
    qsort(keys, (size_t)nkeys, 16 * sizeof(int), cmp_key);
    int dup = 0;
    for (long i = 1; i < nkeys; i++) dup += !cmp_key(keys + (i - 1) * 16, keys + i * 16);
    char what[200];
    long expect = (train - T) / T; /* windows of an epoch, within one of the phase */
    snprintf(what, sizeof(what),
             "world %d: %ld windows in one epoch, none seen twice (%d duplicates), "
             "covering the split (>= %ld), targets shifted by one",
             world, nkeys, dup, expect - (long)B * world);
    check(dup == 0 && nkeys >= expect - (long)B * world && nkeys <= expect + 1 && shifted, what);
    free(keys);
    free(in);
    free(tg);
    for (int r = 0; r < world; r++) tr_loader_free(l[r]);
}

static void resume(void) {
    tr_data_desc d = {.tokenizer = TR_TOKENIZER_BYTE, .val_fraction = 0.1f};
    snprintf(d.text, sizeof(d.text), "%s", corpus);
    int B = 2, T = 16, n = B * T;
    tr_loader *a, *b;
    char err[256];
    tr_loader_open(&a, &d, 256, 0, 1, B, T, 7, err, sizeof(err));
    tr_loader_open(&b, &d, 256, 0, 1, B, T, 7, err, sizeof(err));
    int ia[32], ta[32], ib[32], tb[32];
    for (int i = 0; i < 700; i++) tr_loader_next(a, ia, ta); /* past an epoch boundary */
    tr_loader_set_pos(b, tr_loader_get_pos(a));
    int same = 1;
    for (int i = 0; i < 50; i++) {
        tr_loader_next(a, ia, ta);
        tr_loader_next(b, ib, tb);
        same &= !memcmp(ia, ib, n * sizeof(int)) && !memcmp(ta, tb, n * sizeof(int));
    }
    check(same && tr_loader_get_pos(a).epoch >= 1,
          "resume: a restored position continues with identical batches across epochs");
    tr_loader *c;
    tr_loader_open(&c, &d, 256, 0, 1, B, T, 8, err, sizeof(err));
    tr_loader_next(c, ib, tb);
    tr_loader_set_pos(a, (tr_loader_pos){0, 0});
    tr_loader_next(a, ia, ta);
    check(memcmp(ia, ib, n * sizeof(int)) != 0, "seed: another seed gives another order");
    int v1[32], v2[32], t1[32], t2[32];
    tr_loader_val_batch(a, 1, v1, t1);
    tr_loader_val_batch(c, 1, v2, t2);
    check(!memcmp(v1, v2, sizeof(v1)), "validation batches do not depend on the seed");
    tr_loader_free(a);
    tr_loader_free(b);
    tr_loader_free(c);
}

static void bad_input(void) {
    tr_data_desc d = {.tokenizer = TR_TOKENIZER_BYTE, .val_fraction = 0.1f};
    char err[512];
    tr_loader *l;
    snprintf(d.text, sizeof(d.text), "/nonexistent/corpus.txt");
    int rc = tr_loader_open(&l, &d, 256, 0, 1, 2, 16, 1, err, sizeof(err));
    check(rc == -1 && strstr(err, "/nonexistent/corpus.txt") && strstr(err, "No such file"),
          "missing corpus: names the file");
    printf("     (%s)\n", err);
    FILE *f = fopen("/tmp/tr_test_tiny.txt", "w");
    fputs("too short", f);
    fclose(f);
    snprintf(d.text, sizeof(d.text), "/tmp/tr_test_tiny.txt");
    rc = tr_loader_open(&l, &d, 256, 0, 1, 2, 16, 1, err, sizeof(err));
    check(rc == -1 && strstr(err, "tr_test_tiny.txt") && strstr(err, "tokens"),
          "tiny corpus: says how much is needed");
    printf("     (%s)\n", err);
    snprintf(d.text, sizeof(d.text), "%s", corpus);
    rc = tr_loader_open(&l, &d, 100, 0, 1, 2, 16, 1, err, sizeof(err));
    check(rc == -1 && strstr(err, "vocab 100"), "vocab smaller than the tokenizer's: refused");
}

static void tokenizer(void) {
    tr_tokenizer t;
    char err[64];
    tr_tokenizer_init(&t, TR_TOKENIZER_BYTE, err, sizeof(err));
    const char s[] = "caf\xc3\xa9 \xff\xfe\n\t"; /* UTF-8, invalid bytes, controls */
    int ids[32];
    size_t n = tr_tokenizer_encode(&t, s, sizeof(s) - 1, ids);
    char back[32];
    size_t len = 0;
    for (size_t i = 0; i < n; i++) len += tr_tokenizer_decode(&t, ids[i], back + len);
    check(n == sizeof(s) - 1 && len == n && !memcmp(back, s, n) && ids[3] == 0xc3 && ids[6] == 0xff,
          "byte tokenizer round-trips any bytes");
}

int main(void) {
    write_corpus(20000);
    tokenizer();
    for (int w = 1; w <= 4; w++) coverage(w);
    resume();
    bad_input();
    printf("%s: %d failure(s)\n", failures ? "FAIL" : "PASS", failures);
    return failures ? 1 : 0;
}
