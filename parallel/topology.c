/* parallel/topology.h: the running job as a tr_cluster. Host names gathered from every rank
 * make the nodes; every rank then measures its own figures (sgemm, memcpy, the collective
 * inside its node, between nodes for one rank per node) at the same time as the others, the
 * figures are gathered, and rank 0's cluster is broadcast so that all ranks hold its bytes. */
#define _GNU_SOURCE /* sched_getaffinity, CPU_COUNT */
#include "parallel/topology.h"

#include <cblas.h>
#include <math.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "parallel/comm/base.h"
#include "parallel/comm/env.h"
/* What each rank tells the others about where it runs, gathered as bytes. */
typedef struct {
    char name[256]; /* the host's name, NUL-padded */
    char kernel[40]; /* the running kernel's boot id: ranks with the same share one machine
                        (containers, network namespaces) whatever their hosts' names; "" when
                        not known */
    cpu_set_t cpus; /* the cores this rank may run on (none: unknown) */
} host_rec;

/* How long the measurements run (about 0.3 s with 4 ranks on 2 busy cores, most of it sgemm
 * and memcpy; between hosts 1-3 s more, the link's and the ring's all-reduces: a plan on the
 * box took 3.3-3.5 s at 1 Gbit/s before them, 4.0-4.7 s after; 9.7 s at 100 Mbit/s):
 * SGEMM_REPS products of SGEMM_N cubed after one warm-up, timed together; COPY_REPS memcpy
 * of COPY_BYTES; LAT_REPS all-reduces of 8 bytes and BW_REPS of BW_BYTES after one warm-up
 * each, timed one by one for their median; between hosts, where those took under BW_MIN_S,
 * BIG_REPS of 4x the bytes, up to BIG_BYTES. */
enum {
    SGEMM_N = 512,
    SGEMM_REPS = 4,
    COPY_REPS = 4,
    LAT_REPS = 21,
    BW_REPS = 9,
    BIG_REPS = 5,
    MAX_REPS = 21
};
#define COPY_BYTES ((size_t)32 << 20)
/* 1 MiB inside a host: with 4 ranks on 2 cores, 2 and 4 MiB all-reduces there sometimes
 * outlast the 20 ms that comm/mpi.c's waits spin before they sleep, and then read 20 times
 * slower (between hosts 4 MiB ones read steadily: below) */
#define BW_BYTES ((size_t)1 << 20)
/* Between hosts a 1 MiB all-reduce that takes a few ms is at the mercy of one rank's
 * scheduling: on a box at 1 Gbit/s (4 ranks, 2 cores, 2026-12-06) six plans read the hosts'
 * first ranks' at 47-101 MB/s and the ring through all 4 at 57-86 with 1 MiB, 66-81 and
 * 71-81 with 4 MiB (a tp 4 run's own 4 MiB all-reduces moved 60-70). The ring is timed at
 * 4 MiB whatever the link, the size of the buckets and of tp's collectives there: at 100
 * Mbit/s its 1 MiB one (4 steps of 256 KiB each way) read 10.0 MB/s, 4 MiB 10.9, the first
 * ranks' 11.4, and dp 4's 4 MiB buckets ran as if at about 11-12 */
#define BIG_BYTES ((size_t)4 << 20)
#define BW_MIN_S 0.04

/* One rank's measurements, gathered from every rank as doubles (0: not measured). */
enum {
    F_CORES,
    F_MEM,
    F_FLOPS,
    F_COPY,
    F_INTRA_BW, /* bw, lat, p2p of a link: in this order */
    F_INTRA_LAT,
    F_INTRA_P2P,
    F_INTER_BW,
    F_INTER_LAT,
    F_INTER_P2P,
    F_INTER_RING,  /* every rank's all-reduce at once, over nodes of several ranks each */
    F_NOISE,       /* the largest tr_topology_spread() of the compute probes this rank timed */
    F_LINK_NOISE,  /* ... and of its link probes */
    F_THREADS,     /* threads this rank computes on */
    F_FLOPS_NOISE, /* the sgemm probe's own tr_topology_spread(): what the split by speed reads */
    F_POOL,        /* the ranks that run on this rank's node's cores, of every node */
    F_N
};

/* Who is where: the nodes (hosts) in order of their first rank, and their groups. */
typedef struct {
    int size, n_nodes, contiguous;
    host_rec *recs; /* (size): each rank's host and cores */
    int *node;      /* (size): the node of each rank */
    int *first;     /* (n_nodes): the node's first rank */
    int *count;     /* (n_nodes): ranks on the node */
    int *group;     /* (n_nodes): the group of each node */
    int n_groups;   /* runs of consecutive nodes with the same count */
    int *want;      /* (size): scratch for picking ranks */
    double *figs;   /* (size, F_N): every rank's measurements */
} hosts;

/* The measurements' buffers, all allocated before the first one starts, so that a rank out
 * of memory is known to all before they enter collectives it would miss. */
typedef struct {
    float *a, *b, *c; /* (SGEMM_N, SGEMM_N) */
    char *src, *dst;  /* COPY_BYTES */
    float *link;      /* BIG_BYTES */
} scratch;

static double now(void) {
    return tr_now();
}

/* ---- this process's figures ---------------------------------------------------------------- */

double tr_topology_spread(double *t, int n) {
    if (n < 2) return 0;
    tr_sort_doubles(t, (size_t)n);
    double med = t[n / 2], mad = 0;
    /* the deviations rise both ways from the median: merge the two runs up to the middle one */
    for (int k = 0, lo = n / 2 - 1, hi = n / 2; k <= n / 2; k++)
        mad = lo >= 0 && (hi >= n || med - t[lo] < t[hi] - med) ? med - t[lo--] : t[hi++] - med;
    return med > 0 ? 1.25 * 1.4826 * mad / sqrt((double)n) / med : 0;
}

/* Products of n-cubed after `warm` untimed ones: the best single rate, the rate of all `reps`
 * together (which, unlike the best, sees ranks that take turns on shared cores), and when
 * noise is not NULL the tr_topology_spread() of their times. */
static void sgemm_rates(const float *a, const float *b, float *c, int n, int warm, int reps,
                        double *best, double *all, double *noise) {
    double flop = 2.0 * n * n * n, t1 = now(), t[MAX_REPS] = {0};
    *best = 0;
    for (int rep = 0; rep < warm + reps; rep++) {
        double t0 = now();
        if (rep == warm) t1 = t0;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
        double dt = now() - t0;
        if (rep >= warm && rep - warm < MAX_REPS) t[rep - warm] = dt;
        if (rep >= warm && flop / dt > *best) *best = flop / dt;
    }
    *all = flop * reps / (now() - t1);
    if (noise) *noise = tr_topology_spread(t, reps < MAX_REPS ? reps : MAX_REPS);
}

static void sgemm_fill(float *a, float *b, size_t nn) {
    for (size_t i = 0; i < nn; i++) {
        a[i] = (float)(i % 7) * 0.1f;
        b[i] = (float)(i % 5) * 0.1f;
    }
}

void tr_topology_faster_look(tr_cluster *c, int top, double again) {
    double first = top >= 0 && top < TR_CLUSTER_EFF ? c->model_eff[top] : 0;
    if (!(first > 0) || !(again > 0)) return;
    c->model_look = again / first;
    if (c->model_look <= 1) return;
    for (int i = 0; i < TR_CLUSTER_EFF; i++)
        c->model_eff[i] *= c->model_look;
}

double tr_topology_sgemm_rate(int n, int warm, int reps) {
    size_t nn = (size_t)n * (size_t)n;
    float *a = malloc(nn * sizeof(float)), *b = malloc(nn * sizeof(float));
    float *c = malloc(nn * sizeof(float));
    double rate = 0;
    if (a && b && c) {
        sgemm_fill(a, b, nn);
        double all;
        sgemm_rates(a, b, c, n, warm, reps, &rate, &all, NULL);
    }
    free(a);
    free(b);
    free(c);
    return rate;
}

/* Bytes read + written per second by COPY_REPS memcpy of COPY_BYTES; *noise: their tr_topology_spread(). */
static double copy_rate(char *src, char *dst, double *noise) {
    double t[COPY_REPS];
    memset(src, 1, COPY_BYTES); /* fault the pages in before timing */
    memset(dst, 0, COPY_BYTES);
    double t0 = now(), last = t0;
    for (int rep = 0; rep < COPY_REPS; rep++) {
        memcpy(rep % 2 ? src : dst, rep % 2 ? dst : src, COPY_BYTES);
        double t1 = now();
        t[rep] = t1 - last;
        last = t1;
    }
    *noise = tr_topology_spread(t, COPY_REPS);
    return 2.0 * (double)COPY_BYTES * COPY_REPS / (last - t0);
}

/* Does rank r run on the same machine as rank q (one kernel), known? */
static int same_kernel(const hosts *h, int r, int q) {
    return h->recs[r].kernel[0] && strcmp(h->recs[r].kernel, h->recs[q].kernel) == 0;
}

/* The node's cores: those online, or if fewer those its ranks may run on together (mpirun
 * may bind each rank to one core; a cgroup or taskset may allow fewer than the machine's),
 * less what ranks of other nodes on the same machine take of them: two containers (or the
 * cluster in a box's network namespaces) of 2 ranks each on one 2-core machine get 1 core
 * each, as the ranks of one host of 4 share its 2. *pool: the ranks, of this node and those
 * others, that run on those cores together (4 there: a rank that waits lends its core to any
 * of them, not only to its own node's). */
static int node_cores(const hosts *h, int node, int *pool) {
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    cpu_set_t all;
    CPU_ZERO(&all);
    for (int r = 0; r < h->size; r++)
        if (h->node[r] == node) CPU_OR(&all, &all, &h->recs[r].cpus);
    long allowed = CPU_COUNT(&all);
    if (allowed > 0 && (online <= 0 || allowed < online)) online = allowed;
    int mine = h->count[node], others = 0;
    for (int r = 0; r < h->size; r++) {
        cpu_set_t both;
        CPU_AND(&both, &all, &h->recs[r].cpus);
        others += h->node[r] != node && same_kernel(h, r, h->first[node]) &&
                  (CPU_COUNT(&both) > 0 || allowed == 0);
    }
    long cores = online * mine / (mine + others);
    *pool = mine + others;
    return online > 0 ? (int)(cores > 0 ? cores : 1) : 0;
}

/* This rank's share of its machine's memory: the ranks on it, of every node, divide it. */
static double phys_mem(const hosts *h, int rank) {
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
    int on = 0;
    for (int r = 0; r < h->size; r++)
        on += r == rank || h->node[r] == h->node[rank] || same_kernel(h, r, rank);
    return pages > 0 && page > 0 ? (double)pages * (double)page / on : 0;
}

/* The running kernel's boot id ("" when the system does not say). */
static void boot_id(char *out, size_t n) {
    out[0] = 0;
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (!f) return;
    if (!fgets(out, (int)n, f)) out[0] = 0;
    out[strcspn(out, "\n")] = 0;
    fclose(f);
}

/* ---- who is where -------------------------------------------------------------------------- */

static void hosts_free(hosts *h) {
    free(h->recs);
    free(h->node);
    free(h->first);
    free(h->count);
    free(h->group);
    free(h->want);
    free(h->figs);
}

static int gather_hosts(tr_comm *w, const tr_topology_opts *o, hosts *h, char *err, size_t errlen) {
    host_rec mine;
    memset(&mine, 0, sizeof mine);
    if (o->host)
        snprintf(mine.name, sizeof mine.name, "%s", o->host);
    else if (gethostname(mine.name, sizeof mine.name - 1) != 0)
        snprintf(mine.name, sizeof mine.name, "localhost");
    boot_id(mine.kernel, sizeof mine.kernel);
    if (sched_getaffinity(0, sizeof mine.cpus, &mine.cpus) != 0) CPU_ZERO(&mine.cpus);
    h->size = tr_comm_size(w);
    size_t n = (size_t)h->size;
    h->recs = malloc(n * sizeof(host_rec));
    h->node = malloc(n * sizeof(int));
    h->first = malloc(n * sizeof(int));
    h->count = malloc(n * sizeof(int));
    h->group = malloc(n * sizeof(int));
    h->want = malloc(n * sizeof(int));
    h->figs = malloc(n * F_N * sizeof(double));
    if (!h->recs || !h->node || !h->first || !h->count || !h->group || !h->want || !h->figs) {
        snprintf(err, errlen, "topology: out of memory for %d ranks' hosts", h->size);
        return -1;
    }
    if (tr_comm_all_gather(w, &mine, h->recs, sizeof mine, TR_COMM_BYTE)) {
        snprintf(err, errlen, "topology: gathering the host names failed");
        return -1;
    }
    return 0;
}

/* Nodes in order of their first rank; groups as runs of nodes with equal counts. */
static int map_nodes(hosts *h, char *err, size_t errlen) {
    h->n_nodes = 0;
    h->contiguous = 1;
    for (int r = 0; r < h->size; r++) {
        const char *name = h->recs[r].name;
        int k = 0;
        while (k < h->n_nodes && strcmp(h->recs[h->first[k]].name, name) != 0)
            k++;
        if (k == h->n_nodes) {
            h->first[k] = r;
            h->count[k] = 0;
            h->n_nodes++;
        }
        h->count[k]++;
        h->node[r] = k;
        /* node indices follow first ranks, so a step back means a node's ranks are split */
        if (r > 0 && k < h->node[r - 1]) h->contiguous = 0;
    }
    h->n_groups = 0;
    for (int k = 0; k < h->n_nodes; k++) {
        if (k == 0 || h->count[k] != h->count[k - 1]) h->n_groups++;
        h->group[k] = h->n_groups - 1;
    }
    if (h->n_groups > TR_CLUSTER_MAX_GROUPS) {
        snprintf(err, errlen,
                 "topology: %d runs of nodes with different rank counts, at most %d fit a "
                 "cluster; start the same number of ranks on every node",
                 h->n_groups, TR_CLUSTER_MAX_GROUPS);
        return -1;
    }
    return 0;
}

static int max_count(const hosts *h) {
    int m = 0;
    for (int k = 0; k < h->n_nodes; k++)
        if (h->count[k] > m) m = h->count[k];
    return m;
}

/* ---- the measurements ---------------------------------------------------------------------- */

static void scratch_free(scratch *s) {
    free(s->a);
    free(s->b);
    free(s->c);
    free(s->src);
    free(s->dst);
    free(s->link);
}

/* Allocate what this rank will measure with, then tell every rank who could not. */
static int scratch_init(tr_comm *w, const tr_topology_opts *o, int links, scratch *s, char *err,
                        size_t errlen) {
    size_t nn = (size_t)SGEMM_N * SGEMM_N;
    int ok = 1;
    if (o->cpu && o->peak_flops <= 0) {
        s->a = malloc(nn * sizeof(float));
        s->b = malloc(nn * sizeof(float));
        s->c = malloc(nn * sizeof(float));
        ok = s->a && s->b && s->c;
        if (ok) sgemm_fill(s->a, s->b, nn);
    }
    if (o->cpu) {
        s->src = malloc(COPY_BYTES);
        s->dst = malloc(COPY_BYTES);
        ok = ok && s->src && s->dst;
    }
    if (links) {
        s->link = calloc(BIG_BYTES / sizeof(float), sizeof(float));
        ok = ok && s->link;
    }
    int failed = !ok;
    if (tr_comm_all_reduce(w, &failed, 1, TR_COMM_I32)) {
        snprintf(err, errlen, "topology: all_reduce of the ranks' memory state failed");
        return -1;
    }
    if (failed) {
        snprintf(err, errlen,
                 "topology: %d rank%s (%s) out of memory for the measurements' %.0f MiB", failed,
                 failed > 1 ? "s" : "", ok ? "not this one" : "this one among them",
                 (double)(3 * nn * sizeof(float) + 2 * COPY_BYTES + BIG_BYTES) / (1 << 20));
        return -1;
    }
    return 0;
}

/* The median time of `reps` all-reduces of n floats on g, after one warm-up: a rank
 * descheduled on shared cores delays a few of them, not the typical one. *noise: the larger
 * of itself and their spread. */
static int median_time(tr_comm *g, float *buf, size_t n, int reps, double *median, double *noise) {
    double t[MAX_REPS] = {0};
    int rc = tr_comm_all_reduce(g, buf, n, TR_COMM_F32);
    for (int i = 0; i < reps && !rc; i++) {
        double t0 = now();
        rc = tr_comm_all_reduce(g, buf, n, TR_COMM_F32);
        t[i] = now() - t0;
    }
    double v = tr_topology_spread(t, reps);
    if (v > *noise) *noise = v;
    *median = t[reps / 2];
    return rc;
}

/* The link as the planner models a collective over p ranks (plan_cost.c's t_allreduce):
 * 2 log2(p) steps of latency, then the bytes at the bus bandwidth (NCCL's for all-reduce,
 * 2(p-1)/p x bytes / time). The latency is an 8-byte all-reduce's time over these p ranks,
 * per step; the bandwidth, a BW_BYTES one's less that time, or, up to `most` bytes, of 4x
 * the bytes while the larger took under BW_MIN_S on any rank (all of g decide together: they
 * run the same all-reduces). So the plan prices the probes' all-reduces at what they took.
 * *noise: the larger of itself and the kept bandwidth's spread. */
static int time_link(tr_comm *g, float *buf, size_t least, size_t most, double *bw, double *lat,
                     double *noise) {
    double p = tr_comm_size(g), t = 0, small = 0, spread = 0;
    size_t bytes = least;
    int rc = median_time(g, buf, 2, LAT_REPS, &small, noise);
    while (!rc) {
        spread = 0;
        rc = median_time(g, buf, bytes / sizeof(float), bytes > BW_BYTES ? BIG_REPS : BW_REPS, &t,
                         &spread);
        if (rc || bytes >= most) break;
        buf[0] = t < BW_MIN_S, buf[1] = 0; /* grow: every rank of g decides together */
        rc = tr_comm_all_reduce(g, buf, 2, TR_COMM_F32);
        if (rc || buf[0] == 0) break;
        bytes *= 4;
    }
    if (spread > *noise) *noise = spread;
    if (t > 2 * small) t -= small;
    *bw = t > 0 ? 2.0 * (p - 1) / p * (double)bytes / t : 0;
    *lat = small / (2 * log2(p));
    return rc;
}

/* The median time of `reps` round trips: n floats from `from` to `to`, 8 bytes back; the
 * fastest in *fastest when not NULL; *noise, when not NULL: the larger of itself and their
 * spread. */
static int round_trip(tr_comm *g, float *buf, size_t n, int from, int to, int reps,
                      double *median, double *fastest, double *noise) {
    double t[MAX_REPS] = {0};
    int me = tr_comm_rank(g), rc = 0;
    for (int i = 0; i <= reps && !rc; i++) { /* the first: a warm-up */
        double t0 = now();
        if (me == from)
            rc = tr_comm_send(g, buf, n, TR_COMM_F32, to, 7) ||
                 tr_comm_recv(g, buf, 2, TR_COMM_F32, to, 8);
        else if (me == to)
            rc = tr_comm_recv(g, buf, n, TR_COMM_F32, from, 7) ||
                 tr_comm_send(g, buf, 2, TR_COMM_F32, from, 8);
        if (i > 0) t[i - 1] = now() - t0;
    }
    tr_sort_doubles(t, (size_t)reps);
    double v = me == from || me == to ? tr_topology_spread(t, reps) : 0;
    if (noise && v > *noise) *noise = v;
    *median = t[reps / 2];
    if (fastest) *fastest = t[0];
    return rc;
}

/* The one-way rate from `from` to `to` (set on `from` only): `bytes` less 8 over the
 * difference between round trips of `bytes` and of 8 bytes, each the median of `reps`, or
 * the fastest when `fastest`. When that difference is lost in the noise: `bytes` over the
 * whole round trip when `bound` (a lower bound), else the rate is left alone. */
static int pair_rate(tr_comm *g, float *buf, size_t bytes, int from, int to, int reps,
                     int fastest, int bound, double *rate, double *noise) {
    double small = 0, big = 0, s_fast = 0, b_fast = 0;
    int rc = round_trip(g, buf, 2, from, to, reps, &small, &s_fast, NULL);
    if (!rc)
        rc = round_trip(g, buf, bytes / sizeof(float), from, to, reps, &big, &b_fast, noise);
    if (fastest) small = s_fast, big = b_fast;
    if (tr_comm_rank(g) == from && big > 0 && (big > small || bound))
        *rate = (double)(bytes - 8) / (big > small ? big - small : big);
    return rc;
}

/* The link's own rate, one direction, between each rank of g and the next in turn (at most
 * P2P_PAIRS of them), from the median round trips of BW_BYTES. Each sender keeps its own;
 * the others leave *bw 0. *noise: the larger of itself and the large round trips' spread. */
static int time_p2p(tr_comm *g, float *buf, double *bw, double *noise) {
    enum { P2P_PAIRS = 16 };
    int p = tr_comm_size(g), rc = 0;
    for (int k = 0; k < p && k < P2P_PAIRS && !rc; k++) {
        if (p == 2 && k == 1) break; /* the one pair, once */
        rc = pair_rate(g, buf, BW_BYTES, k, (k + 1) % p, BW_REPS, 0, 0, bw, noise);
    }
    return rc;
}

/* Split w by color and time the link of this rank's subgroup when `timed` (every rank
 * calls it; the others join a group they leave idle), its all-reduces up to `most` bytes
 * (time_link). bw_lat: bandwidth, latency, p2p. */
static int time_split(tr_comm *w, int color, int timed, const char *name, size_t most, float *buf,
                      double *bw_lat, double *noise, char *err, size_t errlen) {
    tr_comm *g;
    if (tr_comm_split(w, color, tr_comm_rank(w), name, &g, err, errlen)) return -1;
    int rc = 0;
    if (timed && tr_comm_size(g) > 1) {
        rc = time_link(g, buf, BW_BYTES, most, &bw_lat[0], &bw_lat[1], noise);
        if (!rc) rc = time_p2p(g, buf, &bw_lat[2], noise); /* the planner's pipeline sends */
    }
    tr_comm_free(g);
    if (rc) snprintf(err, errlen, "topology: timing the %s link failed", name);
    return rc;
}

/* This rank's figures, measured while every other rank measures its own. */
static int measure(tr_comm *w, const tr_topology_opts *o, const hosts *h, int links, scratch *s,
                   double *f, char *err, size_t errlen) {
    int rank = tr_comm_rank(w), node = h->node[rank];
    int pool;
    f[F_CORES] = node_cores(h, node, &pool);
    f[F_POOL] = pool;
    f[F_THREADS] = o->cpu ? o->threads : 0;
    f[F_MEM] = o->cpu ? phys_mem(h, rank) : o->device_mem;
    if (o->mem_given > 0 && (f[F_MEM] <= 0 || o->mem_given < f[F_MEM])) f[F_MEM] = o->mem_given;
    f[F_FLOPS] = o->peak_flops;
    if (o->cpu && o->peak_flops <= 0) {
        if (tr_comm_barrier(w)) goto fail; /* at once: ranks sharing cores slow each other */
        double best;
        sgemm_rates(s->a, s->b, s->c, SGEMM_N, 1, SGEMM_REPS, &best, &f[F_FLOPS],
                    &f[F_FLOPS_NOISE]);
        f[F_NOISE] = f[F_FLOPS_NOISE];
    }
    if (o->cpu) {
        if (tr_comm_barrier(w)) goto fail;
        double v;
        f[F_COPY] = copy_rate(s->src, s->dst, &v);
        if (v > f[F_NOISE]) f[F_NOISE] = v;
    }
    if (links && max_count(h) > 1 &&
        time_split(w, node, 1, "intra", BW_BYTES, s->link, &f[F_INTRA_BW], &f[F_LINK_NOISE], err,
                   errlen))
        return -1;
    int leader = h->first[node] == rank;
    if (links && h->n_nodes > 1 &&
        time_split(w, !leader, leader, "inter", BIG_BYTES, s->link, &f[F_INTER_BW],
                   &f[F_LINK_NOISE], err, errlen))
        return -1;
    /* the leaders' figure is the link with the nodes' other ranks idle; a group with several
       ranks a node crosses it while all of them work (their copies and sums, and on shared
       cores the network's own work, take the same cores): a ring through every rank */
    double lat;
    if (links && h->n_nodes > 1 && max_count(h) > 1 &&
        time_link(w, s->link, BIG_BYTES, BIG_BYTES, &f[F_INTER_RING], &lat, &f[F_LINK_NOISE])) {
        snprintf(err, errlen, "topology: timing the ring through every rank failed");
        return -1;
    }
    return 0;
fail:
    snprintf(err, errlen, "topology: barrier before the measurements failed");
    return -1;
}

/* ---- the cluster --------------------------------------------------------------------------- */

/* The slowest of the ranks r with want[r]: the least of each rate, the most of each latency,
 * ignoring the ranks that did not measure (0). */
static void slowest(const double *all, int size, const int *want, double *agg) {
    for (int i = 0; i < F_N; i++)
        agg[i] = 0;
    for (int r = 0; r < size; r++) {
        if (!want[r]) continue;
        for (int i = 0; i < F_N; i++) {
            double v = all[(size_t)r * F_N + i];
            int most = i == F_INTRA_LAT || i == F_INTER_LAT || i == F_NOISE || i == F_LINK_NOISE ||
                       i == F_THREADS || i == F_FLOPS_NOISE || i == F_POOL;
            if (v > 0 && (agg[i] == 0 || (most ? v > agg[i] : v < agg[i]))) agg[i] = v;
        }
    }
}

static tr_figure fig(double v, tr_origin from) {
    return (tr_figure){v, from};
}

/* A link from the figures at f (bw, lat, p2p), or the assumed ones when not measured. */
static tr_link link_of(const double *f, double bw0, double lat0) {
    if (f[0] > 0 && f[1] > 0)
        return (tr_link){.bw = fig(f[0], TR_ORIGIN_MEASURED),
                         .lat = fig(f[1], TR_ORIGIN_MEASURED),
                         .p2p = fig(f[2], f[2] > 0 ? TR_ORIGIN_MEASURED : TR_ORIGIN_ASSUMED)};
    return (tr_link){.bw = fig(bw0, TR_ORIGIN_ASSUMED), .lat = fig(lat0, TR_ORIGIN_ASSUMED)};
}

static void fill_group(tr_node_group *g, const hosts *h, int gi, const double *agg,
                       const tr_topology_opts *o) {
    int k0 = 0;
    while (h->group[k0] != gi)
        k0++;
    snprintf(g->name, sizeof g->name, h->n_groups > 1 ? "node%d" : "node", gi);
    snprintf(g->device, sizeof g->device, "%s", o->device ? o->device : "cpu");
    for (int k = k0; k < h->n_nodes && h->group[k] == gi; k++)
        g->nodes++;
    g->per_node = h->count[k0];
    g->mem_bytes = fig(agg[F_MEM], !(agg[F_MEM] > 0)             ? TR_ORIGIN_ASSUMED
                                   : agg[F_MEM] == o->mem_given ? TR_ORIGIN_GIVEN
                                                                 : TR_ORIGIN_MEASURED);
    tr_origin peak = !o->cpu             ? TR_ORIGIN_TABLE
                     : o->peak_flops > 0 ? TR_ORIGIN_GIVEN
                                         : TR_ORIGIN_MEASURED;
    g->peak_flops = fig(agg[F_FLOPS], agg[F_FLOPS] > 0 ? peak : TR_ORIGIN_ASSUMED);
    g->mem_bw = fig(agg[F_COPY], agg[F_COPY] > 0 ? TR_ORIGIN_MEASURED : TR_ORIGIN_ASSUMED);
    g->intra = link_of(&agg[F_INTRA_BW], TR_TOPOLOGY_INTRA_BW, TR_TOPOLOGY_INTRA_LAT);
    g->price_hour = fig(0, TR_ORIGIN_ASSUMED);
    g->egress_per_gb = fig(0, TR_ORIGIN_ASSUMED);
    g->cores = (int)agg[F_CORES];
    g->threads = (int)agg[F_THREADS];
    g->pool = (int)agg[F_POOL];
}

/* Append to s (of size n) what fmt makes, truncated. */
TR_PRINTF(3, 4) static void cat(char *s, size_t n, const char *fmt, ...) {
    size_t used = strlen(s);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s + used, n - used, fmt, ap);
    va_end(ap);
}

/* A node's sgemm rate (its slowest rank's; 0: not measured) and the noise of its ranks' sgemm
 * probes (the largest tr_topology_spread). Only the sgemm's own: the link probes' noise (25%
 * on the cluster in a box: TCP between hosts that share 2 cores) says nothing of a host's
 * speed. */
static double node_rate(const hosts *h, int k, double *noise) {
    double v = 0;
    *noise = 0;
    for (int r = 0; r < h->size; r++) {
        const double *f = &h->figs[(size_t)r * F_N];
        if (h->node[r] != k) continue;
        if (f[F_FLOPS] > 0 && (v == 0 || f[F_FLOPS] < v)) v = f[F_FLOPS];
        if (f[F_FLOPS_NOISE] > *noise) *noise = f[F_FLOPS_NOISE];
    }
    return v;
}

/* "detected: 2 nodes (a, b) x 2 ranks, CPU, 2 cores" or, with groups, "(a x 3, b x 1)". */
static void describe(const hosts *h, const tr_cluster *c, const tr_topology_opts *o, int by_speed,
                     int speeds, char *s, size_t n) {
    enum { SHOWN = 8 };
    snprintf(s, n, "detected: %d node%s (", h->n_nodes, h->n_nodes > 1 ? "s" : "");
    for (int k = 0; k < h->n_nodes && k < SHOWN; k++) {
        cat(s, n, "%s%.40s", k ? ", " : "", h->recs[h->first[k]].name);
        if (h->n_groups > 1) cat(s, n, " x %d", h->count[k]);
    }
    if (h->n_nodes > SHOWN) cat(s, n, ", %d more", h->n_nodes - SHOWN);
    cat(s, n, ")");
    if (h->n_groups == 1) cat(s, n, " x %d rank%s", h->count[0], h->count[0] > 1 ? "s" : "");
    if (o->cpu)
        cat(s, n, ", CPU, %d core%s, %d thread%s a rank", c->g[0].cores,
            c->g[0].cores == 1 ? "" : "s", c->g[0].threads, c->g[0].threads == 1 ? "" : "s");
    else
        cat(s, n, ", %.63s", c->g[0].device);
    if (!h->contiguous) cat(s, n, "; ranks not contiguous per node");
    /* the nodes that share a machine, and those of them whose cores overlap another's */
    int on_one = 0, pooled = 0;
    for (int a = 0; a < h->n_nodes; a++) {
        int with = 0, pool;
        for (int b = 0; b < h->n_nodes; b++)
            with |= b != a && same_kernel(h, h->first[a], h->first[b]);
        if (!with) continue;
        on_one++;
        node_cores(h, a, &pool);
        pooled += pool > h->count[a];
    }
    if (on_one && o->cpu)
        cat(s, n, "; nodes on one machine share its %s",
            pooled == on_one ? "cores and memory"
            : pooled         ? "memory (some of them their cores too)"
                             : "memory (their cores apart)");
    /* what the split by speed read: each node's rate and its probe's noise; without it, where
       it would have split, that too, and how to ask for it */
    int unsplit = !by_speed && speeds > h->n_groups;
    if (by_speed || unsplit) {
        cat(s, n, "; sgemm by node");
        for (int k = 0; k < h->n_nodes && k < SHOWN; k++) {
            double noise, v = node_rate(h, k, &noise);
            cat(s, n, "%s %.1f GFLOP/s +-%.0f%%", k ? "," : "", v / 1e9, 100 * noise);
        }
    }
    if (unsplit)
        cat(s, n,
            ": %d speeds, each group planned at its slowest node's (TR_SPEED_GROUPS=1 "
            "plans each speed at its own)",
            speeds);
}

/* Each host by name and the ranks on it, when the record holds them all. */
static void name_hosts(const hosts *h, tr_cluster_hosts *out) {
    if (h->n_nodes > TR_CLUSTER_MAX_HOSTS || h->size > TR_CLUSTER_MAX_RANKS) return;
    out->n_hosts = h->n_nodes;
    out->n_ranks = h->size;
    for (int k = 0; k < h->n_nodes; k++)
        snprintf(out->name[k], sizeof out->name[k], "%.63s", h->recs[h->first[k]].name);
    for (int r = 0; r < h->size; r++) out->host_of[r] = (short)h->node[r];
}

int tr_topology_speed_groups(const double *rate, const double *noise, const int *count, int n,
                             int *group) {
    int groups = 0;
    double first = 0, first_noise = 0;
    for (int k = 0; k < n; k++) {
        double v = rate[k];
        double apart = v > 0 && first > 0 ? (v > first ? v / first : first / v) : 1;
        double bar = 1 + 2 * (noise[k] > first_noise ? noise[k] : first_noise);
        int fresh = k == 0 || count[k] != count[k - 1] || (apart >= TR_TOPOLOGY_SPEED_SPLIT && apart > bar);
        if (fresh) groups++, first = v, first_noise = noise[k];
        group[k] = groups - 1;
    }
    return groups;
}

/* The groups by counts and speeds (tr_topology_speed_groups): how many, and with `apply` the
 * hosts' groups made of them; with more than TR_CLUSTER_MAX_GROUPS the grouping by counts
 * alone stays (each group at its slowest node's rate). 0 when out of memory. */
static int split_by_speed(hosts *h, int apply) {
    size_t n = (size_t)h->n_nodes;
    int *g = malloc(n * sizeof(int)), groups = 0;
    double *rate = malloc(n * sizeof(double)), *noise = malloc(n * sizeof(double));
    if (g && rate && noise) {
        for (int k = 0; k < h->n_nodes; k++) rate[k] = node_rate(h, k, &noise[k]);
        groups = tr_topology_speed_groups(rate, noise, h->count, h->n_nodes, g);
        if (apply && groups <= TR_CLUSTER_MAX_GROUPS) {
            memcpy(h->group, g, n * sizeof(int));
            h->n_groups = groups;
        }
    }
    free(g);
    free(rate);
    free(noise);
    return groups;
}

static void build(hosts *h, const tr_topology_opts *o, int by_speed, tr_cluster *c) {
    memset(c, 0, sizeof *c);
    int speeds = by_speed || (o->cpu && h->n_nodes > 1) ? split_by_speed(h, by_speed) : h->n_groups;
    c->cpu = o->cpu;
    c->n_groups = h->n_groups;
    int *want = h->want;
    double agg[F_N], inter[F_N];
    for (int r = 0; r < h->size; r++) /* the inter link: timed by each node's first rank */
        want[r] = h->first[h->node[r]] == r;
    slowest(h->figs, h->size, want, inter);
    tr_link link = link_of(&inter[F_INTER_BW], TR_TOPOLOGY_INTER_BW, TR_TOPOLOGY_INTER_LAT);
    if (link.bw.from == TR_ORIGIN_MEASURED && inter[F_INTER_RING] > 0)
        link.ring = fig(inter[F_INTER_RING], TR_ORIGIN_MEASURED);
    for (int gi = 0; gi < h->n_groups; gi++) {
        for (int r = 0; r < h->size; r++)
            want[r] = h->group[h->node[r]] == gi;
        slowest(h->figs, h->size, want, agg);
        fill_group(&c->g[gi], h, gi, agg, o);
        c->g[gi].inter = link;
        for (int j = 0; j < h->n_groups; j++)
            c->between[gi][j] = link;
    }
    for (int r = 0; r < h->size; r++)
        want[r] = 1;
    slowest(h->figs, h->size, want, agg); /* the noisiest rank's */
    tr_origin from = o->cpu || o->measure_links ? TR_ORIGIN_MEASURED : TR_ORIGIN_ASSUMED;
    c->noise = fig(agg[F_NOISE], from);
    c->link_noise = fig(agg[F_LINK_NOISE], from);
    name_hosts(h, &c->hosts);
    describe(h, c, o, by_speed, speeds, c->source, sizeof c->source);
}

int tr_topology_detect(tr_comm *world, const tr_topology_opts *o, tr_cluster *out, char *err,
                       size_t errlen) {
    hosts h = {0};
    scratch s = {0};
    double mine[F_N] = {0};
    int links = o->measure_links && tr_comm_size(world) > 1;
    /* the split by speed: off unless asked (TR_SPEED_GROUPS=1), rank 0's setting. Under load
       (ctest -j2 on 2 cores) equal hosts' rates differed 1.5x with quiet probes, and a split
       by speed changed a plan that should not change; where it would split, the detection
       line says so. A malformed value on any rank ends every rank. */
    int by_speed = 0, bad = tr_env_bool("TR_SPEED_GROUPS", &by_speed, err, errlen) < 0, any = bad;
    if (tr_comm_all_reduce(world, &any, 1, TR_COMM_I32) || any) {
        if (!bad) snprintf(err, errlen, "topology: TR_SPEED_GROUPS is malformed on another rank");
        return -1;
    }
    int rc = gather_hosts(world, o, &h, err, errlen);
    if (!rc) rc = map_nodes(&h, err, errlen);
    if (!rc) rc = scratch_init(world, o, links, &s, err, errlen);
    if (!rc) rc = measure(world, o, &h, links, &s, mine, err, errlen);
    scratch_free(&s);
    if (!rc && tr_comm_all_gather(world, mine, h.figs, F_N, TR_COMM_F64)) {
        snprintf(err, errlen, "topology: gathering the ranks' figures failed");
        rc = -1;
    }
    if (!rc && tr_comm_rank(world) == 0) build(&h, o, by_speed, out);
    if (!rc && tr_comm_broadcast(world, out, sizeof *out, TR_COMM_BYTE, 0)) {
        snprintf(err, errlen, "topology: broadcasting the cluster failed");
        rc = -1;
    }
    hosts_free(&h);
    return rc;
}

/* ---- the links between hosts, mid-run ------------------------------------------------------ */

/* The one-way rate from the first rank of host a to that of host b: pair_rate of
 * PROBE_BYTES from the fastest round trips (mid-run, ranks that share cores are descheduled
 * often), bounded by the whole round trip when the difference is lost in the noise (shared
 * memory). */
enum { PROBE_REPS = 3, PROBE_ALL_PAIRS = 16 };
#define PROBE_BYTES ((size_t)128 << 10)

int tr_topology_host_rates(tr_comm *w, const int *host_of, int n_hosts, double *rate, char *err,
                           size_t errlen) {
    int size = tr_comm_size(w);
    int *first = malloc((size_t)n_hosts * sizeof(int));
    float *buf = calloc(PROBE_BYTES / sizeof(float), sizeof(float));
    int rc = first && buf ? 0 : -1;
    for (int h = 0; h < n_hosts && !rc; h++) {
        first[h] = -1;
        for (int r = 0; r < size && first[h] < 0; r++)
            if (host_of[r] == h) first[h] = r;
        if (first[h] < 0) rc = -1;
    }
    for (size_t i = 0; i < (size_t)n_hosts * (size_t)n_hosts; i++)
        rate[i] = 0;
    /* every ordered pair of a few hosts; of many, each host and the next, both ways */
    for (int a = 0; a < n_hosts && !rc; a++)
        for (int b = 0; b < n_hosts && !rc; b++) {
            int near = b == (a + 1) % n_hosts || a == (b + 1) % n_hosts;
            if (a == b || (n_hosts > PROBE_ALL_PAIRS && !near)) continue;
            rc = pair_rate(w, buf, PROBE_BYTES, first[a], first[b], PROBE_REPS, 1, 1,
                           &rate[a * n_hosts + b], NULL);
        }
    free(first);
    free(buf);
    if (!rc && tr_comm_all_reduce(w, rate, (size_t)n_hosts * (size_t)n_hosts, TR_COMM_F64)) rc = -1;
    if (rc) snprintf(err, errlen, "topology: timing the links between hosts failed");
    return rc;
}

int tr_topology_slow_host(const double *rate, int n_hosts, double *mine, double *others) {
    int blamed = -1, n = n_hosts;
    double *out = malloc((size_t)(3 * n * n + 1) * sizeof(double)), *in = out + n * n,
           *without = in + n * n;
    if (!out || n < 3) {
        free(out);
        return -1;
    }
    for (int h = 0; h < n; h++) {
        int no = 0, ni = 0, nw = 0;
        for (int a = 0; a < n; a++)
            for (int b = 0; b < n; b++) {
                double v = rate[a * n + b];
                if (a == b || !(v > 0)) continue;
                if (a == h)
                    out[no++] = v;
                else if (b == h)
                    in[ni++] = v;
                else
                    without[nw++] = v;
            }
        if (!no || !ni || !nw) continue;
        /* its slower direction: a link can be slow one way (what a host sends, say) */
        double w = fmin(tr_median_doubles(out, (size_t)no), tr_median_doubles(in, (size_t)ni)),
               o = tr_median_doubles(without, (size_t)nw);
        /* the slowest host whose own links run at less than half the others' */
        if (w < 0.5 * o && (blamed < 0 || w < *mine)) blamed = h, *mine = w, *others = o;
    }
    free(out);
    return blamed;
}
