/* parallel/topology.h on whatever world it is started in: alone or under `mpirun -np N`
 * (N = 1, 2, 4). The real hosts (one node here), then host names the test gives to play
 * several nodes: 2 x 2 contiguous, 2 x 2 round-robin, 3 + 1 (two groups), 2 x 1; a GPU
 * backend's given figures; links not measured. Every result must be bytewise equal on all
 * ranks. Rank 0 prints what was detected and how long it took. */
#include "parallel/topology.h"

#include <stdint.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int g_fail, g_rank, g_size;

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            g_fail++;                                                                              \
            fprintf(stderr, "FAIL rank %d %s:%d: ", g_rank, __FILE__, __LINE__);                   \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fputc('\n', stderr);                                                                   \
        }                                                                                          \
    } while (0)

/* FNV-1a of the struct's bytes (the broadcast copies padding too). */
static uint64_t hash(const void *p, size_t n) {
    uint64_t h = 1469598103934665603u;
    for (size_t i = 0; i < n; i++)
        h = (h ^ ((const unsigned char *)p)[i]) * 1099511628211u;
    return h;
}

static void check_bytes(tr_comm *w, const void *p, size_t n, const char *what) {
    uint64_t mine = hash(p, n), *all = malloc((size_t)g_size * sizeof *all);
    CHECK(tr_comm_all_gather(w, &mine, all, 1, TR_COMM_I64) == 0, "%s: all_gather", what);
    for (int r = 0; r < g_size; r++)
        CHECK(all[r] == mine, "%s: rank %d's differ from this rank's", what, r);
    free(all);
}

static void check_same(tr_comm *w, const tr_cluster *c, const char *what) {
    check_bytes(w, c, sizeof *c, what);
}

static long devices(const tr_cluster *c) {
    long n = 0;
    for (int i = 0; i < c->n_groups; i++)
        n += (long)c->g[i].nodes * c->g[i].per_node;
    return n;
}

static int measured(tr_figure f) {
    return f.from == TR_ORIGIN_MEASURED && f.v > 0;
}

static void print(const char *what, const tr_cluster *c, double dt) {
    if (g_rank) return;
    printf("%s (%.3f s): %s\n", what, dt, c->source);
    for (int i = 0; i < c->n_groups; i++) {
        const tr_node_group *g = &c->g[i];
        printf("  %s: %d x %d %s, %d cores, %.1f GFLOP/s, %.2f GiB, mem %.1f GB/s, intra %.2f "
               "GB/s %.1f us (%s), inter %.2f GB/s %.1f us (%s)\n",
               g->name, g->nodes, g->per_node, g->device, g->cores, g->peak_flops.v / 1e9,
               g->mem_bytes.v / (1 << 30), g->mem_bw.v / 1e9, g->intra.bw.v / 1e9,
               g->intra.lat.v * 1e6,
               g->intra.bw.from == TR_ORIGIN_MEASURED ? "measured" : "assumed", g->inter.bw.v / 1e9,
               g->inter.lat.v * 1e6,
               g->inter.bw.from == TR_ORIGIN_MEASURED ? "measured" : "assumed");
    }
}

/* Detect with the given options; check what every case must hold. */
static void detect(tr_comm *w, const char *what, const tr_topology_opts *o, tr_cluster *c) {
    char err[256];
    memset(c, 0xAB, sizeof *c); /* the result must not depend on what was there */
    double t0 = tr_now();
    int rc = tr_topology_detect(w, o, c, err, sizeof err);
    double dt = tr_now() - t0;
    CHECK(rc == 0, "%s: %s", what, err);
    if (rc) return;
    print(what, c, dt);
    check_same(w, c, what);
    CHECK(devices(c) == g_size, "%s: %ld devices, %d ranks", what, devices(c), g_size);
    CHECK(!strncmp(c->source, "detected: ", 10), "%s: source '%s'", what, c->source);
    for (int i = 0; i < c->n_groups; i++) {
        const tr_node_group *g = &c->g[i];
        CHECK(g->cores > 0, "%s: %d cores", what, g->cores);
        CHECK(g->peak_flops.v > 0, "%s: no peak", what);
        CHECK(g->mem_bytes.v > 0, "%s: no memory", what);
        CHECK(g->price_hour.from == TR_ORIGIN_ASSUMED && g->egress_per_gb.v == 0, "%s: price",
              what);
        CHECK(g->line == 0 && g->provider[0] == '\0', "%s: line/provider", what);
    }
}

/* The hosts this job really runs on: one node here. */
static void real_hosts(tr_comm *w) {
    tr_topology_opts o = {.cpu = 1, .measure_links = 1};
    tr_cluster c;
    detect(w, "real hosts", &o, &c);
    const tr_node_group *g = &c.g[0];
    CHECK(c.n_groups == 1 && g->nodes == 1 && g->per_node == g_size, "%d groups, %d x %d",
          c.n_groups, g->nodes, g->per_node);
    CHECK(c.cpu == 1 && !strcmp(g->device, "cpu") && !strcmp(g->name, "node"), "%s %s", g->name,
          g->device);
    CHECK(measured(g->peak_flops) && measured(g->mem_bytes) && measured(g->mem_bw),
          "peak, memory and memory bandwidth measured");
    tr_origin links = g_size > 1 ? TR_ORIGIN_MEASURED : TR_ORIGIN_ASSUMED;
    CHECK(g->intra.bw.from == links && g->intra.lat.from == links && g->intra.bw.v > 0 &&
              g->intra.lat.v > 0,
          "intra link %g B/s %g s", g->intra.bw.v, g->intra.lat.v);
    CHECK(g->inter.bw.from == TR_ORIGIN_ASSUMED && g->inter.bw.v == TR_TOPOLOGY_INTER_BW &&
              g->inter.lat.v == TR_TOPOLOGY_INTER_LAT,
          "one node: the inter link is assumed");
    CHECK(g->inter.ring.v == 0, "one node: no ring between nodes");
    char want[64];
    snprintf(want, sizeof want, ") x %d rank%s, CPU, %d core%s", g_size, g_size > 1 ? "s" : "",
             g->cores, g->cores == 1 ? "" : "s");
    CHECK(strstr(c.source, "detected: 1 node (") && strstr(c.source, want), "source '%s'",
          c.source);
    CHECK(!strstr(c.source, "not contiguous"), "source '%s'", c.source);
}

/* Four ranks as two nodes of two: host by rank / 2, then round-robin by rank % 2. */
static void two_by_two(tr_comm *w, int round_robin) {
    char host[32];
    snprintf(host, sizeof host, "host-%d", round_robin ? g_rank % 2 : g_rank / 2);
    tr_topology_opts o = {.cpu = 1, .measure_links = 1, .host = host};
    tr_cluster c;
    detect(w, round_robin ? "2 x 2 round-robin" : "2 x 2", &o, &c);
    const tr_node_group *g = &c.g[0];
    CHECK(c.n_groups == 1 && g->nodes == 2 && g->per_node == 2, "%d groups, %d x %d", c.n_groups,
          g->nodes, g->per_node);
    CHECK(measured(g->intra.bw) && measured(g->intra.lat), "intra measured");
    CHECK(measured(g->inter.bw) && measured(g->inter.lat), "inter measured");
    CHECK(measured(g->inter.ring) && g->inter.ring.v > 0, "the ring through all 4 measured: %g",
          g->inter.ring.v);
    CHECK(strstr(c.source, "detected: 2 nodes (host-0, host-1) x 2 ranks"), "source '%s'",
          c.source);
    CHECK(!strstr(c.source, "not contiguous") == !round_robin, "source '%s'", c.source);
}

/* Four ranks on nodes of 3 and 1: two groups, the second without a link inside its node. */
static void three_and_one(tr_comm *w) {
    tr_topology_opts o = {.cpu = 1, .measure_links = 1, .host = g_rank < 3 ? "big" : "small"};
    tr_cluster c;
    detect(w, "3 + 1", &o, &c);
    CHECK(c.n_groups == 2, "%d groups", c.n_groups);
    if (c.n_groups != 2) return;
    CHECK(!strcmp(c.g[0].name, "node0") && !strcmp(c.g[1].name, "node1"), "names %s %s",
          c.g[0].name, c.g[1].name);
    CHECK(c.g[0].nodes == 1 && c.g[0].per_node == 3 && c.g[1].nodes == 1 && c.g[1].per_node == 1,
          "%d x %d, %d x %d", c.g[0].nodes, c.g[0].per_node, c.g[1].nodes, c.g[1].per_node);
    CHECK(measured(c.g[0].intra.bw) && c.g[1].intra.bw.from == TR_ORIGIN_ASSUMED,
          "intra: measured on the node of 3, assumed on the node of 1");
    CHECK(measured(c.between[0][1].bw) && measured(c.between[1][0].lat) &&
              c.between[0][1].bw.v == c.g[0].inter.bw.v,
          "between the groups: the measured inter link");
    CHECK(measured(c.g[0].inter.ring) && c.between[0][1].ring.v == c.g[0].inter.ring.v,
          "a node of 3: the ring through all 4 measured, the same between the groups");
    CHECK(strstr(c.source, "detected: 2 nodes (big x 3, small x 1), CPU"), "source '%s'", c.source);
}

/* Every rank its own host: no link inside a node, the one between measured. */
static void one_per_node(tr_comm *w) {
    char host[32];
    snprintf(host, sizeof host, "n%d", g_rank);
    tr_topology_opts o = {.cpu = 1, .measure_links = 1, .host = host};
    tr_cluster c;
    detect(w, "1 rank per node", &o, &c);
    const tr_node_group *g = &c.g[0];
    CHECK(c.n_groups == 1 && g->nodes == g_size && g->per_node == 1, "%d x %d", g->nodes,
          g->per_node);
    CHECK(g->intra.bw.from == TR_ORIGIN_ASSUMED && g->intra.bw.v == TR_TOPOLOGY_INTRA_BW,
          "intra assumed");
    CHECK(measured(g->inter.bw) && measured(g->inter.lat), "inter measured");
    CHECK(g->inter.ring.v == 0, "one rank a node: no ring beside the leaders' link");
}

/* A GPU backend's figures come from the caller; without measure_links every link is assumed. */
static void gpu_given(tr_comm *w) {
    tr_topology_opts o = {.cpu = 0,
                          .device = "NVIDIA H100 80GB HBM3",
                          .device_mem = 80e9,
                          .peak_flops = 989e12,
                          .measure_links = 0};
    tr_cluster c;
    detect(w, "GPU, links not measured", &o, &c);
    const tr_node_group *g = &c.g[0];
    CHECK(c.cpu == 0 && !strcmp(g->device, "NVIDIA H100 80GB HBM3"), "device '%s'", g->device);
    CHECK(g->per_node == g_size && g->nodes == 1, "%d x %d", g->nodes, g->per_node);
    CHECK(g->peak_flops.v == 989e12 && g->peak_flops.from == TR_ORIGIN_TABLE, "peak");
    CHECK(g->mem_bytes.v == 80e9 && g->mem_bw.v == 0 && g->mem_bw.from == TR_ORIGIN_ASSUMED,
          "memory");
    CHECK(g->intra.bw.from == TR_ORIGIN_ASSUMED && g->inter.lat.from == TR_ORIGIN_ASSUMED,
          "links assumed");
    CHECK(strstr(c.source, ", NVIDIA H100 80GB HBM3"), "source '%s'", c.source);
}

/* tr_topology_slow_host on made-up rates (MB/s): one host's links slow among 3 and 4 hosts,
 * slowed one way only, none slow, and two hosts (their one link: no end can be named). */
static void slow_host_rule(void) {
    double mine = 0, others = 0;
    double three[9] = {0, 10, 100, 10, 0, 10, 100, 10, 0}; /* host 1 at a tenth */
    CHECK(tr_topology_slow_host(three, 3, &mine, &others) == 1 && mine == 10 && others == 100,
          "3 hosts, host 1 slow: %g against %g", mine, others);
    double out[9] = {0, 100, 100, 10, 0, 10, 100, 100, 0}; /* host 1 sends slowly */
    int h = tr_topology_slow_host(out, 3, &mine, &others);
    CHECK(h == 1, "3 hosts, host 1 slow one way: %d", h);
    double even[9] = {0, 90, 100, 110, 0, 95, 100, 105, 0};
    CHECK(tr_topology_slow_host(even, 3, &mine, &others) == -1, "3 even hosts: none");
    double four[16] = {0, 100, 100, 5, 100, 0, 100, 5, 100, 100, 0, 5, 5, 5, 5, 0};
    CHECK(tr_topology_slow_host(four, 4, &mine, &others) == 3, "4 hosts, host 3 slow");
    double two[4] = {0, 1, 100, 0};
    CHECK(tr_topology_slow_host(two, 2, &mine, &others) == -1, "2 hosts: no end named");
}

/* Nodes grouped by speed: half as fast starts a group when the probes are quiet, not when
 * they varied by more than the difference; a count change always does; equal ones never. */
static void speed_groups_rule(void) {
    int g[4], c2[4] = {2, 2, 2, 2}, mixed_counts[4] = {2, 2, 1, 1};
    double half[4] = {10, 10, 5, 5}, quiet[4] = {0.05, 0.05, 0.1, 0.1};
    int n = tr_topology_speed_groups(half, quiet, c2, 4, g);
    CHECK(n == 2 && g[0] == 0 && g[1] == 0 && g[2] == 1 && g[3] == 1,
          "two hosts at half the rate of two others, probes within 10%%: 2 groups (%d)", n);
    double loud[4] = {0.6, 0.6, 0.6, 0.6};
    n = tr_topology_speed_groups(half, loud, c2, 4, g);
    CHECK(n == 1, "the same with probes varying 60%%: one group, the even plan (%d)", n);
    double near[4] = {10, 8, 11, 7};
    n = tr_topology_speed_groups(near, quiet, c2, 4, g);
    CHECK(n == 1, "rates within 1.5x of the first: one group (%d)", n);
    double same[4] = {10, 10, 10, 10};
    n = tr_topology_speed_groups(same, quiet, mixed_counts, 4, g);
    CHECK(n == 2 && g[2] == 1, "2 ranks then 1 rank a node: 2 groups (%d)", n);
    double faster[3] = {5, 5, 20}, q3[3] = {0, 0, 0};
    n = tr_topology_speed_groups(faster, q3, c2, 3, g);
    CHECK(n == 2 && g[2] == 1, "a host 4x faster than the first: its own group (%d)", n);
}

/* tr_topology_spread: the median's standard error from the median absolute deviation,
 * relative to the median; one slow call among a few does not move it. */
static void spread_rule(void) {
    double even[5] = {1.2, 0.8, 1.0, 0.9, 1.1}; /* median 1, deviations 0.1 twice: MAD 0.1 */
    double want = 1.25 * 1.4826 * 0.1 / sqrt(5.0);
    CHECK(fabs(tr_topology_spread(even, 5) - want) < 1e-12, "5 timings: %g, expected %g",
          tr_topology_spread(even, 5), want);
    double one_slow[3] = {1.0, 100.0, 1.1}; /* a call descheduled: the range read 90x */
    double v = tr_topology_spread(one_slow, 3), w3 = 1.25 * 1.4826 * 0.1 / sqrt(3.0) / 1.1;
    CHECK(fabs(v - w3) < 1e-12, "3 timings, one 100x: %g, expected %g", v, w3);
    double four[4] = {2.0, 2.0, 2.0, 50.0};
    CHECK(tr_topology_spread(four, 4) == 0, "4 timings, 3 equal: 0 (%g)",
          tr_topology_spread(four, 4));
    double many[30]; /* more than the probes take: 1, 1.1, 0.9, 1, 1.1, 0.9, ...; MAD 0.1 */
    for (int i = 0; i < 30; i++)
        many[i] = 1.0 + 0.1 * ((i % 3 == 1) - (i % 3 == 2));
    double w30 = 1.25 * 1.4826 * 0.1 / sqrt(30.0);
    v = tr_topology_spread(many, 30);
    CHECK(fabs(v - w30) < 1e-12 && many[0] == 0.9 && many[29] == 1.1,
          "30 timings: %g, expected %g, sorted", v, w30);
    /* against the definition: the median of the sorted deviations, at every count to 40 */
    unsigned seed = 7;
    for (int n = 2; n <= 40; n++) {
        double t[40], dev[40];
        for (int i = 0; i < n; i++) {
            seed = seed * 1103515245u + 12345u;
            t[i] = 1.0 + (double)(seed >> 16 & 1023) / 256.0;
        }
        (void)tr_topology_spread(t, n); /* sorts t */
        double med = t[n / 2];
        for (int i = 0; i < n; i++)
            dev[i] = fabs(t[i] - med);
        tr_sort_doubles(dev, (size_t)n);
        double want_n = 1.25 * 1.4826 * dev[n / 2] / sqrt((double)n) / med;
        CHECK(fabs(tr_topology_spread(t, n) - want_n) < 1e-12, "%d timings: %g, expected %g", n,
              tr_topology_spread(t, n), want_n);
    }
    double one[1] = {3.0}, zero[3] = {0, 0, 0};
    CHECK(tr_topology_spread(one, 1) == 0 && tr_topology_spread(zero, 3) == 0,
          "one timing, or all 0: 0");
}

/* tr_topology_faster_look: a second look faster than the first scales every size by their
 * ratio; a slower or missing one leaves the figures as measured and records the ratio. */
static void faster_look_rule(void) {
    tr_cluster c;
    memset(&c, 0, sizeof c);
    double first[3] = {0.4, 0.5, 0.6}; /* micro-batches of 1, 2, 4 */
    memcpy(c.model_eff, first, sizeof first);
    tr_topology_faster_look(&c, 2, 0.9); /* the second look 1.5x the first */
    CHECK(fabs(c.model_look - 1.5) < 1e-12, "faster look: ratio %g, expected 1.5", c.model_look);
    int scaled = 1;
    for (int i = 0; i < 3; i++)
        scaled &= fabs(c.model_eff[i] - 1.5 * first[i]) < 1e-12;
    CHECK(scaled && c.model_eff[3] == 0, "faster look: %g %g %g %g, expected 1.5x the first",
          c.model_eff[0], c.model_eff[1], c.model_eff[2], c.model_eff[3]);
    memcpy(c.model_eff, first, sizeof first);
    tr_topology_faster_look(&c, 2, 0.3); /* slower: the first look stays */
    CHECK(fabs(c.model_look - 0.5) < 1e-12 && !memcmp(c.model_eff, first, sizeof first),
          "slower look: ratio %g (0.5), figures kept", c.model_look);
    c.model_look = 0;
    tr_topology_faster_look(&c, 3, 0.9); /* a size not measured: nothing */
    tr_topology_faster_look(&c, 1, 0);   /* a look that failed: nothing */
    CHECK(c.model_look == 0 && !memcmp(c.model_eff, first, sizeof first),
          "no first look or no second: nothing changes (ratio %g)", c.model_look);
}

/* tr_topology_host_rates on the ranks as hosts of their own: every pair timed, the matrix
 * the same on every rank. */
static void host_rates(tr_comm *w) {
    int of[64] = {0}, n = g_size < 64 ? g_size : 64;
    static double rate[64 * 64];
    char err[256] = "";
    if (n != g_size) return;
    for (int r = 0; r < n; r++)
        of[r] = r;
    int rc = tr_topology_host_rates(w, of, n, rate, err, sizeof err);
    CHECK(!rc, "host_rates: %s", err);
    int all = 1;
    for (int a = 0; a < n; a++)
        for (int b = 0; b < n; b++)
            all &= a == b ? rate[a * n + b] == 0 : rate[a * n + b] > 0;
    CHECK(all, "every pair of %d hosts timed", n);
    check_bytes(w, rate, (size_t)n * (size_t)n * sizeof(double), "host rates");
}

int main(int argc, char **argv) {
    tr_comm *w;
    char err[256];
    if (tr_comm_init(&w, &argc, &argv, 60, err, sizeof err)) {
        fprintf(stderr, "test_topology: %s\n", err);
        return 1;
    }
    g_rank = tr_comm_rank(w);
    g_size = tr_comm_size(w);
    real_hosts(w);
    gpu_given(w);
    if (g_size > 1) one_per_node(w);
    if (g_size > 1) host_rates(w);
    if (g_rank == 0) slow_host_rule();
    if (g_rank == 0) speed_groups_rule();
    if (g_rank == 0) spread_rule();
    if (g_rank == 0) faster_look_rule();
    if (g_size == 4) {
        two_by_two(w, 0);
        two_by_two(w, 1);
        three_and_one(w);
    }
    int fails = g_fail;
    tr_comm_all_reduce(w, &fails, 1, TR_COMM_I32);
    if (g_rank == 0)
        printf("test_topology: %d rank%s, %s\n", g_size, g_size > 1 ? "s" : "",
               fails ? "FAILED" : "ok");
    tr_comm_free(w);
    return fails ? 1 : 0;
}
