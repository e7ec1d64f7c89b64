/* Loading checkpoints: the manifest read and checked, the rank files mapped (every block's
 * CRC32C checked up front, or lazily when first read), element ranges of the global tensors,
 * applying a checkpoint to a model, and choosing the checkpoint to resume from. */
#include "trainer/checkpoint_private.h"

#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <yaml.h>

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
    for (int i = 0; i < c->n_keys; i++)
        free(c->keys[i]);
    free(c->keys);
    for (int i = 0; i < c->n_files; i++)
        tr_st_close(&c->files[i]);
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
    return ck_list_steps(ckdir, steps);
}

static int ckpt_read(tr_ckpt *c, const char *dir, int with_optimizer, int lazy, char *err,
                     size_t errlen) {
    memset(c, 0, sizeof(*c));
    snprintf(c->dir, sizeof(c->dir), "%s", dir);
    char path[TR_PATH_MAX + 64];
    snprintf(path, sizeof(path), "%s/manifest.yaml", dir);
    unsigned char *text = NULL;
    size_t len = 0;
    if (ck_read_whole(path, &text, &len, err, errlen)) return -1;
    /* the last line: "# crc32c: XXXXXXXX\n" over everything before it */
    const char *tag = "# crc32c: ";
    size_t tl = strlen(tag);
    if (len < tl + 9 || text[len - 1] != '\n') {
        free(text);
        return ck_fail(err, errlen, "%s: truncated (no checksum line at the end)", path);
    }
    size_t ls = len - 1;
    while (ls > 0 && text[ls - 1] != '\n')
        ls--;
    unsigned want;
    if (len - ls != tl + 9 || strncmp((const char *)text + ls, tag, tl) ||
        sscanf((const char *)text + ls + tl, "%8x", &want) != 1) {
        free(text);
        return ck_fail(err, errlen, "%s: truncated or damaged (no checksum line at the end)", path);
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
        rc = ck_fail(err, errlen,
                     "%s: a required field is missing (step, adam_steps, recipe, "
                     "recipe_sha256, files, tensors)",
                     path);
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
    c->seed =
        strtoull(yscalar(ymap_get(&doc, rng, "seed")) ? yscalar(ymap_get(&doc, rng, "seed")) : "0",
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
        if ((size_t)atol(lbytes) != sizeof(tr_loader_pos) ||
            strlen(hex) != 2 * sizeof(tr_loader_pos)) {
            rc = ck_fail(err, errlen,
                         "%s: the loader position has %s bytes, this build's has %zu "
                         "(saved by another version of trainer)",
                         path, lbytes, sizeof(tr_loader_pos));
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
    char(*fnames)[256] = calloc(nf, 256);
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
            yshape(&doc, ymap_get(&doc, tn, "shape"), t->shape, &t->ndim, 1) ||
            yseq_len(slices) < 1) {
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
            if (!file || !key || !crc || yshape(&doc, ymap_get(&doc, sn, "start"), start, &sd, 0) ||
                yshape(&doc, ymap_get(&doc, sn, "shape"), shape, &hd, 1) || sd != t->ndim ||
                hd != t->ndim || start[0] < 0 || start[1] < 0 ||
                start[0] + shape[0] > t->shape[0] || start[1] + shape[1] > t->shape[1]) {
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
                rc = ck_fail(err, errlen,
                             "%s/%s: tensor '%s' fails its checksum (the file is "
                             "damaged)",
                             dir, file, key);
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
            t->blocks[t->n_blocks++] = (tr_ckpt_block){.src = src,
                                                       .start = {start[0], start[1]},
                                                       .shape = {shape[0], shape[1]},
                                                       .crc = bcrc,
                                                       .verified = !lazy,
                                                       .file = c->files[fi].path,
                                                       .key = kd};
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
        if (!full)
            return ck_fail(err, errlen, "%s: out of memory for tensor '%s'", c->dir, t->name);
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
    int n = ck_list_steps(ckdir, &steps);
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
    return ck_fail(err, errlen,
                   "%s: not a checkpoint (no manifest.yaml) nor a run folder (no "
                   "checkpoints/)",
                   arg);
}
