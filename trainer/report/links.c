/* The ledger's watch on the network between hosts (trainer/report/links.h). */
#include "trainer/report/links.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "data/json.h"
#include "parallel/topology.h"
#include "trainer/report/ledger.h"
#include "trainer/trainer.h"

#define RING 5 /* steps a pace is the median of */

struct tr_links {
    tr_comm *world;
    int n, n_hosts, start_step;
    const char *hosts; /* n x TR_HOST_LEN, the ledger's */
    int *host_of;      /* n: each rank's host */
    double ring[RING], base, now;
    int seen, streak, since, done;
    int blamed, first; /* the host named, its first rank; -1 */
};

tr_links *tr_links_open(tr_comm *world, const char *hosts, int n, int start_step) {
    tr_links *k = calloc(1, sizeof(*k));
    int *of = malloc((size_t)n * sizeof(int));
    if (!k || !of) {
        free(k), free(of);
        return NULL;
    }
    for (int r = 0; r < n; r++) {
        of[r] = -1;
        for (int q = 0; q < r && of[r] < 0; q++)
            if (!strcmp(hosts + (size_t)q * TR_HOST_LEN, hosts + (size_t)r * TR_HOST_LEN))
                of[r] = of[q];
        if (of[r] < 0) of[r] = k->n_hosts++;
    }
    if (k->n_hosts < 2) {
        free(k), free(of);
        return NULL;
    }
    k->world = world, k->n = n, k->hosts = hosts, k->host_of = of, k->start_step = start_step;
    k->blamed = k->first = -1;
    return k;
}

void tr_links_free(tr_links *k) {
    if (!k) return;
    free(k->host_of);
    free(k);
}

static double median5(const double *ring) {
    double v[RING];
    memcpy(v, ring, sizeof(v));
    for (int i = 1; i < RING; i++)
        for (int j = i; j > 0 && v[j] < v[j - 1]; j--) {
            double t = v[j];
            v[j] = v[j - 1], v[j - 1] = t;
        }
    return v[RING / 2];
}

/* "1" or "2, 3": the ranks of host h. */
static void ranks_of(const tr_links *k, int h, char *s, size_t len) {
    size_t used = 0;
    s[0] = 0;
    for (int r = 0; r < k->n && used < len; r++)
        if (k->host_of[r] == h)
            used += (size_t)snprintf(s + used, len - used, "%s%d", used ? ", " : "", r);
}

static const char *host_name(const tr_links *k, int h) {
    for (int r = 0; r < k->n; r++)
        if (k->host_of[r] == h) return k->hosts + (size_t)r * TR_HOST_LEN;
    return "?";
}

/* Rank 0: the alarm, on stdout and as an event. */
static void say(const tr_links *k, const double *rate, double pace, double mine, double others,
                int step, FILE *events, int attempt, int tty) {
    int H = k->n_hosts;
    double ratio = k->base > 0 ? pace / k->base : INFINITY, excess = pace - k->base;
    char ranks[256] = "";
    if (k->blamed >= 0) {
        ranks_of(k, k->blamed, ranks, sizeof ranks);
        printf("%sslow link: host %s (rank%s %s) moves %.3g MB/s one way with the other hosts, "
               "which move %.3g MB/s between themselves; communication has taken %.2fx as long "
               "as at its best since about step %d (%.3f s more a step), charged to it as "
               "waiting\n",
               tty ? "\n" : "", host_name(k, k->blamed), strchr(ranks, ',') ? "s" : "", ranks,
               mine / 1e6, others / 1e6, ratio, k->since, excess);
    } else {
        printf("%sslow network: communication has taken %.2fx as long as at its best since "
               "about step %d (%.3f s more a step); %s",
               tty ? "\n" : "", ratio, k->since, excess,
               H == 2 ? "two hosts share their one link, so which end is slow cannot be told:"
                      : "no one host's link is slower than the others':");
        for (int a = 0; a < H && a < 4; a++)
            for (int b = 0; b < H && b < 4; b++)
                if (a != b && rate[a * H + b] > 0)
                    printf(" %s -> %s %.3g MB/s", host_name(k, a), host_name(k, b),
                           rate[a * H + b] / 1e6);
        printf("\n");
    }
    fflush(stdout);
    if (!events) return;
    fprintf(events, "{\"kind\": \"slow_link\", \"attempt\": %d, \"step\": %d, \"t\": %.3f, \"host\": ",
            attempt, step + 1, tr_ledger_unix_now());
    if (k->blamed >= 0)
        tr_json_write_string(events, host_name(k, k->blamed));
    else
        fprintf(events, "null");
    fprintf(events, ", \"ranks\": [%s], \"since_step\": %d, \"slowdown\": ", ranks, k->since);
    tr_json_write_num(events, ratio, -4);
    fprintf(events, ", \"cost_s_per_step\": ");
    tr_json_write_num(events, excess, -6);
    fprintf(events, ", \"host_bytes_s\": ");
    tr_json_write_num(events, k->blamed >= 0 ? mine : 0, 0);
    fprintf(events, ", \"others_bytes_s\": ");
    tr_json_write_num(events, k->blamed >= 0 ? others : 0, 0);
    fprintf(events, "}\n");
    fflush(events);
}

/* Every rank at once: time the links, name the slow host. */
static void probe(tr_links *k, double pace, int step, FILE *events, int attempt, int tty) {
    int H = k->n_hosts, rank = tr_comm_rank(k->world);
    double *rate = calloc((size_t)H * (size_t)H, sizeof(double)), mine = 0, others = 0;
    char err[256];
    if (!rate || tr_topology_host_rates(k->world, k->host_of, H, rate, err, sizeof err)) {
        if (rank == 0) printf("slow network: %s\n", rate ? err : "out of memory to time it");
        free(rate);
        return;
    }
    k->blamed = tr_topology_slow_host(rate, H, &mine, &others);
    for (int r = 0; r < k->n && k->blamed >= 0 && k->first < 0; r++)
        if (k->host_of[r] == k->blamed) k->first = r;
    if (rank == 0) say(k, rate, pace, mine, others, step, events, attempt, tty);
    free(rate);
}

void tr_links_step(tr_links *k, const double *comm_s, int step, FILE *events, int attempt,
                   int tty) {
    if (!k) return;
    double c = INFINITY;
    for (int r = 0; r < k->n; r++)
        c = fmin(c, comm_s[r]);
    k->now = c;
    if (k->done || step <= k->start_step) return;
    k->ring[k->seen++ % RING] = c;
    if (k->seen < RING) return;
    double pace = median5(k->ring);
    if (k->seen == RING || pace < k->base) k->base = pace;
    if (!(pace > 2 * k->base && pace - k->base > 0.02)) {
        k->streak = 0;
        return;
    }
    if (k->streak++ == 0) k->since = step + 1 - RING / 2; /* the median's lag */
    if (k->streak < 4) return;
    k->done = 1;
    probe(k, pace, step, events, attempt, tty);
}

int tr_links_blame(const tr_links *k, int rank, double *excess) {
    *excess = 0;
    if (!k || k->first < 0 || k->host_of[rank] == k->blamed) return -1;
    *excess = fmax(0.0, k->now - k->base);
    return k->first;
}
