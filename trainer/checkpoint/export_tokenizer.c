/* The tokenizer of an exported Hugging Face folder, written beside config.json and
 * model.safetensors so that transformers.AutoTokenizer.from_pretrained(DIR) encodes a text to
 * the ids trainer's tokenizer gives:
 *   gpt2  vocab.json and merges.txt (the encoder.json and vocab.bpe the run used, copied: they
 *         are those files under Hugging Face's names), tokenizer_config.json (GPT2Tokenizer,
 *         no prefix space, no BOS added) and special_tokens_map.json (<|endoftext|>);
 *   byte  tokenizer.json: a byte-level BPE whose vocabulary is the 256 byte symbols of GPT-2's
 *         byte-to-unicode table, id = the byte, with no merges, and tokenizer_config.json
 *         (PreTrainedTokenizerFast). No special tokens: trainer's byte tokenizer has none. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "parallel/comm/base.h"
#include "trainer/checkpoint/checkpoint.h"

static FILE *open_out(const char *dir, const char *name, char *path, size_t cap) {
    snprintf(path, cap, "%s/%s", dir, name);
    return fopen(path, "wb");
}

static int close_out(FILE *f, const char *path, char *err, size_t errlen) {
    int bad = ferror(f);
    if (fclose(f) || bad)
        return tr_errf(err, errlen, "cannot write '%s': %s", path, strerror(errno));
    return 0;
}

/* Write `text` into DIR/name. */
static int write_text(const char *dir, const char *name, const char *text, char *err,
                      size_t errlen) {
    char path[TR_PATH_MAX + 64];
    FILE *f = open_out(dir, name, path, sizeof(path));
    if (!f) return tr_errf(err, errlen, "cannot write '%s': %s", path, strerror(errno));
    fputs(text, f);
    return close_out(f, path, err, errlen);
}

/* Copy the file src to DIR/name. */
static int copy_file(const char *src, const char *dir, const char *name, char *err, size_t errlen) {
    char path[TR_PATH_MAX + 64], buf[1 << 16];
    FILE *in = fopen(src, "rb");
    if (!in)
        return tr_errf(err, errlen, "cannot read '%s' (the checkpoint's tokenizer): %s", src,
                       strerror(errno));
    FILE *out = open_out(dir, name, path, sizeof(path));
    if (!out) {
        fclose(in);
        return tr_errf(err, errlen, "cannot write '%s': %s", path, strerror(errno));
    }
    size_t n;
    while ((n = fread(buf, 1, sizeof(buf), in)) > 0)
        if (fwrite(buf, 1, n, out) != n) break;
    int bad_in = ferror(in);
    fclose(in);
    if (bad_in) {
        fclose(out);
        return tr_errf(err, errlen, "cannot read '%s': %s", src, strerror(errno));
    }
    return close_out(out, path, err, errlen);
}

/* GPT-2's bytes_to_unicode: the printable Latin-1 bytes stand for themselves, the others for
 * the code points from 256 up, in byte order. */
static unsigned byte_symbol(int b) {
    int printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    if (printable) return (unsigned)b;
    unsigned n = 0;
    for (int k = 0; k < b; k++)
        if (!((k >= '!' && k <= '~') || (k >= 0xA1 && k <= 0xAC) || (k >= 0xAE && k <= 0xFF))) n++;
    return 256 + n;
}

/* A code point below 0x800 as a JSON string's UTF-8 (the symbols are all below 0x144). */
static void put_symbol(FILE *f, unsigned cp) {
    if (cp == '"' || cp == '\\')
        fprintf(f, "\\%c", (char)cp);
    else if (cp < 0x80)
        fputc((int)cp, f);
    else
        fprintf(f, "%c%c", (char)(0xC0 | (cp >> 6)), (char)(0x80 | (cp & 0x3F)));
}

static int write_byte_tokenizer(const char *dir, char *err, size_t errlen) {
    char path[TR_PATH_MAX + 64];
    FILE *f = open_out(dir, "tokenizer.json", path, sizeof(path));
    if (!f) return tr_errf(err, errlen, "cannot write '%s': %s", path, strerror(errno));
    const char *bl = "{\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"trim_offsets\": "
                     "false, \"use_regex\": false}";
    fprintf(f,
            "{\n  \"version\": \"1.0\",\n  \"truncation\": null,\n  \"padding\": null,\n"
            "  \"added_tokens\": [],\n  \"normalizer\": null,\n  \"pre_tokenizer\": %s,\n"
            "  \"post_processor\": null,\n  \"decoder\": %s,\n"
            "  \"model\": {\"type\": \"BPE\", \"dropout\": null, \"unk_token\": null,\n"
            "    \"continuing_subword_prefix\": null, \"end_of_word_suffix\": null,\n"
            "    \"fuse_unk\": false, \"byte_fallback\": false, \"ignore_merges\": false,\n"
            "    \"vocab\": {",
            bl, bl);
    for (int b = 0; b < 256; b++) {
        fputs(b ? ", \"" : "\"", f);
        put_symbol(f, byte_symbol(b));
        fprintf(f, "\": %d", b);
    }
    fputs("},\n    \"merges\": []}\n}\n", f);
    return close_out(f, path, err, errlen);
}

int tr_hf_export_tokenizer(const tr_data_desc *d, int seq_len, const char *out_dir,
                           const char **names, char *err, size_t errlen) {
    char config[512];
    if (d->tokenizer == TR_TOKENIZER_GPT2) {
        const char *eot = "\"<|endoftext|>\"";
        snprintf(config, sizeof(config),
                 "{\n  \"tokenizer_class\": \"GPT2Tokenizer\",\n  \"model_max_length\": %d,\n"
                 "  \"bos_token\": %s,\n  \"eos_token\": %s,\n  \"unk_token\": %s,\n"
                 "  \"add_prefix_space\": false,\n  \"add_bos_token\": false\n}\n",
                 seq_len, eot, eot, eot);
        *names = "vocab.json, merges.txt, tokenizer_config.json, special_tokens_map.json";
        if (copy_file(d->encoder, out_dir, "vocab.json", err, errlen) ||
            copy_file(d->merges, out_dir, "merges.txt", err, errlen) ||
            write_text(out_dir, "tokenizer_config.json", config, err, errlen))
            return -1;
        return write_text(out_dir, "special_tokens_map.json",
                          "{\"bos_token\": \"<|endoftext|>\", \"eos_token\": \"<|endoftext|>\", "
                          "\"unk_token\": \"<|endoftext|>\"}\n",
                          err, errlen);
    }
    snprintf(config, sizeof(config),
             "{\n  \"tokenizer_class\": \"PreTrainedTokenizerFast\",\n"
             "  \"model_max_length\": %d\n}\n",
             seq_len);
    *names = "tokenizer.json, tokenizer_config.json";
    if (write_byte_tokenizer(out_dir, err, errlen)) return -1;
    return write_text(out_dir, "tokenizer_config.json", config, err, errlen);
}
