/* llm.c-compatible token shards: mapping and checking them, and writing them atomically. */
#include "data/shard.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static int32_t get_i32(const unsigned char *p)
{
    return (int32_t)((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                     (uint32_t)p[3] << 24);
}

unsigned tr_shard_token(const void *tokens, int width, long i)
{
    const unsigned char *p = (const unsigned char *)tokens + (size_t)i * (size_t)width;
    if (width == 2)
        return (unsigned)p[0] | (unsigned)p[1] << 8;
    return (unsigned)p[0] | (unsigned)p[1] << 8 | (unsigned)p[2] << 16 | (unsigned)p[3] << 24;
}

int tr_shard_width_for_vocab(int vocab)
{
    return vocab <= 65536 ? 2 : 4;
}

int tr_shard_open(tr_shard *s, const char *path, char *err, size_t errlen)
{
    memset(s, 0, sizeof *s);
    snprintf(s->path, sizeof s->path, "%s", path);
    int fd = open(path, O_RDONLY | O_NONBLOCK); /* a FIFO must not block: refused below */
    if (fd < 0) {
        snprintf(err, errlen, "%s: cannot open shard: %s", path, strerror(errno));
        return -1;
    }
    struct stat st;
    if (fstat(fd, &st) || !S_ISREG(st.st_mode)) {
        snprintf(err, errlen, "%s: not a regular file", path);
        close(fd);
        return -1;
    }
    size_t size = (size_t)st.st_size;
    if (size == 0) {
        snprintf(err, errlen, "%s: empty file (a shard starts with a %d-byte header)", path,
                 TR_SHARD_HEADER_BYTES);
        close(fd);
        return -1;
    }
    if (size < TR_SHARD_HEADER_BYTES) {
        snprintf(err, errlen, "%s: truncated header: the file has %zu bytes, a shard header has %d",
                 path, size, TR_SHARD_HEADER_BYTES);
        close(fd);
        return -1;
    }
    void *map = mmap(NULL, size, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (map == MAP_FAILED) {
        snprintf(err, errlen, "%s: cannot map: %s", path, strerror(errno));
        return -1;
    }
    const unsigned char *h = map;
    int32_t magic = get_i32(h), version = get_i32(h + 4), count = get_i32(h + 8);
    int width = 0;
    if (magic == TR_SHARD_MAGIC_U16 && version == TR_SHARD_VERSION_U16)
        width = 2;
    else if (magic == TR_SHARD_MAGIC_U32 && version == TR_SHARD_VERSION_U32)
        width = 4;
    if (!width) {
        if (magic == TR_SHARD_MAGIC_U16 || magic == TR_SHARD_MAGIC_U32)
            snprintf(err, errlen, "%s: byte 4: unsupported version %d for magic %d (expected %d)",
                     path, version, magic,
                     magic == TR_SHARD_MAGIC_U16 ? TR_SHARD_VERSION_U16 : TR_SHARD_VERSION_U32);
        else
            snprintf(err, errlen,
                     "%s: byte 0: bad magic %d (expected %d for uint16 tokens or %d for uint32): "
                     "not a token shard",
                     path, magic, TR_SHARD_MAGIC_U16, TR_SHARD_MAGIC_U32);
        munmap(map, size);
        return -1;
    }
    size_t want = TR_SHARD_HEADER_BYTES + (size_t)(count < 0 ? 0 : count) * (size_t)width;
    if (count < 0 || size != want) {
        snprintf(err, errlen,
                 "%s: byte 8: the header says %d tokens (%zu bytes in all) but the file has %zu "
                 "bytes%s",
                 path, count, want, size, size < want ? " (truncated)" : "");
        munmap(map, size);
        return -1;
    }
    s->map = map;
    s->map_len = size;
    s->tokens = h + TR_SHARD_HEADER_BYTES;
    s->n = count;
    s->width = width;
    return 0;
}

void tr_shard_close(tr_shard *s)
{
    if (s && s->map)
        munmap((void *)s->map, s->map_len);
    if (s)
        s->map = NULL;
}

struct tr_shard_writer {
    FILE *f;
    char path[1024], tmp[1040];
    int width;
    long count;
    unsigned char buf[1 << 16];
    size_t used;
};

int tr_shard_writer_open(tr_shard_writer **out, const char *path, int width, char *err,
                         size_t errlen)
{
    *out = NULL;
    tr_shard_writer *w = calloc(1, sizeof *w);
    if (!w || strlen(path) >= sizeof w->path) {
        snprintf(err, errlen, "%s: %s", path, w ? "path too long" : "out of memory");
        free(w);
        return -1;
    }
    snprintf(w->path, sizeof w->path, "%s", path);
    snprintf(w->tmp, sizeof w->tmp, "%s.tmp", path);
    w->width = width;
    w->f = fopen(w->tmp, "wb");
    if (!w->f) {
        snprintf(err, errlen, "%s: cannot write: %s", w->tmp, strerror(errno));
        free(w);
        return -1;
    }
    unsigned char header[TR_SHARD_HEADER_BYTES] = {0}; /* filled in at close */
    if (fwrite(header, 1, sizeof header, w->f) != sizeof header) {
        snprintf(err, errlen, "%s: write failed", w->tmp);
        tr_shard_writer_abort(w);
        return -1;
    }
    *out = w;
    return 0;
}

static int flush_buf(tr_shard_writer *w, char *err, size_t errlen)
{
    if (w->used && fwrite(w->buf, 1, w->used, w->f) != w->used) {
        snprintf(err, errlen, "%s: write failed: %s", w->tmp, strerror(errno));
        return -1;
    }
    w->used = 0;
    return 0;
}

int tr_shard_writer_write(tr_shard_writer *w, const int *ids, size_t n, char *err, size_t errlen)
{
    unsigned limit = w->width == 2 ? 0xffffu : 0x7fffffffu;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || (unsigned)ids[i] > limit) {
            snprintf(err, errlen, "%s: token id %d does not fit %d bytes", w->path, ids[i],
                     w->width);
            return -1;
        }
        if (w->used + 4 > sizeof w->buf && flush_buf(w, err, errlen))
            return -1;
        unsigned v = (unsigned)ids[i];
        for (int k = 0; k < w->width; k++)
            w->buf[w->used++] = (unsigned char)(v >> (8 * k));
    }
    if (w->count + (long)n > 0x7fffffffL) {
        snprintf(err, errlen, "%s: more than 2^31 tokens in one shard", w->path);
        return -1;
    }
    w->count += (long)n;
    return 0;
}

long tr_shard_writer_count(const tr_shard_writer *w)
{
    return w->count;
}

int tr_shard_writer_close(tr_shard_writer *w, char *err, size_t errlen)
{
    int32_t h[3] = {w->width == 2 ? TR_SHARD_MAGIC_U16 : TR_SHARD_MAGIC_U32,
                    w->width == 2 ? TR_SHARD_VERSION_U16 : TR_SHARD_VERSION_U32, (int32_t)w->count};
    unsigned char le[12];
    if (errlen)
        err[0] = 0;
    for (int i = 0; i < 3; i++)
        for (int k = 0; k < 4; k++)
            le[4 * i + k] = (unsigned char)((uint32_t)h[i] >> (8 * k));
    if (flush_buf(w, err, errlen) || fseek(w->f, 0, SEEK_SET) || fwrite(le, 1, 12, w->f) != 12 ||
        fflush(w->f) || fsync(fileno(w->f))) {
        if (!err[0])
            snprintf(err, errlen, "%s: write failed: %s", w->tmp, strerror(errno));
        tr_shard_writer_abort(w);
        return -1;
    }
    fclose(w->f);
    w->f = NULL;
    if (rename(w->tmp, w->path)) {
        snprintf(err, errlen, "%s: cannot rename to %s: %s", w->tmp, w->path, strerror(errno));
        remove(w->tmp);
        free(w);
        return -1;
    }
    free(w);
    return 0;
}

void tr_shard_writer_abort(tr_shard_writer *w)
{
    if (!w)
        return;
    if (w->f) {
        fclose(w->f);
        remove(w->tmp);
    }
    free(w);
}
