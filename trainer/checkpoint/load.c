/* Loading checkpoints: the manifest read and checked, the rank files mapped (every block's
 * CRC32C checked up front, or lazily when first read), element ranges of the global tensors,
 * applying a checkpoint to a model, and choosing the checkpoint to resume from. */
#include "trainer/checkpoint/private.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <yaml.h>

#include "dsl/yaml.h"
#include "parallel/schedule.h"

/* ---- reading -----------------------------------------------------------------------------------
 */

static yaml_node_t *ymap_get(yaml_document_t *d, yaml_node_t *map, const char *key) {
    if (!map || map->type != YAML_MAPPING_NODE) return NULL;
    for (yaml_node_pair_t *p = map->data.mapping.pairs.start; p < map->data.mapping.pairs.top;
         p++) {
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

/* A 1- or 2-element list of whole numbers from 0 to INT_MAX (a dimension or an offset: their
 * sums and products stay in range); a 1-D one gets `fill` as its second element. */
static int yshape(yaml_document_t *d, yaml_node_t *n, long *shape, int *ndim, long fill) {
    int k = yseq_len(n);
    if (k < 1 || k > 2) return -1;
    *ndim = k;
    shape[1] = fill;
    for (int i = 0; i < k; i++) {
        const char *s = yscalar(yseq_at(d, n, i));
        char *end;
        if (!s) return -1;
        errno = 0;
        shape[i] = strtol(s, &end, 10);
        if (errno || end == s || *end || shape[i] < 0 || shape[i] > INT_MAX) return -1;
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
    for (int i = 0; i < c->n_keys; i++)
        free(c->keys[i]);
    free(c->keys);
    for (int i = 0; i < c->n_files; i++)
        tr_st_close(&c->files[i]);
    free(c->files);
    free(c->recipe);
    free(c->guard.loss);
    free(c->guard.norm);
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
    return ck_resume_order(ckdir, steps, NULL);
}

/* The manifest's last line, "# crc32c: XXXXXXXX", checked against every byte before it; the
 * rest parsed into doc. */
/* Deeper than any manifest (root, tensors, a tensor, its slices, a slice, its start: 6). */
#define CKPT_MAX_DEPTH 64

static int load_manifest(const char *path, yaml_document_t *doc, char *err, size_t errlen) {
    unsigned char *text = NULL;
    size_t len = 0;
    if (ck_read_whole(path, &text, &len, err, errlen)) return -1;
    const char *tag = "# crc32c: ";
    size_t tl = strlen(tag), ls = len ? len - 1 : 0;
    while (ls > 0 && text[ls - 1] != '\n')
        ls--;
    unsigned want;
    int rc = 0;
    if (len < tl + 9 || text[len - 1] != '\n')
        rc = tr_errf(err, errlen, "%s: truncated (no checksum line at the end)", path);
    else if (len - ls != tl + 9 || strncmp((const char *)text + ls, tag, tl) ||
             sscanf((const char *)text + ls + tl, "%8x", &want) != 1)
        rc = tr_errf(err, errlen, "%s: truncated or damaged (no checksum line at the end)", path);
    else if (tr_crc32c(0, text, ls) != want)
        rc = tr_errf(err, errlen, "%s: checksum mismatch: the file is damaged", path);
    int deep = rc ? 0 : tr_yaml_too_deep((const char *)text, ls, CKPT_MAX_DEPTH);
    if (deep)
        rc = deep < 0 ? tr_errf(err, errlen, "%s: out of memory", path)
                      : tr_errf(err, errlen, "%s:%d: nested deeper than %d levels (a manifest "
                                "needs 6): not a manifest this trainer wrote", path, deep,
                                CKPT_MAX_DEPTH);
    if (!rc) { /* the document keeps copies of its scalars: parser and text can go */
        yaml_parser_t p;
        yaml_parser_initialize(&p);
        yaml_parser_set_input_string(&p, text, ls);
        if (!yaml_parser_load(&p, doc))
            rc = tr_errf(err, errlen, "%s:%zu: %s", path, p.problem_mark.line + 1,
                         p.problem ? p.problem : "YAML error");
        yaml_parser_delete(&p);
    }
    free(text);
    return rc;
}

/* The loader position: its bytes as hex. Absent: c->has_loader stays 0. */
static int read_loader(tr_ckpt *c, yaml_document_t *doc, yaml_node_t *lp, const char *path,
                       char *err, size_t errlen) {
    const char *hex = yscalar(ymap_get(doc, lp, "hex"));
    const char *lbytes = yscalar(ymap_get(doc, lp, "bytes"));
    if (!hex || !lbytes) return 0;
    if ((size_t)atol(lbytes) != sizeof(tr_loader_pos) || strlen(hex) != 2 * sizeof(tr_loader_pos))
        return tr_errf(err, errlen,
                       "%s: the loader position has %s bytes, this build's has %zu "
                       "(saved by another version of trainer)",
                       path, lbytes, sizeof(tr_loader_pos));
    unsigned char *pb = (unsigned char *)&c->loader;
    for (size_t i = 0; i < sizeof(tr_loader_pos); i++) {
        int hi = hexval(hex[2 * i]), lo = hexval(hex[2 * i + 1]);
        if (hi < 0 || lo < 0) return tr_errf(err, errlen, "%s: damaged loader position", path);
        pb[i] = (unsigned char)(hi << 4 | lo);
    }
    c->has_loader = 1;
    return 0;
}

/* A whole number from lo to hi into *v: 0, or -1 when s is none (or absent). */
static int yint(const char *s, long lo, long hi, int *v) {
    char *end;
    if (!s) return -1;
    errno = 0;
    long x = strtol(s, &end, 10);
    if (errno || end == s || *end || x < lo || x > hi) return -1;
    *v = (int)x;
    return 0;
}

/* A double as y_guard writes it (17 significant digits; nan and inf too): 0, or -1. */
static int ydouble(const char *s, double *v) {
    char *end;
    if (!s) return -1;
    *v = strtod(s, &end);
    return end == s || *end ? -1 : 0;
}

/* The guard's ring of the last accepted steps: n finite values under key, in ring order. */
static int read_ring(yaml_document_t *doc, yaml_node_t *gn, const char *key, double *out, int n,
                     const char *path, char *err, size_t errlen) {
    yaml_node_t *seq = ymap_get(doc, gn, key);
    for (int i = 0; i < n; i++) {
        const char *v = yscalar(yseq_at(doc, seq, i));
        if (ydouble(v, &out[i]) || !isfinite(out[i]))
            return tr_errf(err, errlen, "%s: guard.%s[%d] is '%s', not a finite number", path, key,
                           i, v ? v : "");
    }
    return 0;
}

/* The guard's state (tr_ckpt_guard), when the manifest has the section (c->has_guard). */
static int read_guard(tr_ckpt *c, yaml_document_t *doc, yaml_node_t *gn, const char *path,
                      char *err, size_t errlen) {
    if (!gn) return 0; /* an older trainer's checkpoint, or the guard was off */
    tr_ckpt_guard *g = &c->guard;
    const char *ik[5] = {"window", "next", "bad", "first_bad", "rolled_to"};
    int *iv[5] = {&g->window, &g->next, &g->bad, &g->first_bad, &g->rolled_to};
    const long lo[5] = {2, 0, 0, 0, -1}, hi[5] = {10000, 9999, INT_MAX, INT_MAX, INT_MAX};
    for (int k = 0; k < 5; k++) {
        const char *v = yscalar(ymap_get(doc, gn, ik[k]));
        if (yint(v, lo[k], hi[k], iv[k]))
            return tr_errf(err, errlen, "%s: guard.%s is '%s', not a whole number from %ld to %ld",
                           path, ik[k], v ? v : "", lo[k], hi[k]);
    }
    const char *ll = yscalar(ymap_get(doc, gn, "last_loss"));
    const char *ln = yscalar(ymap_get(doc, gn, "last_grad_norm"));
    if (ydouble(ll, &g->last_loss) || ydouble(ln, &g->last_norm))
        return tr_errf(err, errlen,
                       "%s: guard.last_loss '%s' or guard.last_grad_norm '%s' is "
                       "not a number",
                       path, ll ? ll : "", ln ? ln : "");
    g->n = yseq_len(ymap_get(doc, gn, "loss"));
    /* a ring not yet full has its next slot right after its values */
    if (g->n < 0 || g->n > g->window || g->n != yseq_len(ymap_get(doc, gn, "grad_norm")) ||
        g->next >= g->window || (g->n < g->window && g->next != g->n))
        return tr_errf(err, errlen,
                       "%s: guard: the lists loss and grad_norm must hold the same number of "
                       "values, at most window (%d), and next (%d) must lie in the window, right "
                       "after them while it is not full",
                       path, g->window, g->next);
    g->loss = malloc((size_t)g->window * sizeof(double));
    g->norm = malloc((size_t)g->window * sizeof(double));
    if (!g->loss || !g->norm) return tr_errf(err, errlen, "%s: out of memory", path);
    if (read_ring(doc, gn, "loss", g->loss, g->n, path, err, errlen) ||
        read_ring(doc, gn, "grad_norm", g->norm, g->n, path, err, errlen))
        return -1;
    c->has_guard = 1;
    return 0;
}

/* Format, version, step and AdamW step count, seed, recipe (against its SHA-256), loader,
 * the guard's state. */
static int read_header(tr_ckpt *c, yaml_document_t *doc, const char *path, char *err,
                       size_t errlen) {
    yaml_node_t *root = yaml_document_get_root_node(doc);
    const char *fmt = yscalar(ymap_get(doc, root, "format"));
    const char *ver = yscalar(ymap_get(doc, root, "version"));
    const char *step = yscalar(ymap_get(doc, root, "step"));
    const char *adam = yscalar(ymap_get(doc, root, "adam_steps"));
    const char *recipe = yscalar(ymap_get(doc, root, "recipe"));
    const char *sha = yscalar(ymap_get(doc, root, "recipe_sha256"));
    const char *seed = yscalar(ymap_get(doc, ymap_get(doc, root, "rng"), "seed"));
    if (!fmt || strcmp(fmt, CKPT_FORMAT))
        return tr_errf(err, errlen, "%s: not a trainer checkpoint (format '%s', expected '%s')",
                       path, fmt ? fmt : "", CKPT_FORMAT);
    if (!ver || atoi(ver) != CKPT_VERSION)
        return tr_errf(err, errlen, "%s: checkpoint version %s, this trainer reads version %d",
                       path, ver ? ver : "?", CKPT_VERSION);
    if (!step || !adam || !recipe || !sha || yseq_len(ymap_get(doc, root, "files")) < 1 ||
        yseq_len(ymap_get(doc, root, "tensors")) < 0)
        return tr_errf(err, errlen,
                       "%s: a required field is missing (step, adam_steps, recipe, "
                       "recipe_sha256, files, tensors)",
                       path);
    char *end1, *end2;
    errno = 0;
    c->step = strtol(step, &end1, 10);
    c->adam_steps = strtol(adam, &end2, 10);
    if (errno || *end1 || *end2 || end1 == step || end2 == adam || c->step < 0 ||
        c->adam_steps < 0 || c->step > INT_MAX || c->adam_steps > INT_MAX)
        return tr_errf(err, errlen,
                       "%s: step '%s' and adam_steps '%s' must be counts from 0 to "
                       "%d",
                       path, step, adam, INT_MAX);
    c->seed = strtoull(seed ? seed : "0", NULL, 10);
    c->recipe = strdup(recipe);
    snprintf(c->recipe_sha256, sizeof(c->recipe_sha256), "%s", sha);
    char got[65];
    tr_sha256_hex(c->recipe, strlen(c->recipe), got);
    if (strcmp(got, sha))
        return tr_errf(err, errlen, "%s: the recipe's SHA-256 does not match its text", path);
    if (read_loader(c, doc, ymap_get(doc, root, "loader_position"), path, err, errlen)) return -1;
    return read_guard(c, doc, ymap_get(doc, root, "guard"), path, err, errlen);
}

/* The pipeline of the parallel section (chunks > 1): its schedule, virtual stages,
 * micro-batches and chunk starts, each checked when present. A checkpoint of an older trainer
 * has none: virtual_stages is then chunks / pp (what the counts say), the schedule -1 and
 * microbatches 0 (not recorded), has_stages 0 (the cut is not known: a recipe's stages = { }
 * may have placed it anywhere). */
static int read_pipeline(tr_ckpt *c, yaml_document_t *doc, yaml_node_t *par, const char *path,
                         char *err, size_t errlen) {
    c->schedule = -1;
    if (c->chunks <= 1) return 0;
    const char *s = yscalar(ymap_get(doc, par, "schedule"));
    const char *v = yscalar(ymap_get(doc, par, "virtual_stages"));
    const char *mb = yscalar(ymap_get(doc, par, "microbatches"));
    yaml_node_t *cs = ymap_get(doc, par, "chunk_start");
    if (!s && !v && !mb && !cs) { /* an older trainer's checkpoint */
        c->virtual_stages = c->pp > 0 && c->chunks % c->pp == 0 ? c->chunks / c->pp : 0;
        return 0;
    }
    if ((c->schedule = tr_pp_kind_parse(s)) < 0)
        return tr_errf(err, errlen,
                       "%s: parallel.schedule is '%s', not gpipe, 1f1b, interleaved, zb-h1 or zb-v",
                       path, s ? s : "");
    if (yint(v, 1, TR_MAX_CHUNKS, &c->virtual_stages) || c->pp * c->virtual_stages != c->chunks)
        return tr_errf(err, errlen,
                       "%s: parallel.virtual_stages is '%s', but pp %d x virtual_stages must "
                       "be chunks %d",
                       path, v ? v : "", c->pp, c->chunks);
    if (yint(mb, 1, INT_MAX, &c->microbatches))
        return tr_errf(err, errlen, "%s: parallel.microbatches is '%s', not a count from 1",
                       path, mb ? mb : "");
    int ok = yseq_len(cs) == c->chunks + 1;
    for (int k = 0; ok && k <= c->chunks; k++)
        ok = !yint(yscalar(yseq_at(doc, cs, k)), k ? c->chunk_start[k - 1] + 1 : 0,
                   k ? INT_MAX : 0, &c->chunk_start[k]);
    if (!ok)
        return tr_errf(err, errlen,
                       "%s: parallel.chunk_start must list %d block numbers from 0, each above "
                       "the one before",
                       path, c->chunks + 1);
    c->has_stages = 1;
    return 0;
}

/* The layout that saved the checkpoint (the parallel section; absent counts stay 0). */
static int read_layout(tr_ckpt *c, yaml_document_t *doc, const char *path, char *err,
                       size_t errlen) {
    yaml_node_t *par = ymap_get(doc, yaml_document_get_root_node(doc), "parallel");
    const char *keys[6] = {"world", "dp", "tp", "pp", "chunks", "zero"};
    int *dst[6] = {&c->world, &c->dp, &c->tp, &c->pp, &c->chunks, &c->zero};
    for (int k = 0; k < 6; k++) {
        const char *v = yscalar(ymap_get(doc, par, keys[k]));
        *dst[k] = v ? atoi(v) : 0;
    }
    const char *sp = yscalar(ymap_get(doc, par, "sequence_parallel"));
    c->sequence_parallel = sp && !strcmp(sp, "true");
    if (c->chunks > TR_MAX_CHUNKS)
        return tr_errf(err, errlen, "%s: parallel.chunks is %d, more than %d", path, c->chunks,
                       TR_MAX_CHUNKS);
    return read_pipeline(c, doc, par, path, err, errlen);
}

/* Whose part file entry fn held, for a message about it: "" with one writer. */
static void file_owner(const tr_ckpt *c, yaml_document_t *doc, yaml_node_t *fn, char *buf,
                       size_t n) {
    yaml_node_t *mesh = ymap_get(doc, fn, "mesh");
    const char *rank = yscalar(ymap_get(doc, fn, "rank"));
    buf[0] = 0;
    if (c->world <= 1 || !rank) return;
    const char *d = yseq_len(mesh) == 3 ? yscalar(yseq_at(doc, mesh, 0)) : NULL;
    const char *p = d ? yscalar(yseq_at(doc, mesh, 1)) : NULL;
    const char *t = d ? yscalar(yseq_at(doc, mesh, 2)) : NULL;
    if (d && p && t)
        snprintf(buf, n,
                 " (rank %s's part: pipeline stage %s of %d, tp rank %s of %d, dp rank %s of "
                 "%d; a checkpoint needs every rank's file)",
                 rank, p, c->pp, t, c->tp, d, c->dp);
    else
        snprintf(buf, n, " (rank %s's part of %d; a checkpoint needs every rank's file)", rank,
                 c->world);
}

/* Map every rank file the manifest lists, checking its size; their names into fnames. */
static int open_files(tr_ckpt *c, yaml_document_t *doc, const char *dir, const char *path,
                      char (**fnames)[256], char *err, size_t errlen) {
    yaml_node_t *files = ymap_get(doc, yaml_document_get_root_node(doc), "files");
    c->n_files = yseq_len(files);
    size_t nf = c->n_files > 0 ? (size_t)c->n_files : 1;
    c->files = calloc(nf, sizeof(tr_st_file));
    *fnames = calloc(nf, 256);
    if (!c->files || !*fnames) return tr_errf(err, errlen, "%s: out of memory", path);
    for (int i = 0; i < c->n_files; i++) {
        yaml_node_t *fn = yseq_at(doc, files, i);
        const char *name = yscalar(ymap_get(doc, fn, "name"));
        const char *bytes = yscalar(ymap_get(doc, fn, "bytes"));
        if (!name || strchr(name, '/') || strlen(name) >= 256)
            return tr_errf(err, errlen, "%s: damaged file entry %d", path, i);
        snprintf((*fnames)[i], 256, "%s", name);
        char fp[TR_PATH_MAX + 300];
        snprintf(fp, sizeof(fp), "%s/%s", dir, name);
        if (tr_st_open(&c->files[i], fp, err, errlen)) {
            char who[256];
            file_owner(c, doc, fn, who, sizeof(who));
            size_t k = strlen(err);
            snprintf(err + k, errlen - k, "%s", who);
            return -1;
        }
        if (bytes && (size_t)atoll(bytes) != c->files[i].size)
            return tr_errf(err, errlen,
                           "%s: %zu bytes, the manifest says %s (truncated or "
                           "damaged)",
                           fp, c->files[i].size, bytes);
    }
    return 0;
}

/* What reading one tensor's blocks needs. */
typedef struct {
    tr_ckpt *c;
    yaml_document_t *doc;
    const char *dir, *path; /* the folder, its manifest */
    char (*fnames)[256];
    int lazy;
    slice_info *cov; /* the blocks' rectangles and files, for the cover check */
    int cap_cov;
} tensor_reader;

/* Block s of tensor t (its manifest node sn): found in its file, its size and (not lazy) its
 * CRC32C checked, appended to t->blocks. */
static int read_block(tensor_reader *tr, tr_ckpt_tensor *t, yaml_node_t *sn, int s, char *err,
                      size_t errlen) {
    yaml_document_t *doc = tr->doc;
    tr_ckpt *c = tr->c;
    const char *file = yscalar(ymap_get(doc, sn, "file"));
    const char *key = yscalar(ymap_get(doc, sn, "key"));
    const char *crc = yscalar(ymap_get(doc, sn, "crc32c"));
    long start[2], shape[2];
    int sd, hd;
    if (!file || !key || !crc || yshape(doc, ymap_get(doc, sn, "start"), start, &sd, 0) ||
        yshape(doc, ymap_get(doc, sn, "shape"), shape, &hd, 1) || sd != t->ndim || hd != t->ndim ||
        start[0] < 0 || start[1] < 0 || shape[0] < 1 || shape[1] < 1 ||
        start[0] + shape[0] > t->shape[0] || start[1] + shape[1] > t->shape[1])
        return tr_errf(err, errlen, "%s: damaged slice %d of tensor '%s'", tr->path, s, t->name);
    int fi = -1;
    for (int k = 0; k < c->n_files; k++)
        if (!strcmp(tr->fnames[k], file)) fi = k;
    const tr_st_entry *e = fi >= 0 ? tr_st_find(&c->files[fi], key) : NULL;
    if (!e) return tr_errf(err, errlen, "%s: tensor '%s' is not in '%s'", tr->path, key, file);
    size_t n = (size_t)shape[0] * (size_t)shape[1];
    if (e->dtype != TR_ST_F32)
        return tr_errf(err, errlen, "%s/%s: tensor '%s' is not F32 (checkpoints are F32)", tr->dir,
                       file, key);
    if (e->end - e->begin != n * 4)
        return tr_errf(err, errlen, "%s/%s: tensor '%s' does not have the manifest's shape",
                       tr->dir, file, key);
    const unsigned char *src = c->files[fi].data + e->begin;
    uint32_t bcrc = (uint32_t)strtoul(crc, NULL, 16);
    if (!tr->lazy && tr_crc32c(0, src, n * 4) != bcrc)
        return tr_errf(err, errlen,
                       "%s/%s: tensor '%s' fails its checksum (the file is "
                       "damaged)",
                       tr->dir, file, key);
    tr_ckpt_block *nb = realloc(t->blocks, (size_t)(t->n_blocks + 1) * sizeof(*nb));
    if (nb) t->blocks = nb;
    char **nk = realloc(c->keys, (size_t)(c->n_keys + 1) * sizeof(char *));
    if (nk) c->keys = nk;
    if (t->n_blocks >= tr->cap_cov) {
        tr->cap_cov = 2 * t->n_blocks + 16;
        slice_info *g = realloc(tr->cov, (size_t)tr->cap_cov * sizeof(slice_info));
        if (!g)
            nb = NULL;
        else
            tr->cov = g;
    }
    char *kd = nb && nk ? strdup(key) : NULL;
    if (!kd) return tr_errf(err, errlen, "%s: out of memory", tr->path);
    c->keys[c->n_keys++] = kd;
    tr->cov[t->n_blocks] = (slice_info){
        .ndim = t->ndim, .rank = fi, .start = {start[0], start[1]}, .shape = {shape[0], shape[1]}};
    t->blocks[t->n_blocks++] = (tr_ckpt_block){.src = src,
                                               .start = {start[0], start[1]},
                                               .shape = {shape[0], shape[1]},
                                               .crc = bcrc,
                                               .verified = !tr->lazy,
                                               .file = c->files[fi].path,
                                               .key = kd};
    return 0;
}

/* Tensor entry i (node tn): its blocks, which must hold each element once. The AdamW moments
 * are skipped without with_optimizer. */
static int read_tensor(tensor_reader *tr, yaml_node_t *tn, int i, int with_optimizer, char *err,
                       size_t errlen) {
    yaml_document_t *doc = tr->doc;
    const char *name = yscalar(ymap_get(doc, tn, "name"));
    const char *dtype = yscalar(ymap_get(doc, tn, "dtype"));
    yaml_node_t *slices = ymap_get(doc, tn, "slices");
    tr_ckpt_tensor *t = &tr->c->t[tr->c->n];
    if (!name || strlen(name) >= sizeof(t->name) || !dtype || strcmp(dtype, "F32") ||
        yshape(doc, ymap_get(doc, tn, "shape"), t->shape, &t->ndim, 1) || t->shape[0] < 1 ||
        t->shape[1] < 1 || yseq_len(slices) < 1)
        return tr_errf(err, errlen, "%s: damaged tensor entry %d", tr->path, i);
    if (!with_optimizer && (!strncmp(name, "adam_m/", 7) || !strncmp(name, "adam_v/", 7))) {
        memset(t, 0, sizeof(*t));
        return 0;
    }
    snprintf(t->name, sizeof(t->name), "%s", name);
    t->numel = (size_t)t->shape[0] * (size_t)t->shape[1];
    tr->c->n++;
    for (int s = 0; s < yseq_len(slices); s++)
        if (read_block(tr, t, yseq_at(doc, slices, s), s, err, errlen)) return -1;
    char why[512];
    if (ck_check_tensor_cover(name, t->ndim, t->shape, tr->cov, t->n_blocks, why, sizeof(why)))
        return tr_errf(err, errlen, "%s: damaged: %s", tr->path, why);
    if (t->n_blocks == 1) /* one block: the whole tensor, in place */
        t->data = (float *)(uintptr_t)t->blocks[0].src;
    return 0;
}

static int ckpt_read(tr_ckpt *c, const char *dir, int with_optimizer, int lazy, char *err,
                     size_t errlen) {
    memset(c, 0, sizeof(*c));
    snprintf(c->dir, sizeof(c->dir), "%s", dir);
    char path[TR_PATH_MAX + 64];
    snprintf(path, sizeof(path), "%s/manifest.yaml", dir);
    yaml_document_t doc;
    if (load_manifest(path, &doc, err, errlen)) return -1;
    tensor_reader tr = {.c = c, .doc = &doc, .dir = dir, .path = path, .lazy = lazy};
    int rc = read_header(c, &doc, path, err, errlen);
    if (!rc) rc = read_layout(c, &doc, path, err, errlen);
    if (!rc) rc = open_files(c, &doc, dir, path, &tr.fnames, err, errlen);
    yaml_node_t *tensors = ymap_get(&doc, yaml_document_get_root_node(&doc), "tensors");
    int nt = yseq_len(tensors);
    if (!rc && !(c->t = calloc((size_t)(nt > 0 ? nt : 1), sizeof(tr_ckpt_tensor))))
        rc = tr_errf(err, errlen, "%s: out of memory", path);
    for (int i = 0; i < nt && !rc; i++)
        rc = read_tensor(&tr, yseq_at(&doc, tensors, i), i, with_optimizer, err, errlen);
    free(tr.fnames);
    free(tr.cov);
    yaml_document_delete(&doc);
    if (rc) tr_ckpt_free(c);
    return rc;
}

/* A block's bytes against its CRC, once (lazily read checkpoints). */
static int block_check(const tr_ckpt_tensor *t, int b, char *err, size_t errlen) {
    tr_ckpt_block *k = (tr_ckpt_block *)&t->blocks[b]; /* `verified` is a cache */
    if (k->verified) return 0;
    size_t n = (size_t)k->shape[0] * (size_t)k->shape[1] * 4;
    if (tr_crc32c(0, k->src, n) != k->crc)
        return tr_errf(err, errlen, "%s: tensor '%s' fails its checksum (the file is damaged)",
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
        size_t r0 = (size_t)k->start[0], c0 = (size_t)k->start[1], h = (size_t)k->shape[0],
               w = (size_t)k->shape[1];
        size_t first = r0 * cols + c0, last = (r0 + h - 1) * cols + c0 + w;
        if (last <= lo || first >= hi) continue; /* the block cannot meet the range */
        if (block_check(t, b, err, errlen)) return -1;
        if (w == cols) { /* whole rows: contiguous in the tensor too */
            size_t x = first > lo ? first : lo, y = last < hi ? last : hi;
            memcpy(dst + (x - lo), k->src + (x - first) * 4, (y - x) * sizeof(float));
            continue;
        }
        /* only the block's rows that can meet [lo, hi) (first < hi: (hi - 1) / cols >= r0) */
        size_t ra = lo / cols > r0 ? lo / cols - r0 : 0, rb = (hi - 1) / cols - r0 + 1;
        for (size_t r = ra; r < (rb < h ? rb : h); r++) {
            size_t a = (r0 + r) * cols + c0, e = a + w;
            size_t x = a > lo ? a : lo, y = e < hi ? e : hi;
            if (x < y)
                memcpy(dst + (x - lo), k->src + (r * w + (x - a)) * 4, (y - x) * sizeof(float));
        }
    }
    return 0;
}

int tr_ckpt_materialize(tr_ckpt *c, char *err, size_t errlen) {
    for (int i = 0; i < c->n; i++) {
        tr_ckpt_tensor *t = &c->t[i];
        if (t->data) continue;
        float *full = malloc(t->numel * sizeof(float) + 1);
        if (!full)
            return tr_errf(err, errlen, "%s: out of memory for tensor '%s'", c->dir, t->name);
        if (tr_ckpt_read_elems(t, 0, t->numel, full, err, errlen)) {
            free(full);
            return -1;
        }
        t->data = full;
        t->owned = 1;
    }
    return 0;
}

/* The parts of checkpoint tensor t that this process keeps of model tensor i (parameters:
 * kind -1, AdamW moment: 0, 1) into buf at their local places: each held local range as the
 * runs where it lies in the global tensor (tr_param_runs). */
static int read_held(const tr_ckpt *c, const tr_ckpt_tensor *t, const tr_model *m, int i, int kind,
                     float *buf, char *err, size_t errlen) {
    const tr_param *p = tr_model_param(m, i);
    int n = tr_model_held_parts(m, i, kind, NULL, NULL, 0), bad = 0;
    size_t *lo = malloc(2 * (size_t)(n ? n : 1) * sizeof(size_t)), *hi = lo + n;
    tr_run run[64];
    if (!lo) return tr_errf(err, errlen, "%s: out of memory reading '%s'", c->dir, t->name);
    tr_model_held_parts(m, i, kind, lo, hi, n);
    for (int j = 0; j < n && !bad; j++)
        for (size_t a = lo[j]; a < hi[j] && !bad;) {
            int k = tr_param_runs(p, a, hi[j], run, 64);
            if (k <= 0) break;
            if (k > 64) k = 64;
            for (int r = 0; r < k && !bad; r++)
                bad = tr_ckpt_read_elems(t, run[r].global, run[r].global + run[r].n,
                                         buf + run[r].local, err, errlen);
            a = run[k - 1].local + run[k - 1].n;
        }
    free(lo);
    return bad ? -1 : 0;
}

int tr_ckpt_apply(const tr_ckpt *c, tr_model *m, char *err, size_t errlen) {
    int np = tr_model_num_params(m);
    char name[TR_PARAM_NAME_MAX + 16];
    snprintf(name, sizeof(name), "adam_m/%s", np ? tr_model_param(m, 0)->name : "");
    int kinds = tr_ckpt_find(c, name) ? 3 : 1; /* with or without the AdamW moments */
    static const char *prefixes[3] = {"", "adam_m/", "adam_v/"};
    size_t most = 1;
    /* check everything first, so that a mismatch changes nothing */
    for (int i = 0; i < np; i++) {
        const tr_param *p = tr_model_param(m, i);
        for (int k = 0; k < kinds; k++) {
            snprintf(name, sizeof(name), "%s%s", prefixes[k], p->name);
            const tr_ckpt_tensor *t = tr_ckpt_find(c, name);
            if (!t)
                return tr_errf(err, errlen, "%s: no tensor '%s' (the model has it)", c->dir, name);
            if (t->shape[0] != p->gshape[0] || t->shape[1] != p->gshape[1])
                return tr_errf(err, errlen, "%s: tensor '%s' is %ld x %ld, the model's is %d x %d",
                               c->dir, name, t->shape[0], t->shape[1], p->gshape[0], p->gshape[1]);
        }
        if (p->numel > most) most = p->numel;
    }
    /* only the parts this process keeps, through one buffer of the largest local tensor */
    float *buf = malloc(most * sizeof(float));
    if (!buf) return tr_errf(err, errlen, "%s: out of memory (%zu floats)", c->dir, most);
    int rc = 0;
    for (int i = 0; i < np && !rc; i++)
        for (int k = 0; k < kinds && !rc; k++) {
            snprintf(name, sizeof(name), "%s%s", prefixes[k], tr_model_param(m, i)->name);
            rc = read_held(c, tr_ckpt_find(c, name), m, i, k - 1, buf, err, errlen);
            if (!rc && k == 0) tr_model_set_param(m, i, buf);
            if (!rc && k > 0)
                tr_model_set_state(m, i, k == 1 ? TR_STATE_ADAM_M : TR_STATE_ADAM_V, buf);
        }
    free(buf);
    if (!rc && kinds == 3) tr_model_set_adam_steps(m, c->adam_steps);
    return rc;
}

int tr_ckpt_find_resume(const char *out, tr_ckpt *c, int with_optimizer, FILE *log, char *err,
                        size_t errlen) {
    char ckdir[TR_PATH_MAX + 16];
    snprintf(ckdir, sizeof(ckdir), "%s/checkpoints", out);
    long *steps;
    int n = ck_resume_order(ckdir, &steps, log);
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

/* A folder with no checkpoints/: a run folder (its recipe.lua says why it has none), else
 * neither a checkpoint nor a run. */
static int no_checkpoints(const char *arg, char *err, size_t errlen) {
    char p[TR_PATH_MAX + 32], why[512];
    struct stat st;
    snprintf(p, sizeof(p), "%s/recipe.lua", arg);
    if (stat(p, &st))
        return tr_errf(err, errlen,
                       "%s: not a checkpoint (no manifest.yaml) nor a run folder (no "
                       "checkpoints/ or recipe.lua)",
                       arg);
    tr_recipe r;
    int every = -1;
    if (!tr_recipe_load(&r, p, NULL, 0, why, sizeof(why))) {
        every = r.train.checkpoint_every;
        tr_recipe_free(&r);
    }
    if (every == 0)
        return tr_errf(err, errlen,
                       "%s has no checkpoint: the recipe saves none (checkpoint_every 0); rerun "
                       "with --set checkpoint_every=N (or train { checkpoint_every = N })",
                       arg);
    if (every > 0)
        return tr_errf(err, errlen,
                       "%s has no checkpoint: the run stopped before its first save "
                       "(checkpoint_every %d); continue it with trainer run %s/recipe.lua "
                       "--resume",
                       arg, every, arg);
    return tr_errf(err, errlen, "%s has no checkpoint (no checkpoints/)", arg);
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
    return no_checkpoints(arg, err, errlen);
}
