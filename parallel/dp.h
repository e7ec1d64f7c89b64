/* Data parallelism over a dp group: each rank trains on its slice of the global batch, the
 * gradients are summed over the group in buckets whose reduction starts as soon as their last
 * gradient is produced (overlapping the rest of the backward), and ZeRO shards the AdamW state
 * and the update (stage 1), the gradients (2) and the parameters (3) over the group. The
 * training loop calls these the same way for one process or many, whatever the stage, on any
 * backend: every buffer of the model's gradients and parameters (ZeRO's pieces and buckets
 * too) is the backend's memory, moved by its table and by comm.h's collectives on it. */
#ifndef TR_DP_H
#define TR_DP_H

#include <stddef.h>

#include "model/model.h"
#include "parallel/comm/comm.h"

typedef struct tr_dp tr_dp;

/* ZeRO-2's gradient reductions in flight at once (a third start finishes the oldest): more
 * would only hold more gradient memory. The planner's price of them reads it too. */
enum { TR_DP_IN_FLIGHT = 2 };

/* What a ZeRO stage splits over the dp group: the one place that maps a stage number to what
 * it shards. The planner's cost model, the layout's model options, this module and the
 * trainer ask it (or tr_dp_zero for a running group), never compare stage numbers. */
typedef struct {
    int optimizer; /* the AdamW state and the update (stages 1, 2, 3) */
    int grads;     /* the gradients too: each rank keeps its piece of every bucket, and the
                      optimizer state follows those pieces (2, 3) */
    int params;    /* the parameters too, all-gathered per op (3) */
} tr_zero;
static inline tr_zero tr_zero_of(int stage) {
    return (tr_zero){.optimizer = stage >= 1, .grads = stage >= 2, .params = stage >= 3};
}

typedef struct {
    long steps;         /* synchronised steps */
    long buckets;       /* gradient reductions started */
    double span_s;      /* first bucket started .. last bucket complete, summed over steps */
    double exposed_s;   /* of which the training waited for after its backward (ZeRO-2: also
                           within it, for a reduction to finish before the next could start) */
    double mask_s;      /* private gradients: putting buckets in fixed point, masking them (in
                           the backward) and unmasking the sums; the blocking sum of their
                           magnitudes is communication (tr_comm_wait_seconds) */
    double gather_s;    /* time waited for the parameters' transfers: ZeRO-1/2 the refresh
                           after the update, ZeRO-3 the per-op gathers (what overlapping the
                           forward did not hide) */
    long param_gathers; /* ZeRO-1, 2, 3: parameter broadcasts or all-gathers started */
    long refreshed;        /* ZeRO-1, 2: buckets refreshed after an update */
    long refreshed_by_op;  /* of which waited for by the op reading them (the rest: at once) */
} tr_dp_stats;

/* `m` must have been built with opts.shards = the group size when the stage shards the
 * optimizer state but not the gradients (ZeRO-1: the model's own slab shard) and 1 otherwise,
 * opts.shard = the rank in the group, opts.external_grads = tr_zero_of(zero).grads and
 * opts.external_params = tr_zero_of(zero).params.
 * zero: 0..3, as the resolved layout checked it (parallel/layout.h). ZeRO-2: gradients
 * reduce-scattered bucket by bucket into each rank's pieces, optimizer state and update on
 * those pieces; ZeRO-3: the parameters too are kept in those pieces, and each op's buckets are
 * all-gathered just before it runs, the next op's prefetched, and freed after it.
 * bucket_bytes: communication granularity (0: 4 MiB). For ZeRO-3, call before initialising or
 * loading the parameters (it tells the model its pieces).
 * Returns 0; -1 when the configuration is refused (ranks, model: the same answer on
 * every rank); -2 when this rank ran out of memory. err says why. */
int tr_dp_init(tr_dp **out, tr_model *m, tr_comm *dp, int zero, size_t bucket_bytes, char *err,
               size_t errlen);
void tr_dp_free(tr_dp *d);
/* What this group's stage shards. */
tr_zero tr_dp_zero(const tr_dp *d);
/* What one rank allocates at ZeRO stage `zero` over `size` ranks, without building anything:
 * `m` is planned (tr_model_plan) with the options of that stage; at stages 2 and 3 its
 * optimizer state (stage 3: and parameters) is sized for this rank's pieces, cut exactly as
 * tr_dp_init cuts them, and the pieces' summed gradient is added. The transient bucket
 * buffers are not included (tr_dp_grad_buffer_bytes and tr_dp_param_buffer_bytes measure
 * their high-water marks during a run). */
void tr_dp_measure(tr_model *m, int zero, int size, size_t bucket_bytes, tr_memory *mem);

/* Call before the backward of the last micro-batch of a step: its gradients are reduced as
 * they complete. Earlier micro-batches accumulate locally, with no communication (ZeRO 0, 1;
 * ZeRO-2 and 3 reduce every micro-batch, since no full gradient is kept to accumulate into). */
void tr_dp_arm(tr_dp *d);
/* Call after every micro-batch's backward, or a pipeline's after every backward (or weight
 * part) of a chunk: ZeRO-3 frees the parameters gathered for it; a no-op otherwise. Buckets
 * are reduced as they complete, for each micro-batch of each chunk, in any schedule. */
void tr_dp_micro_end(tr_dp *d);
/* The global gradient norm (ZeRO-2: from every rank's pieces). */
double tr_dp_grad_norm(tr_dp *d);
/* Bytes of gradient buffers this object holds (ZeRO-2: the pieces and the ring), beyond the
 * model's own. */
size_t tr_dp_grad_bytes(const tr_dp *d);
/* Of which the transient bucket buffers (ZeRO-2: their measured high-water mark). */
size_t tr_dp_grad_buffer_bytes(const tr_dp *d);
/* After that backward: wait for every bucket. The gradients are then summed over the group.
 * 0; -1 when a masked sum (tr_dp_set_private) did not cancel: the group's rank 0 said so in
 * one line, and the step must not go on. */
int tr_dp_sync_grads(tr_dp *d);
/* Private gradients: from now on the group's gradient sums (ZeRO 0 and 1's all-reduces,
 * ZeRO-2 and 3's reduce-scatters) are masked between ranks of different organisations (org:
 * this rank's; parallel/masked.h), after keys are agreed over the group. Collective. fp32
 * gradients (a device's go through host memory, by the backend's download and upload); -1 and
 * one line in err otherwise or when the keys cannot be agreed. How many organisations there
 * are, and this rank's peers, in *orgs and *peers. */
int tr_dp_set_private(tr_dp *d, const char *org, int *orgs, int *peers, char *err,
                      size_t errlen);
/* The optimizer step: all parameters (ZeRO 0), this rank's shard (ZeRO-1) or pieces (ZeRO-2,
 * 3). ZeRO-1 and 2 then start bringing back the parts the other ranks updated, bucket by
 * bucket, in the order the forward reads them: the next forward's ops wait each for the
 * buckets they read (the model's op hook), so the transfers overlap its compute. */
void tr_dp_step(tr_dp *d, const tr_adamw *opt);
/* ZeRO-1, 2: complete that refresh now, before anything but a forward reads the parameters
 * (every parameter: a dump, tr_model_get_param) or writes them (loading a checkpoint). No
 * communication starts: a rank may call it alone. A no-op otherwise. */
void tr_dp_settle(tr_dp *d);
/* Benchmarks, the blocking baselines: with refresh = 1, ZeRO-1/2's refresh completes right
 * after the update (bench/dp.sh) instead of during the next forward; with reduce = 1, each
 * gradient bucket's reduction (all-reduce, or ZeRO-2's reduce-scatter) completes as soon as it
 * starts (bench/wire_overlap.sh) instead of beside the rest of the backward. */
void tr_dp_set_sync(tr_dp *d, int refresh, int reduce);
/* A step whose update is skipped (trainer/run/guard.c) instead of tr_dp_step: its summed gradient
 * is dropped (ZeRO-2, 3: this rank's pieces zeroed; the model's own gradients are zeroed at the
 * next step's start), the parameters and optimizer state stay as they were. */
void tr_dp_drop_grads(tr_dp *d);
/* The whole AdamW state in host memory: m and v of tr_model_slab_elements floats each,
 * indexed like the slab. */
typedef struct {
    const tr_dp *dp;
    float *m, *v;
    float *p; /* ZeRO-1, 2, 3: the fp32 master parameters too (each rank's own part) */
} tr_dp_state;
/* Gather the sharded moments and (ZeRO-1, 2, 3) fp32 master parameters from every rank, each
 * part from the rank that updates it (every rank calls it; tests and tools: checkpoints do not
 * need it); without sharding, a copy of the model's moments.
 * -1 when out of memory. */
int tr_dp_gather_state(tr_dp *d, tr_dp_state *out);
void tr_dp_state_free(tr_dp_state *s);
/* The step's gradient, summed over the group (after tr_dp_sync_grads, before tr_dp_step),
 * as fp32 into host memory of tr_model_slab_elements floats indexed like the slab: the
 * model's slab, or at ZeRO-2/3 every rank's pieces (every rank calls it). Tools and tests; -1 when out of memory. */
int tr_dp_gather_grads(tr_dp *d, float *out);
/* ZeRO-1, 2, 3: tensor `param` of a gathered tr_dp_state's parameters into dst. */
void tr_dp_param_source(void *ctx, int param, float *dst);
/* ZeRO-3: the high-water mark of gathered parameter buffers (measured). */
size_t tr_dp_param_buffer_bytes(const tr_dp *d);

/* ZeRO-3: while hold is 1, buckets once gathered stay (the whole model at most): for sampling,
 * where every token would otherwise gather every bucket again. hold = 0 frees them. A no-op
 * at other stages. */
void tr_dp_hold_params(tr_dp *d, int hold);

/* The slab ranges this rank writes into checkpoints ([lo, hi) pairs into *out, malloc'ed;
 * returns how many): its pieces (ZeRO-2, 3), its optimizer shard (ZeRO-1), or 1/N of the
 * replicated slab (ZeRO-0). Over the group they cover the slab once. */
int tr_dp_ckpt_ranges(const tr_dp *d, size_t **out);

/* Sum of a value over the group (losses, token counts). */
double tr_dp_sum(tr_dp *d, double x);

tr_dp_stats tr_dp_get_stats(const tr_dp *d);
/* Fraction of the gradient communication hidden behind the backward so far (1 = all). */
double tr_dp_hidden_fraction(const tr_dp *d);

#endif
