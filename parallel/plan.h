/* The planner: for a recipe and a cluster (dsl/cluster.h), every layout that can run (dp x tp
 * x pp, ZeRO stage, micro-batch and count, schedule and virtual stages, sequence
 * parallelism, recompute), its predicted memory per rank and step time, and the best one for
 * an objective: the shortest step, the least cost, or the least cost that finishes the
 * recipe's steps by a deadline. A plan is a pure function of the recipe, the cluster and the
 * options: `trainer plan` runs it for a cluster described in a file, `trainer run` with
 * parallel "auto" for the detected one, and the result goes through tr_layout_resolve like a
 * layout written by hand.
 *
 * The cost model (parallel/plan_cost.c):
 *  memory  per rank: parameters, gradients and AdamW state of the chunks it holds (split by
 *          tp, sharded by ZeRO over dp), activations of its chunks for the micro-batches the
 *          schedule keeps in flight (split by tp, and the stream by sequence parallelism; less
 *          with recompute), the head's logits, and a reserve for the runtime (the CUDA
 *          context, NCCL's buffers: assumed). A quick estimate prunes the search; the plans
 *          shown are then measured exactly by the model's measuring pass (tr_layout_memory:
 *          what each rank's arena allocates).
 *  time    per step: each rank's FLOPs at the device's rate times an efficiency (assumed for
 *          GPUs, measured sgemm on the CPU) plus a fixed cost per operation, element-wise
 *          traffic at the memory bandwidth, tensor-parallel collectives and pipeline sends
 *          with an alpha-beta model on the link they cross (inside a node or between nodes,
 *          between groups), the schedule's bubble, and the data-parallel reduction (by ZeRO
 *          stage) less what hides behind the compute beside it, bucket by bucket (a GPU's;
 *          the CPU backend's collectives use its cores and hide nothing), plus the slowdown
 *          of the compute it hides behind (published).
 *  cost    the devices used times their price per hour times the run's hours, plus the bytes
 *          that leave a provider times its egress price. */
#ifndef TR_PLAN_H
#define TR_PLAN_H

#include <stdio.h>

#include "dsl/cluster.h"
#include "dsl/recipe.h"
#include "parallel/layout.h"

typedef enum { TR_PLAN_TIME = 0, TR_PLAN_COST } tr_plan_objective;

typedef struct {
    tr_plan_objective objective;
    double deadline_h; /* > 0: the cheapest plan that runs the recipe's steps within it */
    int all_devices;   /* 1: use every device of the cluster (a running job: its world); 0:
                          fewer may be chosen (whole nodes, or part of one) when cheaper */
    tr_layout_flags fixed; /* what the command line fixes (as for tr_layout_resolve); the
                              recipe's parallel { } and train fields fix the rest they set */
    int recompute;     /* -1: the recipe's (its "auto": planned); else the level to use */
    tr_dtype dtype;    /* storage dtype (bf16 on GPUs; the CPU computes in fp32) */
    int alternatives;  /* how many runner-up plans to keep (at most TR_PLAN_MAX_ALTS) */
} tr_plan_opts;

#define TR_PLAN_MAX_ALTS 64

typedef struct {
    /* the layout: the record run resolves and checkpoints keep (world, dp, tp, pp, ZeRO,
       sequence parallelism, micro-batching, schedule, recompute, the pp x V chunks balanced
       by the planner); the planner sets the fields it chooses */
    tr_layout l;
    int group_first;    /* the cluster's group its devices start at (l.world of them, through
                           the groups from there on); 0 for a running job's plan */
    /* predictions */
    double mem_bytes;   /* the most any rank holds, with the runtime's reserve */
    double mem_cap;     /* what that rank's device has */
    int mem_exact;      /* mem_bytes from the measuring pass (else the estimate) */
    double step_s;      /* one optimizer step */
    double compute_s;   /* of which computing (the slowest pipeline rank, all micro-batches) */
    double bubble_s;    /* the pipeline's idle time */
    double shared_s;    /* CPU ranks sharing cores: what the cores that waiting pipeline ranks
                           yield to the others take off the above (0 or less) */
    double tp_s;        /* tensor-parallel collectives (not overlapped) */
    double pp_s;        /* pipeline sends and receives (exposed) */
    double dp_s;        /* data-parallel reduction and ZeRO gathers (exposed part) */
    double dp_comm_s;   /* ... all of it, hidden and exposed */
    double dp_hidden;   /* the share of dp_comm_s hidden behind compute (1 where there is
                           none); dp_s has the slowdown of the compute beside it */
    double optim_s;     /* the optimizer step */
    double tokens_s, mfu, hours; /* tokens per second, model FLOPs utilization, the run */
    double cost, cost_per_mtok;  /* USD for the recipe's steps, per million tokens */
    double egress_gb;            /* per step, leaving a provider */
    char why[320];      /* an alternative: why it lost to the chosen plan */
} tr_plan;

/* The tie rule's margins (tr_plan_tie_of, tr_plan_tied). */
typedef struct {
    double band;    /* plans within this share of the best tie (PL_TIE) */
    double compute; /* ... and so do plans this much noise in the compute figures, */
    double links;   /* ... and this much in the links' could reorder */
} tr_plan_tie;

typedef struct {
    tr_plan best;
    int n_alts;
    tr_plan alts[TR_PLAN_MAX_ALTS];
    long evaluated;     /* layouts priced */
    long feasible;      /* of which fit in memory */
    double seconds;     /* the search's wall time */
    int fits;           /* 0: nothing fits (best is the least-memory plan, and need says what
                           would) */
    int deadline_met;   /* with a deadline: whether best meets it */
    char need[300];     /* nothing fits: "needs 12 GPUs of 80 GB, or recompute = full on 8" */
    char figures[800];  /* every figure the cost model used and its origin (measured, given,
                           table, published or assumed) */
    tr_plan_tie tie;    /* the tie rule's margins (tr_plan_tie_of) */
    tr_plan fastest;    /* the plan predicted fastest, which the tie is measured from */
    char memory[900];   /* what the plan memory did (trainer/plan_memory.c), "" when off */
} tr_plan_result;

/* The tie rule of a cluster: the cost model's own margin (PL_TIE, 5%), and how much the
 * figures the cost model uses may move when measured again, each at most PL_TIE_MAX (25%):
 * the compute probes' noise (tr_cluster.noise: the sgemm, memory, model and optimizer
 * timings) and the link probes' (tr_cluster.link_noise). Two measurements a minute apart
 * differ by about that much, and the plan should not follow them; 0 for a cluster from a
 * file. Plans within the margin of the best are a tie, and so are those this noise could
 * reorder (tr_plan_tied); the simplest wins. */
tr_plan_tie tr_plan_tie_of(const tr_cluster *c);

/* Whether plan p, scored sp (its step time, or its cost), ties with plan b scored sb <= sp:
 * within the cost model's margin (sp <= sb (1 + t->band)), or so close that the probes could
 * order them the other way when measured again. The compute figures may move by t->compute:
 * they move the compute, the bubble and what shared cores give back, and the optimizer; the
 * links by t->links: the collectives and sends. The difference of two plans then moves by at
 * most the sum, part by part, of each part's difference (in score units) times its figures'
 * noise. Plans that differ in one kind of part only (ZeRO-2's optimizer against ZeRO-0's)
 * keep their order under any noise; plans that trade one for another (compute for
 * communication) tie while the noise could turn the difference around. Each part moves by
 * its own probes' noise: one noisy probe (a memcpy timed 4 times on shared cores) no longer
 * sets the margin of the others. */
int tr_plan_tied(const tr_plan *b, const tr_plan *p, double sb, double sp, const tr_plan_tie *t);

/* Whether plan a has less machinery than b, the tie rule's order: fewer model-parallel ranks,
 * and of as many, fewer tensor-parallel ones (a pipeline's waiting ranks lend their cores,
 * its sends are few: bench/plan_vs_run.sh measured pp faster in 12 of 17 tied-size pairs on
 * one host, and on the cluster in a box), a lower ZeRO stage, no
 * sequence parallelism, less recompute and on fewer pipeline ranks, fewer virtual stages,
 * fewer micro-batches (the largest micro-batch, the resolver's own choice where memory allows
 * it), the plainer schedule (tr_pp_kind's order: GPipe first), even data-parallel shares,
 * fewer devices (the cost objective); then, only so that the order is total, the shares, the
 * stages' cuts and their recompute. Of two different layouts one is always simpler: which of
 * two tied plans wins does not follow the order the probes' noise gave their scores (1F1B and
 * ZB-H1, priced alike, took turns from one `trainer plan` to the next). */
int tr_plan_simpler(const tr_plan *a, const tr_plan *b);

/* The device memory the runtime takes on one GPU of this kind (tr_device_info's name, or an
 * unknown one), outside what the trainer allocates: the CUDA context and NCCL's buffers of one
 * communicator (the kernels' workspaces, cuBLASLt's included, are the plan's own:
 * model/workspace.c). *origin (may be NULL): how the figure was found. */
double tr_plan_runtime_reserve(const char *device, const char **origin);

/* Plan `r` for cluster `c`: 0 and *out, or -1 and one line in err (a recipe whose fixed
 * fields cannot run on this cluster says which and why, in tr_layout_resolve's words). */
int tr_plan_search(const tr_recipe *r, const tr_cluster *c, const tr_plan_opts *o,
                   tr_plan_result *out, char *err, size_t errlen);

/* Whether the recipe and the fixed flags leave the planner anything to choose (a layout
 * field, the micro-batch or recompute left "auto"). */
int tr_plan_open(const tr_recipe *r, const tr_plan_opts *o);

/* Price one layout (the planner's cost model) into *p: its memory estimate and step time.
 * `l` is resolved for cluster `c` (l->world devices, the first of the cluster). For tests and
 * the benchmark. */
void tr_plan_price(const tr_recipe *r, const tr_cluster *c, const tr_layout *l, tr_dtype dtype,
                   tr_plan *p);

/* a->why anew: why it loses to b, a plan of the search that gave res for cluster c under
 * options o (the plan memory's kept layout in place of the search's choice). */
void tr_plan_why(const tr_cluster *c, const tr_plan_opts *o, const tr_plan_result *res,
                 const tr_plan *b, tr_plan *a);

/* One line: "dp 8 x tp 8 x pp 2, 1f1b, 16 micro-batches of 1, ZeRO-1, sequence parallel,
 * recompute selective". */
void tr_plan_describe(const tr_plan *p, char *buf, size_t len);

#endif
