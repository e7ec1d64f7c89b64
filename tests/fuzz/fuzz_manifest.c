/* Fuzz target: reading a checkpoint (trainer/checkpoint/checkpoint.h: tr_ckpt_read, eager and
 * lazy, then
 * tr_ckpt_materialize), which parses manifest.yaml and maps the rank files it lists. The input
 * is up to three parts separated by FZ_SEP lines: the manifest, rank_00000.safetensors and
 * rank_00001.safetensors. The manifest's last line is a CRC32C of the rest, which a fuzzer
 * cannot forge: unless the input ends with such a line, the target appends the right one, so
 * mutations reach the YAML and what is read from it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "trainer/checkpoint/checkpoint.h"

static int has_crc_line(const uint8_t *m, size_t n) {
    const char *tag = "# crc32c: ";
    size_t tl = strlen(tag);
    return n >= tl + 9 && m[n - 1] == '\n' && (n == tl + 9 || m[n - tl - 10] == '\n') &&
           !memcmp(m + n - tl - 9, tag, tl);
}

static void read_dir(const char *dir, int lazy, int with_optimizer) {
    tr_ckpt c;
    char err[2048];
    int rc = lazy ? tr_ckpt_read_lazy(&c, dir, with_optimizer, err, sizeof err)
                  : tr_ckpt_read(&c, dir, with_optimizer, err, sizeof err);
    if (rc) {
        fz_note("checkpoint", err);
        return;
    }
    if (tr_ckpt_materialize(&c, err, sizeof err)) fz_note("materialize", err);
    tr_ckpt_free(&c);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const uint8_t *part[3];
    size_t len[3];
    int n = fz_split(data, size, part, len, 3);
    char path[512];
    const char *ranks[2] = {"rank_00000.safetensors", "rank_00001.safetensors"};
    for (int r = 0; r < 2; r++) {
        if (r + 1 < n)
            fz_write(ranks[r], part[r + 1], len[r + 1], path, sizeof path);
        else
            fz_remove(ranks[r]);
    }
    if (has_crc_line(part[0], len[0])) {
        fz_write("manifest.yaml", part[0], len[0], path, sizeof path);
    } else {
        char line[32];
        int k = snprintf(line, sizeof line, "# crc32c: %08x\n", tr_crc32c(0, part[0], len[0]));
        uint8_t *m = malloc(len[0] + (size_t)k);
        if (!m) return 0;
        memcpy(m, part[0], len[0]);
        memcpy(m + len[0], line, (size_t)k);
        fz_write("manifest.yaml", m, len[0] + (size_t)k, path, sizeof path);
        free(m);
    }
    read_dir(fz_dir(), 0, 1);
    read_dir(fz_dir(), 1, 0);
    return 0;
}
