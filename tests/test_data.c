/* The data pipeline: shard write/read and every kind of bad shard; the loader's per-rank
 * slices are disjoint and cover each epoch once for several world sizes; a saved position
 * resumes the identical stream; mixes follow their weights; the byte-level text path; the
 * parallel corpus tokenizer (same shards with 1 or 2 threads, exact round trip, JSONL, bad
 * input with file and offset) and the cache a gpt2 text recipe uses. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "data/corpus.h"
#include "data/loader.h"
#include "data/shard.h"
#include "data/tokenizer.h"

static int failures;
static char dir[256];

static void check(int ok, const char *what)
{
    if (!ok)
        failures++;
    printf("%s %s\n", ok ? "ok  " : "FAIL", what);
}

static void path_of(char *buf, size_t n, const char *name)
{
    snprintf(buf, n, "%s/%s", dir, name);
}

/* A shard whose token i is base + i: windows are identified by their first token. */
static void write_shard(const char *name, long n, long base, int width)
{
    char p[512], err[256];
    path_of(p, sizeof p, name);
    tr_shard_writer *w;
    int *ids = malloc((size_t)n * sizeof(int));
    for (long i = 0; i < n; i++)
        ids[i] = (int)((base + i) % (width == 2 ? 65536 : 1L << 30));
    if (tr_shard_writer_open(&w, p, width, err, sizeof err) ||
        tr_shard_writer_write(w, ids, (size_t)n, err, sizeof err) ||
        tr_shard_writer_close(w, err, sizeof err))
        printf("FAIL write %s: %s\n", p, err);
    free(ids);
}

static void shards(void)
{
    write_shard("s16.bin", 1000, 7, 2);
    write_shard("s32.bin", 1000, 70000, 4);
    char p[512], err[256];
    tr_shard s;
    path_of(p, sizeof p, "s16.bin");
    int ok = tr_shard_open(&s, p, err, sizeof err) == 0 && s.width == 2 && s.n == 1000 &&
             tr_shard_token(s.tokens, 2, 999) == 1006;
    int32_t h[3];
    memcpy(h, s.map, sizeof h);
    ok &= h[0] == 20240520 && h[1] == 1 && h[2] == 1000 && s.map_len == 1024 + 2000;
    tr_shard_close(&s);
    path_of(p, sizeof p, "s32.bin");
    ok &= tr_shard_open(&s, p, err, sizeof err) == 0 && s.width == 4 && s.n == 1000 &&
          tr_shard_token(s.tokens, 4, 5) == 70005;
    memcpy(h, s.map, sizeof h);
    ok &= h[0] == 20240801 && h[1] == 7;
    tr_shard_close(&s);
    struct stat st;
    path_of(p, sizeof p, "s16.bin.tmp");
    ok &= stat(p, &st) != 0;
    check(ok, "shards: uint16 and uint32 written (llm.c headers) and read back; no .tmp left");
}

static void bad_shards(void)
{
    char p[512], err[512], what[700];
    tr_shard s;
    FILE *f;
    /* wrong magic */
    path_of(p, sizeof p, "bad_magic.bin");
    f = fopen(p, "wb");
    for (int i = 0; i < 300; i++)
        fputc(i == 0 ? 1 : 0, f);
    for (int i = 0; i < 1024; i++)
        fputc(0, f);
    fclose(f);
    int rc = tr_shard_open(&s, p, err, sizeof err);
    snprintf(what, sizeof what, "wrong magic: %s", err);
    check(rc == -1 && strstr(err, "bad_magic.bin: byte 0: bad magic 1"), what);
    /* truncated: copy a good shard without its last byte */
    char good[512];
    path_of(good, sizeof good, "s16.bin");
    path_of(p, sizeof p, "truncated.bin");
    FILE *in = fopen(good, "rb");
    f = fopen(p, "wb");
    for (int i = 0; i < 1024 + 1999; i++)
        fputc(fgetc(in), f);
    fclose(in);
    fclose(f);
    rc = tr_shard_open(&s, p, err, sizeof err);
    snprintf(what, sizeof what, "truncated shard: %s", err);
    check(rc == -1 && strstr(err, "truncated.bin: byte 8:") && strstr(err, "(truncated)"), what);
    path_of(p, sizeof p, "empty.bin");
    fclose(fopen(p, "wb"));
    rc = tr_shard_open(&s, p, err, sizeof err);
    snprintf(what, sizeof what, "empty shard: %s", err);
    check(rc == -1 && strstr(err, "empty.bin: empty file"), what);
    path_of(p, sizeof p, "missing.bin");
    rc = tr_shard_open(&s, p, err, sizeof err);
    snprintf(what, sizeof what, "missing shard: %s", err);
    check(rc == -1 && strstr(err, "missing.bin: cannot open shard: No such file"), what);

    tr_data_desc d = {.tokenizer = TR_TOKENIZER_BYTE};
    tr_loader *l;
    path_of(d.shards, sizeof d.shards, "nothing_*.bin");
    rc = tr_loader_open(&l, &d, 1 << 20, 0, 1, 2, 8, 1, err, sizeof err);
    snprintf(what, sizeof what, "glob matching nothing: %s", err);
    check(rc == -1 && strstr(err, "nothing_*.bin' matches no file"), what);
    path_of(d.shards, sizeof d.shards, "bad_magic.bin");
    rc = tr_loader_open(&l, &d, 1 << 20, 0, 1, 2, 8, 1, err, sizeof err);
    check(rc == -1 && strstr(err, "bad magic"), "loader: a bad shard in the glob is refused");
    /* token outside the model's vocabulary: s16 holds 7..1006; vocab 500 */
    path_of(d.shards, sizeof d.shards, "s16.bin");
    rc = tr_loader_open(&l, &d, 500, 0, 1, 2, 8, 1, err, sizeof err);
    int bad = 0;
    int in_[16], tg[16];
    for (int i = 0; i < 200 && rc == 0 && !bad; i++)
        bad = tr_loader_next(l, in_, tg) != 0;
    snprintf(what, sizeof what, "token outside the vocabulary: %s", rc ? err : tr_loader_error(l));
    check(rc == 0 && bad && strstr(tr_loader_error(l), "s16.bin: byte ") &&
              strstr(tr_loader_error(l), "outside the model's vocabulary (500)"),
          what);
    if (rc == 0) {
        /* the reported offset is the first bad token of some window: its value is >= 500 */
        long off = atol(strstr(tr_loader_error(l), "byte ") + 5);
        check((off - 1024) / 2 + 7 >= 500 && (off - 1024) % 2 == 0,
              "the byte offset points at a token >= 500");
        tr_loader_free(l);
    }
}

static int cmp_int(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

/* Three shards of distinct token ranges; window = first token. */
static void coverage(int world)
{
    tr_data_desc d = {.tokenizer = TR_TOKENIZER_BYTE};
    path_of(d.shards, sizeof d.shards, "cov_*.bin");
    int B = 3, T = 16;
    tr_loader *l[8];
    char err[256];
    for (int r = 0; r < world; r++) {
        if (tr_loader_open(&l[r], &d, 1 << 30, r, world, B, T, 42, err, sizeof err)) {
            printf("FAIL open: %s\n", err);
            failures++;
            return;
        }
    }
    long E = tr_loader_epoch_windows(l[0], 0, 0), G = (long)B * world;
    long batches = (E + G - 1) / G;
    int *first = malloc((size_t)(batches * G) * sizeof(int));
    int in[48], tg[48], shifted = 1;
    for (long k = 0; k < batches; k++)
        for (int r = 0; r < world; r++) {
            tr_loader_next(l[r], in, tg);
            for (int b = 0; b < B; b++) {
                first[k * G + r * B + b] = in[b * T];
                for (int t = 0; t < T; t++)
                    shifted &= tg[b * T + t] == in[b * T + t] + 1 && in[b * T + t] == in[b * T] + t;
            }
        }
    /* the first E windows of the global stream are this epoch's: distinct, one phase per
     * shard, and as many as the epoch has */
    qsort(first, (size_t)E, sizeof(int), cmp_int);
    int dup = 0, phase_ok = 1;
    long per_shard[3] = {0, 0, 0};
    int phase[3] = {-1, -1, -1};
    for (long i = 0; i < E; i++) {
        dup += i > 0 && first[i] == first[i - 1];
        int s = first[i] / 100000, off = first[i] % 100000;
        if (s > 2)
            continue;
        per_shard[s]++;
        if (phase[s] < 0)
            phase[s] = off % T;
        phase_ok &= off % T == phase[s];
    }
    long sizes[3] = {1000, 777, 2049}, expect = 0;
    for (int s = 0; s < 3; s++)
        expect += phase[s] >= 0 ? (sizes[s] - 1 - phase[s]) / T : 0;
    char what[256];
    snprintf(what, sizeof what,
             "world %d: the ranks' slices of %ld windows are disjoint (%d duplicates), one phase "
             "per shard, cover the epoch once (%ld expected), targets shifted by one",
             world, E, dup, expect);
    check(dup == 0 && phase_ok && expect == E && per_shard[0] + per_shard[1] + per_shard[2] == E &&
              shifted,
          what);
    free(first);
    for (int r = 0; r < world; r++)
        tr_loader_free(l[r]);
}

static void resume(void)
{
    tr_data_desc d = {.tokenizer = TR_TOKENIZER_BYTE};
    path_of(d.shards, sizeof d.shards, "cov_*.bin");
    int B = 2, T = 16, n = B * T;
    tr_loader *a, *b;
    char err[256];
    tr_loader_open(&a, &d, 1 << 30, 0, 1, B, T, 7, err, sizeof err);
    tr_loader_open(&b, &d, 1 << 30, 0, 1, B, T, 7, err, sizeof err);
    int ia[32], ta[32], ib[32], tb[32];
    int same_fresh = 1;
    for (int i = 0; i < 57; i++) { /* mid-epoch (an epoch is about 240 windows) */
        tr_loader_next(a, ia, ta);
        tr_loader_next(b, ib, tb);
        same_fresh &= !memcmp(ia, ib, sizeof ia);
    }
    tr_loader_pos p = tr_loader_get_pos(a);
    int mid = p.src[0].epoch == 0 && p.src[0].shard > 0 && p.batches == 57;
    for (int i = 0; i < 30; i++)
        tr_loader_next(b, ib, tb); /* b wanders off, then comes back */
    tr_loader_set_pos(b, p, err, sizeof err);
    int same = 1;
    for (int i = 0; i < 400; i++) { /* across epoch boundaries */
        tr_loader_next(a, ia, ta);
        tr_loader_next(b, ib, tb);
        same &= !memcmp(ia, ib, n * sizeof(int)) && !memcmp(ta, tb, n * sizeof(int));
    }
    check(same_fresh && mid && same && tr_loader_get_pos(a).src[0].epoch >= 2,
          "resume: a position saved mid-epoch continues with identical batches across epochs");
    tr_loader *c;
    tr_loader_open(&c, &d, 1 << 30, 0, 1, B, T, 8, err, sizeof err);
    tr_loader_next(c, ib, tb);
    tr_loader_pos zero = {.n_sources = 1, .rng = 0, .data = p.data};
    tr_loader_set_pos(a, zero, err, sizeof err);
    tr_loader_next(a, ia, ta);
    check(memcmp(ia, ib, n * sizeof(int)) != 0, "seed: another seed gives another order");
    zero.n_sources = 2;
    check(tr_loader_set_pos(a, zero, err, sizeof err) == -1 && strstr(err, "source"),
          "a position of other data is refused");
    /* the same number of sources, other tokens: refused by the data's fingerprint */
    tr_data_desc d2 = {.tokenizer = TR_TOKENIZER_BYTE};
    path_of(d2.shards, sizeof d2.shards, "s16.bin");
    tr_loader *e;
    int erc = tr_loader_open(&e, &d2, 1 << 30, 0, 1, B, T, 7, err, sizeof err);
    check(erc == 0 && tr_loader_set_pos(e, p, err, sizeof err) == -1 &&
              strstr(err, "differ from those the checkpoint was saved on"),
          "a position saved on other data (same source count) is refused");
    if (!erc) tr_loader_free(e);
    tr_loader_free(a);
    tr_loader_free(b);
    tr_loader_free(c);
}

static void mix(void)
{
    tr_data_desc d = {.tokenizer = TR_TOKENIZER_BYTE, .n_mix = 2};
    path_of(d.mix[0].shards, sizeof d.mix[0].shards, "cov_*.bin");
    path_of(d.mix[1].shards, sizeof d.mix[1].shards, "s32.bin");
    d.mix[0].weight = 0.7f;
    d.mix[1].weight = 0.3f;
    path_of(d.val_shards, sizeof d.val_shards, "s16.bin");
    tr_loader *l, *r1;
    char err[256];
    int rc = tr_loader_open(&l, &d, 1 << 30, 0, 2, 4, 8, 3, err, sizeof err);
    rc |= tr_loader_open(&r1, &d, 1 << 30, 1, 2, 4, 8, 3, err, sizeof err);
    if (rc) {
        printf("FAIL mix open: %s\n", err);
        failures++;
        return;
    }
    long from_b = 0, total = 0;
    int in[32], tg[32];
    for (int i = 0; i < 500; i++) {
        tr_loader_next(l, in, tg);
        for (int b = 0; b < 4; b++, total++)
            from_b += in[b * 8] >= 70000 && in[b * 8] < 71000;
        tr_loader_next(r1, in, tg);
        for (int b = 0; b < 4; b++, total++)
            from_b += in[b * 8] >= 70000 && in[b * 8] < 71000;
    }
    double frac = (double)from_b / (double)total;
    char what[200];
    snprintf(what, sizeof what, "mix 0.7/0.3 over 2 ranks: %.3f of the windows from the 0.3 source",
             frac);
    check(frac > 0.27 && frac < 0.33, what);
    tr_loader_pos p = tr_loader_get_pos(l);
    check(p.n_sources == 2 && p.src[0].offset + p.src[1].offset > 0,
          "mix: the position keeps every source's place and the RNG state");
    int v1 = tr_loader_val_batch(l, 0, in, tg), v0 = in[0];
    int v2 = tr_loader_val_batch(r1, 0, in, tg);
    check(tr_loader_val_batches(l) == (999 / 8) / 8 && v1 == 1 && v2 == 1 && v0 == 7 && in[0] == 7 + 32,
          "validation: shards read in order, ranks take disjoint windows");
    tr_loader_free(l);
    tr_loader_free(r1);
}

static void text_bytes(void)
{
    char p[512], err[512];
    path_of(p, sizeof p, "corpus.txt");
    FILE *f = fopen(p, "wb");
    unsigned s = 12345;
    for (long i = 0; i < 20000; i++) {
        s = s * 1103515245u + 12345u;
        fputc((int)((s >> 16) & 255), f);
    }
    fclose(f);
    tr_data_desc d = {.tokenizer = TR_TOKENIZER_BYTE, .val_fraction = 0.1f};
    snprintf(d.text, sizeof d.text, "%s", p);
    tr_loader *l;
    int rc = tr_loader_open(&l, &d, 256, 0, 1, 2, 16, 1, err, sizeof err);
    int in[32], tg[32];
    check(rc == 0 && tr_loader_train_tokens(l) == 18000 && tr_loader_val_tokens(l) == 2000 &&
              tr_loader_next(l, in, tg) == 0 && tr_loader_val_batch(l, 0, in, tg) == 1,
          "byte-level text: in memory, the tail 10% held out");
    if (rc == 0)
        tr_loader_free(l);
    rc = tr_loader_open(&l, &d, 100, 0, 1, 2, 16, 1, err, sizeof err);
    check(rc == -1 && strstr(err, "vocab 100"), "vocab smaller than the tokenizer's: refused");
    snprintf(d.text, sizeof d.text, "/nonexistent/corpus.txt");
    rc = tr_loader_open(&l, &d, 256, 0, 1, 2, 16, 1, err, sizeof err);
    check(rc == -1 && strstr(err, "/nonexistent/corpus.txt") && strstr(err, "No such file"),
          "missing corpus: names the file");
    path_of(p, sizeof p, "tiny.txt");
    f = fopen(p, "w");
    fputs("too short", f);
    fclose(f);
    snprintf(d.text, sizeof d.text, "%s", p);
    rc = tr_loader_open(&l, &d, 256, 0, 1, 2, 16, 1, err, sizeof err);
    check(rc == -1 && strstr(err, "tiny.txt") && strstr(err, "tokens"),
          "tiny corpus: says how much is needed");
}

static long read_all(const char *pattern_dir, const char *prefix, int **ids)
{
    long n = 0;
    *ids = NULL;
    for (int k = 0;; k++) {
        char p[600], err[256];
        snprintf(p, sizeof p, "%s/%s_%06d.bin", pattern_dir, prefix, k);
        tr_shard s;
        if (tr_shard_open(&s, p, err, sizeof err))
            break;
        *ids = realloc(*ids, (size_t)(n + s.n) * sizeof(int));
        for (long i = 0; i < s.n; i++)
            (*ids)[n + i] = (int)tr_shard_token(s.tokens, s.width, i);
        n += s.n;
        tr_shard_close(&s);
    }
    return n;
}

static void corpus(void)
{
    char err[512], in1[512], in2[512], out1[512], out2[512];
    tr_tokenizer *t;
    if (tr_tokenizer_open(&t, TR_TOKENIZER_GPT2, "../data/gpt2/encoder.json",
                          "../data/gpt2/vocab.bpe", err, sizeof err)) {
        printf("FAIL %s\n", err);
        failures++;
        return;
    }
    /* a 3 MB document (several chunks) and a JSONL file of two documents */
    path_of(in1, sizeof in1, "docs");
    mkdir(in1, 0755);
    path_of(in1, sizeof in1, "docs/a.txt");
    FILE *f = fopen(in1, "wb");
    FILE *sh = fopen("../data/corpora/tinyshakespeare.txt", "rb");
    char buf[65536];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, sh)) > 0)
        fwrite(buf, 1, n, f);
    fclose(sh);
    fclose(f);
    path_of(in2, sizeof in2, "docs/b.jsonl");
    f = fopen(in2, "wb");
    fputs("{\"id\": 1, \"text\": \"Hello world\\n\\u00e9t\\u00e9 \\ud83d\\ude00\"}\n\n"
          "{\"meta\": {\"x\": [1, 2.5e3, null]}, \"text\": \"second doc\"}\n", f);
    fclose(f);
    path_of(in1, sizeof in1, "docs");
    path_of(out1, sizeof out1, "tok1");
    path_of(out2, sizeof out2, "tok2");
    const char *inputs[1] = {in1};
    tr_corpus_opts o = {.inputs = inputs, .n_inputs = 1, .out_dir = out1, .tok = t,
                        .val_fraction = 0.1, .shard_tokens = 100000, .threads = 1};
    tr_corpus_stats st1, st2;
    int rc = tr_corpus_tokenize(&o, &st1, err, sizeof err);
    o.out_dir = out2;
    o.threads = 2;
    rc |= tr_corpus_tokenize(&o, &st2, err, sizeof err);
    if (rc)
        printf("     %s\n", err);
    int *a, *b, *va, *vb;
    long na = read_all(out1, "train", &a), nb = read_all(out2, "train", &b);
    long nva = read_all(out1, "val", &va), nvb = read_all(out2, "val", &vb);
    check(rc == 0 && na == nb && nva == nvb && na > 0 && nva > 0 &&
              !memcmp(a, b, (size_t)na * sizeof(int)) && !memcmp(va, vb, (size_t)nva * sizeof(int)) &&
              st1.train_shards == 4 && st1.val_shards == 1,
          "tokenize: 1 and 2 threads write the same shards (train split into 100k-token shards)");
    /* train + val decode to <eot> shakespeare <eot> jsonl-doc-1 <eot> jsonl-doc-2 */
    size_t cap = 2000000, len = 0;
    char *text = malloc(cap);
    for (long i = 0; i < na + nva; i++) {
        size_t l;
        const char *tk = tr_tokenizer_token(t, i < na ? a[i] : va[i - na], &l);
        memcpy(text + len, tk, l);
        len += l;
    }
    const char *tail = "<|endoftext|>Hello world\n\xc3\xa9t\xc3\xa9 \xf0\x9f\x98\x80"
                       "<|endoftext|>second doc";
    check(len == 13 + 1115394 + strlen(tail) && !memcmp(text, "<|endoftext|>First Citizen", 26) &&
              !memcmp(text + len - strlen(tail), tail, strlen(tail)) && a[0] == 50256,
          "tokenize: shards decode to the documents, each after <|endoftext|> (JSONL escapes "
          "and surrogate pairs decoded)");
    free(text);
    free(a);
    free(b);
    free(va);
    free(vb);
    /* bad JSONL: names the file and the byte offset */
    path_of(in2, sizeof in2, "bad.jsonl");
    f = fopen(in2, "wb");
    fputs("{\"text\": \"ok\"}\n{\"text\": \"unterminated}\n", f);
    fclose(f);
    inputs[0] = in2;
    o.val_fraction = 0;
    rc = tr_corpus_tokenize(&o, &st1, err, sizeof err);
    char what[700];
    snprintf(what, sizeof what, "bad JSONL refused: %s", err);
    check(rc == -1 && strstr(err, "bad.jsonl: byte 38: unterminated string"), what);
    f = fopen(in2, "wb");
    fputs("{\"body\": \"no text field\"}\n", f);
    fclose(f);
    rc = tr_corpus_tokenize(&o, &st1, err, sizeof err);
    snprintf(what, sizeof what, "JSONL without the field refused: %s", err);
    check(rc == -1 && strstr(err, "bad.jsonl: byte 0: no string field 'text'"), what);
    char none[512];
    path_of(none, sizeof none, "no_such_input.txt");
    inputs[0] = none;
    rc = tr_corpus_tokenize(&o, &st1, err, sizeof err);
    check(rc == -1 && strstr(err, "no_such_input.txt: cannot read"), "missing input: named");
    tr_tokenizer_free(t);

    /* a gpt2 text recipe: cached shards, made once */
    tr_data_desc d = {.tokenizer = TR_TOKENIZER_GPT2, .val_fraction = 0.1f};
    path_of(d.text, sizeof d.text, "docs/a.txt");
    snprintf(d.encoder, sizeof d.encoder, "../data/gpt2/encoder.json");
    snprintf(d.merges, sizeof d.merges, "../data/gpt2/vocab.bpe");
    char cdir[1200];
    int made1 = 0, made2 = 1;
    rc = tr_corpus_cache(&d, cdir, sizeof cdir, &made1, NULL, NULL, err, sizeof err);
    rc |= tr_corpus_cache(&d, cdir, sizeof cdir, &made2, NULL, NULL, err, sizeof err);
    tr_loader *l;
    rc |= tr_loader_open(&l, &d, 50304, 0, 1, 4, 64, 1, err, sizeof err);
    int in[256], tg[256];
    check(rc == 0 && made1 == 1 && made2 == 0 && strstr(cdir, "docs/cache/a.txt.gpt2") &&
              tr_loader_train_tokens(l) + tr_loader_val_tokens(l) == 338025 + 1 &&
              tr_loader_next(l, in, tg) == 0,
          "gpt2 text: tokenized into cache/a.txt.gpt2/ on first use only, then loaded");
    if (rc == 0)
        tr_loader_free(l);
    else
        printf("     %s\n", err);
}

int main(void)
{
    snprintf(dir, sizeof dir, "/tmp/tr_test_data_%d", (int)getpid());
    mkdir(dir, 0755);
    shards();
    bad_shards();
    write_shard("cov_0.bin", 1000, 0, 4);
    write_shard("cov_1.bin", 777, 100000, 4);
    write_shard("cov_2.bin", 2049, 200000, 4);
    for (int w = 1; w <= 4; w++)
        coverage(w);
    resume();
    mix();
    text_bytes();
    corpus();
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0)
        printf("     (could not remove %s)\n", dir);
    printf("%s: %d failure(s)\n", failures ? "FAIL" : "PASS", failures);
    return failures ? 1 : 0;
}
