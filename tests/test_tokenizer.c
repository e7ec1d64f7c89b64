/* Tokenizers: GPT-2 BPE against fixed ids from an independent reference (tests/data/
 * make_bpe_fixtures.py: the published algorithm with python3-regex), including invalid UTF-8
 * and the whole shipped corpus; exact round trips; bad vocabulary files give one line naming
 * the file and offset. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/tokenizer.h"
#include "parallel/comm/base.h"

static int failures;

static void check(int ok, const char *what)
{
    if (!ok)
        failures++;
    printf("%s %s\n", ok ? "ok  " : "FAIL", what);
}

static char *slurp(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    char *buf;
    int rc = tr_read_all(f, SIZE_MAX, &buf, n);
    fclose(f);
    return rc ? NULL : buf;
}

static int round_trip(const tr_tokenizer *t, const char *s, size_t n, const int *ids, size_t k)
{
    size_t o = 0;
    for (size_t i = 0; i < k; i++) {
        size_t len;
        const char *b = tr_tokenizer_token(t, ids[i], &len);
        if (!b || o + len > n || memcmp(s + o, b, len) != 0)
            return 0;
        o += len;
    }
    return o == n;
}

static void fixtures(const tr_tokenizer *t)
{
    size_t n;
    char *text = slurp("data/bpe_fixtures.txt", &n);
    check(text != NULL, "fixtures: tests/data/bpe_fixtures.txt read");
    if (!text)
        return;
    int cases = 0, wrong = 0, trips = 0;
    char *save = NULL;
    for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        char *tab = strchr(line, '\t');
        if (!tab)
            continue;
        *tab = 0;
        if (strcmp(line, "shakespeare") == 0) {
            long count = strtol(tab + 1, &tab, 10);
            unsigned long long want = strtoull(tab + 1, NULL, 16);
            size_t len = 0;
            char *corpus = slurp("../data/corpora/tinyshakespeare.txt", &len);
            int *ids = malloc((len + 1) * sizeof(int));
            size_t k = tr_tokenizer_encode(t, corpus, len, ids);
            uint64_t h = 0xcbf29ce484222325ULL;
            for (size_t i = 0; i < k; i++)
                for (int b = 0; b < 4; b++)
                    h = (h ^ (((uint32_t)ids[i] >> (8 * b)) & 255)) * 0x100000001b3ULL;
            char what[160];
            snprintf(what, sizeof what, "Tiny Shakespeare: %zu tokens (reference %ld), same ids "
                     "(hash %016llx), decodes exactly", k, count, (unsigned long long)h);
            check((long)k == count && h == want && round_trip(t, corpus, len, ids, k), what);
            free(ids);
            free(corpus);
            continue;
        }
        size_t hl = strlen(line), bl = hl / 2;
        char *bytes = malloc(bl + 1);
        for (size_t i = 0; i < bl; i++) {
            unsigned v;
            sscanf(line + 2 * i, "%2x", &v);
            bytes[i] = (char)v;
        }
        int want[4096], nw = 0;
        for (char *p = tab + 1; *p;) {
            char *e;
            long v = strtol(p, &e, 10);
            if (e == p)
                break;
            want[nw++] = (int)v;
            p = e;
        }
        int got[4096];
        size_t k = tr_tokenizer_encode(t, bytes, bl, got);
        cases++;
        if ((int)k != nw || memcmp(got, want, k * sizeof(int)) != 0) {
            wrong++;
            if (wrong < 5)
                printf("     mismatch on input %s\n", line);
        }
        trips += round_trip(t, bytes, bl, got, k);
        free(bytes);
    }
    char what[160];
    snprintf(what, sizeof what, "%d tricky strings (unicode, emoji, spaces, contractions, invalid "
             "UTF-8): %d differ from the reference", cases, wrong);
    check(cases > 300 && wrong == 0, what);
    snprintf(what, sizeof what, "%d of %d decode back to the exact input bytes", trips, cases);
    check(trips == cases, what);
    free(text);
}

static void long_pieces(const tr_tokenizer *t)
{
    /* one piece of 200k spaces and one of 200k 'x': must be fast (O(n log n)) and exact */
    size_t n = 200000;
    char *s = malloc(n);
    int *ids = malloc(n * sizeof(int));
    memset(s, ' ', n);
    size_t k = tr_tokenizer_encode(t, s, n, ids);
    /* GPT-2 has no merge of two spaces; 'xxxxxxxx' is one token (tiktoken agrees) */
    int ok = round_trip(t, s, n, ids, k) && k == n;
    memset(s, 'x', n);
    k = tr_tokenizer_encode(t, s, n, ids);
    ok &= round_trip(t, s, n, ids, k) && k == n / 8;
    check(ok, "200,000-byte pieces encode and round-trip");
    free(s);
    free(ids);
}

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "wb");
    fputs(text, f);
    fclose(f);
}

static void bad_files(void)
{
    struct {
        const char *encoder, *merges, *want;
    } cases[] = {
        {"{\"a\": 0, \"b\" 1}", "#version: 0.2\n", "byte 13: expected ':'"},
        {"{\"a\": 0,", "#version: 0.2\n", "byte 8: expected '\"', got the end of the text"},
        {"", "#version: 0.2\n", "expected '{', got the end of the text"},
        {"{\"\\ud800x\": 0}", "", "byte 2: high surrogate not followed by a low one"},
        {"{\"a\": 1.5}", "", "byte 6: expected an integer"},
        {"{\"a\": 0, \"a\": 0}", "", "token id 0 appears twice"},
        {NULL, "bad line here\n", "tr_bad_merges.bpe:1: expected two tokens"},
    };
    const char *enc = "/tmp/tr_bad_encoder.json", *mer = "/tmp/tr_bad_merges.bpe";
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        if (cases[i].encoder) {
            write_file(enc, cases[i].encoder);
            write_file(mer, cases[i].merges);
        } else {
            write_file(mer, cases[i].merges);
            enc = "../data/gpt2/encoder.json";
        }
        tr_tokenizer *t = NULL;
        char err[512] = "", what[700];
        int rc = tr_tokenizer_open(&t, TR_TOKENIZER_GPT2, enc, mer, err, sizeof err);
        snprintf(what, sizeof what, "bad vocabulary file %zu refused: %s", i, err);
        check(rc == -1 && !t && strstr(err, cases[i].want) && !strchr(err, '\n'), what);
    }
    tr_tokenizer *t = NULL;
    char err[512];
    int rc = tr_tokenizer_open(&t, TR_TOKENIZER_GPT2, "/nonexistent/encoder.json",
                               "../data/gpt2/vocab.bpe", err, sizeof err);
    check(rc == -1 && strstr(err, "/nonexistent/encoder.json"), "missing encoder.json: named");
}

int main(void)
{
    tr_tokenizer *t;
    char err[512];
    if (tr_tokenizer_open(&t, TR_TOKENIZER_GPT2, "../data/gpt2/encoder.json",
                          "../data/gpt2/vocab.bpe", err, sizeof err)) {
        printf("FAIL open gpt2: %s\n", err);
        return 1;
    }
    check(tr_tokenizer_vocab(t) == 50257 && tr_tokenizer_eot(t) == 50256,
          "gpt2: vocabulary 50257, <|endoftext|> = 50256");
    size_t len;
    const char *eot = tr_tokenizer_token(t, 50256, &len);
    check(eot && len == 13 && !memcmp(eot, "<|endoftext|>", 13), "gpt2: 50256 decodes to <|endoftext|>");
    fixtures(t);
    long_pieces(t);
    tr_tokenizer_free(t);

    tr_tokenizer *b;
    tr_tokenizer_open(&b, TR_TOKENIZER_BYTE, NULL, NULL, err, sizeof err);
    const char s[] = "caf\xc3\xa9 \xff\xfe\n\t";
    int ids[32];
    size_t n = tr_tokenizer_encode(b, s, sizeof s - 1, ids);
    check(n == sizeof s - 1 && ids[3] == 0xc3 && ids[6] == 0xff && round_trip(b, s, n, ids, n),
          "byte tokenizer round-trips any bytes");
    tr_tokenizer_free(b);
    bad_files();
    printf("%s: %d failure(s)\n", failures ? "FAIL" : "PASS", failures);
    return failures ? 1 : 0;
}
