/* The running job's topology as a tr_cluster (dsl/cluster.h), for the planner: which ranks
 * share a host, the cores and memory there, the compute rate and the links, measured at
 * start-up in well under a second. Uses only the cluster's types, not its functions. */
#ifndef TR_TOPOLOGY_H
#define TR_TOPOLOGY_H

#include <stddef.h>

#include "dsl/cluster.h"
#include "parallel/comm/comm.h"

/* What the caller knows about its backend. */
typedef struct {
    int cpu;            /* the CPU backend: a rank is a device */
    const char *device; /* the device's name ("NVIDIA H100 80GB HBM3"); NULL: "cpu" */
    double device_mem;  /* a GPU's memory in bytes as its runtime reports it; 0: unknown */
    double mem_given;   /* > 0: each rank's memory is at most this (trainer --memory-mib), its
                           origin "given" */
    double peak_flops;  /* FLOP/s per rank: the table's for a GPU (0: unknown); on the CPU
                           0 measures sgemm on every rank at once, > 0 is given */
    int measure_links;  /* 1: time collectives inside and between nodes */
    int threads;        /* the CPU backend: threads each rank computes on (0: unknown) */
    const char *host;   /* this rank's host name; NULL: gethostname (tests name their own
                           to play several nodes on one machine) */
} tr_topology_opts;

/* Figures for links that were not measured (a node of one rank has no link inside it, one
 * node none between nodes, or measure_links is 0), origin TR_ORIGIN_ASSUMED: shared memory
 * inside a node, about 10 Gb/s Ethernet between nodes. */
#define TR_TOPOLOGY_INTRA_BW 10e9
#define TR_TOPOLOGY_INTRA_LAT 5e-6
#define TR_TOPOLOGY_INTER_BW 1e9
#define TR_TOPOLOGY_INTER_LAT 50e-6

/* Detect the cluster this job runs on, the same on every rank: every rank calls it at the
 * same point (it is a sequence of collectives on `world`).
 *
 * Ranks with the same host name form a node; nodes are ordered by their first rank, and
 * consecutive nodes with the same number of ranks form one group ("node", or "node0",
 * "node1", ...), per_node = that number (a rank per device, a GPU or on the CPU backend a
 * share of the cores). When the ranks of a node are not contiguous in rank order (round-robin
 * placement, which the mesh's tp-innermost order does not expect) the groups are still built
 * and `source` ends with "; ranks not contiguous per node".
 *
 * Per group, the slowest of its nodes and ranks:
 * - cores: those online, or the cores its ranks may run on together if fewer;
 * - mem_bytes: the CPU: physical memory / ranks on the node; a GPU: o->device_mem (measured,
 *   as the caller read it from its runtime);
 * - peak_flops: the CPU: sgemm timed on all ranks at once, so that ranks sharing cores see
 *   each other (measured), or o->peak_flops if given; a GPU: o->peak_flops (table);
 * - mem_bw: the CPU: memcpy, bytes read + written per second, all ranks at once; a GPU: 0;
 * - intra, inter: among the ranks of each node, and among one rank per node, the median time
 *   of an 8-byte all-reduce (latency) and the bus bandwidth of a 1 MiB one, 2(p-1)/p x bytes
 *   / (time - latency), as NCCL defines it for all-reduce; between nodes of several ranks
 *   each also inter.ring: that bus bandwidth for an all-reduce over every rank at once;
 * - price_hour, egress_per_gb: 0, assumed.
 * between[i][j] is the inter-node link. Rank 0's result is broadcast, so the struct is
 * bytewise identical on every rank.
 *
 * 0, or -1 and one line in err when a collective fails, memory runs out or the job has more
 * than TR_CLUSTER_MAX_GROUPS runs of differently sized nodes. */
int tr_topology_detect(tr_comm *world, const tr_topology_opts *o, tr_cluster *out, char *err,
                       size_t errlen);

/* How far the figure a probe takes from n repeated timings t (their median, or their mean)
 * would move if it were measured again, relative to it: the median's standard error, about
 * 1.25 sigma / sqrt(n), with sigma estimated from the median absolute deviation (x 1.4826),
 * which one call delayed by the scheduler does not move. (The interquartile range did: of 3
 * or 4 timings it spans the slowest, and one descheduled call of a planner's model probe read
 * 2,321x its median.) Sorts t (its median is then t[n / 2]); 0 for fewer than 2. Two planners that
 * measure the machine a minute apart see figures that far apart, and parallel/plan.c ties plans
 * that the largest of the compute probes' and of the link probes' could reorder (tr_plan_tie_of;
 * tr_cluster.noise, link_noise). */
double tr_topology_spread(double *t, int n);

/* Mid-run: the one-way rate (bytes/s) from each host to each other, rate[a * n_hosts + b]
 * from the first rank of host a to that of host b (0 on the diagonal, and between hosts that
 * are not neighbours when there are more than 16: host h and h + 1, both ways, only), the
 * same on every rank. host_of[r]: world rank r's host, 0..n_hosts-1, each host with a rank.
 * Every rank calls it at the same point; a few round trips of 128 KiB per pair. 0, or -1 and
 * one line in err. */
int tr_topology_host_rates(tr_comm *w, const int *host_of, int n_hosts, double *rate, char *err,
                           size_t errlen);

/* Which host's link is slow, from tr_topology_host_rates' matrix: the host whose transfers
 * one way (from it, or to it: the median of the slower) run at less than half the rate of
 * those between the other hosts (median), the slowest such; *mine and *others get the two rates. -1 when none is, or with
 * fewer than 3 hosts: two hosts share their one link, and which end is slow cannot be told. */
int tr_topology_slow_host(const double *rate, int n_hosts, double *mine, double *others);

/* Nodes into groups (tr_cluster's): runs of nodes with equal rank counts (count[k]) and about
 * the same speed (rate[k], its slowest rank's sgemm rate; 0: not measured), so that the
 * planner sizes pipeline stages by each group's own rate (hosts of different cores or
 * generations) instead of running every stage at the slowest one's pace. A node starts a new
 * group when its rate and its group's first node's differ by TR_TOPOLOGY_SPEED_SPLIT times or
 * more, and by more than twice the probes' noise (1 + 2 x the larger of the two nodes'
 * noise[k], tr_topology_spread's): on a loaded machine, whose probes vary by several times,
 * equal hosts stay one group and the plan the even one. group[k] = node k's group from 0;
 * returns how many. */
#define TR_TOPOLOGY_SPEED_SPLIT 1.5
int tr_topology_speed_groups(const double *rate, const double *noise, const int *count, int n,
                             int *group);

/* A second look of the model's probe at its largest measured micro-batch, 2^top sequences:
 * `again`, a share of the same sgemm rate as c->model_eff[top]. c->model_look becomes again
 * over the first look; where it is above 1 (the first look ran slow), every size's figure is
 * scaled by it, so the faster look sets the level and the sizes keep their measured shape. */
void tr_topology_faster_look(tr_cluster *c, int top, double again);

/* The best rate (FLOP/s) of `reps` single-precision n x n x n products after `warm` untimed
 * ones: what BLAS reaches on this process's threads. 0 when out of memory. */
double tr_topology_sgemm_rate(int n, int warm, int reps);

#endif
