/* Inside the planner: the model summarised for pricing many layouts fast (plan_cost.c), and
 * the search that enumerates them (plan.c). */
#ifndef TR_PLAN_PRIVATE_H
#define TR_PLAN_PRIVATE_H

#include "model/model.h"
#include "parallel/plan.h"

/* Figures the cost model assumes (README "How plans are chosen" lists them). */
/* A GPU's matrix efficiency (the share of its dense bf16 peak a training step's matrix
   products reach) is its group's, tr_node_group.efficiency: per device generation, fitted to
   published runs (dsl/cluster.c). */
/* A GPU's fixed cost per matrix product: the kernels a product brings with it (its own, and the
   norms, activations, residual adds and bias sums around it), each at one launch's cost on the
   host, which sets the pace where kernels are short. The count is the CUDA backend's (counted
   on the emulator, tests/emu_kernels.sh: a block of the GPT-2-shaped recipe runs 38 kernels for
   the cost model's 18 products, of the Llama-shaped 34, a cuDNN graph counted as one kernel).
   The launch: 3.0 us for cuLaunchKernel of a kernel without arguments, 3.3 us with 19, on a
   GB200 (published: meta-pytorch/tritonbench pull request 1017, 2026); 2.2 us back to back
   on a P100 (published: CSCS's ReFrame kernel_latency check, its reference for Piz Daint). */
#define PL_GPU_KERNELS_PER_PRODUCT 2.0
#define PL_GPU_LAUNCH_S 3.0e-6
#define PL_GPU_OP_COST (PL_GPU_KERNELS_PER_PRODUCT * PL_GPU_LAUNCH_S)
/* s per matrix product on the CPU backend, with the operations around it (threads' fork and
   join), where it was not measured (tr_cluster.op_cost: a detected job planning a recipe
   times it, 1.0 us here on one thread): `trainer run` of bench/pp_gpt.lua and bench/tp_gpt.lua on
   one process, micro-batch 1 against 8, took 2.9 and 6.6 ms more per extra micro-batch on 1
   thread, 3.2 and 5.6 ms on 2; with PL_CPU_WEIGHT_PASSES that leaves 0 and 6 us a product (50 and
   14 a micro-batch, x3 for the backward) */
#define PL_CPU_OP_COST 5e-6
/* How much data-parallel communication hides behind compute is counted, bucket by bucket
   (plan_cost.c, pl_exposed): on a GPU the collectives run on NCCL's own stream beside the
   compute, at the link's full speed, and the compute beside them slows: by PL_GPU_CONTENTION
   of the time they hide (published: Lee et al. 2025, "Characterizing Compute-Communication
   Overlap in GPU-Accelerated Distributed Deep Learning", arXiv:2507.03114: GPT and LLaMA
   models on 4 A100s, H100s, MI250s and MI210s, compute beside collectives 18.9% slower on
   average than alone, 40.0% at most). On the
   CPU backend its collectives move data with the cores the compute uses, so nothing hides
   (bench/plan_vs_run.sh: ZeRO-3's gathers cost their full time there; on the cluster in a box
   at 100 Mbit/s, where dp 4's all-reduce is most of the step, dp 4 at ZeRO-0 measured 0.97x
   its price with none of it hidden, 2026-12-05) ... */
/* ... but between hosts, the bytes cross the network (the kernel's socket buffers, the NIC)
   while the cores compute: ZeRO-2's reduce-scatters, bucket by bucket, hide behind this share
   of the compute beside them, where the wire is free for them. Measured (bench/wire_overlap.sh:
   2 hosts of one rank, a core each, dp 2 of bench/pp_gpt.lua in a micro-batch of 32, the
   gradient's 12.8 MB each way about twice the backward at 100 Mbit/s): what the runs with
   every reduction blocking added against what the plan priced hidden at 1.0, 0.90 (medians
   of 2 runs each, 2026-12-07, an Intel Xeon of 2 cores). At 1 Gbit/s on the same box,
   whose links are the cores' (about 50 MB/s), 0.37: there the transfers take the cores the
   compute needs. ZeRO-1/2's refresh hid nothing measurable (its buckets start at once and
   share the link) and is priced so; ZeRO-0/1's all-reduces hid as much as the reduce-scatters
   at 100 Mbit/s but little at 1 Gbit/s, and stay priced exposed (README, How plans are chosen) */
#define PL_CPU_WIRE_OVERLAP 0.9
#define PL_GPU_CONTENTION 0.189
#define PL_UNKNOWN_PEAK 100e12  /* FLOP/s of a device whose peak is not known */
#define PL_UNKNOWN_MEM_BW 1e12  /* bytes/s of a device whose memory bandwidth is not known */
#define PL_TIE 0.05             /* plans predicted this close are a tie: the simplest wins */
#define PL_TIE_MAX 0.25         /* the probes' noise the tie allows for, at most (tr_plan_tie_of) */
#define PL_ELEMENTWISE_PASSES 4.0 /* activation bytes moved per kept byte, forward + backward */
/* The CPU backend's products read their weights through memory once a micro-batch, whatever its
   size (BLAS packs the weight into its own buffer: read and write; the forward, the backward's
   input gradient; the weight gradient accumulated: read and write): weight bytes moved per
   micro-batch, over the measured memory bandwidth. A GPU's products stream theirs within the
   product's time (cuBLAS: no packing), so its cost model has none. */
#define PL_CPU_WEIGHT_PASSES 6.0

/* The model as the cost model reads it: per block (tr_cost_blocks), prefix sums, and the
 * bytes per parameter and per activation byte of this dtype (from one measuring pass). */
typedef struct {
    int n;               /* blocks */
    tr_cost *blk;        /* n blocks, per token at T */
    double *pre_flops;   /* prefix sums over blocks of fwd_flops, n + 1 */
    double C, V, T, Vpad;
    double wmax;         /* the widest product output (model.c's width_scratch at tp 1) */
    int tied;            /* tied head: with pp > 1 the last stage keeps a copy of the embedding */
    double p_bytes, g_bytes, o_bytes; /* per parameter: weights (+ fp32 master), gradient,
                                         AdamW state */
    double a_scale;      /* measured activation bytes / tr_cost's fp32 count */
    double es;           /* storage dtype bytes (activations exchanged between ranks) */
    double train_flops_tok; /* 3 x forward per token: MFU's numerator */
    double seqs;         /* sequences per optimizer step */
    double bucket;       /* bytes per data-parallel collective (parallel.bucket_kb) */
    long steps;
} pl_model;

int pl_model_init(pl_model *m, const tr_recipe *r, tr_dtype dtype, char *err, size_t errlen);
void pl_model_free(pl_model *m);

/* The devices a layout of `world` ranks uses (the first ranks of the cluster) and the links
 * its groups cross. */
typedef struct {
    double rate;    /* slowest device's FLOP/s a matrix product reaches */
    double eff[TR_CLUSTER_EFF]; /* the cluster's model_eff: of rate, what the recipe's model
                                   reaches at micro-batches of 2^i sequences (0: unmeasured) */
    double peak;    /* its nominal peak (MFU's denominator) */
    double mem_bw;  /* slowest memory bandwidth */
    double optim_rate; /* the cluster's optim_rate: parameters updated per second (0: unmeasured) */
    double mem_cap; /* smallest device memory */
    double op_cost; /* per operation */
    double weight_passes; /* the weights' bytes moved through memory per micro-batch */
    int beside;           /* data-parallel collectives run beside the compute (a GPU's NCCL stream),
                             not on the cores it uses (the CPU backend) */
    double reserve; /* memory the runtime keeps */
    double share;   /* CPU ranks that share cores: the part of a rank's own speed it gets
                       while every rank of its node computes (cores / (ranks x threads), the
                       rate the probes measured, all at once), 1 when they do not */
    double price_s; /* USD per second for all the devices used */
    int per_node;   /* the smallest node used (devices) */
    int per_pool;   /* CPU ranks that run on one node's cores together: per_node, or more
                       where nodes of one machine share its cores (tr_node_group.pool, the
                       largest group's); shared_cores takes a pool to be that many
                       consecutive ranks, as mpirun places nodes' ranks in turn */
    int groups;     /* groups the world spans */
    tr_link intra, inter, between; /* slowest of each kind among those used */
    int mpi_coll;   /* collectives are Open MPI's libnbc (the CPU backend), not NCCL's rings:
                       plan_cost.c's t_coll prices each as that library runs it */
    int node_link;  /* inter is a node's link, timed by one flow (a detected job's): the ranks
                       of a node that cross at once share it (plan_cost.c, crossing) */
    double egress_per_byte; /* the dearest provider's (0: one provider) */
    int mixed;      /* the groups used reach different rates: stages are sized by speed */
    double g_rate[TR_CLUSTER_MAX_GROUPS]; /* each group's rate (peak x efficiency) */
    long g_end[TR_CLUSTER_MAX_GROUPS];    /* the world rank after each group's last */
} pl_devices;

void pl_devices_of(const tr_cluster *c, long world, pl_devices *d);

/* The rate of pipeline rank p's slowest device in layout l (world rank (d pp + p) tp + t):
 * dv->rate unless the devices are mixed. */
double pl_stage_rate(const pl_devices *dv, const tr_layout *l, int p);
/* The rate of data-parallel replica d's slowest device (its pp x tp ranks). */
double pl_replica_rate(const pl_devices *dv, const tr_layout *l, int d);

/* The memory pipeline rank r of plan p holds (the quick estimate, with the reserve). */
double pl_stage_memory(const pl_model *m, const pl_devices *dv, const tr_plan *p, int r);

/* Of one pass's gathers (ga seconds in na buckets, ahead of the ops that read them) and
 * reductions (re in nr, after the ops that make them), what stays exposed beside its window
 * seconds of compute, the buckets run in turn beside it (pl_devices.beside). */
double pl_exposed(const pl_devices *dv, double ga, double na, double re, double nr, double window);

/* One layout to price: the fields of tr_plan's first part. */
void pl_price(const pl_model *m, const pl_devices *dv, tr_plan *p);

#endif
