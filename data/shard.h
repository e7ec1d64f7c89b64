/* Token shards, compatible with llm.c's: a 1024-byte header of 256 int32 (magic, version,
 * token count, the rest zero), then the tokens as little-endian uint16 (magic 20240520,
 * version 1) or, for vocabularies over 65,535, uint32 (magic 20240801, version 7). Shards are
 * memory-mapped for reading and written atomically (a temporary file renamed when complete). */
#ifndef TR_SHARD_H
#define TR_SHARD_H

#include <stddef.h>

#define TR_SHARD_HEADER_BYTES 1024
#define TR_SHARD_MAGIC_U16 20240520
#define TR_SHARD_VERSION_U16 1
#define TR_SHARD_MAGIC_U32 20240801
#define TR_SHARD_VERSION_U32 7

typedef struct {
    char path[1024];
    const unsigned char *map; /* the whole file, read-only */
    size_t map_len;
    const void *tokens; /* map + TR_SHARD_HEADER_BYTES */
    long n;             /* tokens */
    int width;          /* bytes per token: 2 or 4 */
} tr_shard;

/* Map and check a shard: magic and version, and a size that matches the token count. Errors
 * name the file and the byte offset. */
int tr_shard_open(tr_shard *s, const char *path, char *err, size_t errlen);
void tr_shard_close(tr_shard *s);

/* Token i of a mapped shard or of any array of `width`-byte tokens. */
unsigned tr_shard_token(const void *tokens, int width, long i);

/* Width a vocabulary needs: 2 bytes up to 65,536 ids, else 4. */
int tr_shard_width_for_vocab(int vocab);

typedef struct tr_shard_writer tr_shard_writer;

/* Write a shard to path + ".tmp"; tr_shard_writer_close fills in the header, syncs and
 * renames it to path, so path never holds a partial shard. */
int tr_shard_writer_open(tr_shard_writer **w, const char *path, int width, char *err,
                         size_t errlen);
int tr_shard_writer_write(tr_shard_writer *w, const int *ids, size_t n, char *err, size_t errlen);
long tr_shard_writer_count(const tr_shard_writer *w);
int tr_shard_writer_close(tr_shard_writer *w, char *err, size_t errlen);
/* Drop an unfinished shard (removes the temporary file). NULL is a no-op. */
void tr_shard_writer_abort(tr_shard_writer *w);

#endif
