/* Clusters without a file: the table of known devices, ranks counted through the groups,
 * the cluster of `--gpus N --gpus-per-node K --gpu NAME`, and the cluster written back as a
 * cluster file (the reader is cluster_yaml.c). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "dsl/cluster_private.h"

#define GiB 1073741824.0

const char *tr_origin_name(tr_origin o) {
    switch (o) {
    case TR_ORIGIN_ASSUMED:
        return "assumed";
    case TR_ORIGIN_TABLE:
        return "table";
    case TR_ORIGIN_GIVEN:
        return "given";
    case TR_ORIGIN_MEASURED:
        return "measured";
    case TR_ORIGIN_PUBLISHED:
        return "published";
    }
    return "?";
}

/* Memory is about what the driver reports (a little under the marketed size); peak_flops the
 * vendor's dense bf16 tensor-core figure (without sparsity); mem_bw the vendor's. The link
 * figures are typical, not measured: intra_bw is the bus bandwidth NCCL's all-reduce reaches
 * inside a server (NVLink 3 on the A100, NVLink 4 on the H100 / H200, NVLink 5 on the B200,
 * PCIe on the L40S and H100 PCIe), inter_bw a server's network divided by its devices
 * (8 x 200 Gb/s HDR for the A100, 8 x 400 Gb/s NDR for the H100 / H200 / B200 / MI300X, less
 * the protocol's share), latencies the order of one step of a ring. Prices are assumed: a
 * typical on-demand price per device-hour in 2024-25; they vary by provider and month.
 * Sources: the vendors' datasheets (NVIDIA A100, H100, H200, DGX B200, L40S; AMD MI300X).
 *
 * efficiency: the share of peak_flops a training step's matrix products reach, fitted to the
 * calibration set of tests/published_runs.tsv for the generations it has runs of (the median
 * ratio of published to predicted throughput there; tests/test_plan.c prints the errors), and
 * never to its validation set. The A100 (EFF_A100) from Narayanan et al. 2021 Table 1 (GPT
 * models, 32-3072 A100-80GB); the H100 (EFF_H100) from Megatron-LM's README scaling table of
 * July 2024 (GPT models, 48-6144 H100-80GB). A device of another generation takes the
 * nearest one's figure, assumed: the H200 the H100's (the same chip, more memory), the B200,
 * MI300X, L40S and H100 PCIe the H100's (newer, higher peaks are reached less fully). */
#define EFF_A100 0.53
#define EFF_H100 0.50
#define SRC_A100 "Narayanan et al. 2021, A100"
#define SRC_H100 "Megatron-LM 2024, H100"
static const tr_device_info devices[] = {
    /* name, aliases,
       mem_bytes, peak_flops, mem_bw, intra_bw, intra_lat, inter_bw, inter_lat, per_node, price,
       efficiency, its source (NULL: assumed) */
    {"A100-40GB", "A100-SXM4-40GB,NVIDIA A100-SXM4-40GB", /* HBM2, NVLink 3, HDR */
     40 * GiB, 312e12, 1.555e12, 230e9, 5e-6, 22e9, 10e-6, 8, 1.3,
     EFF_A100, SRC_A100},
    {"A100-80GB", "A100-SXM4-80GB,NVIDIA A100-SXM4-80GB", /* HBM2e, NVLink 3, HDR */
     80 * GiB, 312e12, 2.039e12, 230e9, 5e-6, 22e9, 10e-6, 8, 1.8,
     EFF_A100, SRC_A100},
    {"H100-80GB", "H100,H100-SXM,H100-SXM5,NVIDIA H100 80GB HBM3", /* NVLink 4, NDR */
     80 * GiB, 989e12, 3.35e12, 360e9, 5e-6, 45e9, 10e-6, 8, 2.5,
     EFF_H100, SRC_H100},
    {"H100-PCIe", "H100-PCIE-80GB,NVIDIA H100 PCIe", /* HBM2e, PCIe 5, HDR */
     80 * GiB, 756e12, 2.0e12, 25e9, 5e-6, 22e9, 10e-6, 8, 2.0,
     EFF_H100, NULL},
    {"H200", "H200-141GB,H200-SXM,NVIDIA H200", /* HBM3e 141 GB, NVLink 4, NDR */
     140 * GiB, 989e12, 4.8e12, 360e9, 5e-6, 45e9, 10e-6, 8, 3.5,
     EFF_H100, NULL},
    {"B200", "B200-180GB,NVIDIA B200", /* HBM3e, NVLink 5, NDR */
     180 * GiB, 2250e12, 8e12, 720e9, 5e-6, 45e9, 10e-6, 8, 5.5,
     EFF_H100, NULL},
    {"L40S", "NVIDIA L40S", /* GDDR6 48 GB, PCIe 4, no NVLink, Ethernet */
     45 * GiB, 362e12, 0.864e12, 20e9, 5e-6, 3e9, 10e-6, 8, 1.0,
     EFF_H100, NULL},
    {"MI300X", "AMD Instinct MI300X", /* HBM3 192 GB, Infinity Fabric, 400 Gb/s per device */
     192 * GiB, 1307e12, 5.3e12, 300e9, 5e-6, 45e9, 10e-6, 8, 3.0,
     EFF_H100, NULL},
};

#define N_DEVICES ((int)(sizeof devices / sizeof devices[0]))

int tr_device_count(void) {
    return N_DEVICES;
}

const tr_device_info *tr_device_at(int i) {
    return i >= 0 && i < N_DEVICES ? &devices[i] : NULL;
}

/* Whether name is one of the comma-separated aliases (any case). */
static int in_aliases(const char *aliases, const char *name) {
    size_t n = strlen(name);
    for (const char *p = aliases; *p;) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        if (len == n && !strncasecmp(p, name, n)) return 1;
        if (!end) break;
        p = end + 1;
    }
    return 0;
}

const tr_device_info *tr_device_find(const char *name) {
    if (!name || !*name) return NULL;
    for (int i = 0; i < N_DEVICES; i++)
        if (!strcasecmp(devices[i].name, name) || in_aliases(devices[i].aliases, name))
            return &devices[i];
    return NULL;
}

void tr_device_list(char *buf, size_t len) {
    if (!len) return;
    buf[0] = 0;
    size_t used = 0;
    for (int i = 0; i < N_DEVICES && used < len; i++) {
        int w = snprintf(buf + used, len - used, "%s%s", i ? ", " : "", devices[i].name);
        if (w < 0) break;
        used += (size_t)w;
    }
}

static void fill(tr_figure *f, double v, tr_origin from) {
    if (f->from == TR_ORIGIN_GIVEN) return;
    f->v = v;
    f->from = from;
}

/* An unknown device: figures a planner can work with, all assumed. The file must give its
 * memory and peak rate (cluster_yaml.c refuses it otherwise): those decide a plan. The links
 * are a PCIe server on 100 Gb/s Ethernet shared by 8 devices. */
static const tr_device_info unknown_device = {
    "", "", 0, 0, 1e12, 20e9, 5e-6, 1.5e9, 20e-6, TR_UNKNOWN_PER_NODE, 0, EFF_H100, NULL,
};

void tr_group_fill(tr_node_group *g, const tr_device_info *d) {
    tr_origin from = d ? TR_ORIGIN_TABLE : TR_ORIGIN_ASSUMED;
    if (!d) d = &unknown_device;
    fill(&g->mem_bytes, d->mem_bytes, from);
    fill(&g->peak_flops, d->peak_flops, from);
    fill(&g->mem_bw, d->mem_bw, from);
    fill(&g->intra.bw, d->intra_bw, from);
    fill(&g->intra.lat, d->intra_lat, from);
    fill(&g->inter.bw, d->inter_bw, from);
    fill(&g->inter.lat, d->inter_lat, from);
    fill(&g->price_hour, d->price_hour, from);
    fill(&g->egress_per_gb, 0, TR_ORIGIN_ASSUMED); /* no provider's egress is in the table */
    tr_group_fill_efficiency(g, d);
}

void tr_group_fill_efficiency(tr_node_group *g, const tr_device_info *d) {
    if (!d) d = &unknown_device;
    if (g->efficiency.from == TR_ORIGIN_GIVEN) return;
    const char *src = d->efficiency_source;
    fill(&g->efficiency, d->efficiency, src ? TR_ORIGIN_PUBLISHED : TR_ORIGIN_ASSUMED);
    snprintf(g->efficiency_source, sizeof g->efficiency_source, "%s", src ? src : "");
}

void tr_cluster_fill_between(tr_cluster *c) {
    for (int i = 0; i < c->n_groups; i++) {
        c->between[i][i] = c->g[i].inter;
        for (int j = 0; j < c->n_groups; j++) {
            if (i == j) continue;
            const tr_link *a = &c->g[i].inter, *b = &c->g[j].inter;
            const tr_link *slow =
                a->bw.v != b->bw.v ? (a->bw.v < b->bw.v ? a : b) : (a->lat.v >= b->lat.v ? a : b);
            fill(&c->between[i][j].bw, slow->bw.v, TR_ORIGIN_ASSUMED);
            fill(&c->between[i][j].lat, slow->lat.v, TR_ORIGIN_ASSUMED);
        }
    }
}

long tr_cluster_devices(const tr_cluster *c) {
    long n = 0;
    for (int i = 0; i < c->n_groups; i++)
        n += (long)c->g[i].nodes * c->g[i].per_node;
    return n;
}

int tr_cluster_group_of(const tr_cluster *c, long rank, long *node) {
    if (rank < 0) return -1;
    long first_node = 0;
    for (int i = 0; i < c->n_groups; i++) {
        long size = (long)c->g[i].nodes * c->g[i].per_node;
        if (rank < size) {
            if (node) *node = first_node + rank / c->g[i].per_node;
            return i;
        }
        rank -= size;
        first_node += c->g[i].nodes;
    }
    return -1;
}

/* World rank r's node (a detected job's: its host) into *node, and its organisation: "" when
 * it has none (then its node is its own). */
static const char *org_of(const tr_cluster *c, long r, long *node) {
    const tr_cluster_hosts *h = &c->hosts;
    if (h->n_hosts > 0 && r >= 0 && r < h->n_ranks) {
        *node = h->host_of[r];
        return h->org[h->host_of[r]];
    }
    int g = tr_cluster_group_of(c, r, node);
    if (g < 0) *node = -1 - r; /* out of range: a node of its own */
    return g < 0 ? "" : c->g[g].org;
}

int tr_cluster_same_org(const tr_cluster *c, long a, long b) {
    long na, nb;
    const char *oa = org_of(c, a, &na), *ob = org_of(c, b, &nb);
    return na == nb || (oa[0] && !strcmp(oa, ob));
}

/* Being in one organisation is an equivalence, so a block is in one when every two
 * neighbours in it are: only neighbours on different nodes need a look. */
int tr_cluster_blocks_in_orgs(const tr_cluster *c, long world, long block) {
    if (block <= 1) return 1;
    const tr_cluster_hosts *h = &c->hosts;
    if (h->n_hosts > 0) {
        for (long r = 1; r < world && r < h->n_ranks; r++)
            if (r % block && !tr_cluster_same_org(c, r - 1, r)) return 0;
        return 1;
    }
    long first = 0;
    for (int i = 0; i < c->n_groups && first < world; i++) {
        long per = c->g[i].per_node;
        for (long n = 0; n < c->g[i].nodes; n++) {
            long p = first + n * per; /* the node's first rank */
            if (p >= world) return 1;
            if (p > 0 && p % block && !tr_cluster_same_org(c, p - 1, p)) return 0;
        }
        first += (long)c->g[i].nodes * per;
    }
    return 1;
}

/* o into named[0..*k) unless there already */
static void add_name(const char **named, int *k, const char *o) {
    for (int j = 0; j < *k; j++)
        if (!strcmp(named[j], o)) return;
    if (*k < TR_CLUSTER_MAX_HOSTS) named[(*k)++] = o;
}

int tr_cluster_orgs(const tr_cluster *c, int g0, long world, int *named) {
    const char *names[TR_CLUSTER_MAX_HOSTS];
    int k = 0;
    long own = 0;
    const tr_cluster_hosts *h = &c->hosts;
    if (h->n_hosts > 0 && g0 == 0) {
        unsigned char used[TR_CLUSTER_MAX_HOSTS] = {0};
        for (long r = 0; r < world && r < h->n_ranks; r++) {
            int x = h->host_of[r];
            if (x < 0 || x >= TR_CLUSTER_MAX_HOSTS || used[x]) continue;
            used[x] = 1;
            if (h->org[x][0]) add_name(names, &k, h->org[x]);
            else own++;
        }
    } else {
        for (int i = g0 < 0 ? 0 : g0; i < c->n_groups && world > 0; i++) {
            const tr_node_group *g = &c->g[i];
            long nodes = (world + g->per_node - 1) / g->per_node;
            if (nodes > g->nodes) nodes = g->nodes;
            if (g->org[0]) add_name(names, &k, g->org);
            else own += nodes;
            world -= (long)g->nodes * g->per_node;
        }
    }
    *named = k > 0;
    return (int)(own + k);
}

/* The checks of tr_cluster_from_gpus; *per_node resolved from the device when 0. */
static int check_gpus(long n, int *per_node, const char *gpu, const tr_device_info *d, char *err,
                      size_t errlen) {
    if (!d) {
        char known[512];
        tr_device_list(known, sizeof known);
        snprintf(err, errlen, "--gpu %s: unknown device; known: %s", gpu ? gpu : "(none)", known);
        return -1;
    }
    if (n < 1) {
        snprintf(err, errlen, "--gpus %ld: must be at least 1", n);
        return -1;
    }
    if (*per_node < 0 || *per_node > TR_CLUSTER_MAX_PER_NODE) {
        snprintf(err, errlen, "--gpus-per-node %d: must be from 1 to %d", *per_node,
                 TR_CLUSTER_MAX_PER_NODE);
        return -1;
    }
    int usual = *per_node == 0;
    if (usual) *per_node = n < d->per_node ? (int)n : d->per_node;
    if (n % *per_node) {
        snprintf(err, errlen, "--gpus %ld is not a multiple of --gpus-per-node %d%s", n, *per_node,
                 usual ? " (the device's usual server; give --gpus-per-node)" : "");
        return -1;
    }
    if (n / *per_node > TR_CLUSTER_MAX_NODES) {
        snprintf(err, errlen, "--gpus %ld: more than %d nodes of %d", n, TR_CLUSTER_MAX_NODES,
                 *per_node);
        return -1;
    }
    return 0;
}

int tr_cluster_from_gpus(tr_cluster *c, long n, int per_node, const char *gpu, char *err,
                         size_t errlen) {
    memset(c, 0, sizeof *c);
    const tr_device_info *d = tr_device_find(gpu);
    if (check_gpus(n, &per_node, gpu, d, err, errlen)) return -1;
    snprintf(c->source, sizeof c->source, "--gpus %ld --gpus-per-node %d --gpu %s", n, per_node,
             d->name);
    c->n_groups = 1;
    tr_node_group *g = &c->g[0];
    snprintf(g->name, sizeof g->name, "node");
    snprintf(g->device, sizeof g->device, "%s", d->name);
    g->nodes = (int)(n / per_node);
    g->per_node = per_node;
    tr_group_fill(g, d);
    tr_cluster_fill_between(c);
    return 0;
}

/* ---- writing --------------------------------------------------------------------------- */

/* v in base units as a number of the file's units (v * div / mul), in the fewest digits that
 * the reader (x * mul / div) turns back into v. A figure read from a file or the table comes
 * back exactly; one measured may have no such number (x * 1e9 skips doubles) and comes back
 * within a unit in the last place. */
static void put_num(FILE *f, double v, double mul, double div) {
    double x = v * div / mul;
    char buf[40];
    for (int p = 15; p <= 17; p++) {
        snprintf(buf, sizeof buf, "%.*g", p, x);
        if (strtod(buf, NULL) * mul / div == v) break;
    }
    fputs(buf, f);
}

/* A YAML double-quoted string: quotes, backslashes and control bytes escaped. */
static void put_str(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\')
            fprintf(f, "\\%c", ch);
        else if (ch < 32 || ch == 127)
            fprintf(f, "\\x%02x", ch);
        else
            fputc(ch, f);
    }
    fputc('"', f);
}

static void put_link(FILE *f, const char *key, const tr_link *l) {
    fprintf(f, "    %s: { bandwidth_gb_s: ", key);
    put_num(f, l->bw.v, 1e9, 1);
    fputs(", latency_us: ", f);
    put_num(f, l->lat.v, 1, 1e6);
    fputs(" }\n", f);
}

static void put_group(FILE *f, const tr_node_group *g) {
    fputs("  - name: ", f);
    put_str(f, g->name);
    fputs("\n    device: ", f);
    put_str(f, g->device);
    fprintf(f, "\n    nodes: %d\n    per_node: %d\n", g->nodes, g->per_node);
    if (g->provider[0]) {
        fputs("    provider: ", f);
        put_str(f, g->provider);
        fputc('\n', f);
    }
    if (g->org[0]) {
        fputs("    organisation: ", f);
        put_str(f, g->org);
        fputc('\n', f);
    }
    fputs("    memory_gib: ", f);
    put_num(f, g->mem_bytes.v, GiB, 1);
    fputs("\n    peak_tflops: ", f);
    put_num(f, g->peak_flops.v, 1e12, 1);
    fputs("\n    memory_bandwidth_gb_s: ", f);
    put_num(f, g->mem_bw.v, 1e9, 1);
    if (g->efficiency.v > 0) {
        fputs("\n    matrix_efficiency: ", f);
        put_num(f, g->efficiency.v, 1, 1);
    }
    fputc('\n', f);
    put_link(f, "intra_node", &g->intra);
    put_link(f, "inter_node", &g->inter);
    fputs("    price_per_hour: ", f);
    put_num(f, g->price_hour.v, 1, 1);
    fputs("\n    egress_per_gb: ", f);
    put_num(f, g->egress_per_gb.v, 1, 1);
    fputc('\n', f);
    if (g->cores) fprintf(f, "    cores: %d\n", g->cores);
}

static void put_cluster(FILE *f, const tr_cluster *c) {
    fputs("# A cluster written by the trainer (tr_cluster_write) from: ", f);
    for (const char *s = c->source; *s; s++) /* one comment line */
        fputc((unsigned char)*s < 32 ? ' ' : *s, f);
    fputs("\ngroups:\n", f);
    for (int i = 0; i < c->n_groups; i++)
        put_group(f, &c->g[i]);
    if (c->n_groups > 1) fputs("links:\n", f);
    for (int i = 0; i < c->n_groups; i++)
        for (int j = i + 1; j < c->n_groups; j++) {
            fputs("  - between: [", f);
            put_str(f, c->g[i].name);
            fputs(", ", f);
            put_str(f, c->g[j].name);
            fputs("]\n    bandwidth_gb_s: ", f);
            put_num(f, c->between[i][j].bw.v, 1e9, 1);
            fputs("\n    latency_us: ", f);
            put_num(f, c->between[i][j].lat.v, 1, 1e6);
            fputc('\n', f);
        }
}

/* Written to PATH.tmp, then renamed over PATH: a reader never sees half a file. */
int tr_cluster_write(const tr_cluster *c, const char *path, char *err, size_t errlen) {
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp) {
        snprintf(err, errlen, "%s: cannot write: path too long", path);
        return -1;
    }
    FILE *f = fopen(tmp, "w");
    if (!f) {
        snprintf(err, errlen, "%s: cannot write: %s", tmp, strerror(errno));
        return -1;
    }
    put_cluster(f, c);
    int bad = ferror(f);
    if (fclose(f) || bad) {
        snprintf(err, errlen, "%s: cannot write: %s", tmp, strerror(errno ? errno : EIO));
        remove(tmp);
        return -1;
    }
    if (rename(tmp, path)) {
        snprintf(err, errlen, "%s: cannot write: %s", path, strerror(errno));
        remove(tmp);
        return -1;
    }
    return 0;
}
