/* Checkpoints: CRC32C and SHA-256, safetensors files, the YAML manifest,
 * the asynchronous writer (a thread that copies and writes while training goes on), verified
 * loading, choosing the checkpoint to resume from, and the recipe comparison a resume needs.
 * See trainer/checkpoint.h for the layout and the guarantees. */
#include "trainer/checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <yaml.h>

#if defined(__SSE4_2__) && defined(__x86_64__)
#include <nmmintrin.h>
#endif

#include "trainer/trainer.h"

#define CKPT_FORMAT "trainer-checkpoint"
#define CKPT_VERSION 1

#if defined(__GNUC__)
#define CK_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define CK_PRINTF(a, b)
#endif

CK_PRINTF(3, 4) static int ck_fail(char *err, size_t errlen, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
    return -1;
}

/* ---- CRC-32C ------------------------------------------------------------------------------ */

static uint32_t crc_table[256];
static pthread_once_t crc_once = PTHREAD_ONCE_INIT;

static void crc_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
        crc_table[i] = c;
    }
}

uint32_t tr_crc32c(uint32_t crc, const void *data, size_t n) {
    const unsigned char *p = data;
    crc = ~crc;
#if defined(__SSE4_2__) && defined(__x86_64__)
    uint64_t c = crc;
    while (n >= 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        c = _mm_crc32_u64(c, v);
        p += 8;
        n -= 8;
    }
    crc = (uint32_t)c;
    while (n--) crc = _mm_crc32_u8(crc, *p++);
#else
    pthread_once(&crc_once, crc_init);
    while (n--) crc = crc_table[(crc ^ *p++) & 0xff] ^ (crc >> 8);
#endif
    (void)crc_once;
    (void)crc_init;
    return ~crc;
}

/* ---- SHA-256 (FIPS 180-4) ------------------------------------------------------------------ */

static const uint32_t sha_k[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4,
    0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe,
    0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f,
    0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7,
    0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc,
    0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
    0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116,
    0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
    0xc67178f2};

static uint32_t ror32(uint32_t x, int r) {
    return (x >> r) | (x << (32 - r));
}

static void sha_block(uint32_t h[8], const unsigned char *b) {
    uint32_t w[64];
    for (int i = 0; i < 16; i++)
        w[i] = (uint32_t)b[4 * i] << 24 | (uint32_t)b[4 * i + 1] << 16 |
               (uint32_t)b[4 * i + 2] << 8 | b[4 * i + 3];
    for (int i = 16; i < 64; i++) {
        uint32_t s0 = ror32(w[i - 15], 7) ^ ror32(w[i - 15], 18) ^ (w[i - 15] >> 3);
        uint32_t s1 = ror32(w[i - 2], 17) ^ ror32(w[i - 2], 19) ^ (w[i - 2] >> 10);
        w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    uint32_t a = h[0], bb = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], hh = h[7];
    for (int i = 0; i < 64; i++) {
        uint32_t t1 = hh + (ror32(e, 6) ^ ror32(e, 11) ^ ror32(e, 25)) + ((e & f) ^ (~e & g)) +
                      sha_k[i] + w[i];
        uint32_t t2 = (ror32(a, 2) ^ ror32(a, 13) ^ ror32(a, 22)) + ((a & bb) ^ (a & c) ^ (bb & c));
        hh = g, g = f, f = e, e = d + t1, d = c, c = bb, bb = a, a = t1 + t2;
    }
    h[0] += a, h[1] += bb, h[2] += c, h[3] += d, h[4] += e, h[5] += f, h[6] += g, h[7] += hh;
}

void tr_sha256_hex(const void *data, size_t n, char hex[65]) {
    uint32_t h[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                     0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    const unsigned char *p = data;
    size_t left = n;
    for (; left >= 64; left -= 64, p += 64) sha_block(h, p);
    unsigned char last[128] = {0};
    memcpy(last, p, left);
    last[left] = 0x80;
    size_t blocks = left + 9 > 64 ? 2 : 1;
    uint64_t bits = (uint64_t)n * 8;
    for (int i = 0; i < 8; i++) last[blocks * 64 - 1 - i] = (unsigned char)(bits >> (8 * i));
    for (size_t i = 0; i < blocks; i++) sha_block(h, last + 64 * i);
    for (int i = 0; i < 8; i++) snprintf(hex + 8 * i, 9, "%08x", h[i]);
}

/* ---- files ---------------------------------------------------------------------------------- */

/* Fault injection for tests: TR_FAULT_SAVE_BYTES=N aborts the process once the writer has
 * written N bytes of a checkpoint (a crash in the middle of a save). */
static long long fault_left = -1;
static int fault_hang; /* TR_FAULT_SAVE_HANG=1: the writer's first write never returns (a hung disk) */

static int write_all(int fd, const void *buf, size_t n) {
    const char *p = buf;
    while (n > 0) {
        size_t chunk = n > (64u << 20) ? (64u << 20) : n;
        while (fault_hang) pause(); /* signals end it, as they would a write to a hung disk */
        if (fault_left >= 0 && (long long)chunk >= fault_left) {
            if (fault_left > 0 && write(fd, p, (size_t)fault_left) < 0) abort();
            fprintf(stderr, "trainer: TR_FAULT_SAVE_BYTES reached: aborting in the middle of a "
                            "checkpoint save\n");
            abort();
        }
        ssize_t k = write(fd, p, chunk);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return -1;
        if (fault_left >= 0) fault_left -= k;
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

static int fsync_dir(const char *dir) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY);
    if (fd < 0) return -1;
    int rc = fsync(fd);
    close(fd);
    return rc;
}

/* Write a whole file from pieces and fsync it. */
/* The file appears whole or not at all: written to a temporary beside it, synced, renamed
 * over `path` (a checkpoint's files are inside a temporary folder as well; an exported model
 * has no other protection). */
static int write_file(const char *path, const void *const *parts, const size_t *lens, int n,
                      char *err, size_t errlen) {
    char tmp[TR_PATH_MAX + 64];
    if (snprintf(tmp, sizeof(tmp), "%s.tmp%ld", path, (long)getpid()) >= (int)sizeof(tmp))
        return ck_fail(err, errlen, "cannot create '%s': path too long", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) return ck_fail(err, errlen, "cannot create '%s': %s", path, strerror(errno));
    for (int i = 0; i < n; i++) {
        if (write_all(fd, parts[i], lens[i])) {
            int e = errno;
            close(fd);
            unlink(tmp);
            return ck_fail(err, errlen, "cannot write '%s': %s", path, strerror(e));
        }
    }
    int bad = fsync(fd);
    bad |= close(fd);
    if (bad || rename(tmp, path)) {
        int e = errno;
        unlink(tmp);
        return ck_fail(err, errlen, "cannot write '%s': %s", path, strerror(e));
    }
    return 0;
}

/* path opened read-only, with its size; -1 and err naming the file otherwise */
static int open_sized(const char *path, size_t *size, char *err, size_t errlen) {
    int fd = open(path, O_RDONLY | O_NONBLOCK); /* a FIFO is refused below, not waited on */
    if (fd < 0) return ck_fail(err, errlen, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st)) {
        close(fd);
        return ck_fail(err, errlen, "%s: cannot stat: %s", path, strerror(errno));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return ck_fail(err, errlen, "%s: not a regular file", path);
    }
    *size = (size_t)st.st_size;
    return fd;
}

static int read_whole(const char *path, unsigned char **buf, size_t *size, char *err,
                      size_t errlen) {
    size_t n, got = 0;
    int fd = open_sized(path, &n, err, errlen);
    if (fd < 0) return -1;
    unsigned char *b = malloc(n + 1);
    if (!b) {
        close(fd);
        return ck_fail(err, errlen, "%s: out of memory (%zu bytes)", path, n);
    }
    while (got < n) {
        size_t chunk = n - got > (256u << 20) ? (256u << 20) : n - got;
        ssize_t k = read(fd, b + got, chunk);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) {
            free(b);
            close(fd);
            return ck_fail(err, errlen, "%s: cannot read: %s", path,
                           k < 0 ? strerror(errno) : "file shrank while reading");
        }
        got += (size_t)k;
    }
    close(fd);
    b[n] = 0;
    *buf = b;
    *size = n;
    return 0;
}

/* Remove a flat folder (files only) and the folder itself. */
static void remove_dir(const char *dir) {
    DIR *d = opendir(dir);
    if (d) {
        struct dirent *e;
        char p[TR_PATH_MAX + 300];
        while ((e = readdir(d))) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
            snprintf(p, sizeof(p), "%s/%s", dir, e->d_name);
            unlink(p);
        }
        closedir(d);
    }
    rmdir(dir);
}

/* ---- safetensors ----------------------------------------------------------------------------- */

static tr_st_dtype st_dtype(const char *s) {
    if (!strcmp(s, "F32")) return TR_ST_F32;
    if (!strcmp(s, "F16")) return TR_ST_F16;
    if (!strcmp(s, "BF16")) return TR_ST_BF16;
    return TR_ST_OTHER;
}

static size_t st_dtype_size(tr_st_dtype d) {
    return d == TR_ST_F32 ? 4 : d == TR_ST_OTHER ? 0 : 2;
}

/* The whole file, mapped read-only: pages come in as they are read and can be dropped again,
 * so a big checkpoint costs no anonymous memory. Published files are never modified. */
static int map_whole(const char *path, unsigned char **buf, size_t *size, char *err,
                     size_t errlen) {
    int fd = open_sized(path, size, err, errlen);
    if (fd < 0) return -1;
    *buf = NULL;
    if (*size == 0) {
        close(fd);
        return 0;
    }
    void *p = mmap(NULL, *size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (p == MAP_FAILED) return ck_fail(err, errlen, "%s: cannot map: %s", path, strerror(errno));
    *buf = p;
    return 0;
}

int tr_st_open(tr_st_file *f, const char *path, char *err, size_t errlen) {
    memset(f, 0, sizeof(*f));
    snprintf(f->path, sizeof(f->path), "%s", path);
    if (map_whole(path, &f->buf, &f->size, err, errlen)) return -1;
    if (f->size < 8) {
        tr_st_close(f);
        return ck_fail(err, errlen, "%s: truncated (%zu bytes, not a safetensors file)", path,
                       f->size);
    }
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--) hl = hl << 8 | f->buf[i];
    if (hl > f->size - 8 || hl > (100u << 20)) {
        size_t size = f->size; /* tr_st_close clears it */
        tr_st_close(f);
        return ck_fail(err, errlen, "%s: truncated or not safetensors (header of %llu bytes in a "
                       "file of %zu)", path, (unsigned long long)hl, size);
    }
    tr_json h;
    char jerrbuf[128];
    if (tr_json_parse(&h, (const char *)f->buf + 8, (size_t)hl, jerrbuf, sizeof(jerrbuf))) {
        tr_st_close(f);
        return ck_fail(err, errlen, "%s: damaged header: %s", path, jerrbuf);
    }
    int rc = 0;
    if (h.type != TR_JSON_OBJ) rc = ck_fail(err, errlen, "%s: header is not a JSON object", path);
    f->data = f->buf + 8 + hl;
    f->data_len = f->size - 8 - (size_t)hl;
    f->e = calloc((size_t)(h.n > 0 ? h.n : 1), sizeof(tr_st_entry));
    size_t max_end = 0;
    for (int i = 0; !rc && i < h.n; i++) {
        const tr_json *t = &h.kids[i];
        if (!strcmp(t->key, "__metadata__")) continue;
        const tr_json *dt = tr_json_get(t, "dtype"), *sh = tr_json_get(t, "shape"),
                      *off = tr_json_get(t, "data_offsets");
        tr_st_entry *e = &f->e[f->n];
        if (!dt || dt->type != TR_JSON_STR || !sh || sh->type != TR_JSON_ARR || sh->n > 4 || !off ||
            off->type != TR_JSON_ARR || off->n != 2 || strlen(t->key) >= sizeof(e->name)) {
            rc = ck_fail(err, errlen, "%s: damaged header entry '%.80s'", path, t->key);
            break;
        }
        snprintf(e->name, sizeof(e->name), "%s", t->key);
        e->dtype = st_dtype(dt->str);
        e->ndim = sh->n;
        size_t numel = 1;
        for (int d = 0; d < sh->n; d++) {
            e->shape[d] = (long)sh->kids[d].num;
            numel *= (size_t)e->shape[d];
        }
        e->begin = (size_t)off->kids[0].num;
        e->end = (size_t)off->kids[1].num;
        if (e->end < e->begin || (e->dtype != TR_ST_OTHER && e->end - e->begin != numel * st_dtype_size(e->dtype))) {
            rc = ck_fail(err, errlen, "%s: tensor '%s': offsets do not match its shape", path,
                         e->name);
            break;
        }
        if (e->end > max_end) max_end = e->end;
        f->n++;
    }
    tr_json_free(&h);
    if (!rc && max_end > f->data_len)
        rc = ck_fail(err, errlen, "%s: truncated: data needs %zu bytes, the file holds %zu", path,
                     max_end, f->data_len);
    if (rc) tr_st_close(f);
    return rc;
}

const tr_st_entry *tr_st_find(const tr_st_file *f, const char *name) {
    for (int i = 0; i < f->n; i++)
        if (!strcmp(f->e[i].name, name)) return &f->e[i];
    return NULL;
}

static float half_to_f32(uint16_t h) {
    uint32_t s = (uint32_t)(h >> 15) << 31, e = (h >> 10) & 31, m = h & 1023, bits;
    if (e == 0) {
        float v = ldexpf((float)m, -24);
        return s ? -v : v;
    }
    if (e == 31)
        bits = s | 0x7f800000u | (m << 13);
    else
        bits = s | ((e + 112) << 23) | (m << 13);
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

int tr_st_read_f32(const tr_st_file *f, const tr_st_entry *e, float *out, char *err,
                   size_t errlen) {
    const unsigned char *p = f->data + e->begin;
    size_t n = (e->end - e->begin) / (st_dtype_size(e->dtype) ? st_dtype_size(e->dtype) : 1);
    switch (e->dtype) {
    case TR_ST_F32: memcpy(out, p, n * 4); return 0;
    case TR_ST_F16:
    case TR_ST_BF16:
        for (size_t i = 0; i < n; i++) {
            uint16_t h = (uint16_t)(p[2 * i] | p[2 * i + 1] << 8);
            if (e->dtype == TR_ST_BF16) {
                uint32_t bits = (uint32_t)h << 16;
                memcpy(&out[i], &bits, 4);
            } else {
                out[i] = half_to_f32(h);
            }
        }
        return 0;
    case TR_ST_OTHER: break;
    }
    return ck_fail(err, errlen, "%s: tensor '%s' has a dtype other than F32, F16, BF16", f->path,
                   e->name);
}

void tr_st_close(tr_st_file *f) {
    if (!f) return;
    if (f->buf) munmap(f->buf, f->size);
    free(f->e);
    memset(f, 0, sizeof(*f));
}


/* Header JSON padded with spaces so the data start at a multiple of 8 bytes; returns the
 * malloc'ed "u64 length + JSON" prefix and its size. */
static unsigned char *st_header(const tr_st_tensor *t, int n, const char *const *meta,
                                size_t *out_len) {
    char *json = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&json, &len);
    fputc('{', f);
    if (meta && meta[0]) {
        fputs("\"__metadata__\":{", f);
        for (int i = 0; meta[i]; i += 2) {
            if (i) fputc(',', f);
            tr_json_write_string(f, meta[i]);
            fputc(':', f);
            tr_json_write_string(f, meta[i + 1]);
        }
        fputc('}', f);
    }
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        size_t numel = (size_t)t[i].shape[0] * (size_t)(t[i].ndim > 1 ? t[i].shape[1] : 1);
        if (i || (meta && meta[0])) fputc(',', f);
        tr_json_write_string(f, t[i].name);
        fprintf(f, ":{\"dtype\":\"F32\",\"shape\":[%ld", t[i].shape[0]);
        if (t[i].ndim > 1) fprintf(f, ",%ld", t[i].shape[1]);
        fprintf(f, "],\"data_offsets\":[%zu,%zu]}", off, off + numel * 4);
        off += numel * 4;
    }
    fputc('}', f);
    fclose(f);
    size_t padded = (len + 7) / 8 * 8;
    unsigned char *h = malloc(8 + padded);
    for (int i = 0; i < 8; i++) h[i] = (unsigned char)((uint64_t)padded >> (8 * i));
    memcpy(h + 8, json, len);
    memset(h + 8 + len, ' ', padded - len);
    free(json);
    *out_len = 8 + padded;
    return h;
}

int tr_st_write(const char *path, const tr_st_tensor *t, int n, const char *const *metadata,
                char *err, size_t errlen) {
    size_t hlen;
    unsigned char *h = st_header(t, n, metadata, &hlen);
    const void **parts = malloc((size_t)(n + 1) * sizeof(void *));
    size_t *lens = malloc((size_t)(n + 1) * sizeof(size_t));
    parts[0] = h;
    lens[0] = hlen;
    for (int i = 0; i < n; i++) {
        parts[i + 1] = t[i].data;
        lens[i + 1] = (size_t)t[i].shape[0] * (size_t)(t[i].ndim > 1 ? t[i].shape[1] : 1) * 4;
    }
    int rc = write_file(path, parts, lens, n + 1, err, errlen);
    free(parts);
    free(lens);
    free(h);
    return rc;
}

/* ---- the manifest (YAML) -------------------------------------------------------------------- */

typedef struct {
    yaml_emitter_t e;
    int bad;
} yout;

static void y_event(yout *y, yaml_event_t *ev) {
    if (!y->bad && !yaml_emitter_emit(&y->e, ev)) y->bad = 1;
}

static void y_str(yout *y, const char *s, yaml_scalar_style_t style) {
    yaml_event_t ev;
    yaml_scalar_event_initialize(&ev, NULL, NULL, (yaml_char_t *)s, (int)strlen(s), 1, 1, style);
    y_event(y, &ev);
}

static void y_plain(yout *y, const char *s) {
    y_str(y, s, YAML_ANY_SCALAR_STYLE);
}

CK_PRINTF(2, 3) static void y_fmt(yout *y, const char *fmt, ...) {
    char buf[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    y_plain(y, buf);
}

static void y_map(yout *y, int start) {
    yaml_event_t ev;
    if (start)
        yaml_mapping_start_event_initialize(&ev, NULL, NULL, 1, YAML_BLOCK_MAPPING_STYLE);
    else
        yaml_mapping_end_event_initialize(&ev);
    y_event(y, &ev);
}

static void y_seq(yout *y, int start, int flow) {
    yaml_event_t ev;
    if (start)
        yaml_sequence_start_event_initialize(&ev, NULL, NULL, 1,
                                             flow ? YAML_FLOW_SEQUENCE_STYLE : YAML_BLOCK_SEQUENCE_STYLE);
    else
        yaml_sequence_end_event_initialize(&ev);
    y_event(y, &ev);
}

static void y_shape(yout *y, int ndim, const long *shape) {
    y_seq(y, 1, 1);
    for (int d = 0; d < ndim; d++) y_fmt(y, "%ld", shape[d]);
    y_seq(y, 0, 1);
}

static const char *act_name(tr_activation a) {
    return a == TR_ACT_SWIGLU ? "swiglu" : "gelu";
}

static void y_node(yout *y, const tr_node *n) {
    y_map(y, 1);
    y_plain(y, "kind");
    y_plain(y, tr_node_kind_name(n->kind));
    switch (n->kind) {
    case TR_NODE_STACK:
        y_plain(y, "n");
        y_fmt(y, "%d", n->repeat);
        break;
    case TR_NODE_ROPE:
        y_plain(y, "theta");
        y_fmt(y, "%.9g", n->rope_theta);
        break;
    case TR_NODE_LAYERNORM:
    case TR_NODE_RMSNORM:
        y_plain(y, "eps");
        y_fmt(y, "%.9g", n->eps);
        if (n->kind == TR_NODE_LAYERNORM) {
            y_plain(y, "bias");
            y_plain(y, n->bias ? "true" : "false");
        }
        break;
    case TR_NODE_ATTENTION:
        y_plain(y, "heads");
        y_fmt(y, "%d", n->heads);
        y_plain(y, "kv_heads");
        y_fmt(y, "%d", n->kv_heads);
        y_plain(y, "bias");
        y_plain(y, n->bias ? "true" : "false");
        y_plain(y, "rope_theta");
        y_fmt(y, "%.9g", n->rope_theta);
        break;
    case TR_NODE_MLP:
        y_plain(y, "hidden");
        y_fmt(y, "%d", n->hidden);
        y_plain(y, "activation");
        y_plain(y, act_name(n->activation));
        y_plain(y, "bias");
        y_plain(y, n->bias ? "true" : "false");
        break;
    case TR_NODE_LM_HEAD:
        y_plain(y, "tied");
        y_plain(y, n->tied ? "true" : "false");
        break;
    default: break;
    }
    if (n->n_children) {
        y_plain(y, "children");
        y_seq(y, 1, 0);
        for (int i = 0; i < n->n_children; i++) y_node(y, &n->children[i]);
        y_seq(y, 0, 0);
    }
    y_map(y, 0);
}

static int y_write_handler(void *data, unsigned char *buffer, size_t size) {
    return fwrite(buffer, 1, size, (FILE *)data) == size;
}

/* One block of a global tensor as the manifest lists it: the rectangle [start, start + shape)
 * (rows x columns; one dimension for vectors), stored under `key` in rank `rank`'s file. A
 * rank writes the blocks of the slab ranges it keeps; each is elements [flat, flat + count) of
 * the flattened tensor. */
typedef struct {
    int param, kind;     /* tr_model_param index; -1 parameters, 0 adam_m, 1 adam_v */
    int rank;
    int ndim;
    long start[2], shape[2];
    size_t flat, count;
    size_t offset;       /* floats into the snapshot buffer (this rank's blocks) */
    uint32_t crc;
} slice_info;

static const char *kind_prefix(int kind) {
    return kind < 0 ? "" : kind == 0 ? "adam_m/" : "adam_v/";
}

/* The global name of a block's tensor, and its key in the rank's file: the name itself when
 * the block is the whole tensor, else name@flat. */
static void slice_names(const tr_param *p, const slice_info *s, char *name, size_t nlen,
                        char *key, size_t klen) {
    snprintf(name, nlen, "%s%s", kind_prefix(s->kind), p->name);
    if (s->count == p->numel)
        snprintf(key, klen, "%s", name);
    else
        snprintf(key, klen, "%s@%zu", name, s->flat);
}

static int cmp_slice(const void *a, const void *b) {
    const slice_info *x = a, *y = b;
    if (x->kind != y->kind) return x->kind < y->kind ? -1 : 1;
    if (x->param != y->param) return x->param < y->param ? -1 : 1;
    return x->flat < y->flat ? -1 : x->flat > y->flat;
}

/* Append the blocks covering elements [a, b) of tensor p (at most three: a partial first row,
 * whole rows, a partial last row). */
static int add_blocks(slice_info **sl, int *n, int *cap, const tr_param *p, int param, int kind,
                      int rank, size_t a, size_t b) {
    size_t C = p->ndim > 1 ? (size_t)p->shape[1] : p->numel;
    while (a < b) {
        size_t r = a / C, c = a % C, len;
        long start[2], shape[2];
        if (p->ndim == 1) {
            len = b - a;
            start[0] = (long)a, shape[0] = (long)len;
            start[1] = 0, shape[1] = 1;
        } else if (c || b - a < C) { /* part of one row */
            len = C - c < b - a ? C - c : b - a;
            start[0] = (long)r, start[1] = (long)c, shape[0] = 1, shape[1] = (long)len;
        } else { /* whole rows */
            size_t rows = (b - a) / C;
            len = rows * C;
            start[0] = (long)r, start[1] = 0, shape[0] = (long)rows, shape[1] = (long)C;
        }
        if (*n == *cap) {
            *cap = *cap ? 2 * *cap : 64;
            slice_info *g = realloc(*sl, (size_t)*cap * sizeof(slice_info));
            if (!g) return -1;
            *sl = g;
        }
        (*sl)[(*n)++] = (slice_info){.param = param, .kind = kind, .rank = rank,
                                     .ndim = p->ndim, .start = {start[0], start[1]},
                                     .shape = {shape[0], shape[1]}, .flat = a, .count = len};
        a += len;
    }
    return 0;
}

typedef struct {
    long step, adam_steps;
    tr_loader_pos pos;
} snap_meta;

/* The manifest text (with its trailing checksum comment); malloc'ed. */
static char *manifest_text(unsigned long long seed, const char *recipe_text, const char *sha,
                           const tr_model_desc *d, const tr_model *m, const snap_meta *sm,
                           const slice_info *sl, int n_sl, const size_t *file_bytes, int world,
                           int zero, size_t *out_len) {
    size_t n_params = tr_model_num_elements(m);
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    yout y = {0};
    yaml_emitter_initialize(&y.e);
    yaml_emitter_set_output(&y.e, y_write_handler, f);
    yaml_emitter_set_width(&y.e, 100);
    yaml_emitter_set_unicode(&y.e, 1);
    yaml_event_t ev;
    yaml_stream_start_event_initialize(&ev, YAML_UTF8_ENCODING);
    y_event(&y, &ev);
    yaml_document_start_event_initialize(&ev, NULL, NULL, NULL, 1);
    y_event(&y, &ev);
    y_map(&y, 1);
    y_plain(&y, "format");
    y_plain(&y, CKPT_FORMAT);
    y_plain(&y, "version");
    y_fmt(&y, "%d", CKPT_VERSION);
    y_plain(&y, "step");
    y_fmt(&y, "%ld", sm->step);
    y_plain(&y, "adam_steps");
    y_fmt(&y, "%ld", sm->adam_steps);
    y_plain(&y, "recipe_sha256");
    y_plain(&y, sha);
    y_plain(&y, "recipe");
    y_str(&y, recipe_text, YAML_LITERAL_SCALAR_STYLE);
    y_plain(&y, "model");
    y_map(&y, 1);
    y_plain(&y, "vocab");
    y_fmt(&y, "%d", d->vocab);
    y_plain(&y, "dim");
    y_fmt(&y, "%d", d->dim);
    y_plain(&y, "seq_len");
    y_fmt(&y, "%d", d->seq_len);
    y_plain(&y, "parameters");
    y_fmt(&y, "%zu", n_params);
    y_plain(&y, "layers");
    y_seq(&y, 1, 0);
    for (int i = 0; i < d->root.n_children; i++) y_node(&y, &d->root.children[i]);
    y_seq(&y, 0, 0);
    y_map(&y, 0);
    y_plain(&y, "parallel");
    y_map(&y, 1);
    y_plain(&y, "world");
    y_fmt(&y, "%d", world);
    y_plain(&y, "dp");
    y_fmt(&y, "%d", world);
    y_plain(&y, "tp");
    y_plain(&y, "1");
    y_plain(&y, "pp");
    y_plain(&y, "1");
    y_plain(&y, "zero");
    y_fmt(&y, "%d", zero);
    y_map(&y, 0);
    y_plain(&y, "rng");
    y_map(&y, 1);
    /* every random choice derives from the seed and a position: parameter init from (seed,
       name, index), data order from (seed, loader position), sampling from the seed; the
       loop keeps no other generator */
    y_plain(&y, "seed");
    y_fmt(&y, "%llu", seed);
    y_plain(&y, "loader");
    y_plain(&y, "see loader_position");
    y_map(&y, 0);
    y_plain(&y, "loader_position");
    y_map(&y, 1);
    y_plain(&y, "bytes");
    y_fmt(&y, "%zu", sizeof(tr_loader_pos));
    y_plain(&y, "hex");
    {
        char *hex = malloc(2 * sizeof(tr_loader_pos) + 1);
        const unsigned char *pb = (const unsigned char *)&sm->pos;
        for (size_t i = 0; i < sizeof(tr_loader_pos); i++) snprintf(hex + 2 * i, 3, "%02x", pb[i]);
        y_str(&y, hex, YAML_DOUBLE_QUOTED_SCALAR_STYLE);
        free(hex);
    }
    y_map(&y, 0);
    y_plain(&y, "files");
    y_seq(&y, 1, 0);
    for (int r = 0; r < world; r++) {
        y_map(&y, 1);
        y_plain(&y, "name");
        y_fmt(&y, "rank_%05d.safetensors", r);
        y_plain(&y, "rank");
        y_fmt(&y, "%d", r);
        y_plain(&y, "bytes");
        y_fmt(&y, "%zu", file_bytes[r]);
        y_map(&y, 0);
    }
    y_seq(&y, 0, 0);
    y_plain(&y, "tensors");
    y_seq(&y, 1, 0);
    /* sl is sorted by (kind, tensor, position): one entry per tensor, its blocks in order */
    for (int i = 0; i < n_sl;) {
        const tr_param *p = tr_model_param(m, sl[i].param);
        long shape[2] = {p->shape[0], p->shape[1]};
        char name[TR_PARAM_NAME_MAX + 16], key[TR_PARAM_NAME_MAX + 48];
        slice_names(p, &sl[i], name, sizeof(name), key, sizeof(key));
        y_map(&y, 1);
        y_plain(&y, "name");
        y_plain(&y, name);
        y_plain(&y, "dtype");
        y_plain(&y, "F32");
        y_plain(&y, "shape");
        y_shape(&y, p->ndim, shape);
        y_plain(&y, "slices");
        y_seq(&y, 1, 0);
        int j = i;
        for (; j < n_sl && sl[j].kind == sl[i].kind && sl[j].param == sl[i].param; j++) {
            slice_names(p, &sl[j], name, sizeof(name), key, sizeof(key));
            y_map(&y, 1);
            y_plain(&y, "file");
            y_fmt(&y, "rank_%05d.safetensors", sl[j].rank);
            y_plain(&y, "key");
            y_plain(&y, key);
            y_plain(&y, "start");
            y_shape(&y, p->ndim, sl[j].start);
            y_plain(&y, "shape");
            y_shape(&y, p->ndim, sl[j].shape);
            y_plain(&y, "crc32c");
            y_fmt(&y, "%08x", sl[j].crc);
            y_map(&y, 0);
        }
        y_seq(&y, 0, 0);
        y_map(&y, 0);
        i = j;
    }
    y_seq(&y, 0, 0);
    y_map(&y, 0);
    yaml_document_end_event_initialize(&ev, 1);
    y_event(&y, &ev);
    yaml_stream_end_event_initialize(&ev);
    y_event(&y, &ev);
    yaml_emitter_flush(&y.e);
    yaml_emitter_delete(&y.e);
    fflush(f);
    uint32_t crc = tr_crc32c(0, buf, len);
    fprintf(f, "# crc32c: %08x\n", crc);
    fclose(f);
    if (y.bad) {
        free(buf);
        return NULL;
    }
    *out_len = len;
    return buf;
}

/* ---- the writer ------------------------------------------------------------------------------ */

enum { W_IDLE = 0, W_COPY, W_WRITE };

struct tr_ckpt_writer {
    tr_model *m;
    char out[TR_PATH_MAX];
    char ckdir[TR_PATH_MAX + 16];
    char *recipe_text;
    size_t recipe_len;
    char sha[65];
    tr_model_desc desc;
    unsigned long long seed;
    tr_ckpt_opts o;
    /* the snapshot: this rank's blocks of the parameters, then of m, then of v */
    int n_params, n_sl;
    slice_info *sl;
    int copy_failed; /* a block this process does not keep (a wrong range list) */
    float *snap;
    size_t snap_floats;
    snap_meta meta;
    pthread_t thread;
    int started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int state, quit;
    tr_ckpt_stats stats;
    char err[512];
};

static void copy_state(tr_ckpt_writer *w) {
    double t0 = tr_now();
    w->copy_failed = 0;
    for (int i = 0; i < w->n_sl; i++) {
        const slice_info *s = &w->sl[i];
        size_t lo = tr_model_param(w->m, s->param)->offset + s->flat;
        if (tr_model_read_range(w->m, s->kind, lo, lo + s->count, w->snap + s->offset))
            w->copy_failed = 1;
    }
    w->stats.copy_s += tr_now() - t0;
}

static int cmp_long_desc(const void *a, const void *b) {
    long x = *(const long *)a, y = *(const long *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

/* Steps of the complete checkpoints in dir (step_NNNNNNNN folders), newest first. */
static int list_steps(const char *dir, long **steps) {
    DIR *d = opendir(dir);
    int n = 0, cap = 0;
    *steps = NULL;
    if (!d) return 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        char *end;
        if (strncmp(e->d_name, "step_", 5) != 0) continue;
        errno = 0;
        long s = strtol(e->d_name + 5, &end, 10);
        if (errno || *end || end == e->d_name + 5 || s < 0 || s > INT_MAX) continue;
        char canon[32]; /* only names this writer makes: it is read back under that name */
        snprintf(canon, sizeof(canon), "step_%08ld", s);
        if (strcmp(canon, e->d_name)) continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 16;
            *steps = realloc(*steps, (size_t)cap * sizeof(long));
        }
        (*steps)[n++] = s;
    }
    closedir(d);
    if (n) qsort(*steps, (size_t)n, sizeof(long), cmp_long_desc);
    return n;
}

/* Ranks other than 0 list the blocks they wrote in rank_R.part (appearing by rename once
 * their file is on disk, or saying why it failed); rank 0 waits for every list, then writes
 * the manifest and publishes the checkpoint. The folder must be shared by the ranks. */
static void part_path(char *out, size_t n, const char *tmp, int rank) {
    snprintf(out, n, "%s/rank_%05d.part", tmp, rank);
}

static int write_part(const tr_ckpt_writer *w, const char *tmp, size_t bytes, const char *failed,
                      char *err, size_t errlen) {
    char *buf = NULL, path[TR_PATH_MAX + 128], fin[TR_PATH_MAX + 128];
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (failed) {
        fprintf(f, "failed %s\n", failed);
    } else {
        fprintf(f, "bytes %zu\n", bytes);
        for (int i = 0; i < w->n_sl; i++) {
            const slice_info *s = &w->sl[i];
            fprintf(f, "%d %d %ld %ld %ld %ld %zu %zu %08x\n", s->param, s->kind, s->start[0],
                    s->start[1], s->shape[0], s->shape[1], s->flat, s->count, s->crc);
        }
    }
    fclose(f);
    part_path(fin, sizeof(fin), tmp, w->o.rank);
    snprintf(path, sizeof(path), "%.*s.tmp", (int)(sizeof(path) - 8), fin);
    const void *pp[1] = {buf};
    size_t pl[1] = {len};
    int rc = write_file(path, pp, pl, 1, err, errlen);
    free(buf);
    if (!rc && rename(path, fin))
        rc = ck_fail(err, errlen, "cannot rename '%s': %s", path, strerror(errno));
    return rc;
}

/* How long a save may take before it counts as stuck (tr_ckpt_opts.timeout_s). */
static double save_limit(const tr_ckpt_writer *w) {
    if (w->o.timeout_s <= 0) return 3600;
    return w->o.timeout_s + (double)w->snap_floats * sizeof(float) / 20e6;
}

/* Rank 0: wait for rank r's list and append its blocks. */
static int read_part(const tr_ckpt_writer *w, const char *tmp, int r, slice_info **sl, int *n,
                     int *cap, size_t *bytes, char *err, size_t errlen) {
    char path[TR_PATH_MAX + 128];
    part_path(path, sizeof(path), tmp, r);
    double t0 = tr_now(), limit = save_limit(w);
    FILE *f;
    while (!(f = fopen(path, "r"))) {
        if (tr_now() - t0 > limit)
            return ck_fail(err, errlen, "rank %d did not write its part of the checkpoint "
                           "within %.0f s (%s missing)", r, limit, path);
        struct timespec ts = {0, 20 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    char line[512];
    int rc = 0, np = tr_model_num_params(w->m);
    if (!fgets(line, sizeof(line), f)) line[0] = 0;
    if (!strncmp(line, "failed ", 7)) {
        line[strcspn(line, "\n")] = 0;
        rc = ck_fail(err, errlen, "rank %d: %s", r, line + 7);
    } else if (sscanf(line, "bytes %zu", bytes) != 1) {
        rc = ck_fail(err, errlen, "%s: damaged", path);
    }
    while (!rc && fgets(line, sizeof(line), f)) {
        slice_info s = {.rank = r};
        unsigned crc;
        if (sscanf(line, "%d %d %ld %ld %ld %ld %zu %zu %x", &s.param, &s.kind, &s.start[0],
                   &s.start[1], &s.shape[0], &s.shape[1], &s.flat, &s.count, &crc) != 9 ||
            s.param < 0 || s.param >= np || s.kind < -1 || s.kind > 1) {
            rc = ck_fail(err, errlen, "%s: damaged line '%.60s'", path, line);
            break;
        }
        s.crc = crc;
        s.ndim = tr_model_param(w->m, s.param)->ndim;
        if (*n == *cap) {
            *cap = *cap ? 2 * *cap : 64;
            *sl = realloc(*sl, (size_t)*cap * sizeof(slice_info));
        }
        (*sl)[(*n)++] = s;
    }
    fclose(f);
    return rc;
}

static int write_checkpoint(tr_ckpt_writer *w, size_t *bytes, char *err, size_t errlen) {
    const snap_meta *sm = &w->meta;
    char tmp[TR_PATH_MAX + 64], fin[TR_PATH_MAX + 64], path[TR_PATH_MAX + 128];
    snprintf(tmp, sizeof(tmp), "%s/.tmp_step_%08ld", w->ckdir, sm->step);
    snprintf(fin, sizeof(fin), "%s/step_%08ld", w->ckdir, sm->step);
    int world = w->o.world;
    if (world == 1) remove_dir(tmp); /* several writers: rank 0 cleared leftovers at start */
    if (mkdir(tmp, 0755) && !(world > 1 && errno == EEXIST))
        return ck_fail(err, errlen, "cannot create '%s': %s", tmp, strerror(errno));
    if (w->copy_failed)
        return ck_fail(err, errlen, "rank %d was asked to save a range it does not keep",
                       w->o.rank);
    /* this rank's blocks: a CRC each, one safetensors file */
    tr_st_tensor *t = malloc((size_t)(w->n_sl ? w->n_sl : 1) * sizeof(tr_st_tensor));
    char (*keys)[TR_PARAM_NAME_MAX + 48] = malloc((size_t)(w->n_sl ? w->n_sl : 1) * sizeof(*keys));
    for (int i = 0; i < w->n_sl; i++) {
        slice_info *s = &w->sl[i];
        const tr_param *p = tr_model_param(w->m, s->param);
        char name[TR_PARAM_NAME_MAX + 16];
        slice_names(p, s, name, sizeof(name), keys[i], sizeof(keys[i]));
        t[i] = (tr_st_tensor){.name = keys[i], .ndim = p->ndim,
                              .shape = {s->shape[0], s->shape[1]},
                              .data = w->snap + s->offset};
        s->crc = tr_crc32c(0, t[i].data, s->count * sizeof(float));
    }
    char file[32], stepbuf[32], rankbuf[16], worldbuf[16];
    snprintf(file, sizeof(file), "rank_%05d.safetensors", w->o.rank);
    snprintf(stepbuf, sizeof(stepbuf), "%ld", sm->step);
    snprintf(rankbuf, sizeof(rankbuf), "%d", w->o.rank);
    snprintf(worldbuf, sizeof(worldbuf), "%d", world);
    const char *meta[] = {"format", CKPT_FORMAT, "step", stepbuf, "rank", rankbuf,
                          "world", worldbuf, NULL};
    snprintf(path, sizeof(path), "%s/%s", tmp, file);
    size_t hlen;
    unsigned char *h = st_header(t, w->n_sl, meta, &hlen);
    const void *parts[2] = {h, w->snap};
    size_t lens[2] = {hlen, w->snap_floats * sizeof(float)};
    int rc = write_file(path, parts, lens, 2, err, errlen);
    free(h);
    free(t);
    free(keys);
    if (rc) return -1;
    *bytes = hlen + lens[1];
    if (w->o.rank > 0) return write_part(w, tmp, *bytes, NULL, err, errlen);
    /* rank 0: every rank's blocks, then the manifest */
    size_t *fbytes = calloc((size_t)world, sizeof(size_t));
    int n_all = w->n_sl, cap = w->n_sl ? w->n_sl : 1;
    slice_info *all = malloc((size_t)cap * sizeof(slice_info));
    memcpy(all, w->sl, (size_t)w->n_sl * sizeof(slice_info));
    fbytes[0] = *bytes;
    for (int r = 1; r < world && !rc; r++) {
        rc = read_part(w, tmp, r, &all, &n_all, &cap, &fbytes[r], err, errlen);
        *bytes += fbytes[r];
    }
    if (!rc) {
        qsort(all, (size_t)n_all, sizeof(slice_info), cmp_slice);
        size_t mlen;
        char *man = manifest_text(w->seed, w->recipe_text, w->sha, &w->desc, w->m, sm, all, n_all,
                                  fbytes, world, w->o.zero, &mlen);
        if (!man) {
            rc = ck_fail(err, errlen, "cannot format the manifest (libyaml emitter error)");
        } else {
            snprintf(path, sizeof(path), "%s/manifest.yaml", tmp);
            const void *mp[1] = {man};
            size_t ml[1] = {mlen};
            rc = write_file(path, mp, ml, 1, err, errlen);
            free(man);
            *bytes += mlen;
        }
    }
    free(all);
    free(fbytes);
    if (rc) return -1;
    for (int r = 1; r < world; r++) { /* the lists served their purpose */
        part_path(path, sizeof(path), tmp, r);
        unlink(path);
    }
    /* publish: the folder by rename, then `latest` by rename */
    if (fsync_dir(tmp)) return ck_fail(err, errlen, "cannot sync '%s': %s", tmp, strerror(errno));
    remove_dir(fin); /* an older save of the same step (a resumed run redoing it) */
    if (rename(tmp, fin))
        return ck_fail(err, errlen, "cannot rename '%s': %s", tmp, strerror(errno));
    fsync_dir(w->ckdir);
    char latest[64];
    snprintf(latest, sizeof(latest), "step_%08ld\n", sm->step);
    snprintf(path, sizeof(path), "%s/latest.tmp", w->ckdir);
    const void *lp[1] = {latest};
    size_t ll[1] = {strlen(latest)};
    if (write_file(path, lp, ll, 1, err, errlen)) return -1;
    snprintf(tmp, sizeof(tmp), "%s/latest", w->ckdir);
    if (rename(path, tmp)) return ck_fail(err, errlen, "cannot rename '%s': %s", path, strerror(errno));
    fsync_dir(w->ckdir);
    /* retention: only now that a newer one is complete */
    long *steps;
    int n = list_steps(w->ckdir, &steps);
    for (int i = 0, kept = 0; i < n; i++) {
        if (steps[i] > sm->step) continue; /* from a run this one resumed past: leave it */
        if (++kept <= w->o.keep) continue;
        snprintf(path, sizeof(path), "%s/step_%08ld", w->ckdir, steps[i]);
        remove_dir(path);
    }
    free(steps);
    return 0;
}

static void *writer_main(void *arg) {
    tr_ckpt_writer *w = arg;
    pthread_mutex_lock(&w->mu);
    for (;;) {
        while (w->state == W_IDLE && !w->quit) pthread_cond_wait(&w->cv, &w->mu);
        if (w->state == W_IDLE && w->quit) break;
        if (w->state == W_COPY) {
            pthread_mutex_unlock(&w->mu);
            copy_state(w);
            pthread_mutex_lock(&w->mu);
            w->state = W_WRITE;
            pthread_cond_broadcast(&w->cv);
        }
        pthread_mutex_unlock(&w->mu);
        double t0 = tr_now();
        char err[512];
        size_t bytes = 0;
        int rc = write_checkpoint(w, &bytes, err, sizeof(err));
        double dt = tr_now() - t0;
        if (rc) {
            char tmp[TR_PATH_MAX + 64], err2[512];
            snprintf(tmp, sizeof(tmp), "%s/.tmp_step_%08ld", w->ckdir, w->meta.step);
            if (w->o.rank == 0)
                remove_dir(tmp);
            else /* tell rank 0, which publishes, rather than leave it waiting */
                write_part(w, tmp, 0, err, err2, sizeof(err2));
            if (w->o.world > 1)
                fprintf(stderr, "\ntrainer: rank %d: checkpoint of step %ld not saved: %s\n",
                        w->o.rank, w->meta.step, err);
            else
                fprintf(stderr, "\ntrainer: checkpoint of step %ld not saved: %s\n",
                        w->meta.step, err);
        }
        pthread_mutex_lock(&w->mu);
        if (rc) {
            w->stats.failed++;
            if (snprintf(w->err, sizeof(w->err), "checkpoint of step %ld not saved: %s",
                         w->meta.step, err) < 0)
                w->err[0] = 0;
        } else {
            w->stats.saves++;
            w->stats.bytes = bytes;
        }
        w->stats.write_s += dt;
        w->stats.last_write_s = dt;
        w->state = W_IDLE;
        pthread_cond_broadcast(&w->cv);
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

int tr_ckpt_writer_init(tr_ckpt_writer **out, tr_model *m, const tr_recipe *recipe,
                        const tr_ckpt_opts *opts, char *err, size_t errlen) {
    *out = NULL;
    tr_ckpt_writer *w = calloc(1, sizeof(*w));
    if (!w) return ck_fail(err, errlen, "checkpoints: out of memory");
    w->m = m;
    w->o = *opts;
    if (w->o.keep < 1) w->o.keep = 1;
    if (w->o.world < 1) w->o.world = 1;
    w->desc = *tr_model_desc_of(m);
    w->seed = recipe->train.seed;
    snprintf(w->out, sizeof(w->out), "%s", opts->out);
    snprintf(w->ckdir, sizeof(w->ckdir), "%s/checkpoints", opts->out);
    if (tr_mkdirs(w->ckdir, err, errlen)) {
        free(w);
        return -1;
    }
    /* leftovers of a save that was killed: never taken by a resume, removed here (by rank 0:
       the others may be writing into a new one once training runs) */
    DIR *d = w->o.rank == 0 ? opendir(w->ckdir) : NULL;
    if (d) {
        struct dirent *e;
        while ((e = readdir(d))) {
            if (strncmp(e->d_name, ".tmp_step_", 10) != 0) continue;
            char p[TR_PATH_MAX + 300];
            snprintf(p, sizeof(p), "%s/%s", w->ckdir, e->d_name);
            remove_dir(p);
        }
        closedir(d);
    }
    FILE *mf = open_memstream(&w->recipe_text, &w->recipe_len);
    tr_recipe_write_lua(recipe, mf);
    fclose(mf);
    tr_sha256_hex(w->recipe_text, w->recipe_len, w->sha);
    w->n_params = tr_model_num_params(m);
    /* this rank's blocks: every tensor's part inside each of its slab ranges, for the
       parameters, m and v */
    size_t whole[2] = {0, tr_model_slab_elements(m)};
    const size_t *rg = opts->ranges ? opts->ranges : whole;
    int n_rg = opts->ranges ? opts->n_ranges : 1, cap = 0;
    for (int kind = -1; kind <= 1; kind++)
        for (int r = 0; r < n_rg; r++)
            for (int i = 0; i < w->n_params; i++) {
                const tr_param *p = tr_model_param(m, i);
                size_t lo = rg[2 * r] > p->offset ? rg[2 * r] : p->offset;
                size_t hi = rg[2 * r + 1] < p->offset + p->numel ? rg[2 * r + 1] : p->offset + p->numel;
                if (lo < hi && add_blocks(&w->sl, &w->n_sl, &cap, p, i, kind, w->o.rank,
                                          lo - p->offset, hi - p->offset)) {
                    free(w->sl);
                    free(w->recipe_text);
                    free(w);
                    return ck_fail(err, errlen, "checkpoints: out of memory");
                }
            }
    size_t off = 0;
    for (int i = 0; i < w->n_sl; i++) {
        w->sl[i].offset = off;
        off += w->sl[i].count;
    }
    w->o.ranges = NULL; /* the caller's, used only here */
    w->snap_floats = off;
    w->snap = malloc(off * sizeof(float) + 1);
    if (!w->snap) {
        free(w->sl);
        free(w->recipe_text);
        free(w);
        return ck_fail(err, errlen, "checkpoints: cannot allocate the host copy (%zu bytes)",
                       off * sizeof(float));
    }
    const char *hang = getenv("TR_FAULT_SAVE_HANG");
    fault_hang = hang && *hang && strcmp(hang, "0");
    const char *fault = getenv("TR_FAULT_SAVE_BYTES");
    if (fault && *fault) {
        char *end;
        errno = 0;
        fault_left = strtoll(fault, &end, 10);
        if (errno || *end || fault_left < 0) {
            fault_left = -1;
            free(w->snap); /* not started: no thread, mutex or condition yet */
            free(w->sl);
            free(w->recipe_text);
            free(w);
            return ck_fail(err, errlen, "TR_FAULT_SAVE_BYTES must be a byte count, got '%s'", fault);
        }
    }
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    if (pthread_create(&w->thread, NULL, writer_main, w)) {
        tr_ckpt_writer_free(w);
        return ck_fail(err, errlen, "checkpoints: cannot start the writer thread");
    }
    w->started = 1;
    *out = w;
    return 0;
}

/* With w->mu held: wait until the writer is idle (or past W_COPY when `copy_only`), at most
 * save_limit. A writer stuck past it (a hung disk) cannot be stopped or joined: one line,
 * and the process exits, so that the job ends instead of hanging. */
static void wait_writer(tr_ckpt_writer *w, int copy_only) {
    double limit = save_limit(w), t0 = tr_now();
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += (time_t)limit + 1;
    while (copy_only ? w->state == W_COPY : w->state != W_IDLE) {
        if (pthread_cond_timedwait(&w->cv, &w->mu, &until) == ETIMEDOUT &&
            (copy_only ? w->state == W_COPY : w->state != W_IDLE)) {
            fflush(stdout);
            char who[32] = "";
            if (w->o.world > 1) snprintf(who, sizeof(who), "rank %d: ", w->o.rank);
            fprintf(stderr, "\ntrainer: %sthe checkpoint of step %ld is still being written "
                    "after %.0f s (a hung disk or file system?): stopping\n", who, w->meta.step,
                    tr_now() - t0);
            fflush(stderr);
            _exit(1);
        }
    }
}

double tr_ckpt_save(tr_ckpt_writer *w, long step, const tr_loader_pos *pos) {
    double t0 = tr_now();
    pthread_mutex_lock(&w->mu);
    if (w->state != W_IDLE) {
        wait_writer(w, 0);
        if (tr_now() - t0 >= 0.005)
            fprintf(stderr, "\ntrainer: step %ld waited %.2f s for the previous checkpoint to be "
                            "written (save less often: train.checkpoint_every)\n",
                    step, tr_now() - t0);
    }
    w->meta.step = step;
    w->meta.adam_steps = tr_model_adam_steps(w->m);
    memset(&w->meta.pos, 0, sizeof(w->meta.pos));
    if (pos) w->meta.pos = *pos;
    if (w->o.overlap && !w->o.sync) {
        w->state = W_COPY;
        pthread_cond_broadcast(&w->cv);
        pthread_mutex_unlock(&w->mu);
    } else {
        pthread_mutex_unlock(&w->mu);
        copy_state(w);
        pthread_mutex_lock(&w->mu);
        w->state = W_WRITE;
        pthread_cond_broadcast(&w->cv);
        if (w->o.sync) wait_writer(w, 0);
        pthread_mutex_unlock(&w->mu);
    }
    double dt = tr_now() - t0;
    w->stats.stall_s += dt;
    return dt;
}

double tr_ckpt_fence(tr_ckpt_writer *w) {
    if (!w) return 0;
    double t0 = tr_now();
    pthread_mutex_lock(&w->mu);
    wait_writer(w, 1);
    pthread_mutex_unlock(&w->mu);
    double dt = tr_now() - t0;
    w->stats.stall_s += dt;
    return dt;
}

int tr_ckpt_wait(tr_ckpt_writer *w, char *err, size_t errlen) {
    if (!w) return 0;
    pthread_mutex_lock(&w->mu);
    wait_writer(w, 0);
    int rc = w->stats.failed ? -1 : 0;
    if (rc) snprintf(err, errlen, "%s", w->err);
    pthread_mutex_unlock(&w->mu);
    return rc;
}

tr_ckpt_stats tr_ckpt_writer_stats(const tr_ckpt_writer *w) {
    return w->stats;
}

void tr_ckpt_writer_free(tr_ckpt_writer *w) {
    if (!w) return;
    if (w->started) {
        pthread_mutex_lock(&w->mu);
        wait_writer(w, 0);
        w->quit = 1;
        pthread_cond_broadcast(&w->cv);
        pthread_mutex_unlock(&w->mu);
        pthread_join(w->thread, NULL);
    }
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv);
    free(w->snap);
    free(w->sl);
    free(w->recipe_text);
    free(w);
}

/* ---- reading ----------------------------------------------------------------------------------- */

static yaml_node_t *ymap_get(yaml_document_t *d, yaml_node_t *map, const char *key) {
    if (!map || map->type != YAML_MAPPING_NODE) return NULL;
    for (yaml_node_pair_t *p = map->data.mapping.pairs.start; p < map->data.mapping.pairs.top; p++) {
        yaml_node_t *k = yaml_document_get_node(d, p->key);
        if (k && k->type == YAML_SCALAR_NODE && !strcmp((const char *)k->data.scalar.value, key))
            return yaml_document_get_node(d, p->value);
    }
    return NULL;
}

static const char *yscalar(yaml_node_t *n) {
    return n && n->type == YAML_SCALAR_NODE ? (const char *)n->data.scalar.value : NULL;
}

static int yseq_len(yaml_node_t *n) {
    return n && n->type == YAML_SEQUENCE_NODE
               ? (int)(n->data.sequence.items.top - n->data.sequence.items.start)
               : -1;
}

static yaml_node_t *yseq_at(yaml_document_t *d, yaml_node_t *n, int i) {
    return yaml_document_get_node(d, n->data.sequence.items.start[i]);
}

/* A 1- or 2-element list; a 1-D one gets `fill` as its second element. */
static int yshape(yaml_document_t *d, yaml_node_t *n, long *shape, int *ndim, long fill) {
    int k = yseq_len(n);
    if (k < 1 || k > 2) return -1;
    *ndim = k;
    shape[1] = fill;
    for (int i = 0; i < k; i++) {
        const char *s = yscalar(yseq_at(d, n, i));
        if (!s) return -1;
        shape[i] = atol(s);
    }
    return 0;
}

void tr_ckpt_free(tr_ckpt *c) {
    if (!c) return;
    for (int i = 0; i < c->n; i++) {
        if (c->t[i].owned) free(c->t[i].data);
        free(c->t[i].blocks);
    }
    free(c->t);
    for (int i = 0; i < c->n_keys; i++) free(c->keys[i]);
    free(c->keys);
    for (int i = 0; i < c->n_files; i++) tr_st_close(&c->files[i]);
    free(c->files);
    free(c->recipe);
    memset(c, 0, sizeof(*c));
}

const tr_ckpt_tensor *tr_ckpt_find(const tr_ckpt *c, const char *name) {
    for (int i = 0; i < c->n; i++)
        if (!strcmp(c->t[i].name, name)) return &c->t[i];
    return NULL;
}

static int hexval(char h) {
    return h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10 : -1;
}

static int ckpt_read(tr_ckpt *c, const char *dir, int with_optimizer, int lazy, char *err,
                     size_t errlen);

int tr_ckpt_read(tr_ckpt *c, const char *dir, int with_optimizer, char *err, size_t errlen) {
    return ckpt_read(c, dir, with_optimizer, 0, err, errlen);
}

int tr_ckpt_read_lazy(tr_ckpt *c, const char *dir, int with_optimizer, char *err, size_t errlen) {
    return ckpt_read(c, dir, with_optimizer, 1, err, errlen);
}

int tr_ckpt_steps(const char *out, long **steps) {
    char ckdir[TR_PATH_MAX + 16];
    snprintf(ckdir, sizeof(ckdir), "%s/checkpoints", out);
    return list_steps(ckdir, steps);
}

static int ckpt_read(tr_ckpt *c, const char *dir, int with_optimizer, int lazy, char *err,
                     size_t errlen) {
    memset(c, 0, sizeof(*c));
    snprintf(c->dir, sizeof(c->dir), "%s", dir);
    char path[TR_PATH_MAX + 64];
    snprintf(path, sizeof(path), "%s/manifest.yaml", dir);
    unsigned char *text = NULL;
    size_t len = 0;
    if (read_whole(path, &text, &len, err, errlen)) return -1;
    /* the last line: "# crc32c: XXXXXXXX\n" over everything before it */
    const char *tag = "# crc32c: ";
    size_t tl = strlen(tag);
    if (len < tl + 9 || text[len - 1] != '\n') {
        free(text);
        return ck_fail(err, errlen, "%s: truncated (no checksum line at the end)", path);
    }
    size_t ls = len - 1;
    while (ls > 0 && text[ls - 1] != '\n') ls--;
    unsigned want;
    if (len - ls != tl + 9 || strncmp((const char *)text + ls, tag, tl) ||
        sscanf((const char *)text + ls + tl, "%8x", &want) != 1) {
        free(text);
        return ck_fail(err, errlen, "%s: truncated or damaged (no checksum line at the end)",
                       path);
    }
    if (tr_crc32c(0, text, ls) != want) {
        free(text);
        return ck_fail(err, errlen, "%s: checksum mismatch: the file is damaged", path);
    }
    yaml_parser_t p;
    yaml_document_t doc;
    yaml_parser_initialize(&p);
    yaml_parser_set_input_string(&p, text, ls);
    if (!yaml_parser_load(&p, &doc)) {
        int rc = ck_fail(err, errlen, "%s:%zu: %s", path, p.problem_mark.line + 1,
                         p.problem ? p.problem : "YAML error");
        yaml_parser_delete(&p);
        free(text);
        return rc;
    }
    int rc = 0;
    yaml_node_t *root = yaml_document_get_root_node(&doc);
    const char *fmt = yscalar(ymap_get(&doc, root, "format"));
    const char *ver = yscalar(ymap_get(&doc, root, "version"));
    const char *step = yscalar(ymap_get(&doc, root, "step"));
    const char *adam = yscalar(ymap_get(&doc, root, "adam_steps"));
    const char *recipe = yscalar(ymap_get(&doc, root, "recipe"));
    const char *sha = yscalar(ymap_get(&doc, root, "recipe_sha256"));
    yaml_node_t *rng = ymap_get(&doc, root, "rng");
    yaml_node_t *lp = ymap_get(&doc, root, "loader_position");
    yaml_node_t *files = ymap_get(&doc, root, "files");
    yaml_node_t *tensors = ymap_get(&doc, root, "tensors");
    if (!fmt || strcmp(fmt, CKPT_FORMAT)) {
        rc = ck_fail(err, errlen, "%s: not a trainer checkpoint (format '%s', expected '%s')", path,
                     fmt ? fmt : "", CKPT_FORMAT);
        goto out;
    }
    if (!ver || atoi(ver) != CKPT_VERSION) {
        rc = ck_fail(err, errlen, "%s: checkpoint version %s, this trainer reads version %d", path,
                     ver ? ver : "?", CKPT_VERSION);
        goto out;
    }
    if (!step || !adam || !recipe || !sha || yseq_len(files) < 1 || yseq_len(tensors) < 0) {
        rc = ck_fail(err, errlen, "%s: a required field is missing (step, adam_steps, recipe, "
                     "recipe_sha256, files, tensors)", path);
        goto out;
    }
    char *end1, *end2;
    errno = 0;
    c->step = strtol(step, &end1, 10);
    c->adam_steps = strtol(adam, &end2, 10);
    if (errno || *end1 || *end2 || end1 == step || end2 == adam || c->step < 0 ||
        c->adam_steps < 0 || c->step > INT_MAX || c->adam_steps > INT_MAX) {
        rc = ck_fail(err, errlen, "%s: step '%s' and adam_steps '%s' must be counts from 0 to %d",
                     path, step, adam, INT_MAX);
        goto out;
    }
    c->seed = strtoull(yscalar(ymap_get(&doc, rng, "seed")) ? yscalar(ymap_get(&doc, rng, "seed"))
                                                           : "0",
                       NULL, 10);
    c->recipe = strdup(recipe);
    snprintf(c->recipe_sha256, sizeof(c->recipe_sha256), "%s", sha);
    {
        char got[65];
        tr_sha256_hex(c->recipe, strlen(c->recipe), got);
        if (strcmp(got, sha)) {
            rc = ck_fail(err, errlen, "%s: the recipe's SHA-256 does not match its text", path);
            goto out;
        }
    }
    const char *hex = yscalar(ymap_get(&doc, lp, "hex"));
    const char *lbytes = yscalar(ymap_get(&doc, lp, "bytes"));
    if (hex && lbytes) {
        if ((size_t)atol(lbytes) != sizeof(tr_loader_pos) || strlen(hex) != 2 * sizeof(tr_loader_pos)) {
            rc = ck_fail(err, errlen, "%s: the loader position has %s bytes, this build's has %zu "
                         "(saved by another version of trainer)", path, lbytes,
                         sizeof(tr_loader_pos));
            goto out;
        }
        unsigned char *pb = (unsigned char *)&c->loader;
        for (size_t i = 0; i < sizeof(tr_loader_pos); i++) {
            int hi = hexval(hex[2 * i]), lo = hexval(hex[2 * i + 1]);
            if (hi < 0 || lo < 0) {
                rc = ck_fail(err, errlen, "%s: damaged loader position", path);
                goto out;
            }
            pb[i] = (unsigned char)(hi << 4 | lo);
        }
        c->has_loader = 1;
    }
    /* the files */
    c->n_files = yseq_len(files);
    size_t nf = c->n_files > 0 ? (size_t)c->n_files : 1;
    c->files = calloc(nf, sizeof(tr_st_file));
    char (*fnames)[256] = calloc(nf, 256);
    for (int i = 0; i < c->n_files && !rc; i++) {
        yaml_node_t *fn = yseq_at(&doc, files, i);
        const char *name = yscalar(ymap_get(&doc, fn, "name"));
        const char *bytes = yscalar(ymap_get(&doc, fn, "bytes"));
        if (!name || strchr(name, '/') || strlen(name) >= 256) {
            rc = ck_fail(err, errlen, "%s: damaged file entry %d", path, i);
            break;
        }
        snprintf(fnames[i], 256, "%s", name);
        char fp[TR_PATH_MAX + 300];
        snprintf(fp, sizeof(fp), "%s/%s", dir, name);
        if (tr_st_open(&c->files[i], fp, err, errlen)) {
            rc = -1;
            break;
        }
        if (bytes && (size_t)atoll(bytes) != c->files[i].size)
            rc = ck_fail(err, errlen, "%s: %zu bytes, the manifest says %s (truncated or damaged)",
                         fp, c->files[i].size, bytes);
    }
    /* the tensors */
    int nt = yseq_len(tensors);
    c->t = calloc((size_t)(nt > 0 ? nt : 1), sizeof(tr_ckpt_tensor));
    for (int i = 0; i < nt && !rc; i++) {
        yaml_node_t *tn = yseq_at(&doc, tensors, i);
        const char *name = yscalar(ymap_get(&doc, tn, "name"));
        const char *dtype = yscalar(ymap_get(&doc, tn, "dtype"));
        yaml_node_t *slices = ymap_get(&doc, tn, "slices");
        tr_ckpt_tensor *t = &c->t[c->n];
        if (!name || strlen(name) >= sizeof(t->name) || !dtype || strcmp(dtype, "F32") ||
            yshape(&doc, ymap_get(&doc, tn, "shape"), t->shape, &t->ndim, 1) || yseq_len(slices) < 1) {
            rc = ck_fail(err, errlen, "%s: damaged tensor entry %d", path, i);
            break;
        }
        if (!with_optimizer && (!strncmp(name, "adam_m/", 7) || !strncmp(name, "adam_v/", 7)))
            continue;
        snprintf(t->name, sizeof(t->name), "%s", name);
        t->numel = (size_t)t->shape[0] * (size_t)t->shape[1];
        c->n++;
        size_t covered = 0;
        for (int s = 0; s < yseq_len(slices) && !rc; s++) {
            yaml_node_t *sn = yseq_at(&doc, slices, s);
            const char *file = yscalar(ymap_get(&doc, sn, "file"));
            const char *key = yscalar(ymap_get(&doc, sn, "key"));
            const char *crc = yscalar(ymap_get(&doc, sn, "crc32c"));
            long start[2], shape[2];
            int sd, hd;
            if (!file || !key || !crc ||
                yshape(&doc, ymap_get(&doc, sn, "start"), start, &sd, 0) ||
                yshape(&doc, ymap_get(&doc, sn, "shape"), shape, &hd, 1) || sd != t->ndim ||
                hd != t->ndim || start[0] < 0 || start[1] < 0 || start[0] + shape[0] > t->shape[0] ||
                start[1] + shape[1] > t->shape[1]) {
                rc = ck_fail(err, errlen, "%s: damaged slice %d of tensor '%s'", path, s, name);
                break;
            }
            int fi = -1;
            for (int k = 0; k < c->n_files; k++)
                if (!strcmp(fnames[k], file)) fi = k;
            const tr_st_entry *e = fi >= 0 ? tr_st_find(&c->files[fi], key) : NULL;
            if (!e) {
                rc = ck_fail(err, errlen, "%s: tensor '%s' is not in '%s'", path, key, file);
                break;
            }
            size_t sn_el = (size_t)shape[0] * (size_t)shape[1];
            covered += sn_el;
            if (e->dtype != TR_ST_F32) {
                rc = ck_fail(err, errlen, "%s/%s: tensor '%s' is not F32 (checkpoints are F32)",
                             dir, file, key);
                break;
            }
            if (e->end - e->begin != sn_el * 4) {
                rc = ck_fail(err, errlen, "%s/%s: tensor '%s' does not have the manifest's shape",
                             dir, file, key);
                break;
            }
            const unsigned char *src = c->files[fi].data + e->begin;
            uint32_t bcrc = (uint32_t)strtoul(crc, NULL, 16);
            if (!lazy && tr_crc32c(0, src, sn_el * 4) != bcrc) {
                rc = ck_fail(err, errlen, "%s/%s: tensor '%s' fails its checksum (the file is "
                             "damaged)", dir, file, key);
                break;
            }
            tr_ckpt_block *nb = realloc(t->blocks, (size_t)(t->n_blocks + 1) * sizeof(*nb));
            char **nk = realloc(c->keys, (size_t)(c->n_keys + 1) * sizeof(char *));
            if (nk) c->keys = nk;
            char *kd = nk ? strdup(key) : NULL;
            if (!nb || !kd) {
                if (nb) t->blocks = nb;
                free(kd);
                rc = ck_fail(err, errlen, "%s: out of memory", path);
                break;
            }
            c->keys[c->n_keys++] = kd;
            t->blocks = nb;
            t->blocks[t->n_blocks++] = (tr_ckpt_block){
                .src = src, .start = {start[0], start[1]}, .shape = {shape[0], shape[1]},
                .crc = bcrc, .verified = !lazy, .file = c->files[fi].path, .key = kd};
        }
        if (!rc && t->n_blocks == 1 && covered == t->numel) /* one block: the tensor, in place */
            t->data = (float *)(uintptr_t)t->blocks[0].src;
        if (!rc && covered != t->numel)
            rc = ck_fail(err, errlen, "%s: the slices of tensor '%s' hold %zu of its %zu elements",
                         path, name, covered, t->numel);
    }
    free(fnames);
out:
    yaml_document_delete(&doc);
    yaml_parser_delete(&p);
    free(text);
    if (rc) tr_ckpt_free(c);
    return rc;
}

/* A block's bytes against its CRC, once (lazily read checkpoints). */
static int block_check(const tr_ckpt_tensor *t, int b, char *err, size_t errlen) {
    tr_ckpt_block *k = (tr_ckpt_block *)&t->blocks[b]; /* `verified` is a cache */
    if (k->verified) return 0;
    size_t n = (size_t)k->shape[0] * (size_t)k->shape[1] * 4;
    if (tr_crc32c(0, k->src, n) != k->crc)
        return ck_fail(err, errlen, "%s: tensor '%s' fails its checksum (the file is damaged)",
                       k->file, k->key);
    k->verified = 1;
    return 0;
}

int tr_ckpt_read_elems(const tr_ckpt_tensor *t, size_t lo, size_t hi, float *dst, char *err,
                       size_t errlen) {
    size_t cols = (size_t)t->shape[1];
    if (t->data && !t->owned) { /* one block in place */
        if (t->n_blocks == 1 && block_check(t, 0, err, errlen)) return -1;
        memcpy(dst, t->data + lo, (hi - lo) * sizeof(float));
        return 0;
    }
    if (t->data) { /* materialized: its blocks were checked then */
        memcpy(dst, t->data + lo, (hi - lo) * sizeof(float));
        return 0;
    }
    for (int b = 0; b < t->n_blocks; b++) { /* each row of each block that meets [lo, hi) */
        const tr_ckpt_block *k = &t->blocks[b];
        size_t first = (size_t)k->start[0] * cols + (size_t)k->start[1],
               last = (size_t)(k->start[0] + k->shape[0] - 1) * cols + (size_t)k->start[1] +
                      (size_t)k->shape[1];
        if (last <= lo || first >= hi) continue; /* the block cannot meet the range */
        if (block_check(t, b, err, errlen)) return -1;
        for (long r = 0; r < k->shape[0]; r++) {
            size_t a = (size_t)(k->start[0] + r) * cols + (size_t)k->start[1],
                   e = a + (size_t)k->shape[1];
            size_t x = a > lo ? a : lo, y = e < hi ? e : hi;
            if (x < y)
                memcpy(dst + (x - lo), k->src + ((size_t)r * (size_t)k->shape[1] + (x - a)) * 4,
                       (y - x) * sizeof(float));
        }
    }
    return 0;
}

int tr_ckpt_materialize(tr_ckpt *c, char *err, size_t errlen) {
    for (int i = 0; i < c->n; i++) {
        tr_ckpt_tensor *t = &c->t[i];
        if (t->data) continue;
        float *full = malloc(t->numel * sizeof(float) + 1);
        if (!full) return ck_fail(err, errlen, "%s: out of memory for tensor '%s'", c->dir, t->name);
        if (tr_ckpt_read_elems(t, 0, t->numel, full, err, errlen)) {
            free(full);
            return -1;
        }
        t->data = full;
        t->owned = 1;
    }
    return 0;
}

int tr_ckpt_apply(const tr_ckpt *c, tr_model *m, char *err, size_t errlen) {
    int np = tr_model_num_params(m);
    char name[TR_PARAM_NAME_MAX + 16];
    snprintf(name, sizeof(name), "adam_m/%s", np ? tr_model_param(m, 0)->name : "");
    int kinds = tr_ckpt_find(c, name) ? 3 : 1; /* with or without the AdamW moments */
    static const char *prefixes[3] = {"", "adam_m/", "adam_v/"};
    float *buf = NULL;
    /* check everything first, so that a mismatch changes nothing */
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < np; i++) {
            const tr_param *p = tr_model_param(m, i);
            for (int k = 0; k < kinds; k++) {
                snprintf(name, sizeof(name), "%s%s", prefixes[k], p->name);
                const tr_ckpt_tensor *t = tr_ckpt_find(c, name);
                if (!t)
                    return ck_fail(err, errlen, "%s: no tensor '%s' (the model has it)", c->dir,
                                   name);
                if (t->shape[0] != p->shape[0] || t->shape[1] != p->shape[1])
                    return ck_fail(err, errlen,
                                   "%s: tensor '%s' is %ld x %ld, the model's is %d x %d", c->dir,
                                   name, t->shape[0], t->shape[1], p->shape[0], p->shape[1]);
                if (pass == 0) continue;
                /* only the parts this process keeps, through one tensor-sized buffer */
                int kind = k - 1, np2 = tr_model_held_parts(m, i, kind, NULL, NULL, 0);
                size_t *lo = malloc(2 * (size_t)(np2 ? np2 : 1) * sizeof(size_t)), *hi = lo + np2;
                float *nb = realloc(buf, t->numel * sizeof(float) + 1);
                if (!lo || !nb) {
                    free(lo);
                    free(nb ? nb : buf);
                    return ck_fail(err, errlen, "%s: out of memory reading '%s'", c->dir, name);
                }
                buf = nb;
                tr_model_held_parts(m, i, kind, lo, hi, np2);
                int bad = 0;
                for (int j = 0; j < np2 && !bad; j++)
                    bad = tr_ckpt_read_elems(t, lo[j], hi[j], buf + lo[j], err, errlen);
                free(lo);
                if (bad) {
                    free(buf);
                    return -1;
                }
                const float *src = buf;
                if (k == 0)
                    tr_model_set_param(m, i, src);
                else
                    tr_model_set_state(m, i, k == 1 ? TR_STATE_ADAM_M : TR_STATE_ADAM_V, src);
            }
        }
    }
    free(buf);
    if (kinds == 3) tr_model_set_adam_steps(m, c->adam_steps);
    return 0;
}

int tr_ckpt_find_resume(const char *out, tr_ckpt *c, int with_optimizer, FILE *log, char *err,
                        size_t errlen) {
    char ckdir[TR_PATH_MAX + 16];
    snprintf(ckdir, sizeof(ckdir), "%s/checkpoints", out);
    long *steps;
    int n = list_steps(ckdir, &steps);
    for (int i = 0; i < n; i++) {
        char dir[TR_PATH_MAX + 64];
        snprintf(dir, sizeof(dir), "%s/step_%08ld", ckdir, steps[i]);
        char why[768];
        if (tr_ckpt_read(c, dir, with_optimizer, why, sizeof(why)) == 0) {
            free(steps);
            return 0;
        }
        if (log) fprintf(log, "skipping checkpoint %s: %s\n", dir, why);
    }
    free(steps);
    snprintf(err, errlen, "no usable checkpoint in %s/", ckdir);
    return 1;
}

int tr_ckpt_open_arg(const char *arg, tr_ckpt *c, int with_optimizer, FILE *log, char *err,
                     size_t errlen) {
    char p[TR_PATH_MAX + 32];
    struct stat st;
    snprintf(p, sizeof(p), "%s/manifest.yaml", arg);
    if (!stat(p, &st)) return tr_ckpt_read(c, arg, with_optimizer, err, errlen);
    snprintf(p, sizeof(p), "%s/checkpoints", arg);
    if (!stat(p, &st)) {
        int rc = tr_ckpt_find_resume(arg, c, with_optimizer, log, err, errlen);
        return rc ? -1 : 0;
    }
    return ck_fail(err, errlen, "%s: not a checkpoint (no manifest.yaml) nor a run folder (no "
                   "checkpoints/)", arg);
}

/* ---- recipe comparison ------------------------------------------------------------------- */

static int same_node(const tr_node *a, const tr_node *b) {
    if (a->kind != b->kind || a->repeat != b->repeat || a->n_children != b->n_children ||
        a->heads != b->heads || a->kv_heads != b->kv_heads || a->hidden != b->hidden ||
        a->activation != b->activation || a->bias != b->bias || a->eps != b->eps ||
        a->rope_theta != b->rope_theta || a->tied != b->tied)
        return 0;
    for (int i = 0; i < a->n_children; i++)
        if (!same_node(&a->children[i], &b->children[i])) return 0;
    return 1;
}

/* The text of one top-level section ("data {" ...) of a recipe as tr_recipe_write_lua writes
 * it: its first line and the indented lines after it. malloc'ed; "" when absent. */
static char *section_text(const tr_recipe *r, const char *head) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    tr_recipe_write_lua(r, f);
    fclose(f);
    size_t hl = strlen(head);
    char *s = buf, *res = NULL;
    while (s && *s) {
        if (!strncmp(s, head, hl) && (s == buf || s[-1] == '\n')) {
            char *e = s;
            do {
                e = strchr(e, '\n');
                if (!e) break;
                e++;
            } while (*e == ' ' || *e == '}');
            size_t n = e ? (size_t)(e - s) : strlen(s);
            res = malloc(n + 1);
            memcpy(res, s, n);
            res[n] = 0;
            break;
        }
        s = strchr(s, '\n');
        if (s) s++;
    }
    free(buf);
    return res ? res : strdup("");
}

/* The shortest decimal that reads back as the same float. */
static void short_float(char *buf, size_t n, float x) {
    for (int p = 6; p <= 9; p++) {
        snprintf(buf, n, "%.*g", p, (double)x);
        if (strtof(buf, NULL) == x) return;
    }
}

static void add_diff(char *list, size_t cap, const char *field, const char *was, const char *now) {
    size_t l = strlen(list);
    if (snprintf(list + l, cap - l, "%s%s (%s -> %s)", l ? ", " : "", field, was, now) < 0)
        list[l] = 0;
}

int tr_ckpt_compare_recipes(const tr_recipe *saved, const tr_recipe *now, FILE *log, char *err,
                            size_t errlen) {
    char bad[1024] = "", a[64], b[64];
    const tr_model_desc *ma = &saved->model, *mb = &now->model;
#define INT_DIFF(list, name, x, y)                                                                 \
    do {                                                                                           \
        if ((x) != (y)) {                                                                          \
            snprintf(a, sizeof a, "%lld", (long long)(x));                                         \
            snprintf(b, sizeof b, "%lld", (long long)(y));                                         \
            add_diff(list, sizeof list, name, a, b);                                               \
        }                                                                                          \
    } while (0)
#define FLT_DIFF(list, name, x, y)                                                                 \
    do {                                                                                           \
        if ((x) != (y)) {                                                                          \
            short_float(a, sizeof a, (x));                                                         \
            short_float(b, sizeof b, (y));                                                         \
            add_diff(list, sizeof list, name, a, b);                                               \
        }                                                                                          \
    } while (0)
    INT_DIFF(bad, "model.vocab", ma->vocab, mb->vocab);
    INT_DIFF(bad, "model.dim", ma->dim, mb->dim);
    INT_DIFF(bad, "model.seq_len", ma->seq_len, mb->seq_len);
    if (!same_node(&ma->root, &mb->root)) {
        size_t l = strlen(bad);
        snprintf(bad + l, sizeof(bad) - l, "%smodel layers (the layer tree differs)", l ? ", " : "");
    }
    char *da = section_text(saved, "data"), *db = section_text(now, "data");
    if (strcmp(da, db)) {
        size_t l = strlen(bad);
        snprintf(bad + l, sizeof(bad) - l, "%sdata", l ? ", " : "");
    }
    free(da);
    free(db);
    FLT_DIFF(bad, "optimizer.lr", saved->optim.lr, now->optim.lr);
    FLT_DIFF(bad, "optimizer.beta1", saved->optim.beta1, now->optim.beta1);
    FLT_DIFF(bad, "optimizer.beta2", saved->optim.beta2, now->optim.beta2);
    FLT_DIFF(bad, "optimizer.eps", saved->optim.eps, now->optim.eps);
    FLT_DIFF(bad, "optimizer.weight_decay", saved->optim.weight_decay, now->optim.weight_decay);
    FLT_DIFF(bad, "optimizer.grad_clip", saved->optim.grad_clip, now->optim.grad_clip);
    INT_DIFF(bad, "schedule.warmup", saved->schedule.warmup, now->schedule.warmup);
    if (saved->schedule.decay != now->schedule.decay) {
        static const char *decays[] = {"cosine", "linear", "constant", "wsd"};
        add_diff(bad, sizeof bad, "schedule.decay", decays[saved->schedule.decay & 3],
                 decays[now->schedule.decay & 3]);
    }
    FLT_DIFF(bad, "schedule.min_lr", saved->schedule.min_lr, now->schedule.min_lr);
    FLT_DIFF(bad, "schedule.decay_frac", saved->schedule.decay_frac, now->schedule.decay_frac);
    INT_DIFF(bad, "train.batch_tokens", saved->train.batch_tokens, now->train.batch_tokens);
    INT_DIFF(bad, "train.seed", saved->train.seed, now->train.seed);
    if (bad[0]) {
        snprintf(err, errlen, "the recipe changed in ways a resume cannot follow: %s", bad);
        return -1;
    }
    char ok[1024] = "";
    INT_DIFF(ok, "train.steps", saved->train.steps, now->train.steps);
    INT_DIFF(ok, "train.eval_every", saved->train.eval_every, now->train.eval_every);
    INT_DIFF(ok, "train.eval_tokens", saved->train.eval_tokens, now->train.eval_tokens);
    INT_DIFF(ok, "train.sample_tokens", saved->train.sample_tokens, now->train.sample_tokens);
    INT_DIFF(ok, "train.log_every", saved->train.log_every, now->train.log_every);
    INT_DIFF(ok, "train.checkpoint_every", saved->train.checkpoint_every,
             now->train.checkpoint_every);
    INT_DIFF(ok, "train.keep_checkpoints", saved->train.keep_checkpoints,
             now->train.keep_checkpoints);
    /* another micro-batch (another number of ranks, say) sums the same gradient in another
       order: the run continues exactly, up to rounding */
    INT_DIFF(ok, "train.micro_batch (the continuation then matches up to rounding, not bitwise)",
             saved->train.micro_batch, now->train.micro_batch);
    if (strcmp(saved->train.out, now->train.out))
        add_diff(ok, sizeof ok, "train.out", saved->train.out, now->train.out);
#undef INT_DIFF
#undef FLT_DIFF
    if (ok[0] && log) fprintf(log, "resume: allowed recipe changes: %s\n", ok);
    return 0;
}
