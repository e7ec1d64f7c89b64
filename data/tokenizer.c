/* Byte-level and GPT-2 byte-level BPE tokenizers.
 * GPT-2 (Radford et al. 2019; the published encoder.py): text is split into pieces by the
 * pattern 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+, written
 * out here as a hand-made scanner over Unicode classes; each piece's bytes are then merged,
 * lowest merge rank first (leftmost on ties), until no adjacent pair has a merge. */
#include "data/tokenizer.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "data/json.h"
#include "data/tokenizer_private.h"
#include "parallel/comm/base.h"

#define GPT2_EOT "<|endoftext|>"

struct tr_tokenizer {
    tr_tokenizer_kind kind;
    int vocab, eot;
    /* token bytes: token id's bytes are blob[off[id] .. off[id] + len[id]) */
    char *blob;
    uint32_t *off, *len;
    /* bytes -> id: open addressing, entries are id + 1 (0 = empty) */
    uint32_t *tab;
    uint32_t tab_mask;
    int byte_id[256];
    /* merges: key (left << 32 | right) -> rank and merged id */
    uint64_t *mkey;
    uint32_t *mrank, *mtok;
    uint32_t mmask;
};

static uint64_t hash_bytes(const unsigned char *s, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ULL; /* FNV-1a, then a final mix */
    for (size_t i = 0; i < n; i++)
        h = (h ^ s[i]) * 0x100000001b3ULL;
    return h ^ (h >> 29);
}

static uint64_t hash_pair(uint64_t k)
{
    k *= 0x9e3779b97f4a7c15ULL;
    return k ^ (k >> 31);
}

static int lookup(const tr_tokenizer *t, const unsigned char *s, size_t n)
{
    uint32_t h = (uint32_t)hash_bytes(s, n) & t->tab_mask;
    for (;;) {
        uint32_t e = t->tab[h];
        if (!e)
            return -1;
        uint32_t id = e - 1;
        if (t->len[id] == n && memcmp(t->blob + t->off[id], s, n) == 0)
            return (int)id;
        h = (h + 1) & t->tab_mask;
    }
}

static int merge_find(const tr_tokenizer *t, uint32_t a, uint32_t b, uint32_t *rank)
{
    uint64_t key = (uint64_t)a << 32 | b;
    uint32_t h = (uint32_t)hash_pair(key) & t->mmask;
    for (;;) {
        uint32_t r = t->mrank[h];
        if (r == UINT32_MAX)
            return -1;
        if (t->mkey[h] == key) {
            *rank = r;
            return (int)t->mtok[h];
        }
        h = (h + 1) & t->mmask;
    }
}

/* ---- loading ------------------------------------------------------------------------------ */

/* GPT-2's byte <-> printable character map: bytes 33-126, 161-172 and 174-255 stand for
 * themselves; the other 68 bytes map, in order, to U+0100 upwards. */
static void byte_map(unsigned *to_cp)
{
    int n = 0;
    for (int b = 0; b < 256; b++) {
        int keep = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
        to_cp[b] = keep ? (unsigned)b : 256u + (unsigned)n++;
    }
}

/* Map a UTF-8 string of GPT-2's printable characters back to bytes (in place); -1 when a
 * character is outside the map. */
static int unmap(const int *from_cp, char *s, size_t n, size_t *out)
{
    size_t i = 0, o = 0;
    while (i < n) {
        unsigned cp;
        int l = tr_utf8_decode((const unsigned char *)s + i, n - i, &cp);
        if (l == 0 || cp >= 512 || from_cp[cp] < 0)
            return -1;
        s[o++] = (char)from_cp[cp];
        i += (size_t)l;
    }
    *out = o;
    return 0;
}

static char *read_file(const char *path, size_t *n, char *err, size_t errlen)
{
    int fd = open(path, O_RDONLY | O_NONBLOCK); /* a FIFO is refused, not waited on */
    struct stat st;
    if (fd < 0) {
        snprintf(err, errlen, "%s: cannot read: %s", path, strerror(errno));
        return NULL;
    }
    if (fstat(fd, &st) || !S_ISREG(st.st_mode)) {
        snprintf(err, errlen, "%s: not a regular file", path);
        close(fd);
        return NULL;
    }
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        snprintf(err, errlen, "%s: cannot read: %s", path, strerror(errno));
        close(fd);
        return NULL;
    }
    char *buf;
    int rc = tr_read_all(f, SIZE_MAX, &buf, n), e = errno;
    fclose(f);
    if (rc) {
        snprintf(err, errlen, "%s: cannot read (%s)", path,
                 e == ENOMEM ? "out of memory" : "read error");
        return NULL;
    }
    return buf;
}

static int load_encoder(tr_tokenizer *t, const char *path, const int *from_cp, char *err,
                        size_t errlen)
{
    size_t n;
    char *text = read_file(path, &n, err, errlen);
    if (!text)
        return -1;
    tr_json_cur j = {.s = text, .n = n};
    int rc = -1, cap = 1 << 16, count = 0;
    size_t blob_cap = 1 << 20, blob_len = 0;
    t->blob = malloc(blob_cap);
    t->off = malloc((size_t)cap * sizeof(uint32_t));
    t->len = malloc((size_t)cap * sizeof(uint32_t));
    char *seen = calloc((size_t)cap, 1);
    char key[1024];
    if (!t->blob || !t->off || !t->len || !seen) {
        snprintf(err, errlen, "%s: out of memory", path);
        goto done;
    }
    if (tr_json_expect(&j, '{'))
        goto bad;
    tr_json_ws(&j);
    if (j.i < j.n && j.s[j.i] == '}') {
        snprintf(err, errlen, "%s: byte %zu: the vocabulary is empty", path, j.i);
        goto done;
    }
    for (;;) {
        size_t at, klen;
        tr_json_ws(&j);
        at = j.i;
        long id;
        if (tr_json_string(&j, key, sizeof key, &klen) || tr_json_expect(&j, ':') ||
            tr_json_int(&j, &id))
            goto bad;
        if (id >= cap) {
            snprintf(err, errlen, "%s: byte %zu: token id %ld is larger than %d", path, at, id,
                     cap - 1);
            goto done;
        }
        if (seen[id]) {
            snprintf(err, errlen, "%s: byte %zu: token id %ld appears twice", path, at, id);
            goto done;
        }
        size_t blen = klen;
        if (strcmp(key, GPT2_EOT) != 0 && (klen == sizeof key || unmap(from_cp, key, klen, &blen))) {
            snprintf(err, errlen, "%s: byte %zu: token is not in GPT-2's byte alphabet", path, at);
            goto done;
        }
        if (klen == sizeof GPT2_EOT - 1 && memcmp(key, GPT2_EOT, klen) == 0)
            t->eot = (int)id;
        if (blob_len + blen > blob_cap) {
            char *g = realloc(t->blob, blob_cap *= 2);
            if (!g) {
                snprintf(err, errlen, "%s: out of memory", path);
                goto done;
            }
            t->blob = g;
        }
        memcpy(t->blob + blob_len, key, blen);
        t->off[id] = (uint32_t)blob_len;
        t->len[id] = (uint32_t)blen;
        blob_len += blen;
        seen[id] = 1;
        count++;
        if (id + 1 > t->vocab)
            t->vocab = (int)id + 1;
        tr_json_ws(&j);
        if (j.i < j.n && j.s[j.i] == ',') {
            j.i++;
            continue;
        }
        if (tr_json_expect(&j, '}'))
            goto bad;
        break;
    }
    tr_json_ws(&j);
    if (j.i != j.n) {
        snprintf(err, errlen, "%s: byte %zu: unexpected text after the object", path, j.i);
        goto done;
    }
    if (count != t->vocab) {
        snprintf(err, errlen, "%s: token ids are not contiguous (%d tokens, largest id %d)", path,
                 count, t->vocab - 1);
        goto done;
    }
    rc = 0;
    goto done;
bad:
    snprintf(err, errlen, "%s: byte %zu: %s", path, j.at, j.err);
done:
    free(seen);
    free(text);
    return rc;
}

static int load_merges(tr_tokenizer *t, const char *path, const int *from_cp, char *err,
                       size_t errlen)
{
    size_t n;
    char *text = read_file(path, &n, err, errlen);
    if (!text)
        return -1;
    int rc = -1, rank = 0;
    t->mmask = (1u << 17) - 1;
    t->mkey = malloc((size_t)(t->mmask + 1) * sizeof(uint64_t));
    t->mrank = malloc((size_t)(t->mmask + 1) * sizeof(uint32_t));
    t->mtok = malloc((size_t)(t->mmask + 1) * sizeof(uint32_t));
    if (!t->mkey || !t->mrank || !t->mtok) {
        snprintf(err, errlen, "%s: out of memory", path);
        goto done;
    }
    memset(t->mrank, 0xff, (size_t)(t->mmask + 1) * sizeof(uint32_t));
    size_t i = 0;
    for (int line = 1; i < n; line++) {
        size_t e = i;
        while (e < n && text[e] != '\n')
            e++;
        size_t end = e > i && text[e - 1] == '\r' ? e - 1 : e;
        size_t len = end - i;
        char *s = text + i;
        i = e + 1;
        if (line == 1 && len >= 8 && memcmp(s, "#version", 8) == 0)
            continue;
        if (len == 0)
            continue;
        char *sp = memchr(s, ' ', len);
        size_t la, lb;
        if (!sp || sp == s || sp == s + len - 1 || memchr(sp + 1, ' ', (size_t)(s + len - sp - 1))) {
            snprintf(err, errlen, "%s:%d: expected two tokens separated by one space", path, line);
            goto done;
        }
        if (unmap(from_cp, s, (size_t)(sp - s), &la) ||
            unmap(from_cp, sp + 1, (size_t)(s + len - sp - 1), &lb)) {
            snprintf(err, errlen, "%s:%d: token is not in GPT-2's byte alphabet", path, line);
            goto done;
        }
        int a = lookup(t, (unsigned char *)s, la), b = lookup(t, (unsigned char *)sp + 1, lb);
        char joined[2048];
        memcpy(joined, s, la);
        memcpy(joined + la, sp + 1, lb);
        int m = la + lb <= sizeof joined ? lookup(t, (unsigned char *)joined, la + lb) : -1;
        if (a < 0 || b < 0 || m < 0) {
            snprintf(err, errlen, "%s:%d: merge of tokens that are not in the vocabulary", path,
                     line);
            goto done;
        }
        uint32_t r;
        if (merge_find(t, (uint32_t)a, (uint32_t)b, &r) >= 0)
            continue; /* a repeated merge keeps its first (lowest) rank */
        if ((uint32_t)rank >= t->mmask / 2) {
            snprintf(err, errlen, "%s:%d: more than %u merges", path, line, t->mmask / 2);
            goto done;
        }
        uint64_t key = (uint64_t)a << 32 | (uint32_t)b;
        uint32_t h = (uint32_t)hash_pair(key) & t->mmask;
        while (t->mrank[h] != UINT32_MAX)
            h = (h + 1) & t->mmask;
        t->mkey[h] = key;
        t->mrank[h] = (uint32_t)rank++;
        t->mtok[h] = (uint32_t)m;
    }
    if (rank == 0) {
        snprintf(err, errlen, "%s: no merges", path);
        goto done;
    }
    rc = 0;
done:
    free(text);
    return rc;
}

static int open_gpt2(tr_tokenizer *t, const char *encoder, const char *merges, char *err,
                     size_t errlen)
{
    unsigned to_cp[256];
    int from_cp[512];
    byte_map(to_cp);
    for (int i = 0; i < 512; i++)
        from_cp[i] = -1;
    for (int b = 0; b < 256; b++)
        from_cp[to_cp[b]] = b;
    t->eot = -1;
    if (!encoder || !merges) {
        snprintf(err, errlen, "gpt2 tokenizer: needs encoder.json and vocab.bpe");
        return -1;
    }
    if (load_encoder(t, encoder, from_cp, err, errlen))
        return -1;
    uint32_t size = 1;
    while (size < 2u * (uint32_t)t->vocab)
        size <<= 1;
    t->tab = calloc(size, sizeof(uint32_t));
    if (!t->tab) {
        snprintf(err, errlen, "%s: out of memory", encoder);
        return -1;
    }
    t->tab_mask = size - 1;
    for (int id = 0; id < t->vocab; id++) {
        if (id == t->eot)
            continue; /* the separator is never produced from text */
        const unsigned char *s = (const unsigned char *)t->blob + t->off[id];
        uint32_t h = (uint32_t)hash_bytes(s, t->len[id]) & t->tab_mask;
        while (t->tab[h]) {
            uint32_t o = t->tab[h] - 1;
            if (t->len[o] == t->len[id] && memcmp(t->blob + t->off[o], s, t->len[id]) == 0) {
                snprintf(err, errlen, "%s: tokens %u and %d have the same bytes", encoder, o, id);
                return -1;
            }
            h = (h + 1) & t->tab_mask;
        }
        t->tab[h] = (uint32_t)id + 1;
    }
    for (int b = 0; b < 256; b++) {
        unsigned char c = (unsigned char)b;
        t->byte_id[b] = lookup(t, &c, 1);
        if (t->byte_id[b] < 0) {
            snprintf(err, errlen, "%s: byte %d has no token", encoder, b);
            return -1;
        }
    }
    return load_merges(t, merges, from_cp, err, errlen);
}

int tr_tokenizer_open(tr_tokenizer **out, tr_tokenizer_kind kind, const char *encoder,
                      const char *merges, char *err, size_t errlen)
{
    *out = NULL;
    tr_tokenizer *t = calloc(1, sizeof *t);
    if (!t) {
        snprintf(err, errlen, "tokenizer: out of memory");
        return -1;
    }
    t->kind = kind;
    switch (kind) {
    case TR_TOKENIZER_BYTE:
        t->vocab = 256;
        t->eot = -1;
        t->blob = malloc(256);
        t->off = malloc(256 * sizeof(uint32_t));
        t->len = malloc(256 * sizeof(uint32_t));
        if (!t->blob || !t->off || !t->len) {
            snprintf(err, errlen, "tokenizer: out of memory");
            break;
        }
        for (int b = 0; b < 256; b++) {
            t->blob[b] = (char)b;
            t->off[b] = (uint32_t)b;
            t->len[b] = 1;
        }
        *out = t;
        return 0;
    case TR_TOKENIZER_GPT2:
        if (open_gpt2(t, encoder, merges, err, errlen))
            break;
        *out = t;
        return 0;
    default:
        snprintf(err, errlen, "unknown tokenizer kind %d", (int)kind);
        break;
    }
    tr_tokenizer_free(t);
    return -1;
}

void tr_tokenizer_free(tr_tokenizer *t)
{
    if (!t)
        return;
    free(t->blob);
    free(t->off);
    free(t->len);
    free(t->tab);
    free(t->mkey);
    free(t->mrank);
    free(t->mtok);
    free(t);
}

int tr_tokenizer_vocab(const tr_tokenizer *t)
{
    return t->vocab;
}

int tr_tokenizer_eot(const tr_tokenizer *t)
{
    return t->eot;
}

const char *tr_tokenizer_name(const tr_tokenizer *t)
{
    return t->kind == TR_TOKENIZER_GPT2 ? "gpt2" : "byte";
}

const char *tr_tokenizer_token(const tr_tokenizer *t, int id, size_t *len)
{
    if (id < 0 || id >= t->vocab)
        return NULL;
    *len = t->len[id];
    return t->blob + t->off[id];
}

/* ---- BPE ---------------------------------------------------------------------------------- */

typedef struct {
    uint32_t rank, left, tl, tr; /* candidate merge of symbol `left` (token tl) and its right
                                    neighbour (token tr) */
} cand;

static int cand_less(const cand *a, const cand *b)
{
    return a->rank < b->rank || (a->rank == b->rank && a->left < b->left);
}

static void heap_push(cand *h, size_t *n, cand c)
{
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!cand_less(&c, &h[p]))
            break;
        h[i] = h[p];
        i = p;
    }
    h[i] = c;
}

static cand heap_pop(cand *h, size_t *n)
{
    cand top = h[0], last = h[--*n];
    size_t i = 0;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        const cand *best = &last;
        if (l < *n && cand_less(&h[l], best))
            m = l, best = &h[l];
        if (r < *n && cand_less(&h[r], best))
            m = r;
        if (m == i)
            break;
        h[i] = h[m];
        i = m;
    }
    if (*n)
        h[i] = last;
    return top;
}

static void push_pair(const tr_tokenizer *t, cand *heap, size_t *nh, const int32_t *tok,
                      const int32_t *nxt, uint32_t left)
{
    int32_t r = nxt[left];
    if (r < 0)
        return;
    uint32_t rank;
    if (merge_find(t, (uint32_t)tok[left], (uint32_t)tok[r], &rank) >= 0)
        heap_push(heap, nh, (cand){rank, left, (uint32_t)tok[left], (uint32_t)tok[r]});
}

/* Merge the bytes of one piece into ids; returns the count. Symbols are a linked list over
 * the byte positions; candidate merges sit in a min-heap and are checked when popped (a
 * merge nearby may have made them stale), so a piece of n bytes costs O(n log n). */
static size_t bpe_piece(const tr_tokenizer *t, const unsigned char *p, size_t n, int *ids)
{
    if (n == 1) {
        ids[0] = t->byte_id[p[0]];
        return 1;
    }
    int whole = lookup(t, p, n);
    if (whole >= 0) {
        ids[0] = whole;
        return 1;
    }
    enum { SMALL = 64 };
    int32_t tok_s[SMALL], nxt_s[SMALL], prv_s[SMALL];
    cand heap_s[3 * SMALL]; /* pushes: n-1 at first, then at most 2 per merge */
    int32_t *tok = tok_s, *nxt = nxt_s, *prv = prv_s;
    cand *heap = heap_s;
    void *big = NULL;
    if (n > SMALL) {
        big = malloc(n * (3 * sizeof(int32_t) + 3 * sizeof(cand)));
        if (!big) { /* cannot merge: fall back to one token per byte, still decodable */
            for (size_t i = 0; i < n; i++)
                ids[i] = t->byte_id[p[i]];
            return n;
        }
        heap = big;
        tok = (int32_t *)(heap + 3 * n);
        nxt = tok + n;
        prv = nxt + n;
    }
    for (size_t i = 0; i < n; i++) {
        tok[i] = t->byte_id[p[i]];
        nxt[i] = i + 1 < n ? (int32_t)(i + 1) : -1;
        prv[i] = (int32_t)i - 1;
    }
    size_t nh = 0;
    for (size_t i = 0; i + 1 < n; i++)
        push_pair(t, heap, &nh, tok, nxt, (uint32_t)i);
    while (nh) {
        cand c = heap_pop(heap, &nh);
        int32_t r = nxt[c.left];
        /* stale unless the pair is still there: `left` alive, with the same tokens */
        if (tok[c.left] != (int32_t)c.tl || r < 0 || tok[r] != (int32_t)c.tr)
            continue;
        uint32_t rank;
        tok[c.left] = merge_find(t, c.tl, c.tr, &rank);
        tok[r] = -1;
        nxt[c.left] = nxt[r];
        if (nxt[r] >= 0)
            prv[nxt[r]] = (int32_t)c.left;
        if (prv[c.left] >= 0)
            push_pair(t, heap, &nh, tok, nxt, (uint32_t)prv[c.left]);
        push_pair(t, heap, &nh, tok, nxt, c.left);
    }
    size_t k = 0;
    for (int32_t i = 0; i >= 0; i = nxt[i])
        ids[k++] = tok[i];
    free(big);
    return k;
}

/* Class of the character at s[i] and its length in bytes; invalid bytes are "other". */
static inline int char_class(const unsigned char *s, size_t n, size_t i, int *len)
{
    static const unsigned char ascii[128] = {
        ['\t'] = TR_UC_SPACE, ['\n'] = TR_UC_SPACE, [0x0b] = TR_UC_SPACE, [0x0c] = TR_UC_SPACE,
        ['\r'] = TR_UC_SPACE, [0x1c] = 0xff, [0x1d] = 0xff, [0x1e] = 0xff, [0x1f] = 0xff,
        [' '] = TR_UC_SPACE,
        ['0'] = 2, ['1'] = 2, ['2'] = 2, ['3'] = 2, ['4'] = 2, ['5'] = 2, ['6'] = 2, ['7'] = 2,
        ['8'] = 2, ['9'] = 2,
        ['A'] = 1, ['B'] = 1, ['C'] = 1, ['D'] = 1, ['E'] = 1, ['F'] = 1, ['G'] = 1, ['H'] = 1,
        ['I'] = 1, ['J'] = 1, ['K'] = 1, ['L'] = 1, ['M'] = 1, ['N'] = 1, ['O'] = 1, ['P'] = 1,
        ['Q'] = 1, ['R'] = 1, ['S'] = 1, ['T'] = 1, ['U'] = 1, ['V'] = 1, ['W'] = 1, ['X'] = 1,
        ['Y'] = 1, ['Z'] = 1,
        ['a'] = 1, ['b'] = 1, ['c'] = 1, ['d'] = 1, ['e'] = 1, ['f'] = 1, ['g'] = 1, ['h'] = 1,
        ['i'] = 1, ['j'] = 1, ['k'] = 1, ['l'] = 1, ['m'] = 1, ['n'] = 1, ['o'] = 1, ['p'] = 1,
        ['q'] = 1, ['r'] = 1, ['s'] = 1, ['t'] = 1, ['u'] = 1, ['v'] = 1, ['w'] = 1, ['x'] = 1,
        ['y'] = 1, ['z'] = 1,
    };
    unsigned c = s[i];
    if (c < 0x80 && ascii[c] != 0xff) {
        *len = 1;
        return ascii[c];
    }
    unsigned cp;
    int l = tr_utf8_decode(s + i, n - i, &cp);
    if (l == 0) {
        *len = 1;
        return TR_UC_OTHER;
    }
    *len = l;
    return tr_unicode_class(cp);
}

/* Length of the next piece at s[i..n) under GPT-2's pattern. */
static size_t next_piece(const unsigned char *s, size_t n, size_t i)
{
    if (s[i] == '\'' && i + 1 < n) { /* 's 't 'm 'd 're 've 'll */
        unsigned char a = s[i + 1], b = i + 2 < n ? s[i + 2] : 0;
        if (a == 's' || a == 't' || a == 'm' || a == 'd')
            return 2;
        if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l'))
            return 3;
    }
    int l0, k0 = char_class(s, n, i, &l0);
    size_t j = i;
    int k = k0;
    if (s[i] == ' ' && i + 1 < n) { /* ` ?` before a letter, number or other run */
        int l1, k1 = char_class(s, n, i + 1, &l1);
        if (k1 != TR_UC_SPACE) {
            j = i + 1;
            k = k1;
        }
    }
    if (k != TR_UC_SPACE) {
        int l;
        while (j < n && char_class(s, n, j, &l) == k)
            j += (size_t)l;
        return j - i;
    }
    /* whitespace: \s+(?!\S) takes the run but leaves its last character to the next piece
     * when the run is followed by something; a single one then matches \s+ alone */
    size_t last = i;
    int l;
    j = i;
    while (j < n && char_class(s, n, j, &l) == TR_UC_SPACE) {
        last = j;
        j += (size_t)l;
    }
    if (j == n || last == i)
        return j - i;
    return last - i;
}

size_t tr_tokenizer_encode(const tr_tokenizer *t, const char *text, size_t n, int *ids)
{
    const unsigned char *s = (const unsigned char *)text;
    if (t->kind == TR_TOKENIZER_BYTE) {
        for (size_t i = 0; i < n; i++)
            ids[i] = s[i];
        return n;
    }
    size_t k = 0;
    for (size_t i = 0; i < n;) {
        size_t len = next_piece(s, n, i);
        k += bpe_piece(t, s + i, len, ids + k);
        i += len;
    }
    return k;
}
