/* A cluster: the machines a plan is made for (parallel/plan.h). Three sources fill the same
 * struct: a cluster file (`--cluster FILE`, YAML, read here with libyaml), the command line
 * (`--gpus N --gpus-per-node K --gpu NAME`, tr_cluster_from_gpus) and the running job itself
 * (parallel/topology.h: hosts, cores, the measured sgemm rate and links). A plan is a pure
 * function of a recipe and a cluster, so `trainer plan` runs anywhere for a cluster it does
 * not have.
 *
 * Ranks are numbered through the groups in order, the nodes of a group in order and the
 * devices of a node in order: world rank 0 is the first device of the first node of the first
 * group. Rates are per device: a link's bandwidth is what one device moves in one direction
 * through a collective's ring (NCCL's "bus bandwidth"), a node's network share per device
 * between nodes. Units are SI: bytes, seconds, FLOP/s, US dollars.
 *
 * Each number says where it came from (tr_origin): given in a file or flag, taken from the
 * table of known devices (tr_device_find), measured on this machine, or assumed (a default
 * the planner states). `trainer plan` prints which is which. */
#ifndef TR_CLUSTER_H
#define TR_CLUSTER_H

#include <stddef.h>

#define TR_CLUSTER_MAX_GROUPS 16

typedef enum {
    TR_ORIGIN_ASSUMED = 0, /* a default: no file, flag, table or measurement gave it */
    TR_ORIGIN_TABLE,       /* the table of known devices */
    TR_ORIGIN_GIVEN,       /* the cluster file or a flag */
    TR_ORIGIN_MEASURED,    /* measured on this machine at start-up */
    TR_ORIGIN_PUBLISHED    /* fitted to published training runs on that device (the
                              calibration set of tests/published_runs.tsv) */
} tr_origin;

/* "assumed", "table", "given", "measured", "published" */
const char *tr_origin_name(tr_origin o);

/* A known device type: the figures a name stands for. */
typedef struct {
    const char *name;    /* "H100-80GB"; matched case-insensitively, also by its aliases */
    const char *aliases; /* comma-separated other names ("H100,H100-SXM"), or "" */
    double mem_bytes;    /* device memory */
    double peak_flops;   /* dense bf16 tensor-core FLOP/s (the vendor's figure) */
    double mem_bw;       /* device memory bandwidth, bytes/s */
    double intra_bw;     /* all-reduce bus bandwidth per device inside a node, bytes/s */
    double intra_lat;    /* latency of a collective step inside a node, s */
    double inter_bw;     /* network share per device between nodes, bytes/s (a typical
                            server of this device: 8 x 200 Gb/s HDR for the A100, 8 x 400
                            Gb/s NDR for the H100 / H200 / B200) */
    double inter_lat;    /* between nodes, s */
    int per_node;        /* devices in its usual server */
    double price_hour;   /* a typical on-demand price per device-hour, USD (assumed: prices
                            vary by provider and month) */
    double efficiency;   /* of peak_flops, what a training step's matrix products reach */
    const char *efficiency_source; /* the published runs it was fitted to ("Megatron-LM
                            2024, H100"), or NULL: assumed, another generation's figure */
} tr_device_info;

/* The table: A100-40GB, A100-80GB, H100-80GB, H200, B200, L40S and more. NULL when the name
 * is unknown. tr_device_list writes the names, comma-separated, for messages. */
const tr_device_info *tr_device_find(const char *name);
int tr_device_count(void);
const tr_device_info *tr_device_at(int i);
void tr_device_list(char *buf, size_t len);

/* One figure and where it came from. */
typedef struct {
    double v;
    tr_origin from;
} tr_figure;

/* A link: bandwidth (bytes/s per device, one direction, through a collective) and latency
 * (s); for a detected job also p2p, what one transfer between two of its devices moves in one
 * direction (bytes/s: the link's own rate; v 0 where not measured), and, between nodes of
 * several ranks each, ring: the bus bandwidth of an all-reduce over every rank of the job at
 * once (each node's link carries one flow each way while all of its ranks work; v 0 where
 * not measured). */
typedef struct {
    tr_figure bw, lat;
    tr_figure p2p;
    tr_figure ring;
} tr_link;

/* Nodes of one kind at one provider. */
typedef struct {
    char name[64];     /* the group's name in the file ("h100-east"), or "node" */
    char provider[64]; /* a label ("" when none) */
    char org[64];      /* the organisation its nodes belong to (private gradients: masked
                          sums between organisations); "" when none: each node its own */
    char device[64];   /* the device's name ("H100-80GB", "cpu") */
    int nodes;         /* servers */
    int per_node;      /* devices (GPUs; on the CPU backend, ranks) per server */
    tr_figure mem_bytes;    /* per device */
    tr_figure peak_flops;   /* per device: the rate the planner's efficiencies multiply */
    tr_figure efficiency;   /* a GPU's: of peak_flops, what a training step's matrix products
                               reach (published for a device the calibration set has runs
                               of, else assumed; a file may give it) */
    char efficiency_source[64]; /* published: the runs it was fitted to */
    tr_figure mem_bw;       /* per device, bytes/s */
    tr_link intra;          /* between devices of one node */
    tr_link inter;          /* between nodes of this group */
    tr_figure price_hour;   /* per device-hour, USD */
    tr_figure egress_per_gb; /* per GB leaving the provider, USD */
    int cores;              /* CPU cores per node (the CPU backend: they are shared by its
                               ranks); 0 when not known */
    int threads;            /* the CPU backend: threads each rank computes on (the most of
                               any rank); 0 when not known */
    int pool;               /* the CPU backend: the ranks that run on a node's cores, its own
                               and those of other nodes on the same machine whose cores they
                               share (the cluster in a box's hosts); 0 when not known (then
                               per_node: the node's cores are its own) */
    int line;               /* the group's line in the cluster file, 0 otherwise */
} tr_node_group;

/* The hosts of a running job, as topology detection found them (parallel/topology.h): each
 * host's name and which world ranks run there. Empty (n_hosts 0) for a cluster from a file or
 * flags, and for a job of more than TR_CLUSTER_MAX_HOSTS hosts or TR_CLUSTER_MAX_RANKS ranks
 * (the groups still describe it). */
#define TR_CLUSTER_MAX_HOSTS 256
#define TR_CLUSTER_MAX_RANKS 4096
typedef struct {
    int n_hosts, n_ranks;
    char name[TR_CLUSTER_MAX_HOSTS][64];
    char org[TR_CLUSTER_MAX_HOSTS][64];  /* each host's organisation (trainer run --orgs);
                                            "": the host its own */
    short host_of[TR_CLUSTER_MAX_RANKS]; /* world rank -> its host's index in name */
} tr_cluster_hosts;

#define TR_CLUSTER_EFF 8 /* micro-batches of 1 to 128 sequences */
typedef struct {
    char source[512]; /* "clusters/h100x8.yaml", "--gpus 64 --gpus-per-node 8 --gpu H100-80GB",
                         "detected: 1 node (host1), 2 ranks, CPU" */
    int cpu;          /* the CPU backend: a rank's rate is the measured sgemm rate of its
                         share of the node's cores */
    int n_groups;
    tr_node_group g[TR_CLUSTER_MAX_GROUPS];
    /* between nodes of different groups (i != j, symmetric); a pair the file does not name
       gets the slower of the two groups' inter links, assumed */
    tr_link between[TR_CLUSTER_MAX_GROUPS][TR_CLUSTER_MAX_GROUPS];
    tr_cluster_hosts hosts; /* a detected job's hosts and ranks */
    tr_figure noise;        /* a detected job: how far its compute probes' figures (sgemm,
                               memory, the model's and the optimizer's timings) would move if
                               measured again, on the noisiest rank (tr_topology_spread);
                               0 (assumed) for a cluster from a file or flags */
    tr_figure link_noise;   /* the same of its link probes (all-reduces and sends) */
    /* A detected CPU job planning a recipe: the share of the sgemm rate (g[].peak_flops) the
       recipe's own model reaches in a forward and backward at micro-batches of 2^i
       sequences, every op included (trainer/run/plan.c times a copy with one block on every
       rank at once); 0 where not measured (the planner's assumed rates then) */
    double model_eff[TR_CLUSTER_EFF];
    /* The second look's rate over the first at the largest size measured (0: not looked
       again); above 1, model_eff is the second look's (tr_topology_faster_look) */
    double model_look;
    /* A detected CPU job: parameters the backend's AdamW updates per second on a rank, every
       rank at once (the slowest; trainer/run/plan.c); 0 where not measured (the planner then
       prices the update at the memory bandwidth) */
    double optim_rate;
    /* A detected CPU job planning a recipe: seconds per matrix product that do not shrink with
       its size (its call, the fork and join of the operations around it), every rank at once
       (trainer/run/plan.c times the recipe's model shrunk to nothing); 0 where not measured
       (the planner's assumed PL_CPU_OP_COST then) */
    double op_cost;
} tr_cluster;

/* g's matrix efficiency from the device d's (NULL: an unknown device's, assumed), unless
 * the cluster file gave it: published where d's was fitted to published runs, else assumed;
 * g->efficiency_source names the runs. */
void tr_group_fill_efficiency(tr_node_group *g, const tr_device_info *d);

/* Every device of the cluster: the sum of nodes * per_node. */
long tr_cluster_devices(const tr_cluster *c);

/* The group holding world rank `rank` (ranks numbered as above), and its node's index in the
 * whole cluster (0-based, through the groups). -1 when rank is out of range. */
int tr_cluster_group_of(const tr_cluster *c, long rank, long *node);

/* Organisations (private gradients, parallel/masked.h: the data-parallel sums are masked
 * between them, and nothing else may cross). A detected job's ranks are in their host's
 * organisation (hosts.org), a file's in their group's (g[].org); a rank without one is in
 * its node's own. tr_cluster_same_org: whether world ranks a and b are in one;
 * tr_cluster_blocks_in_orgs: whether every run of `block` consecutive ranks from rank 0 of
 * the first `world` (a tensor x pipeline group, parallel/layout.h's numbering) lies in one;
 * tr_cluster_orgs: how many organisations the `world` ranks from group g0's first span, and
 * in *named whether any of them has a name (else each node is its own). */
int tr_cluster_same_org(const tr_cluster *c, long a, long b);
int tr_cluster_blocks_in_orgs(const tr_cluster *c, long world, long block);
int tr_cluster_orgs(const tr_cluster *c, int g0, long world, int *named);

/* N devices of a known type, K per node (K 0: the type's usual server, capped at N): one
 * group, every figure from the table (origin TR_ORIGIN_TABLE) but the counts (given). -1 and
 * one line in err ("--gpu H10: unknown device; known: A100-40GB, ...", "--gpus 12 is not a
 * multiple of --gpus-per-node 8") when the arguments do not make a cluster. */
int tr_cluster_from_gpus(tr_cluster *c, long n, int per_node, const char *gpu, char *err,
                         size_t errlen);

/* Read a cluster file (YAML). 0, or -1 and one line in err naming the file, the line and the
 * field: "clusters/pool.yaml:12: groups[2].per_node: must be a whole number from 1 to 1024,
 * got 'eight'". Unknown fields are mistakes too (a misspelt field would silently change the
 * plan). The format is in the README ("Cluster files") and in recipes/clusters/ (the examples). */
int tr_cluster_load(tr_cluster *c, const char *path, char *err, size_t errlen);

/* Write the cluster as YAML that tr_cluster_load reads back to the same figures (origins
 * become "given"), for the run's output folder and tests. */
int tr_cluster_write(const tr_cluster *c, const char *path, char *err, size_t errlen);

#endif
