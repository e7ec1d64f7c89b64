/* Checkpoint plumbing shared by saving and loading: CRC32C and SHA-256, whole-file writes that
 * appear atomically (and the fault injection tests use to crash or hang them), reads, folder
 * listing and removal, and safetensors files (reading with their header checked, writing). */
#include "trainer/checkpoint/private.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#if defined(__SSE4_2__) && defined(__x86_64__)
#include <nmmintrin.h>
#endif

/* ---- CRC-32C ------------------------------------------------------------------------------ */

static uint32_t crc_table[256];
static pthread_once_t crc_once = PTHREAD_ONCE_INIT;

static void crc_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
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
    while (n--)
        crc = _mm_crc32_u8(crc, *p++);
#else
    pthread_once(&crc_once, crc_init);
    while (n--)
        crc = crc_table[(crc ^ *p++) & 0xff] ^ (crc >> 8);
#endif
    (void)crc_once;
    (void)crc_init;
    return ~crc;
}

/* ---- SHA-256 (FIPS 180-4) ------------------------------------------------------------------ */

static const uint32_t sha_k[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

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
    for (; left >= 64; left -= 64, p += 64)
        sha_block(h, p);
    unsigned char last[128] = {0};
    memcpy(last, p, left);
    last[left] = 0x80;
    size_t blocks = left + 9 > 64 ? 2 : 1;
    uint64_t bits = (uint64_t)n * 8;
    for (int i = 0; i < 8; i++)
        last[blocks * 64 - 1 - i] = (unsigned char)(bits >> (8 * i));
    for (size_t i = 0; i < blocks; i++)
        sha_block(h, last + 64 * i);
    for (int i = 0; i < 8; i++)
        snprintf(hex + 8 * i, 9, "%08x", h[i]);
}

/* ---- files ---------------------------------------------------------------------------------- */

/* Fault injection for tests (ck_fault_init): TR_FAULT_SAVE_BYTES=N aborts the process once
 * the writer has written N bytes of a checkpoint (a crash in the middle of a save). */
static long long fault_left = -1;
static int
    fault_hang; /* TR_FAULT_SAVE_HANG=1: the writer's first write never returns (a hung disk) */

static int write_all(int fd, const void *buf, size_t n) {
    const char *p = buf;
    while (n > 0) {
        size_t chunk = n > (64u << 20) ? (64u << 20) : n;
        while (fault_hang)
            pause(); /* signals end it, as they would a write to a hung disk */
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

void ck_fault_init(long long fault_bytes, int fault_hang_on) {
    fault_left = fault_bytes > 0 ? fault_bytes : -1;
    fault_hang = fault_hang_on;
}

int ck_fsync_dir(const char *dir) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY);
    if (fd < 0) return -1;
    int rc = fsync(fd);
    close(fd);
    return rc;
}

/* A checkpoint's files are inside a temporary folder as well; an exported model has no other
 * protection than the rename. */
int ck_write_file(const char *path, const void *const *parts, const size_t *lens, int n, char *err,
                  size_t errlen) {
    char tmp[TR_PATH_MAX + 64];
    if (snprintf(tmp, sizeof(tmp), "%s.tmp%ld", path, (long)getpid()) >= (int)sizeof(tmp))
        return tr_errf(err, errlen, "cannot create '%s': path too long", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) return tr_errf(err, errlen, "cannot create '%s': %s", path, strerror(errno));
    for (int i = 0; i < n; i++) {
        if (write_all(fd, parts[i], lens[i])) {
            int e = errno;
            close(fd);
            unlink(tmp);
            return tr_errf(err, errlen, "cannot write '%s': %s", path, strerror(e));
        }
    }
    int bad = fsync(fd);
    bad |= close(fd);
    if (bad || rename(tmp, path)) {
        int e = errno;
        unlink(tmp);
        return tr_errf(err, errlen, "cannot write '%s': %s", path, strerror(e));
    }
    return 0;
}

/* path opened read-only, with its size; -1 and err naming the file otherwise */
static int open_sized(const char *path, size_t *size, char *err, size_t errlen) {
    int fd = open(path, O_RDONLY | O_NONBLOCK); /* a FIFO is refused below, not waited on */
    if (fd < 0) return tr_errf(err, errlen, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st)) {
        close(fd);
        return tr_errf(err, errlen, "%s: cannot stat: %s", path, strerror(errno));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return tr_errf(err, errlen, "%s: not a regular file", path);
    }
    *size = (size_t)st.st_size;
    return fd;
}

int ck_read_whole(const char *path, unsigned char **buf, size_t *size, char *err, size_t errlen) {
    size_t n;
    int fd = open_sized(path, &n, err, errlen);
    if (fd < 0) return -1;
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        close(fd);
        return tr_errf(err, errlen, "%s: cannot read: %s", path, strerror(errno));
    }
    char *text;
    int rc = tr_read_all(f, SIZE_MAX, &text, size), e = errno;
    fclose(f);
    if (rc && e == ENOMEM) return tr_errf(err, errlen, "%s: out of memory (%zu bytes)", path, n);
    if (rc) return tr_errf(err, errlen, "%s: cannot read: %s", path, strerror(e));
    if (*size < n) {
        free(text);
        return tr_errf(err, errlen, "%s: cannot read: file shrank while reading", path);
    }
    *buf = (unsigned char *)text;
    return 0;
}

void ck_remove_dir(const char *dir) {
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
    if (p == MAP_FAILED) return tr_errf(err, errlen, "%s: cannot map: %s", path, strerror(errno));
    *buf = p;
    return 0;
}

/* A header count (a dimension or an offset): a JSON number, whole, from 0 to max. */
static int st_count(const tr_json *v, size_t max) {
    return v->type == TR_JSON_NUM && v->num >= 0 && v->num <= (double)max &&
           v->num == floor(v->num);
}

int tr_st_open(tr_st_file *f, const char *path, char *err, size_t errlen) {
    memset(f, 0, sizeof(*f));
    snprintf(f->path, sizeof(f->path), "%s", path);
    if (map_whole(path, &f->buf, &f->size, err, errlen)) return -1;
    if (f->size < 8) {
        tr_st_close(f);
        return tr_errf(err, errlen, "%s: truncated (%zu bytes, not a safetensors file)", path,
                       f->size);
    }
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--)
        hl = hl << 8 | f->buf[i];
    if (hl > f->size - 8 || hl > (100u << 20)) {
        size_t size = f->size; /* tr_st_close clears it */
        tr_st_close(f);
        return tr_errf(err, errlen,
                       "%s: truncated or not safetensors (header of %llu bytes in a "
                       "file of %zu)",
                       path, (unsigned long long)hl, size);
    }
    tr_json h;
    char jerrbuf[128];
    if (tr_json_parse(&h, (const char *)f->buf + 8, (size_t)hl, jerrbuf, sizeof(jerrbuf))) {
        tr_st_close(f);
        return tr_errf(err, errlen, "%s: damaged header: %s", path, jerrbuf);
    }
    int rc = 0;
    if (h.type != TR_JSON_OBJ) rc = tr_errf(err, errlen, "%s: header is not a JSON object", path);
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
            rc = tr_errf(err, errlen, "%s: damaged header entry '%.80s'", path, t->key);
            break;
        }
        snprintf(e->name, sizeof(e->name), "%s", t->key);
        e->dtype = st_dtype(dt->str);
        e->ndim = sh->n;
        size_t numel = 1;
        int whole = st_count(&off->kids[0], f->size) && st_count(&off->kids[1], f->size);
        for (int d = 0; d < sh->n; d++) {
            whole = whole && st_count(&sh->kids[d], f->size);
            e->shape[d] = whole ? (long)sh->kids[d].num : 0;
            numel *= (size_t)e->shape[d]; /* may wrap; then the size check below fails */
        }
        if (!whole) {
            rc = tr_errf(err, errlen,
                         "%s: tensor '%.80s': shape and data_offsets must be whole numbers "
                         "from 0 to the file's size",
                         path, t->key);
            break;
        }
        e->begin = (size_t)off->kids[0].num;
        e->end = (size_t)off->kids[1].num;
        if (e->end < e->begin ||
            (e->dtype != TR_ST_OTHER && e->end - e->begin != numel * st_dtype_size(e->dtype))) {
            rc = tr_errf(err, errlen, "%s: tensor '%s': offsets do not match its shape", path,
                         e->name);
            break;
        }
        if (e->end > max_end) max_end = e->end;
        f->n++;
    }
    tr_json_free(&h);
    if (!rc && max_end > f->data_len)
        rc = tr_errf(err, errlen, "%s: truncated: data needs %zu bytes, the file holds %zu", path,
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
    case TR_ST_F32:
        memcpy(out, p, n * 4);
        return 0;
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
    case TR_ST_OTHER:
        break;
    }
    return tr_errf(err, errlen, "%s: tensor '%s' has a dtype other than F32, F16, BF16", f->path,
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
unsigned char *ck_st_header(const tr_st_tensor *t, int n, const char *const *meta,
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
    for (int i = 0; i < 8; i++)
        h[i] = (unsigned char)((uint64_t)padded >> (8 * i));
    memcpy(h + 8, json, len);
    memset(h + 8 + len, ' ', padded - len);
    free(json);
    *out_len = 8 + padded;
    return h;
}

int tr_st_write(const char *path, const tr_st_tensor *t, int n, const char *const *metadata,
                char *err, size_t errlen) {
    size_t hlen;
    unsigned char *h = ck_st_header(t, n, metadata, &hlen);
    const void **parts = malloc((size_t)(n + 1) * sizeof(void *));
    size_t *lens = malloc((size_t)(n + 1) * sizeof(size_t));
    parts[0] = h;
    lens[0] = hlen;
    for (int i = 0; i < n; i++) {
        parts[i + 1] = t[i].data;
        lens[i + 1] = (size_t)t[i].shape[0] * (size_t)(t[i].ndim > 1 ? t[i].shape[1] : 1) * 4;
    }
    int rc = ck_write_file(path, parts, lens, n + 1, err, errlen);
    free(parts);
    free(lens);
    free(h);
    return rc;
}

static int cmp_long_desc(const void *a, const void *b) {
    long x = *(const long *)a, y = *(const long *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

/* Steps of the complete checkpoints in dir (step_NNNNNNNN folders), newest first. */
int ck_list_steps(const char *dir, long **steps) {
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

/* The step `latest` names when it names one of the n complete checkpoints in steps; -1 when
 * it is missing, unreadable or names another. */
static long latest_step(const char *dir, const long *steps, int n) {
    char path[TR_PATH_MAX + 16], name[64] = "";
    snprintf(path, sizeof(path), "%s/latest", dir);
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    int got = fgets(name, sizeof(name), f) != NULL;
    fclose(f);
    long s;
    char canon[32], tail = 0;
    if (!got || sscanf(name, "step_%ld%c", &s, &tail) < 1 || (tail && tail != '\n')) return -1;
    snprintf(canon, sizeof(canon), "step_%08ld", s);
    if (strncmp(canon, name, strlen(canon))) return -1;
    for (int i = 0; i < n; i++)
        if (steps[i] == s) return s;
    return -1;
}

int ck_resume_order(const char *dir, long **steps, FILE *log) {
    int n = ck_list_steps(dir, steps);
    if (n == 0) return 0;
    long s = latest_step(dir, *steps, n);
    if (s < 0) {
        if (log)
            fprintf(log,
                    "%s/latest is missing or names no complete checkpoint: trying the newest "
                    "complete one (step %ld) first\n",
                    dir, (*steps)[0]);
        return n;
    }
    int at = 0; /* move latest's step to the front, the others keep their order */
    while ((*steps)[at] != s)
        at++;
    memmove(*steps + 1, *steps, (size_t)at * sizeof(long));
    (*steps)[0] = s;
    return n;
}

int tr_ckpt_remove_all(const char *out, char *err, size_t errlen) {
    char ckdir[TR_PATH_MAX + 16], p[TR_PATH_MAX + 300];
    snprintf(ckdir, sizeof(ckdir), "%s/checkpoints", out);
    DIR *d = opendir(ckdir);
    if (!d)
        return errno == ENOENT
                   ? 0
                   : tr_errf(err, errlen, "cannot read '%s': %s", ckdir, strerror(errno));
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) { /* only the writer's own names: a user's file stays */
        const char *s = e->d_name;
        snprintf(p, sizeof(p), "%s/%s", ckdir, s);
        if (!strncmp(s, "step_", 5) || !strncmp(s, ".tmp_step_", 10)) {
            ck_remove_dir(p);
            n += s[0] == 's';
        } else if (!strcmp(s, "latest") || !strcmp(s, "latest.tmp")) {
            unlink(p);
        }
    }
    closedir(d);
    rmdir(ckdir); /* fails, and stays, when a user's file is in it */
    long *left;
    int k = ck_list_steps(ckdir, &left);
    free(left);
    snprintf(p, sizeof(p), "%s/latest", ckdir);
    if (k > 0 || !access(p, F_OK))
        return tr_errf(err, errlen, "cannot remove the checkpoints in '%s' (permissions?)", ckdir);
    return n;
}

int tr_ckpt_remove_after(const char *out, long step, char *err, size_t errlen) {
    char ckdir[TR_PATH_MAX + 16], path[TR_PATH_MAX + 64], dst[TR_PATH_MAX + 32], latest[64];
    snprintf(ckdir, sizeof(ckdir), "%s/checkpoints", out);
    long *steps;
    int n = ck_list_steps(ckdir, &steps);
    for (int i = 0; i < n && steps[i] > step; i++) {
        snprintf(path, sizeof(path), "%s/step_%08ld", ckdir, steps[i]);
        ck_remove_dir(path);
    }
    free(steps);
    /* `latest` by rename, as a save publishes it */
    snprintf(latest, sizeof(latest), "step_%08ld\n", step);
    snprintf(path, sizeof(path), "%s/latest.tmp", ckdir);
    snprintf(dst, sizeof(dst), "%s/latest", ckdir);
    const void *lp[1] = {latest};
    size_t ll[1] = {strlen(latest)};
    if (ck_write_file(path, lp, ll, 1, err, errlen)) return -1;
    if (rename(path, dst))
        return tr_errf(err, errlen, "cannot rename '%s': %s", path, strerror(errno));
    ck_fsync_dir(ckdir);
    return 0;
}
