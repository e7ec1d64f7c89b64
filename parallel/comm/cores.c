/* The spare-core rule (cores.h). */
#define _GNU_SOURCE /* sched_getaffinity, CPU_COUNT */
#include "parallel/comm/cores.h"

#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

tr_node_cores tr_node_cores_here(int ranks) {
    tr_node_cores c = {.online = sysconf(_SC_NPROCESSORS_ONLN), .ranks = ranks > 0 ? ranks : 1};
    cpu_set_t set;
    CPU_ZERO(&set);
    c.allowed = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : c.online;
    if (c.online < 1) c.online = 1;
    if (c.allowed < 1 || c.allowed > c.online) c.allowed = c.online;
    const char *v = getenv("OMP_NUM_THREADS");
    char *end = NULL;
    long t = v ? strtol(v, &end, 10) : 0;
    c.given = end && end != v && (*end == 0 || *end == ',') && t > 0;
    c.threads = c.given ? t : tr_node_threads(c.online, c.allowed, c.ranks);
    return c;
}

long tr_node_threads(long online, long allowed, int ranks) {
    long share = online / (ranks > 0 ? ranks : 1);
    if (share > allowed) share = allowed;
    return share > 0 ? share : 1;
}

int tr_spare_core(const tr_node_cores *c, char *why, size_t n) {
    if (why && n)
        snprintf(why, n, "%d rank%s x %ld thread%s on %ld core%s", c->ranks,
                 c->ranks == 1 ? "" : "s", c->threads, c->threads == 1 ? "" : "s", c->online,
                 c->online == 1 ? "" : "s");
    return (double)c->ranks * (double)c->threads < (double)c->online && c->allowed > c->threads;
}
