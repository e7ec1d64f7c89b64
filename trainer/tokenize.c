/* `trainer tokenize INPUT... --out DIR`: text files, folders of them and JSONL to token shards,
 * with every core, a progress line (MB/s, ETA) and a validation split. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "data/corpus.h"
#include "data/tokenizer.h"
#include "trainer/trainer.h"

#ifndef TR_DATA_DIR
#define TR_DATA_DIR "data"
#endif

static const char *help =
    "usage: trainer tokenize INPUT... --out DIR [--tokenizer gpt2|byte] [--val-fraction F]\n"
    "                        [--shard-tokens N] [--field NAME] [--threads N]\n"
    "                        [--encoder FILE] [--merges FILE]\n"
    "\n"
    "Tokenize text into token shards that `data { shards = ... }` trains on (llm.c's format:\n"
    "a 1024-byte header, then uint16 tokens, or uint32 for vocabularies over 65,535).\n"
    "INPUT is a text file (one document), a .jsonl file (one document per line, in a string\n"
    "field) or a folder (every file in it, recursively, in name order). GPT-2 puts\n"
    "<|endoftext|> before every document.\n"
    "\n"
    "  --out DIR          output folder: DIR/train_000000.bin ..., DIR/val_000000.bin ...\n"
    "                     (shards already there are replaced)\n"
    "  --tokenizer NAME   gpt2 (default) or byte\n"
    "  --val-fraction F   the tail F of the input (by bytes) becomes the validation shards\n"
    "                     (default 0.01; 0 = none), cut at the first document boundary or\n"
    "                     safe point after it, or before it when the last document has none\n"
    "  --shard-tokens N   tokens per shard (default 100000000)\n"
    "  --field NAME       the JSONL field with the text (default text)\n"
    "  --threads N        worker threads (default: every core)\n"
    "  --encoder FILE     GPT-2 encoder.json (default: the project's data/gpt2/encoder.json)\n"
    "  --merges FILE      GPT-2 vocab.bpe (default: the project's data/gpt2/vocab.bpe)\n";

static void progress(void *ctx, const tr_corpus_stats *st)
{
    int tty = *(int *)ctx;
    double mb = st->bytes_done / 1e6, rate = st->seconds > 0 ? mb / st->seconds : 0;
    double left = rate > 0 ? (st->bytes_total - st->bytes_done) / 1e6 / rate : 0;
    char eta[32], tk[32];
    tr_fmt_seconds(left, eta, sizeof eta);
    tr_fmt_count((double)(st->train_tokens + st->val_tokens), tk, sizeof tk);
    fprintf(stderr, "%stokenize: %.1f / %.1f MB | %.1f MB/s | %s tokens | ETA %s%s",
            tty ? "\r\033[K" : "", mb, st->bytes_total / 1e6, rate, tk, eta, tty ? "" : "\n");
    fflush(stderr);
}

static int bad_number(const char *flag, const char *v)
{
    fprintf(stderr, "trainer tokenize: %s needs a number, got '%s'\n", flag, v);
    return 2;
}

int tr_cmd_tokenize(int argc, char **argv)
{
    const char **inputs = calloc((size_t)argc, sizeof *inputs);
    int n_inputs = 0, threads = 0, rc = 2;
    const char *out = NULL, *field = NULL, *encoder = TR_DATA_DIR "/gpt2/encoder.json";
    const char *merges = TR_DATA_DIR "/gpt2/vocab.bpe";
    tr_tokenizer_kind kind = TR_TOKENIZER_GPT2;
    double val = 0.01;
    long shard_tokens = 100000000L;
    tr_tokenizer *tok = NULL;
    if (!inputs)
        return 1;
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        int has_value = i + 1 < argc;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(help, stdout);
            rc = 0;
            goto done;
        }
        if (a[0] == '-' && a[1] == '-' && !has_value) {
            fprintf(stderr, "trainer tokenize: %s needs a value (see trainer tokenize --help)\n",
                    a);
            goto done;
        }
        char *end;
        if (!strcmp(a, "--out")) {
            out = argv[++i];
        } else if (!strcmp(a, "--tokenizer")) {
            const char *v = argv[++i];
            if (!strcmp(v, "gpt2"))
                kind = TR_TOKENIZER_GPT2;
            else if (!strcmp(v, "byte"))
                kind = TR_TOKENIZER_BYTE;
            else {
                fprintf(stderr, "trainer tokenize: --tokenizer must be gpt2 or byte, got '%s'\n",
                        v);
                goto done;
            }
        } else if (!strcmp(a, "--val-fraction")) {
            val = strtod(argv[++i], &end);
            if (*end || !(val >= 0 && val <= 0.5)) {
                fprintf(stderr, "trainer tokenize: --val-fraction must be in [0, 0.5], got '%s'\n",
                        argv[i]);
                goto done;
            }
        } else if (!strcmp(a, "--shard-tokens")) {
            shard_tokens = strtol(argv[++i], &end, 10);
            if (*end || shard_tokens < 1 || shard_tokens > 0x7fffffffL) {
                rc = bad_number(a, argv[i]);
                goto done;
            }
        } else if (!strcmp(a, "--threads")) {
            threads = (int)strtol(argv[++i], &end, 10);
            if (*end || threads < 1 || threads > 4096) {
                rc = bad_number(a, argv[i]);
                goto done;
            }
        } else if (!strcmp(a, "--field")) {
            field = argv[++i];
        } else if (!strcmp(a, "--encoder")) {
            encoder = argv[++i];
        } else if (!strcmp(a, "--merges")) {
            merges = argv[++i];
        } else if (a[0] == '-' && a[1] != '\0') {
            fprintf(stderr, "trainer tokenize: unknown option '%s' (see trainer tokenize --help)\n",
                    a);
            goto done;
        } else {
            inputs[n_inputs++] = a;
        }
    }
    if (!n_inputs || !out) {
        fprintf(stderr, "trainer tokenize: %s (see trainer tokenize --help)\n",
                !n_inputs ? "no input given" : "--out DIR is required");
        goto done;
    }
    rc = 1;
    char err[1024];
    if (tr_tokenizer_open(&tok, kind, encoder, merges, err, sizeof err)) {
        fprintf(stderr, "trainer tokenize: %s\n", err);
        goto done;
    }
    int tty = isatty(STDERR_FILENO);
    tr_corpus_opts o = {.inputs = inputs, .n_inputs = n_inputs, .out_dir = out, .tok = tok,
                        .val_fraction = val, .shard_tokens = shard_tokens, .field = field,
                        .threads = threads, .progress = progress, .progress_ctx = &tty};
    tr_corpus_stats st;
    if (tr_corpus_tokenize(&o, &st, err, sizeof err)) {
        if (tty)
            fputs("\r\033[K", stderr);
        fprintf(stderr, "trainer tokenize: %s\n", err);
        goto done;
    }
    if (tty)
        fputs("\n", stderr);
    long nthreads = threads > 0 ? threads : sysconf(_SC_NPROCESSORS_ONLN);
    char tail[64] = "";
    if (val > 0) /* where the cut fell: a document boundary may move it from the fraction asked */
        snprintf(tail, sizeof tail, " (the last %.2f%% of the input)",
                 100.0 * st.val_bytes / st.bytes_total);
    printf("tokenized %.1f MB in %.2f s (%.1f MB/s on %ld thread(s)) with %s: %ld train tokens in "
           "%d shard(s), %ld validation tokens in %d shard(s)%s, in %s/\n",
           st.bytes_total / 1e6, st.seconds, st.bytes_total / 1e6 / (st.seconds > 0 ? st.seconds : 1e-9),
           nthreads, tr_tokenizer_name(tok), st.train_tokens, st.train_shards, st.val_tokens,
           st.val_shards, tail, out);
    rc = 0;
done:
    tr_tokenizer_free(tok);
    free(inputs);
    return rc;
}
