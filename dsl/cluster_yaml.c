/* Reading a cluster file (tr_cluster_load): YAML through libyaml's document API, every field
 * checked, every mistake one line `PATH:LINE: FIELD: what is wrong (what would be right)`.
 *
 * The format (examples in recipes/clusters/):
 *
 *   groups:                      # required: 1 to TR_CLUSTER_MAX_GROUPS groups of nodes
 *     - name: h100               # required, unique, [A-Za-z0-9_.-]+ (up to 63)
 *       device: H100-80GB        # required; a known device (tr_device_find) fills every
 *                                # figure below, which may still be given to override it;
 *                                # an unknown one needs memory_gib and peak_tflops
 *       nodes: 2                 # required, 1 to 100000
 *       per_node: 8              # devices per node, 1 to 1024; default: the device's usual
 *                                # server (8 for an unknown device)
 *       provider: cloud-a        # a label; default none
 *       memory_gib: 80           # per device, GiB (2^30 bytes), > 0
 *       peak_tflops: 989         # dense bf16 per device, TFLOP/s (1e12), > 0
 *       memory_bandwidth_gb_s: 3350                  # GB/s (1e9 bytes), > 0
 *       intra_node: { bandwidth_gb_s: 360, latency_us: 5 }   # between devices of a node
 *       inter_node: { bandwidth_gb_s: 45, latency_us: 10 }   # a device's share between nodes
 *       price_per_hour: 2.49     # USD per device-hour, >= 0; unknown device: 0, assumed
 *       egress_per_gb: 0.08      # USD per GB leaving the provider, >= 0; default 0, assumed
 *       cores: 96                # CPU cores per node, 0 to 1000000; default 0 (not known)
 *       matrix_efficiency: 0.45  # of peak_tflops, what a training step's matrix products
 *                                # reach, above 0 and at most 1; default: the device's
 *                                # (published for the A100 and H100, else assumed)
 *       organisation: lab-a      # who runs these nodes, a name: private gradients mask the
 *                                # data-parallel sums between organisations and keep tensor
 *                                # and pipeline groups inside one; default: each node its own
 *   links:                       # optional, between groups; a pair not listed gets the
 *     - between: [h100, a100]    # slower group's inter_node link, assumed
 *       bandwidth_gb_s: 1.25     # required
 *       latency_ms: 30           # latency_us or latency_ms; default: as for a pair not listed
 *
 * A link's latency may be given as latency_us or latency_ms (not both), anywhere a link is.
 * Numbers are plain decimals; counts are whole numbers. Fields are named in messages as
 * paths counted from 1: `groups[2].intra_node.bandwidth_gb_s`, `links[1].between`. */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <yaml.h>

#include "dsl/cluster_private.h"
#include "dsl/yaml.h"
#include "parallel/comm/base.h"

#define MAX_FILE_BYTES (1 << 20)

typedef struct {
    const char *path;
    yaml_document_t *doc;
    char *err;
    size_t errlen;
} reader;

/* The one way a load fails: "PATH:LINE: FIELD: message", made one line whatever the input. */
TR_PRINTF(4, 5)
static int fail(const reader *r, int line, const char *field, const char *fmt, ...) {
    if (!r->errlen) return -1;
    int w = snprintf(r->err, r->errlen, "%s:%d: %s: ", r->path, line, field);
    if (w >= 0 && (size_t)w < r->errlen) {
        va_list ap;
        va_start(ap, fmt);
        tr_verrf(r->err + w, r->errlen - (size_t)w, fmt, ap);
        va_end(ap);
    }
    for (char *p = r->err; *p; p++)
        if ((unsigned char)*p < 32) *p = ' ';
    return -1;
}

static int line_of(const yaml_node_t *n) {
    return (int)n->start_mark.line + 1;
}

static yaml_node_t *node(const reader *r, int id) {
    return yaml_document_get_node(r->doc, id);
}

/* The text of a scalar, NULL for a list or a mapping. */
static const char *text_of(const yaml_node_t *n) {
    return n->type == YAML_SCALAR_NODE ? (const char *)n->data.scalar.value : NULL;
}

/* What a value is, for "got ...": 'text' (shortened), nothing, a list or a mapping. */
static const char *shown(const yaml_node_t *n, char *buf, size_t len) {
    const char *s = text_of(n);
    if (n->type == YAML_SEQUENCE_NODE) return "a list";
    if (n->type == YAML_MAPPING_NODE) return "a mapping";
    if (!s || !*s) return "nothing";
    snprintf(buf, len, "'%.40s%s'", s, strlen(s) > 40 ? "..." : "");
    return buf;
}

/* ---- values ---------------------------------------------------------------------------- */

/* A whole number from lo to hi. */
static int get_count(const reader *r, const yaml_node_t *v, const char *field, long lo, long hi,
                     int *out) {
    const char *s = text_of(v);
    char *end = NULL;
    errno = 0;
    long x = s && *s && strspn(s, "+-0123456789") == strlen(s) ? strtol(s, &end, 10) : 0;
    if (!end || *end || errno || x < lo || x > hi) {
        char buf[64];
        return fail(r, line_of(v), field, "must be a whole number from %ld to %ld, got %s", lo, hi,
                    shown(v, buf, sizeof buf));
    }
    *out = (int)x;
    return 0;
}

/* A decimal number, > 0 (positive) or >= 0, in the file's units: the figure is x * mul / div,
 * given. */
static int get_figure(const reader *r, const yaml_node_t *v, const char *field, int positive,
                      double mul, double div, tr_figure *out) {
    const char *s = text_of(v);
    char *end = NULL;
    double x = s && *s && strspn(s, "+-.0123456789eE") == strlen(s) ? strtod(s, &end) : 0;
    double f = x * mul / div;
    if (!end || *end || !isfinite(f) || (positive ? !(x > 0) : !(x >= 0))) {
        char buf[64];
        return fail(r, line_of(v), field, "must be a number %s, got %s",
                    positive ? "greater than 0" : "0 or more", shown(v, buf, sizeof buf));
    }
    *out = (tr_figure){f, TR_ORIGIN_GIVEN};
    return 0;
}

/* Text into out[64]: a name ([A-Za-z0-9_.-]+), or any text, empty or not. */
enum { TEXT_ANY, TEXT_NONEMPTY, TEXT_NAME };

static int get_text(const reader *r, const yaml_node_t *v, const char *field, int kind, char *out) {
    static const char name_chars[] =
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-";
    const char *s = text_of(v);
    char buf[64];
    size_t n = s ? strlen(s) : 0;
    if (!s || n > 63 || (kind != TEXT_ANY && n == 0))
        return fail(r, line_of(v), field, "must be %s of up to 63 characters, got %s",
                    kind == TEXT_NAME ? "a name" : "text", shown(v, buf, sizeof buf));
    if (kind == TEXT_NAME && strspn(s, name_chars) != n)
        return fail(r, line_of(v), field,
                    "must be a name of letters, digits, '_', '.' and '-', got %s",
                    shown(v, buf, sizeof buf));
    memcpy(out, s, n + 1);
    return 0;
}

/* ---- mappings -------------------------------------------------------------------------- */

/* The index in known[0..n) of pair p's key, or -1 (and the error) for a key that is not
 * text, not known or given twice; seen collects the keys given so far. */
static int key_index(const reader *r, const yaml_node_pair_t *p, const char *where,
                     const char *const *known, int n, unsigned *seen) {
    yaml_node_t *k = node(r, p->key);
    const char *key = text_of(k);
    char field[160], list[320] = "";
    const char *dot = *where ? "." : ""; /* the top level's keys are paths by themselves */
    for (int i = 0; i < n; i++) {
        if (key && !strcmp(key, known[i])) {
            snprintf(field, sizeof field, "%s%s%s", where, dot, key);
            if (*seen & (1u << i)) return fail(r, line_of(k), field, "given twice");
            *seen |= 1u << i;
            return i;
        }
        size_t used = strlen(list);
        snprintf(list + used, sizeof list - used, "%s%s", i ? ", " : "", known[i]);
    }
    char buf[64];
    snprintf(field, sizeof field, "%s%s%s", where, dot, key ? key : "?");
    if (!key)
        return fail(r, line_of(k), *where ? where : "top level",
                    "a key must be a field name, got %s", shown(k, buf, sizeof buf));
    return fail(r, line_of(k), field, "unknown field; known: %s", list);
}

static int need_mapping(const reader *r, const yaml_node_t *v, const char *field,
                        const char *what) {
    if (v->type == YAML_MAPPING_NODE) return 0;
    char buf[64];
    return fail(r, line_of(v), field, "must be a mapping (%s), got %s", what,
                shown(v, buf, sizeof buf));
}

/* ---- links ----------------------------------------------------------------------------- */

enum { L_BW, L_US, L_MS, L_BETWEEN, L_N };
static const char *const link_keys[L_N] = {"bandwidth_gb_s", "latency_us", "latency_ms", "between"};

/* One of a link's figures (k < L_BETWEEN) into l. */
static int link_figure(const reader *r, int k, const yaml_node_t *v, const char *field,
                       unsigned seen, tr_link *l) {
    if ((seen & (1u << L_US)) && (seen & (1u << L_MS)))
        return fail(r, line_of(v), field, "give latency_us or latency_ms, not both");
    if (k == L_BW) return get_figure(r, v, field, 1, 1e9, 1, &l->bw);
    return get_figure(r, v, field, 0, 1, k == L_US ? 1e6 : 1e3, &l->lat);
}

/* intra_node / inter_node: { bandwidth_gb_s, latency_us | latency_ms }, each optional. */
static int get_link(const reader *r, const yaml_node_t *v, const char *field, tr_link *l) {
    if (need_mapping(r, v, field, "bandwidth_gb_s, latency_us or latency_ms")) return -1;
    unsigned seen = 0;
    for (yaml_node_pair_t *p = v->data.mapping.pairs.start; p < v->data.mapping.pairs.top; p++) {
        int k = key_index(r, p, field, link_keys, L_BETWEEN, &seen);
        if (k < 0) return -1;
        char sub[192];
        snprintf(sub, sizeof sub, "%s.%s", field, link_keys[k]);
        if (link_figure(r, k, node(r, p->value), sub, seen, l)) return -1;
    }
    return 0;
}

/* The group named by v, or -1 (and the error). */
static int group_named(const reader *r, const tr_cluster *c, const yaml_node_t *v,
                       const char *field) {
    const char *s = text_of(v);
    char names[512] = "", buf[64];
    for (int i = 0; i < c->n_groups; i++) {
        if (s && !strcmp(s, c->g[i].name)) return i;
        size_t used = strlen(names);
        snprintf(names + used, sizeof names - used, "%s%s", i ? ", " : "", c->g[i].name);
    }
    return fail(r, line_of(v), field, "no group named %s (groups: %s)", shown(v, buf, sizeof buf),
                names);
}

/* between: [a, b], two different groups, into ab[2]. */
static int get_between(const reader *r, const tr_cluster *c, const yaml_node_t *v,
                       const char *field, int ab[2]) {
    char buf[64];
    int list = v->type == YAML_SEQUENCE_NODE;
    long n = list ? v->data.sequence.items.top - v->data.sequence.items.start : 0;
    if (list) snprintf(buf, sizeof buf, "a list of %ld", n);
    if (n != 2)
        return fail(r, line_of(v), field, "must be a list of two group names like [%s, %s], got %s",
                    c->g[0].name, c->g[c->n_groups - 1].name,
                    list ? buf : shown(v, buf, sizeof buf));
    for (int k = 0; k < 2; k++)
        if ((ab[k] = group_named(r, c, node(r, v->data.sequence.items.start[k]), field)) < 0)
            return -1;
    if (ab[0] == ab[1])
        return fail(r, line_of(v), field,
                    "joins '%s' to itself; a link is between two different groups (within a group: "
                    "its inter_node)",
                    c->g[ab[0]].name);
    return 0;
}

/* links[i] (from 1): { between, bandwidth_gb_s, latency_us | latency_ms } into
 * c->between; given[a][b] is the entry that gave the pair a, b (0: none yet). */
static int get_link_entry(const reader *r, tr_cluster *c, const yaml_node_t *v, int i,
                          int given[][TR_CLUSTER_MAX_GROUPS]) {
    char where[32], field[192];
    snprintf(where, sizeof where, "links[%d]", i);
    if (need_mapping(r, v, where, "between, bandwidth_gb_s, latency_us or latency_ms")) return -1;
    unsigned seen = 0;
    int ab[2] = {-1, -1}, between_line = line_of(v);
    tr_link l = {.bw = {0, TR_ORIGIN_ASSUMED}, .lat = {0, TR_ORIGIN_ASSUMED}};
    for (yaml_node_pair_t *p = v->data.mapping.pairs.start; p < v->data.mapping.pairs.top; p++) {
        int k = key_index(r, p, where, link_keys, L_N, &seen);
        if (k < 0) return -1;
        yaml_node_t *val = node(r, p->value);
        snprintf(field, sizeof field, "%s.%s", where, link_keys[k]);
        if (k == L_BETWEEN) between_line = line_of(val);
        if (k == L_BETWEEN ? get_between(r, c, val, field, ab)
                           : link_figure(r, k, val, field, seen, &l))
            return -1;
    }
    static const int required[] = {L_BETWEEN, L_BW};
    for (int k = 0; k < 2; k++)
        if (!(seen & (1u << required[k]))) {
            snprintf(field, sizeof field, "%s.%s", where, link_keys[required[k]]);
            return fail(r, line_of(v), field, "missing (a link needs between and bandwidth_gb_s)");
        }
    snprintf(field, sizeof field, "%s.between", where);
    int *prev = &given[ab[0]][ab[1]];
    if (*prev)
        return fail(r, between_line, field,
                    "the link between '%s' and '%s' is already given by links[%d]",
                    c->g[ab[0]].name, c->g[ab[1]].name, *prev);
    *prev = given[ab[1]][ab[0]] = i;
    c->between[ab[0]][ab[1]] = c->between[ab[1]][ab[0]] = l;
    return 0;
}

static int get_links(const reader *r, tr_cluster *c, const yaml_node_t *v) {
    if (v->type != YAML_SEQUENCE_NODE) {
        char buf[64];
        return fail(r, line_of(v), "links", "must be a list of links between groups, got %s",
                    shown(v, buf, sizeof buf));
    }
    int given[TR_CLUSTER_MAX_GROUPS][TR_CLUSTER_MAX_GROUPS] = {{0}};
    int i = 0;
    for (yaml_node_item_t *it = v->data.sequence.items.start; it < v->data.sequence.items.top; it++)
        if (get_link_entry(r, c, node(r, *it), ++i, given)) return -1;
    return 0;
}

/* ---- groups ---------------------------------------------------------------------------- */

enum {
    G_NAME,
    G_DEVICE,
    G_NODES,
    G_PER_NODE,
    G_PROVIDER,
    G_MEMORY,
    G_PEAK,
    G_MEMBW,
    G_INTRA,
    G_INTER,
    G_PRICE,
    G_EGRESS,
    G_CORES,
    G_EFF,
    G_ORG,
    G_N
};
static const char *const group_keys[G_N] = {
    "name",       "device",     "nodes",          "per_node",
    "provider",   "memory_gib", "peak_tflops",    "memory_bandwidth_gb_s",
    "intra_node", "inter_node", "price_per_hour", "egress_per_gb",
    "cores",      "matrix_efficiency", "organisation"};

static int group_field(const reader *r, int k, const yaml_node_t *v, const char *field,
                       tr_node_group *g) {
    switch (k) {
    case G_NAME:
        return get_text(r, v, field, TEXT_NAME, g->name);
    case G_DEVICE:
        return get_text(r, v, field, TEXT_NONEMPTY, g->device);
    case G_NODES:
        return get_count(r, v, field, 1, TR_CLUSTER_MAX_NODES, &g->nodes);
    case G_PER_NODE:
        return get_count(r, v, field, 1, TR_CLUSTER_MAX_PER_NODE, &g->per_node);
    case G_PROVIDER:
        return get_text(r, v, field, TEXT_ANY, g->provider);
    case G_MEMORY:
        return get_figure(r, v, field, 1, 1073741824.0, 1, &g->mem_bytes);
    case G_PEAK:
        return get_figure(r, v, field, 1, 1e12, 1, &g->peak_flops);
    case G_MEMBW:
        return get_figure(r, v, field, 1, 1e9, 1, &g->mem_bw);
    case G_INTRA:
        return get_link(r, v, field, &g->intra);
    case G_INTER:
        return get_link(r, v, field, &g->inter);
    case G_PRICE:
        return get_figure(r, v, field, 0, 1, 1, &g->price_hour);
    case G_EGRESS:
        return get_figure(r, v, field, 0, 1, 1, &g->egress_per_gb);
    case G_CORES:
        return get_count(r, v, field, 0, 1000000, &g->cores);
    case G_EFF:
        if (get_figure(r, v, field, 1, 1, 1, &g->efficiency)) return -1;
        if (g->efficiency.v > 1)
            return fail(r, line_of(v), field, "must be a share of the peak, at most 1, got %g",
                        g->efficiency.v);
        return 0;
    case G_ORG:
        return get_text(r, v, field, TEXT_NAME, g->org);
    }
    return -1;
}

/* After its fields: the required ones, a unique name, an unknown device's figures; then
 * what the file did not give from the table (or assumed). line[k]: where field k was. */
static int finish_group(const reader *r, tr_cluster *c, int i, const int *line) {
    tr_node_group *g = &c->g[i];
    char where[32], field[64], known[512];
    snprintf(where, sizeof where, "groups[%d]", i + 1);
    for (int k = G_NAME; k <= G_NODES; k++)
        if (!line[k]) {
            snprintf(field, sizeof field, "%s.%s", where, group_keys[k]);
            return fail(r, g->line, field, "missing (a group needs name, device and nodes)");
        }
    snprintf(field, sizeof field, "%s.name", where);
    for (int j = 0; j < i; j++)
        if (!strcmp(c->g[j].name, g->name))
            return fail(r, line[G_NAME], field, "'%s' is already the name of groups[%d]", g->name,
                        j + 1);
    const tr_device_info *d = tr_device_find(g->device);
    snprintf(field, sizeof field, "%s.device", where);
    tr_device_list(known, sizeof known);
    const char *need = line[G_MEMORY] ? "peak_tflops"
                       : line[G_PEAK] ? "memory_gib"
                                      : "memory_gib and peak_tflops";
    if (!d && (!line[G_MEMORY] || !line[G_PEAK]))
        return fail(r, line[G_DEVICE], field,
                    "unknown device '%s': give its %s, or name a known device: %s", g->device, need,
                    known);
    if (d) snprintf(g->device, sizeof g->device, "%s", d->name);
    if (!g->per_node) g->per_node = d ? d->per_node : TR_UNKNOWN_PER_NODE;
    tr_group_fill(g, d);
    return 0;
}

/* groups[i] (from 0) into c->g[i]. */
static int get_group(const reader *r, tr_cluster *c, const yaml_node_t *v, int i) {
    char where[32], field[64];
    snprintf(where, sizeof where, "groups[%d]", i + 1);
    if (need_mapping(r, v, where, "name, device, nodes, ...")) return -1;
    tr_node_group *g = &c->g[i];
    g->line = line_of(v);
    unsigned seen = 0;
    int line[G_N] = {0};
    for (yaml_node_pair_t *p = v->data.mapping.pairs.start; p < v->data.mapping.pairs.top; p++) {
        int k = key_index(r, p, where, group_keys, G_N, &seen);
        if (k < 0) return -1;
        yaml_node_t *val = node(r, p->value);
        snprintf(field, sizeof field, "%s.%s", where, group_keys[k]);
        line[k] = line_of(val);
        if (group_field(r, k, val, field, g)) return -1;
    }
    return finish_group(r, c, i, line);
}

static int get_groups(const reader *r, tr_cluster *c, const yaml_node_t *v) {
    char buf[64];
    int list = v->type == YAML_SEQUENCE_NODE;
    if (!list || v->data.sequence.items.top == v->data.sequence.items.start)
        return fail(
            r, line_of(v), "groups",
            "must be a list of one or more groups (- name: ..., device: ..., nodes: ...), got %s",
            list ? "an empty list" : shown(v, buf, sizeof buf));
    yaml_node_item_t *first = v->data.sequence.items.start;
    for (yaml_node_item_t *it = first; it < v->data.sequence.items.top; it++) {
        int i = (int)(it - first);
        yaml_node_t *g = node(r, *it);
        if (i == TR_CLUSTER_MAX_GROUPS) {
            char where[32];
            snprintf(where, sizeof where, "groups[%d]", i + 1);
            return fail(r, line_of(g), where,
                        "more than %d groups (merge groups of one device at one provider)",
                        TR_CLUSTER_MAX_GROUPS);
        }
        if (get_group(r, c, g, i)) return -1;
        c->n_groups = i + 1;
    }
    return 0;
}

/* ---- the file -------------------------------------------------------------------------- */

static int get_cluster(const reader *r, tr_cluster *c) {
    static const char *const keys[] = {"groups", "links"};
    yaml_node_t *root = yaml_document_get_root_node(r->doc);
    if (!root)
        return fail(
            r, 1, "groups",
            "missing: the file is empty (a cluster file lists its groups; see recipes/clusters/)");
    if (need_mapping(r, root, "top level", "groups and links")) return -1;
    unsigned seen = 0;
    yaml_node_t *at[2] = {NULL, NULL};
    for (yaml_node_pair_t *p = root->data.mapping.pairs.start; p < root->data.mapping.pairs.top;
         p++) {
        int k = key_index(r, p, "", keys, 2, &seen);
        if (k < 0) return -1;
        at[k] = node(r, p->value);
    }
    if (!at[0])
        return fail(
            r, line_of(root), "groups",
            "missing (a cluster file lists its groups under 'groups:'; see recipes/clusters/)");
    if (get_groups(r, c, at[0]) || (at[1] && get_links(r, c, at[1]))) return -1;
    tr_cluster_fill_between(c);
    return 0;
}

/* The whole file, NUL-terminated, in *text (freed by the caller). */
static int read_file(const reader *r, char **text, size_t *len) {
    FILE *f = fopen(r->path, "rb");
    if (!f) {
        snprintf(r->err, r->errlen, "%s: cannot read: %s", r->path, strerror(errno));
        return -1;
    }
    int rc = tr_read_all(f, MAX_FILE_BYTES, text, len), e = errno;
    fclose(f);
    if (rc)
        snprintf(r->err, r->errlen, "%s: cannot read: %s", r->path,
                 e == ENOMEM  ? "out of memory"
                 : e == EFBIG ? "larger than 1 MiB (not a cluster file?)"
                              : strerror(e));
    return rc;
}

/* libyaml's complaint about the text: its problem, its line and what it was reading. */
static int syntax_error(const reader *r, const yaml_parser_t *p, const char *text) {
    int line = (int)p->problem_mark.line + 1;
    if (p->error == YAML_READER_ERROR) { /* bad bytes: only an offset is known */
        line = 1;
        for (size_t i = 0; i < p->problem_offset && text[i]; i++)
            line += text[i] == '\n';
    }
    char ctx[160] = "";
    if (p->context)
        snprintf(ctx, sizeof ctx, " (%s at line %d)", p->context, (int)p->context_mark.line + 1);
    return fail(r, line, "syntax", "%s%s", p->problem ? p->problem : "not YAML", ctx);
}

/* Deeper nesting than any cluster file needs (its deepest: the root, groups, a group and its
 * intra_node: 4). */
#define MAX_DEPTH 64

/* 0, or -1 with the line when the text nests deeper than a cluster file can (dsl/yaml.h). */
static int check_depth(const reader *r, const char *text, size_t len) {
    int line = tr_yaml_too_deep(text, len, MAX_DEPTH);
    if (line < 0) {
        snprintf(r->err, r->errlen, "%s: out of memory", r->path);
        return -1;
    }
    return line ? fail(r, line, "syntax", "nested deeper than %d levels (a cluster file needs 4)",
                       MAX_DEPTH)
                : 0;
}

/* One YAML document from text into doc (deleted by the caller when 0 is returned). */
static int parse(const reader *r, const char *text, size_t len, yaml_document_t *doc) {
    if (check_depth(r, text, len)) return -1;
    yaml_parser_t p;
    if (!yaml_parser_initialize(&p)) {
        snprintf(r->err, r->errlen, "%s: out of memory", r->path);
        return -1;
    }
    yaml_parser_set_input_string(&p, (const unsigned char *)text, len);
    int rc = yaml_parser_load(&p, doc) ? 0 : syntax_error(r, &p, text);
    if (!rc) { /* a second document would be ignored silently */
        yaml_document_t more;
        if (!yaml_parser_load(&p, &more)) {
            rc = syntax_error(r, &p, text);
        } else {
            yaml_node_t *root = yaml_document_get_root_node(&more);
            if (root)
                rc = fail(r, line_of(root), "syntax",
                          "a second document ('---'); a cluster file is one");
            yaml_document_delete(&more);
        }
        if (rc) yaml_document_delete(doc);
    }
    yaml_parser_delete(&p);
    return rc;
}

int tr_cluster_load(tr_cluster *c, const char *path, char *err, size_t errlen) {
    memset(c, 0, sizeof *c);
    snprintf(c->source, sizeof c->source, "%s", path);
    reader r = {path, NULL, err, errlen};
    char *text;
    size_t len;
    if (read_file(&r, &text, &len)) return -1;
    yaml_document_t doc;
    int rc = parse(&r, text, len, &doc);
    free(text);
    if (rc) return -1;
    r.doc = &doc;
    rc = get_cluster(&r, c);
    yaml_document_delete(&doc);
    return rc;
}
