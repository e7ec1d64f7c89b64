/* Tests for cluster files and the table of known devices (dsl/cluster.c, cluster_yaml.c): the
 * table's lookups, --gpus clusters and their refusals, ranks through the groups, the examples
 * in recipes/clusters/ with their figures and origins, write -> load round trips, and every
 * prefix of the examples loading or failing with one line. `test_cluster --bad FILE` checks
 * one file of clusters_bad/ (a ctest each): its load must fail with the message on its first
 * line, `# expect: MESSAGE`, the whole line, or its start when MESSAGE ends in " ...".
 * Plain C: ok/FAIL per check, non-zero exit on failure. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dsl/cluster.h"
#include "check.h"

#define GiB 1073741824.0

static char err[1024];


/* A figure equal to v (to 1e-12, as written in decimal) with origin `from`. */
static int fig(tr_figure f, double v, tr_origin from) {
    return fabs(f.v - v) <= 1e-12 * fabs(v) && f.from == from;
}

static void test_table(void) {
    const tr_device_info *h100 = tr_device_find("H100-80GB");
    check(h100 && tr_device_find("h100") == h100 && tr_device_find("H100-SXM") == h100 &&
              tr_device_find("nvidia h100 80gb hbm3") == h100,
          "H100-80GB by its name and aliases, any case");
    check(tr_device_find("A100") == NULL && tr_device_find("H10") == NULL &&
              tr_device_find("") == NULL && tr_device_find(NULL) == NULL &&
              tr_device_find(",") == NULL,
          "no device for A100 (40 or 80 GB?), H10, \"\", NULL, \",\"");
    const char *need[] = {"A100-40GB", "A100-80GB", "H100-80GB", "H100-PCIe",
                          "H200",      "B200",      "L40S"};
    int n = tr_device_count(), all = n >= 7, every = 1;
    for (int i = 0; i < 7; i++)
        all = all && tr_device_find(need[i]) && !strcmp(tr_device_find(need[i])->name, need[i]);
    check(all, "the table has A100-40GB, A100-80GB, H100-80GB, H100-PCIe, H200, B200, L40S");
    for (int i = 0; i < n; i++) {
        const tr_device_info *d = tr_device_at(i);
        every = every && tr_device_find(d->name) == d && d->mem_bytes > 0 && d->peak_flops > 0 &&
                d->mem_bw > 0 && d->intra_bw > d->inter_bw && d->per_node >= 1 && d->price_hour > 0;
    }
    check(every && !tr_device_at(-1) && !tr_device_at(n), "every row finds itself, is sane");
    check(h100->peak_flops == 989e12 && h100->mem_bytes == 80 * GiB &&
              tr_device_find("H200")->mem_bw == 4.8e12 &&
              tr_device_find("a100-40gb")->per_node == 8,
          "figures: H100 989 TFLOP/s, 80 GiB; H200 4.8 TB/s; A100 8 a server");
    char list[512], tiny[12];
    tr_device_list(list, sizeof list);
    tr_device_list(tiny, sizeof tiny);
    check(!strncmp(list, "A100-40GB, A100-80GB, H100-80GB, ", 33) && strstr(list, ", L40S") &&
              !strcmp(tiny, "A100-40GB, "),
          "the list: %s (cut short: '%s')", list, tiny);
}

static void gpus_refused(long n, int per_node, const char *gpu, const char *expected) {
    tr_cluster c;
    err[0] = 0;
    int rc = tr_cluster_from_gpus(&c, n, per_node, gpu, err, sizeof err);
    if (!check(rc == -1 && !strcmp(err, expected),
               "refused: --gpus %ld --gpus-per-node %d --gpu %s", n, per_node, gpu ? gpu : "NULL"))
        printf("     expected: %s\n     got (rc %d): %s\n", expected, rc, err);
}

static void test_from_gpus(void) {
    tr_cluster c;
    int rc = tr_cluster_from_gpus(&c, 64, 8, "h100", err, sizeof err);
    const tr_node_group *g = &c.g[0];
    check(!rc && c.n_groups == 1 && !strcmp(g->name, "node") && !strcmp(g->device, "H100-80GB") &&
              g->nodes == 8 && g->per_node == 8 && fig(g->peak_flops, 989e12, TR_ORIGIN_TABLE) &&
              fig(g->inter.bw, 45e9, TR_ORIGIN_TABLE) &&
              fig(g->egress_per_gb, 0, TR_ORIGIN_ASSUMED) &&
              fig(c.between[0][0].bw, 45e9, TR_ORIGIN_TABLE) && tr_cluster_devices(&c) == 64 &&
              !strcmp(c.source, "--gpus 64 --gpus-per-node 8 --gpu H100-80GB"),
          "--gpus 64 --gpus-per-node 8 --gpu h100: 8 nodes of 8 H100-80GB, figures from the table");
    check(fig(g->efficiency, 0.50, TR_ORIGIN_PUBLISHED) &&
              !strcmp(g->efficiency_source, "Megatron-LM 2024, H100"),
          "the H100's matrix efficiency %.2f, %s (%s)", g->efficiency.v,
          tr_origin_name(g->efficiency.from), g->efficiency_source);
    rc = tr_cluster_from_gpus(&c, 8, 8, "A100-40GB", err, sizeof err);
    check(!rc && fig(c.g[0].efficiency, 0.53, TR_ORIGIN_PUBLISHED) &&
              !strcmp(c.g[0].efficiency_source, "Narayanan et al. 2021, A100"),
          "the A100's matrix efficiency %.2f, %s (%s)", c.g[0].efficiency.v,
          tr_origin_name(c.g[0].efficiency.from), c.g[0].efficiency_source);
    rc = tr_cluster_from_gpus(&c, 8, 8, "H200", err, sizeof err);
    check(!rc && fig(c.g[0].efficiency, 0.50, TR_ORIGIN_ASSUMED) && !c.g[0].efficiency_source[0],
          "the H200's: the H100's, assumed");
    rc = tr_cluster_from_gpus(&c, 4, 0, "A100-80GB", err, sizeof err);
    check(!rc && c.g[0].nodes == 1 && c.g[0].per_node == 4, "--gpus 4: one node of 4");
    rc = tr_cluster_from_gpus(&c, 24, 0, "B200", err, sizeof err);
    check(!rc && c.g[0].nodes == 3 && c.g[0].per_node == 8, "--gpus 24 --gpu B200: 3 nodes of 8");
    gpus_refused(8, 8, "H10",
                 "--gpu H10: unknown device; known: A100-40GB, A100-80GB, H100-80GB, H100-PCIe, "
                 "H200, B200, L40S, MI300X");
    gpus_refused(8, 8, NULL,
                 "--gpu (none): unknown device; known: A100-40GB, A100-80GB, H100-80GB, H100-PCIe, "
                 "H200, B200, L40S, MI300X");
    gpus_refused(0, 8, "H100", "--gpus 0: must be at least 1");
    gpus_refused(12, 8, "H100", "--gpus 12 is not a multiple of --gpus-per-node 8");
    gpus_refused(12, 0, "H100",
                 "--gpus 12 is not a multiple of --gpus-per-node 8 (the device's usual server; "
                 "give --gpus-per-node)");
    gpus_refused(8, -1, "H100", "--gpus-per-node -1: must be from 1 to 1024");
    gpus_refused(2048, 2048, "H100", "--gpus-per-node 2048: must be from 1 to 1024");
    gpus_refused(800008, 8, "H100", "--gpus 800008: more than 100000 nodes of 8");
}

static int load(tr_cluster *c, const char *path) {
    if (tr_cluster_load(c, path, err, sizeof err) == 0) return 0;
    check(0, "load %s: %s", path, err);
    return -1;
}

static void test_examples(void) {
    tr_cluster c;
    if (!load(&c, "../recipes/clusters/h100x8.yaml")) {
        const tr_node_group *g = &c.g[0];
        check(c.n_groups == 1 && g->nodes == 1 && g->per_node == 8 && g->line == 4 &&
                  !strcmp(g->device, "H100-80GB") && !c.cpu &&
                  !strcmp(c.source, "../recipes/clusters/h100x8.yaml") &&
                  fig(g->mem_bytes, 80 * GiB, TR_ORIGIN_TABLE) &&
                  fig(g->intra.bw, 360e9, TR_ORIGIN_TABLE) &&
                  fig(g->price_hour, 2.5, TR_ORIGIN_TABLE) && tr_cluster_devices(&c) == 8,
              "h100x8.yaml: 1 node of 8 H100-80GB, figures from the table");
    }
    if (!load(&c, "../recipes/clusters/a100x128_ib.yaml")) {
        const tr_node_group *g = &c.g[0];
        check(c.n_groups == 1 && g->nodes == 16 && tr_cluster_devices(&c) == 128 &&
                  g->cores == 128 && fig(g->inter.bw, 22e9, TR_ORIGIN_GIVEN) &&
                  fig(g->inter.lat, 8e-6, TR_ORIGIN_GIVEN) &&
                  fig(g->intra.bw, 230e9, TR_ORIGIN_GIVEN) &&
                  fig(g->peak_flops, 312e12, TR_ORIGIN_TABLE) &&
                  fig(g->mem_bw, 2.039e12, TR_ORIGIN_TABLE),
              "a100x128_ib.yaml: 16 x 8 A100-80GB, links given, the rest from the table");
    }
    if (!load(&c, "../recipes/clusters/mixed_pool.yaml")) {
        const tr_node_group *h = &c.g[0], *a = &c.g[1];
        check(c.n_groups == 2 && h->nodes == 2 && a->nodes == 4 && a->per_node == 8 &&
                  h->line == 5 && a->line == 12 && !strcmp(h->provider, "cloud-a") &&
                  !strcmp(a->provider, "cloud-b") && fig(h->price_hour, 2.49, TR_ORIGIN_GIVEN) &&
                  fig(a->egress_per_gb, 0.05, TR_ORIGIN_GIVEN) &&
                  fig(a->mem_bytes, 80 * GiB, TR_ORIGIN_TABLE) &&
                  fig(c.between[0][1].bw, 1.25e9, TR_ORIGIN_GIVEN) &&
                  fig(c.between[1][0].lat, 0.03, TR_ORIGIN_GIVEN) &&
                  fig(c.between[1][1].bw, 22e9, TR_ORIGIN_TABLE) && tr_cluster_devices(&c) == 48,
              "mixed_pool.yaml: 16 H100 + 32 A100, prices and the internet link given");
        long node = -1;
        int g0 = tr_cluster_group_of(&c, 0, &node), ok = g0 == 0 && node == 0;
        ok = ok && tr_cluster_group_of(&c, 15, &node) == 0 && node == 1;
        ok = ok && tr_cluster_group_of(&c, 16, &node) == 1 && node == 2;
        ok = ok && tr_cluster_group_of(&c, 47, &node) == 1 && node == 5;
        ok = ok && tr_cluster_group_of(&c, 48, &node) == -1 &&
             tr_cluster_group_of(&c, -1, NULL) == -1;
        check(ok,
              "ranks 0, 15, 16, 47 in groups 0, 0, 1, 1 on nodes 0, 1, 2, 5; 48 and -1 in none");
    }
}

/* A file written from text and loaded: 0 or -1 as the loader says. */
static int load_text(tr_cluster *c, const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    if (!f) return -2;
    fputs(text, f);
    fclose(f);
    return tr_cluster_load(c, path, err, sizeof err);
}

static void test_defaults(const char *dir) {
    char path[512];
    snprintf(path, sizeof path, "%s/defaults.yaml", dir);
    tr_cluster c;
    int rc =
        load_text(&c, path,
                  "groups:\n  - {name: fast, device: mystery-9, nodes: 2, memory_gib: 24,\n     "
                  "peak_tflops: 100, intra_node: {latency_ms: 0.01}}\n  - name: slow\n    device: "
                  "L40S\n    nodes: 1\n    per_node: 4\n    inter_node: {bandwidth_gb_s: 1}\n");
    const tr_node_group *f = &c.g[0];
    check(!rc && f->per_node == 8 && !strcmp(f->device, "mystery-9") &&
              fig(f->mem_bytes, 24 * GiB, TR_ORIGIN_GIVEN) &&
              fig(f->intra.lat, 1e-5, TR_ORIGIN_GIVEN) && f->intra.bw.from == TR_ORIGIN_ASSUMED &&
              fig(f->price_hour, 0, TR_ORIGIN_ASSUMED) && c.g[1].per_node == 4 &&
              fig(c.g[1].inter.lat, 10e-6, TR_ORIGIN_TABLE) &&
              fig(c.between[0][1].bw, 1e9, TR_ORIGIN_ASSUMED) &&
              fig(c.between[1][0].lat, 10e-6, TR_ORIGIN_ASSUMED),
          "an unknown device: per_node 8, price 0 assumed; a pair not named: the slower link");
    check(!rc && fig(f->efficiency, 0.50, TR_ORIGIN_ASSUMED) && !f->efficiency_source[0] &&
              fig(c.g[1].efficiency, 0.50, TR_ORIGIN_ASSUMED),
          "an unknown device and the L40S: the H100's matrix efficiency, assumed");
    if (rc) printf("     %s\n", err);
    snprintf(path, sizeof path, "%s/no_such.yaml", dir);
    rc = tr_cluster_load(&c, path, err, sizeof err);
    char expected[600];
    snprintf(expected, sizeof expected, "%s: cannot read: No such file or directory", path);
    check(rc == -1 && !strcmp(err, expected), "a missing file: %s", err);
}

/* Exactly: these figures all came from files or the table (cluster.c, put_num). */
static int same_figure(tr_figure a, tr_figure b) {
    return a.v == b.v && b.from == TR_ORIGIN_GIVEN;
}

/* b, read back from a's file: the same groups and figures, every one given. */
static int same_cluster(const tr_cluster *a, const tr_cluster *b) {
    int ok = a->n_groups == b->n_groups;
    for (int i = 0; ok && i < a->n_groups; i++) {
        const tr_node_group *x = &a->g[i], *y = &b->g[i];
        ok = !strcmp(x->name, y->name) && !strcmp(x->device, y->device) &&
             !strcmp(x->provider, y->provider) && !strcmp(x->org, y->org) &&
             x->nodes == y->nodes &&
             x->per_node == y->per_node && x->cores == y->cores &&
             same_figure(x->mem_bytes, y->mem_bytes) && same_figure(x->peak_flops, y->peak_flops) &&
             same_figure(x->mem_bw, y->mem_bw) && same_figure(x->intra.bw, y->intra.bw) &&
             same_figure(x->intra.lat, y->intra.lat) && same_figure(x->inter.bw, y->inter.bw) &&
             same_figure(x->inter.lat, y->inter.lat) && same_figure(x->price_hour, y->price_hour) &&
             same_figure(x->egress_per_gb, y->egress_per_gb) &&
             same_figure(x->efficiency, y->efficiency);
        for (int j = 0; ok && j < a->n_groups; j++)
            ok = same_figure(a->between[i][j].bw, b->between[i][j].bw) &&
                 same_figure(a->between[i][j].lat, b->between[i][j].lat);
    }
    return ok;
}

static void round_trip(const tr_cluster *a, const char *dir, const char *what) {
    char path[512];
    snprintf(path, sizeof path, "%s/written.yaml", dir);
    tr_cluster b;
    int rc = tr_cluster_write(a, path, err, sizeof err);
    if (!rc) rc = tr_cluster_load(&b, path, err, sizeof err);
    if (!check(!rc && same_cluster(a, &b), "write -> load: %s", what) && rc)
        printf("     %s\n", err);
    remove(path);
}

static void test_round_trips(const char *dir) {
    const char *files[] = {"../recipes/clusters/h100x8.yaml",
                           "../recipes/clusters/a100x128_ib.yaml",
                           "../recipes/clusters/mixed_pool.yaml",
                           "../recipes/clusters/two_labs.yaml"};
    tr_cluster c;
    for (int i = 0; i < 4; i++)
        if (!load(&c, files[i])) round_trip(&c, dir, files[i]);
    if (!tr_cluster_from_gpus(&c, 24, 0, "B200", err, sizeof err))
        round_trip(&c, dir, "--gpus 24 --gpu B200");
    /* awkward text and numbers: quotes, a backslash, a colon; thirds; tiny and huge */
    char path[512];
    snprintf(path, sizeof path, "%s/awkward.yaml", dir);
    int rc = load_text(
        &c, path,
        "groups:\n  - {name: a, device: \"odd \\\"one\\\\: x\", nodes: 3, per_node: 3,\n     "
        "provider: 'it''s #1', memory_gib: 0.333333333333333,\n     peak_tflops: 1e-9, "
        "matrix_efficiency: 0.333333333333333, "
        "memory_bandwidth_gb_s: 1e6, cores: 7,\n     inter_node: {latency_ms: 0.1}}\n  - {name: b, "
        "device: H200, nodes: 1, egress_per_gb: 0.1}\n  - {name: c, device: l40s, nodes: "
        "100000}\nlinks:\n  - {between: [c, a], bandwidth_gb_s: 0.7, latency_us: 333}\n");
    if (check(!rc && !strcmp(c.g[0].device, "odd \"one\\: x") &&
                  !strcmp(c.g[0].provider, "it's #1") && !strcmp(c.g[2].device, "L40S"),
              "an awkward file loads"))
        round_trip(&c, dir, "awkward names and numbers");
    else
        printf("     %s\n", err);
}

/* Every prefix of every example, and each with one byte changed: a cluster or one line of
 * error naming the file, never a crash (the sanitizer build runs this). */
static void test_prefixes(const char *dir) {
    const char *files[] = {"../recipes/clusters/a100x128_ib.yaml",
                           "../recipes/clusters/mixed_pool.yaml"};
    char path[512], text[4096];
    snprintf(path, sizeof path, "%s/prefix.yaml", dir);
    int ok = 1, tries = 0;
    for (int i = 0; i < 2; i++) {
        FILE *f = fopen(files[i], "r");
        size_t n = f ? fread(text, 1, sizeof text - 1, f) : 0;
        if (f) fclose(f);
        for (size_t len = 0; len <= n; len++, tries += 2) {
            tr_cluster c;
            char keep = text[len], flip = "\n:-[{'\"&*!"[len % 10];
            text[len] = 0;
            int rc = load_text(&c, path, text);
            ok = ok &&
                 (rc == 0 || (rc == -1 && !strncmp(err, path, strlen(path)) && !strchr(err, '\n')));
            text[len] = keep;
            if (len < n) { /* one byte changed, the rest whole */
                char was = text[len];
                text[len] = flip;
                rc = load_text(&c, path, text);
                ok = ok && (rc == 0 || (rc == -1 && !strchr(err, '\n')));
                text[len] = was;
            }
        }
    }
    check(ok, "%d cut or changed examples: each loads or fails with one line", tries);
    remove(path);
}

/* One file of clusters_bad/, from its folder: fails with the line its first line expects. */
static int bad_file(const char *path) {
    char first[1024] = "";
    FILE *f = fopen(path, "r");
    if (!f || !fgets(first, sizeof first, f) || strncmp(first, "# expect: ", 10)) {
        printf("FAIL %s: its first line must be '# expect: <message>'\n", path);
        if (f) fclose(f);
        return 1;
    }
    fclose(f);
    char *expect = first + 10;
    expect[strcspn(expect, "\n")] = 0;
    size_t n = strlen(expect);
    int prefix = n >= 4 && !strcmp(expect + n - 4, " ...");
    tr_cluster c;
    int rc = tr_cluster_load(&c, path, err, sizeof err);
    int same = prefix ? !strncmp(err, expect, n - 4) : !strcmp(err, expect);
    if (rc == -1 && same && !strchr(err, '\n')) {
        printf("ok   %s\n", path);
        return 0;
    }
    printf("FAIL %s\n  expected: %s\n  got (rc %d): %s\n", path, expect, rc, rc ? err : "");
    return 1;
}

/* Organisations: a file's groups, a file without them (each node its own), and a detected
 * job's hosts, whose ranks need not be in host order. */
static void test_orgs(void) {
    tr_cluster c;
    int named = -1;
    if (!load(&c, "../recipes/clusters/two_labs.yaml")) {
        check(!strcmp(c.g[0].org, "lab-a") && !strcmp(c.g[1].org, "lab-b") &&
                  tr_cluster_same_org(&c, 0, 15) && !tr_cluster_same_org(&c, 15, 16) &&
                  tr_cluster_same_org(&c, 16, 31),
              "two labs: ranks 0 and 15 (two servers of lab-a) in one organisation, 15 and "
              "16 not");
        check(tr_cluster_blocks_in_orgs(&c, 32, 16) && tr_cluster_blocks_in_orgs(&c, 32, 8) &&
                  !tr_cluster_blocks_in_orgs(&c, 32, 32) && !tr_cluster_blocks_in_orgs(&c, 24, 12),
              "two labs: groups of 16 and 8 stay in a lab; of 32 and 12 do not");
        check(tr_cluster_orgs(&c, 0, 32, &named) == 2 && named == 1 &&
                  tr_cluster_orgs(&c, 0, 16, &named) == 1 && tr_cluster_orgs(&c, 1, 16, &named) == 1,
              "two labs: 2 organisations on 32 devices, 1 on either lab's 16");
    }
    if (!load(&c, "../recipes/clusters/mixed_pool.yaml")) {
        check(tr_cluster_same_org(&c, 0, 7) && !tr_cluster_same_org(&c, 7, 8) &&
                  tr_cluster_blocks_in_orgs(&c, 48, 8) && !tr_cluster_blocks_in_orgs(&c, 48, 16) &&
                  tr_cluster_orgs(&c, 0, 48, &named) == 6 && named == 0 &&
                  tr_cluster_orgs(&c, 0, 20, &named) == 3,
              "no organisation fields: each of the 6 servers its own (8 fits, 16 does not)");
    }
    memset(&c, 0, sizeof c);
    c.n_groups = 1;
    c.g[0].nodes = 2, c.g[0].per_node = 2;
    c.hosts.n_hosts = 2, c.hosts.n_ranks = 4;
    short by_slot[4] = {0, 1, 0, 1};
    memcpy(c.hosts.host_of, by_slot, sizeof by_slot);
    int apart = !tr_cluster_blocks_in_orgs(&c, 4, 2) && tr_cluster_orgs(&c, 0, 4, &named) == 2;
    strcpy(c.hosts.org[0], "x"), strcpy(c.hosts.org[1], "x");
    check(apart && tr_cluster_blocks_in_orgs(&c, 4, 2) && tr_cluster_blocks_in_orgs(&c, 4, 4) &&
              tr_cluster_orgs(&c, 0, 4, &named) == 1 && named == 1,
          "detected hosts, ranks placed round-robin: pairs (0, 1) span both hosts, refused "
          "until both hosts are organisation x");
}

int main(int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[1], "--bad")) return bad_file(argv[2]);
    char dir[] = "/tmp/test_cluster_XXXXXX";
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    test_table();
    test_from_gpus();
    test_examples();
    test_defaults(dir);
    test_round_trips(dir);
    test_prefixes(dir);
    test_orgs();
    char path[600];
    snprintf(path, sizeof path, "%s/defaults.yaml", dir);
    remove(path);
    snprintf(path, sizeof path, "%s/awkward.yaml", dir);
    remove(path);
    rmdir(dir);
    printf("%d ok, %d failed\n", n_ok, n_fail);
    return n_fail ? 1 : 0;
}
