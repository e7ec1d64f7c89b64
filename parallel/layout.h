/* The resolved layout of a run: how its processes split the work (dp x tp x pp, ZeRO stage,
 * sequence parallelism) and the micro-batching. Made in one place (tr_layout_resolve) from the
 * recipe's parallel { ... }, the command-line flags and the world size, checked once with one
 * message per mistake, then only read: by `run` (agreed by all ranks, written into the
 * resolved recipe.lua and every checkpoint manifest), `show`, the parallel runtime and
 * checkpoints. The model options and the per-process memory of a layout come from here too,
 * so that `show` predicts exactly what `run` allocates. */
#ifndef TR_LAYOUT_H
#define TR_LAYOUT_H

#include <stddef.h>
#include <stdio.h>

#include "dsl/recipe.h"
#include "model/model.h"

typedef struct {
    int world;             /* processes: dp * tp * pp */
    int dp, tp, pp;        /* the mesh; world rank = (d * pp + p) * tp + t (parallel/comm/comm.h) */
    int zero;              /* ZeRO stage over the dp group, 0..3 */
    int sequence_parallel; /* tp > 1: norms, residuals and dropout-free regions on 1/tp of the
                              rows, all-gather / reduce-scatter instead of all-reduce */
    int seq_len;           /* T: tokens per sequence (the model's seq_len) */
    int micro_batch;       /* sequences per forward/backward on each data-parallel rank */
    int accum;             /* micro-batches per optimizer step (uneven dp_shares: the most a
                              replica runs; tr_layout_accum_of gives each one's) */
    int private_gradients; /* data-parallel sums masked between hosts (parallel/masked.h) */
    int shares_uneven;     /* dp replicas run different numbers of micro-batches a step:
                              dp_shares[d] (the recipe's or the planner's, by their speeds) */
    int dp_shares[TR_MAX_DP_SHARES];
    int micro_auto;        /* micro_batch was "auto" (resolved by memory) */
    int bucket_kb;         /* gradient bucket (KiB): the recipe's, or 4096 */
    int pad_vocab;         /* vocabulary padding of the head's products (the flags'; 0: the
                              backend's) */
    tr_recompute recompute;  /* the most of any pipeline rank's */
    int recompute_per_stage; /* the levels differ by pipeline rank (the recipe's list, or the
                                planner's): stage_recompute[p] for p < pp */
    signed char stage_recompute[TR_MAX_CHUNKS];
    /* pipeline parallelism (pp > 1; with pp 1 one chunk, the whole model) */
    int schedule;       /* tr_pp_kind (parallel/schedule.h) */
    int microbatches;   /* M: micro-batches per step through the pipeline (= accum) */
    int virtual_stages; /* V: chunks per pipeline rank (interleaved), else 1 */
    int n_blocks;       /* the model's blocks (tr_cost_blocks) */
    int stages_given;   /* chunk_start came from the recipe's stages = { ... } */
    /* pp * V chunks in model order, chunk c = blocks [chunk_start[c], chunk_start[c + 1])
       (chunk_start[pp * V] = n_blocks), on pipeline rank c % pp */
    int chunk_start[TR_MAX_CHUNKS + 1];
} tr_layout;

/* What the command line asks for; -1 (or 0 for pp, microbatches, virtual_stages,
 * sequence_parallel and micro_batch) where a flag was not given and the recipe decides. Flags
 * override the recipe; a flag --microbatches overrides the recipe's micro_batch, and a flag
 * --micro-batch the recipe's microbatches. */
typedef struct {
    int dp, tp, pp, zero;
    int schedule;          /* --schedule: tr_pp_kind, -1: the recipe's */
    int microbatches;      /* --microbatches, 0: the recipe's */
    int virtual_stages;    /* --virtual-stages, 0: the recipe's */
    int sequence_parallel; /* 1: --sequence-parallel, -1: --no-sequence-parallel */
    int micro_batch;       /* --micro-batch, 0: the recipe's */
    int private_gradients; /* 1: --private-gradients, 0: the recipe's */
    int pad_vocab;         /* vocabulary padding of the head's products: the backend's, or
                              TR_PAD_VOCAB (tests: a GPU's padding on the CPU); 0: the model's
                              default (a planned model has no backend to ask) */
} tr_layout_flags;

/* Private gradients asked for, by the flag or the recipe: the one rule the planner, the
 * resolver and the run's organisations (trainer/run/private.c) read. */
static inline int tr_private_asked(const tr_layout_flags *f, const tr_parallel_desc *p) {
    return f->private_gradients > 0 || p->private_gradients > 0;
}

/* Resolve the layout of `r` for `world` processes with the flags: -1 and one line in err for
 * the first mistake, naming the setting and what would work (tp must divide the heads, the
 * kv_heads or be a multiple of them, the MLP widths, dp * tp * pp must be the world size,
 * ...). A mistake located in the recipe starts with `recipe.lua:LINE: `; one that comes from
 * the flags alone starts with the flag (`--zero must be ...`) or the numbers (`dp 1 x tp 2 =
 * 2 processes, ...`), for the caller to prefix with its command. `dtype` and `budget` (bytes
 * of activations and scratch per process, 0: a quarter of the host's memory, at most 8 GiB)
 * size an "auto" micro-batch. Without a planner, "auto" fields are: dp = world / (tp * pp),
 * tp = pp = 1, ZeRO 0, no sequence parallelism.
 * The pipeline (pp > 1): schedule "auto" is 1f1b, virtual_stages 1; microbatches M, when
 * given, sets the micro-batch (the sequences of a step on each dp rank / M), else M is the
 * number of micro-batches the micro-batch gives (accum). The pp * V chunks start where
 * stages = { ... } says, else where tr_layout_partition balances the blocks' forward FLOPs.
 * With pp 1 the schedule is not used (resolved to 1f1b) and V must be 1. */
int tr_layout_resolve(tr_layout *l, const tr_recipe *r, const tr_layout_flags *f, int world,
                      tr_dtype dtype, double budget, char *err, size_t errlen);

/* The flags that pin every field of a resolved (or planned) layout: resolving them again, with
 * the layout's recompute in the recipe (r->train.recompute), gives the same layout. How a
 * plan becomes the run's layout. */
tr_layout_flags tr_layout_pin(const tr_layout *l);

/* Whether f fixes any field of the layout (the mesh, ZeRO, the schedule, the micro-batches,
 * sequence parallelism): what a flag fixes is not the planner's to choose or to remember. */
int tr_layout_flags_given(const tr_layout_flags *f);

/* This process's coordinates in the mesh. */
typedef struct {
    int d, p, t;
} tr_layout_coord;
tr_layout_coord tr_layout_coord_of(const tr_layout *l, int world_rank);

/* The model options of the process at world rank `rank` (tp_comm is left NULL: the caller
 * sets its group). */
tr_model_opts tr_layout_model_opts(const tr_layout *l, int rank);

/* What one process allocates at this layout: the model's measuring pass with the layout's
 * options, plus ZeRO's gradient pieces (stage 2, 3) sized exactly as parallel/dp.c cuts them;
 * the transient bucket buffers of stages 2 and 3 are not included (they are measured as
 * high-water marks during the run). `rank`: whose (the data-parallel pieces differ at the
 * edges by up to a bucket's padding). */
int tr_layout_memory(const tr_layout *l, const tr_model_desc *d, tr_dtype dtype, int rank,
                     tr_memory *mem, char *err, size_t errlen);

/* The fullest process's bytes at this layout (tr_layout_memory's kinds summed, the most over
 * the pipeline ranks: the others repeat one of them), with the device workspaces and ZeRO's
 * bucket buffers when `device` (a GPU's: every byte it allocates): 0, or -1 with err. */
int tr_layout_memory_most(const tr_layout *l, const tr_model_desc *d, tr_dtype dtype, int device,
                          double *bytes, char *err, size_t errlen);

/* One line, without the process count (the caller knows how they were started):
 * "dp 1 x tp 2: tensor parallel, sequence parallel, ZeRO-0, micro-batch 4 (auto), 2
 * accumulation steps"; with pp > 1 "dp 2 x tp 1 x pp 4: data parallel, pipeline 1f1b over 8
 * micro-batches, ZeRO-1, micro-batch 2". */
void tr_layout_describe(const tr_layout *l, char *buf, size_t len);

/* The pipeline's chunks (pp > 1; nothing with pp 1): a header line with the schedule and its
 * theoretical bubble (tr_pp_bubble), then one line per chunk, grouped by pipeline rank: its
 * blocks, the layers outside the stacks it carries ("blocks 0-5 (+ embedding, positions)",
 * "blocks 18-23 (+ final norm, head)"), its forward FLOPs per token and their share. For
 * `show` and the run's start-up log; `d` is the model the layout was resolved for. */
void tr_layout_describe_stages(const tr_layout *l, const tr_model_desc *d, FILE *out);

/* Write the resolved layout back into the recipe (every field of parallel { ... } and
 * train.micro_batch; with pp > 1 the schedule, virtual stages and the chunks' starts too, and
 * microbatches unless the micro-batch was "auto"), so that the saved recipe.lua names it and
 * loads again to the same layout. */
void tr_layout_to_recipe(const tr_layout *l, tr_recipe *r);

/* Pipeline rank p's recompute level (the layout's own unless it differs by rank). */
tr_recompute tr_layout_recompute_at(const tr_layout *l, int p);
/* Its name: "full", or per pipeline rank "selective/none/none". */
/* Micro-batches data-parallel replica d runs per step (accum, or its dp_shares entry), and
 * those of a whole step, summed over the replicas (dp x accum when even). */
int tr_layout_accum_of(const tr_layout *l, int d);
int tr_layout_step_micro_batches(const tr_layout *l);
/* Each replica's micro-batches a step, "3/1" (dp entries; truncated to n). */
void tr_layout_shares_name(const tr_layout *l, char *buf, size_t n);

void tr_layout_recompute_name(const tr_layout *l, char *buf, size_t n);
/* The layout's recompute into a recipe's train { }: one level, or one per pipeline rank. */
void tr_layout_recompute_to_recipe(const tr_layout *l, tr_train_desc *t);

/* Cut n blocks of the given costs (>= 0) into k contiguous non-empty chunks (1 <= k <= n):
 * start[c] = the first block of chunk c, start[k] = n. Exact: the most expensive chunk is as
 * cheap as any cut makes it; among the cuts that reach it, the one with the least sum of
 * squared chunk costs (the other chunks as even as they can be), and on a tie the one found
 * first, whose chunks end earliest. Two dynamic programs of O(k n^2) steps. 0, or -1 when out
 * of memory or k is out of range. */
int tr_layout_partition(const double *cost, int n, int k, int *start);
/* The same for chunks on devices of different speeds: chunk c's time is its cost over
 * speed[c] (> 0; the pipeline rank that holds it: devices of two generations, or CPU hosts
 * of different core counts), and the cut balances the times. -1 also for a speed <= 0. */
int tr_layout_partition_speeds(const double *cost, int n, int k, const double *speed,
                               int *start);

#endif
