/* Fuzz target: llm.c token shards (data/shard.h). The input is the shard file; when it opens,
 * every token is read (the size was checked against the header's count). */
#include "data/shard.h"
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[512], err[1200];
    fz_write("shard.bin", data, size, path, sizeof path);
    tr_shard s;
    if (tr_shard_open(&s, path, err, sizeof err)) {
        fz_note("shard", err);
        return 0;
    }
    unsigned sum = 0;
    for (long i = 0; i < s.n; i++)
        sum += tr_shard_token(s.tokens, s.width, i);
    tr_shard_close(&s);
    return (int)(sum & 0); /* the reads are the test */
}
