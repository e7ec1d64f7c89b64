/* The checkpoint manifest (manifest.yaml): the step, the resolved recipe and its SHA-256, the
 * model tree, the parallel layout, the seed, the loader position, the guard's state, and every
 * global tensor with its blocks; the last line is a CRC32C of everything before it. Written
 * with libyaml's emitter by rank 0 once every rank's block list is in. */
#include "trainer/checkpoint/private.h"

#include "parallel/schedule.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

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

TR_PRINTF(2, 3) static void y_fmt(yout *y, const char *fmt, ...) {
    char buf[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    y_plain(y, buf);
}

/* One mapping entry: the key, then its value formatted as printf does. */
TR_PRINTF(3, 4) static void y_key(yout *y, const char *key, const char *fmt, ...) {
    char buf[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    y_plain(y, key);
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
        yaml_sequence_start_event_initialize(
            &ev, NULL, NULL, 1, flow ? YAML_FLOW_SEQUENCE_STYLE : YAML_BLOCK_SEQUENCE_STYLE);
    else
        yaml_sequence_end_event_initialize(&ev);
    y_event(y, &ev);
}

static void y_shape(yout *y, int ndim, const long *shape) {
    y_seq(y, 1, 1);
    for (int d = 0; d < ndim; d++)
        y_fmt(y, "%ld", shape[d]);
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
        y_key(y, "n", "%d", n->repeat);
        break;
    case TR_NODE_ROPE:
        y_key(y, "theta", "%.9g", n->rope_theta);
        break;
    case TR_NODE_LAYERNORM:
    case TR_NODE_RMSNORM:
        y_key(y, "eps", "%.9g", n->eps);
        if (n->kind == TR_NODE_LAYERNORM) {
            y_plain(y, "bias");
            y_plain(y, n->bias ? "true" : "false");
        }
        break;
    case TR_NODE_ATTENTION:
        y_key(y, "heads", "%d", n->heads);
        y_key(y, "kv_heads", "%d", n->kv_heads);
        y_plain(y, "bias");
        y_plain(y, n->bias ? "true" : "false");
        y_key(y, "rope_theta", "%.9g", n->rope_theta);
        break;
    case TR_NODE_MLP:
        y_key(y, "hidden", "%d", n->hidden);
        y_plain(y, "activation");
        y_plain(y, act_name(n->activation));
        y_plain(y, "bias");
        y_plain(y, n->bias ? "true" : "false");
        break;
    case TR_NODE_LM_HEAD:
        y_plain(y, "tied");
        y_plain(y, n->tied ? "true" : "false");
        break;
    default:
        break;
    }
    if (n->n_children) {
        y_plain(y, "children");
        y_seq(y, 1, 0);
        for (int i = 0; i < n->n_children; i++)
            y_node(y, &n->children[i]);
        y_seq(y, 0, 0);
    }
    y_map(y, 0);
}

static int y_write_handler(void *data, unsigned char *buffer, size_t size) {
    return fwrite(buffer, 1, size, (FILE *)data) == size;
}

static const char *kind_prefix(int kind) {
    return kind < 0 ? "" : kind == 0 ? "adam_m/" : "adam_v/";
}

static size_t global_numel(const tr_param *p) {
    return (size_t)p->gshape[0] * (size_t)p->gshape[1];
}

/* The global name of a block's tensor, and its key in the rank's file: the name itself when
 * the block is the whole global tensor, else name@flat (its first element's global index:
 * unique, since every element is written once). */
void ck_slice_names(const tr_param *p, const slice_info *s, char *name, size_t nlen, char *key,
                    size_t klen) {
    snprintf(name, nlen, "%s%s", kind_prefix(s->kind), p->name);
    if (s->count == global_numel(p))
        snprintf(key, klen, "%s", name);
    else
        snprintf(key, klen, "%s@%zu", name, s->flat);
}

/* ---- blocks of the global tensors ------------------------------------------------------- */

/* Append b, or grow the last block when b continues it: the next global rows at the same
 * columns (a vector: the next elements) and the next local elements, so that the grown
 * block's rows still lie back to back, row-major, in the local tensor and the snapshot. */
static int push_block(slice_info **sl, int *n, int *cap, const slice_info *b) {
    slice_info *l = *n ? &(*sl)[*n - 1] : NULL;
    if (l && l->param == b->param && l->kind == b->kind && l->local + l->count == b->local &&
        (b->ndim == 1 ? l->flat + l->count == b->flat
                      : l->start[1] == b->start[1] && l->shape[1] == b->shape[1] &&
                            l->start[0] + l->shape[0] == b->start[0])) {
        l->shape[0] += b->shape[0];
        l->count += b->count;
        return 0;
    }
    if (*n == *cap) {
        *cap = *cap ? 2 * *cap : 64;
        slice_info *g = realloc(*sl, (size_t)*cap * sizeof(slice_info));
        if (!g) return -1;
        *sl = g;
    }
    (*sl)[(*n)++] = *b;
    return 0;
}

/* One run of elements contiguous in the local and the global tensor, as blocks: a partial
 * first row, whole rows, a partial last row (a run of a column-split tensor lies in one row;
 * push_block stacks such rows into one rectangle). */
static int push_run(slice_info **sl, int *n, int *cap, const tr_param *p, slice_info b,
                    const tr_run *run) {
    size_t G = (size_t)p->gshape[1], g = run->global, left = run->n;
    b.local = run->local;
    while (left > 0) {
        size_t r = g / G, c = g % G, len;
        b.flat = g;
        if (p->ndim == 1) {
            len = left;
            b.start[0] = (long)g, b.start[1] = 0, b.shape[0] = (long)len, b.shape[1] = 1;
        } else if (c || left < G) { /* part of one row */
            len = G - c < left ? G - c : left;
            b.start[0] = (long)r, b.start[1] = (long)c, b.shape[0] = 1, b.shape[1] = (long)len;
        } else { /* whole rows */
            len = left / G * G;
            b.start[0] = (long)r, b.start[1] = 0, b.shape[0] = (long)(len / G);
            b.shape[1] = (long)G;
        }
        b.count = len;
        if (push_block(sl, n, cap, &b)) return -1;
        g += len, b.local += len, left -= len;
    }
    return 0;
}

int ck_add_blocks(slice_info **sl, int *n, int *cap, const tr_param *p, int param, int gparam,
                  int kind, int rank, size_t lo, size_t hi) {
    const slice_info b = {
        .param = param, .gparam = gparam, .kind = kind, .rank = rank, .ndim = p->ndim};
    tr_run run[32];
    if (p->pp_copy) return 0; /* the last stage's copy of a tied embedding: the first writes it */
    while (lo < hi) {
        int k = tr_param_runs(p, lo, hi, run, 32);
        if (k <= 0) return 0; /* past the tensor's rows: nothing of it there */
        if (k > 32) k = 32;
        for (int j = 0; j < k; j++)
            if (p->seg[run[j].seg].copy == 0 && push_run(sl, n, cap, p, b, &run[j])) return -1;
        lo = run[k - 1].local + run[k - 1].n;
    }
    return 0;
}

static int cmp_slice(const void *a, const void *b) {
    const slice_info *x = a, *y = b;
    if (x->kind != y->kind) return x->kind < y->kind ? -1 : 1;
    if (x->gparam != y->gparam) return x->gparam < y->gparam ? -1 : 1;
    return x->flat < y->flat ? -1 : x->flat > y->flat;
}

void ck_sort_blocks(slice_info *sl, int n) {
    qsort(sl, (size_t)n, sizeof(slice_info), cmp_slice);
}

/* Rows [r0, r1) x columns [c0, c1) of a global tensor, from one rank's block: a block of
 * whole rows is one span, any other block one span per row (a vector is one row). */
typedef struct {
    long r0, r1, c0, c1;
    int rank;
} span;

static int cmp_span(const void *a, const void *b) {
    const span *x = a, *y = b;
    if (x->r0 != y->r0) return x->r0 < y->r0 ? -1 : 1;
    return x->c0 < y->c0 ? -1 : x->c0 > y->c0;
}

/* The spans of blocks b[0..nb) of a tensor of G columns, sorted; NULL when out of memory. */
static span *tensor_spans(const slice_info *b, int nb, long G, size_t *n) {
    size_t cap = 0;
    for (int k = 0; k < nb; k++)
        cap += b[k].ndim == 1 || (b[k].start[1] == 0 && b[k].shape[1] == G) || b[k].shape[0] < 0
                   ? 1
                   : (size_t)b[k].shape[0];
    span *sp = malloc((cap ? cap : 1) * sizeof(span));
    if (!sp) return NULL;
    *n = 0;
    for (int k = 0; k < nb; k++) {
        const slice_info *x = &b[k];
        if (x->ndim == 1) {
            sp[(*n)++] = (span){0, 1, x->start[0], x->start[0] + x->shape[0], x->rank};
        } else if (x->start[1] == 0 && x->shape[1] == G) { /* whole rows: one span */
            sp[(*n)++] = (span){x->start[0], x->start[0] + x->shape[0], 0, G, x->rank};
        } else {
            for (long r = x->start[0]; r < x->start[0] + x->shape[0]; r++)
                sp[(*n)++] = (span){r, r + 1, x->start[1], x->start[1] + x->shape[1], x->rank};
        }
    }
    qsort(sp, *n, sizeof(span), cmp_span);
    return sp;
}

static void element_name(char *buf, size_t n, int ndim, long r, long c) {
    if (ndim == 1)
        snprintf(buf, n, "element %ld", c);
    else
        snprintf(buf, n, "element [%ld, %ld]", r, c);
}

/* Sweep the sorted spans of one R x G tensor with the next element expected, (r, c). */
static int sweep_spans(const char *name, int ndim, long R, long G, const span *sp, size_t n,
                       char *err, size_t errlen) {
    long r = 0, c = 0;
    char at[64];
    for (size_t k = 0; k < n; k++) {
        const span *s = &sp[k];
        if (s->r0 < 0 || s->c0 < 0 || s->r1 > R || s->c1 > G || s->c0 >= s->c1 || s->r0 >= s->r1)
            return tr_errf(err, errlen,
                           "tensor '%s': a block of rank %d lies outside its %ld x "
                           "%ld elements",
                           name, s->rank, R, G);
        if (s->r0 < r || (s->r0 == r && s->c0 < c)) { /* an earlier span holds (r0, c0) */
            int other = -1;
            for (size_t j = k; j-- > 0 && other < 0;)
                if (sp[j].r0 <= s->r0 && s->r0 < sp[j].r1 && sp[j].c0 <= s->c0 && s->c0 < sp[j].c1)
                    other = sp[j].rank;
            element_name(at, sizeof(at), ndim, s->r0, s->c0);
            return tr_errf(err, errlen, "tensor '%s': %s is in two blocks (of ranks %d and %d)",
                           name, at, other, s->rank);
        }
        if (s->r0 > r || s->c0 > c) break; /* a gap before s */
        if (s->c0 == 0 && s->c1 == G)
            r = s->r1;
        else if ((c = s->c1) == G)
            r++, c = 0;
    }
    if (r == R && c == 0) return 0;
    element_name(at, sizeof(at), ndim, r, c);
    return tr_errf(err, errlen, "tensor '%s': %s is in no block", name, at);
}

int ck_check_tensor_cover(const char *name, int ndim, const long gshape[2], const slice_info *b,
                          int nb, char *err, size_t errlen) {
    long R = ndim == 1 ? 1 : gshape[0], G = ndim == 1 ? gshape[0] : gshape[1];
    size_t n;
    span *sp = tensor_spans(b, nb, G, &n);
    if (!sp) return tr_errf(err, errlen, "out of memory checking the blocks of '%s'", name);
    int rc = sweep_spans(name, ndim, R, G, sp, n, err, errlen);
    free(sp);
    return rc;
}

int ck_check_cover(const tr_model *g, const slice_info *sl, int n, char *err, size_t errlen) {
    int rc = 0, np = tr_model_num_params(g), j = 0;
    char why[512];
    for (int kind = -1; kind <= 1 && !rc; kind++)
        for (int i = 0; i < np && !rc; i++) {
            const tr_param *p = tr_model_param(g, i);
            int k = j;
            while (k < n && sl[k].kind == kind && sl[k].gparam == i)
                k++;
            char name[TR_PARAM_NAME_MAX + 16];
            snprintf(name, sizeof(name), "%s%s", kind_prefix(kind), p->name);
            long gshape[2] = {p->gshape[0], p->gshape[1]};
            if (k == j) /* not one element of it: a rank (a pipeline stage?) did not write */
                rc = tr_errf(why, sizeof(why),
                             "tensor '%s' is in no block (no rank wrote any of it)", name);
            else
                rc = ck_check_tensor_cover(name, p->ndim, gshape, sl + j, k - j, why, sizeof(why));
            j = k;
        }
    if (!rc && j < n)
        rc = tr_errf(why, sizeof(why), "a block of no tensor (kind %d, tensor %d)", sl[j].kind,
                     sl[j].gparam);
    if (rc)
        return tr_errf(err, errlen,
                       "the ranks' blocks do not hold every element of the global "
                       "tensors exactly once (a bug in the ranges or the layout): %s",
                       why);
    return 0;
}

/* ---- the manifest ------------------------------------------------------------------------ */

static void y_model(yout *y, const tr_model_desc *d, const tr_model *g) {
    size_t n = 0; /* the global tensors' elements */
    for (int i = 0; i < tr_model_num_params(g); i++)
        n += global_numel(tr_model_param(g, i));
    y_plain(y, "model");
    y_map(y, 1);
    y_key(y, "vocab", "%d", d->vocab);
    y_key(y, "dim", "%d", d->dim);
    y_key(y, "seq_len", "%d", d->seq_len);
    y_key(y, "parameters", "%zu", n);
    y_plain(y, "layers");
    y_seq(y, 1, 0);
    for (int i = 0; i < d->root.n_children; i++)
        y_node(y, &d->root.children[i]);
    y_seq(y, 0, 0);
    y_map(y, 0);
}

/* The layout the checkpoint was saved with (for people and tools: loading reads the blocks,
 * whatever the layout); with a pipeline also its schedule, virtual stages, micro-batches and
 * the blocks each chunk starts at (`trainer show CHECKPOINT`). */
static void y_parallel(yout *y, const tr_ckpt_opts *o, int n_chunks) {
    y_plain(y, "parallel");
    y_map(y, 1);
    y_key(y, "world", "%d", o->world);
    y_key(y, "dp", "%d", o->layout.dp);
    y_key(y, "tp", "%d", o->layout.tp);
    y_key(y, "pp", "%d", o->layout.pp);
    y_plain(y, "chunks"); /* pipeline chunks: pp x virtual stages (1: no pipeline) */
    y_fmt(y, "%d", n_chunks);
    y_key(y, "zero", "%d", o->layout.zero);
    y_plain(y, "sequence_parallel");
    y_plain(y, o->layout.sequence_parallel ? "true" : "false");
    if (n_chunks > 1) { /* the pipeline (checked by the writer: pp x V = n_chunks) */
        y_plain(y, "schedule");
        y_plain(y, tr_pp_kind_name((tr_pp_kind)o->layout.schedule));
        y_key(y, "virtual_stages", "%d", o->layout.virtual_stages);
        y_key(y, "microbatches", "%d", o->layout.microbatches);
        y_plain(y, "chunk_start"); /* chunk c = blocks [start[c], start[c + 1]) */
        y_seq(y, 1, 1);
        for (int c = 0; c <= n_chunks; c++)
            y_fmt(y, "%d", o->layout.chunk_start[c]);
        y_seq(y, 0, 1);
    }
    y_map(y, 0);
}

static void y_position(yout *y, unsigned long long seed, const tr_loader_pos *pos) {
    y_plain(y, "rng");
    y_map(y, 1);
    /* every random choice derives from the seed and a position: parameter init from (seed,
       name, index), data order from (seed, loader position), sampling from the seed; the
       loop keeps no other generator */
    y_key(y, "seed", "%llu", seed);
    y_plain(y, "loader");
    y_plain(y, "see loader_position");
    y_map(y, 0);
    y_plain(y, "loader_position");
    y_map(y, 1);
    y_key(y, "bytes", "%zu", sizeof(tr_loader_pos));
    y_plain(y, "hex");
    char hex[2 * sizeof(tr_loader_pos) + 1];
    const unsigned char *pb = (const unsigned char *)pos;
    for (size_t i = 0; i < sizeof(tr_loader_pos); i++)
        snprintf(hex + 2 * i, 3, "%02x", pb[i]);
    y_str(y, hex, YAML_DOUBLE_QUOTED_SCALAR_STYLE);
    y_map(y, 0);
}

/* The guard's state (trainer/checkpoint/checkpoint.h: tr_ckpt_guard); 17 significant digits read
 * back
 * as the same double. */
static void y_guard(yout *y, const tr_ckpt_guard *g) {
    const char *keys[2] = {"loss", "grad_norm"};
    const double *ring[2] = {g->loss, g->norm};
    y_plain(y, "guard");
    y_map(y, 1);
    y_key(y, "window", "%d", g->window);
    y_key(y, "next", "%d", g->next);
    for (int k = 0; k < 2; k++) { /* n values each, in ring order */
        y_plain(y, keys[k]);
        y_seq(y, 1, 1);
        for (int i = 0; i < g->n; i++)
            y_fmt(y, "%.17g", ring[k][i]);
        y_seq(y, 0, 1);
    }
    y_key(y, "bad", "%d", g->bad);
    y_key(y, "first_bad", "%d", g->first_bad);
    y_key(y, "last_loss", "%.17g", g->last_loss);
    y_key(y, "last_grad_norm", "%.17g", g->last_norm);
    y_key(y, "rolled_to", "%d", g->rolled_to);
    y_map(y, 0);
}

/* Every rank's file, with the rank's place in the mesh (world rank = (d * pp + p) * tp + t:
 * parallel/comm/comm.h), so that a message about a missing file can say whose part it held. */
static void y_files(yout *y, const size_t *file_bytes, const tr_ckpt_opts *o) {
    y_plain(y, "files");
    y_seq(y, 1, 0);
    for (int r = 0; r < o->world; r++) {
        y_map(y, 1);
        y_key(y, "name", "rank_%05d.safetensors", r);
        y_key(y, "rank", "%d", r);
        y_plain(y, "mesh"); /* [dp rank, pipeline stage, tp rank] */
        y_seq(y, 1, 1);
        tr_layout_coord c = tr_layout_coord_of(&o->layout, r);
        y_fmt(y, "%d", c.d);
        y_fmt(y, "%d", c.p);
        y_fmt(y, "%d", c.t);
        y_seq(y, 0, 1);
        y_key(y, "bytes", "%zu", file_bytes[r]);
        y_map(y, 0);
    }
    y_seq(y, 0, 0);
}

/* Every global tensor once, with its global shape and its blocks from every rank (sl sorted
 * by kind, global tensor, position; g the one-process model). */
static void y_tensors(yout *y, const tr_model *g, const slice_info *sl, int n_sl) {
    y_plain(y, "tensors");
    y_seq(y, 1, 0);
    for (int i = 0; i < n_sl;) {
        const tr_param *p = tr_model_param(g, sl[i].gparam);
        long shape[2] = {p->gshape[0], p->gshape[1]};
        char name[TR_PARAM_NAME_MAX + 16], key[TR_PARAM_NAME_MAX + 48];
        ck_slice_names(p, &sl[i], name, sizeof(name), key, sizeof(key));
        y_map(y, 1);
        y_plain(y, "name");
        y_plain(y, name);
        y_plain(y, "dtype");
        y_plain(y, "F32");
        y_plain(y, "shape");
        y_shape(y, p->ndim, shape);
        y_plain(y, "slices");
        y_seq(y, 1, 0);
        int j = i;
        for (; j < n_sl && sl[j].kind == sl[i].kind && sl[j].gparam == sl[i].gparam; j++) {
            ck_slice_names(p, &sl[j], name, sizeof(name), key, sizeof(key));
            y_map(y, 1);
            y_key(y, "file", "rank_%05d.safetensors", sl[j].rank);
            y_plain(y, "key");
            y_plain(y, key);
            y_plain(y, "start");
            y_shape(y, p->ndim, sl[j].start);
            y_plain(y, "shape");
            y_shape(y, p->ndim, sl[j].shape);
            y_key(y, "crc32c", "%08x", sl[j].crc);
            y_map(y, 0);
        }
        y_seq(y, 0, 0);
        y_map(y, 0);
        i = j;
    }
    y_seq(y, 0, 0);
}

char *ck_manifest_text(unsigned long long seed, const char *recipe_text, const char *sha,
                       const tr_model_desc *d, const tr_model *g, const snap_meta *sm,
                       const slice_info *sl, int n_sl, const size_t *file_bytes,
                       const tr_ckpt_opts *o, int n_chunks, size_t *out_len) {
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
    y_model(&y, d, g);
    y_parallel(&y, o, n_chunks);
    y_position(&y, seed, &sm->pos);
    if (sm->has_guard) y_guard(&y, &sm->guard);
    y_files(&y, file_bytes, o);
    y_tensors(&y, g, sl, n_sl);
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
