/* The checkpoint manifest (manifest.yaml): the step, the resolved recipe and its SHA-256, the
 * model tree, the parallel layout, the seed, the loader position, and every global tensor with
 * its blocks; the last line is a CRC32C of everything before it. Written with libyaml's
 * emitter by rank 0 once every rank's block list is in. */
#include "trainer/checkpoint_private.h"

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

/* The global name of a block's tensor, and its key in the rank's file: the name itself when
 * the block is the whole tensor, else name@flat. */
void ck_slice_names(const tr_param *p, const slice_info *s, char *name, size_t nlen, char *key,
                    size_t klen) {
    snprintf(name, nlen, "%s%s", kind_prefix(s->kind), p->name);
    if (s->count == p->numel)
        snprintf(key, klen, "%s", name);
    else
        snprintf(key, klen, "%s@%zu", name, s->flat);
}

char *ck_manifest_text(unsigned long long seed, const char *recipe_text, const char *sha,
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
    for (int i = 0; i < d->root.n_children; i++)
        y_node(&y, &d->root.children[i]);
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
        for (size_t i = 0; i < sizeof(tr_loader_pos); i++)
            snprintf(hex + 2 * i, 3, "%02x", pb[i]);
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
        ck_slice_names(p, &sl[i], name, sizeof(name), key, sizeof(key));
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
            ck_slice_names(p, &sl[j], name, sizeof(name), key, sizeof(key));
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
