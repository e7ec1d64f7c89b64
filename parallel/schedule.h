/* Pipeline schedules: for P pipeline ranks, V model chunks per rank (virtual stages) and M
 * micro-batches, the plain list of actions each rank runs in order during one optimizer step.
 * Chunk c (0 .. P*V-1, in model order) lives on rank tr_pp_rank_of(c): c % P, but for zb-v's
 * V (chunks c and 2P-1-c on rank c); "chunk" in an action is that global index. The list implies
 * the communication: a forward of chunk c > 0 receives its input from chunk c-1's rank, a forward
 * of chunk c < P*V-1 sends its output to chunk c+1's rank, and the backward (full, or input part)
 * mirrors it. A schedule is generated once, tested on its own (tests/test_schedule.c simulates
 * every rank's list: no deadlock, every forward before its backward, never more activations held
 * than promised) and only read by the executor (parallel/pipeline.c).
 *
 *   gpipe        every forward, then every backward, both oldest micro-batch first (M
 *                micro-batches of activations held); bubble (P-1)/M
 *   1f1b         min(P-1-r, M) warm-up forwards on rank r, then one forward one backward,
 *                then the remaining backwards (at most min(P-r, M) held: P on rank 0);
 *                bubble (P-1)/M
 *   interleaved  Megatron's interleaved 1F1B over V chunks per rank; bubble (P-1)/(V*M);
 *                needs M a multiple of P
 *   zb-h1        Qi et al. 2024 (ZB-H1): each backward split into the input gradient (B,
 *                on the critical path) and the weight gradient (W, deferred into the
 *                cool-down's waits), holding on every rank no more than 1F1B's min(P-r, M)
 *                (a micro-batch counts from its forward to its W: the output gradients W
 *                keeps lie over activations only B read, model.c); bubble 2(P-1)/(3M), two
 *                thirds of 1F1B's, also for M < P
 *   zb-v         Qi et al. 2024 (ZB-V): V = 2 chunks per rank in a V, chunk r and chunk
 *                2P-1-r on rank r (the first and the last chunk on rank 0), the backward split
 *                as zb-h1's; lists from the paper's greedy in unit time, each rank holding at
 *                most P micro-batches of each half-stage chunk (rank 0 P-1 of its second):
 *                2P halves, the blocks 1F1B's rank 0 holds in P whole stages; bubble by
 *                simulation: the paper's (P-1)/(6M+P-1) where P divides M (pp 4 M 8 5.9% as an
 *                idle fraction; 1F1B 27%, ZB-H1 20%), between it and ZB-H1's otherwise; needs
 *                M >= P
 *
 * Bubbles above are ratios, idle time / compute time, for M >= P with a forward of one unit and
 * a backward of two (B and W one each). tr_pp_bubble returns the idle fraction of the step
 * instead: fraction = ratio / (1 + ratio), e.g. 1f1b's (P-1)/(M+P-1). */
#ifndef TR_SCHEDULE_H
#define TR_SCHEDULE_H

#include <stddef.h>

#define TR_PP_MAX_RANKS 64

typedef enum { TR_PP_GPIPE = 0, TR_PP_1F1B, TR_PP_INTERLEAVED, TR_PP_ZBH1, TR_PP_ZBV } tr_pp_kind;

typedef enum {
    TR_ACT_FWD = 0, /* forward of (micro-batch, chunk) */
    TR_ACT_BWD,     /* the whole backward: input and weight gradients */
    TR_ACT_BWD_IN,  /* zb-h1: the input gradient only (what the previous chunk waits for) */
    TR_ACT_BWD_W    /* zb-h1: the weight gradient of an earlier BWD_IN of the same pair */
} tr_pp_op;

typedef struct {
    unsigned char op; /* tr_pp_op */
    int mb;           /* micro-batch 0 .. M-1 */
    int chunk;        /* global chunk 0 .. P*V-1 (on rank tr_pp_rank_of(chunk)) */
} tr_pp_action;

typedef struct {
    tr_pp_kind kind;
    int P, V, M;
    int n[TR_PP_MAX_RANKS];              /* actions of each rank (P <= 64) */
    tr_pp_action *list[TR_PP_MAX_RANKS]; /* each rank's actions, in order */
    /* the promise: the most micro-batch-chunks whose forward ran and whose backward (zb-h1:
       weight part) has not, on each rank */
    int max_inflight[TR_PP_MAX_RANKS];
} tr_pp_schedule;

/* "gpipe", "1f1b", "interleaved", "zb-h1", "zb-v" -> kind; -1 when unknown. */
int tr_pp_kind_parse(const char *s);
const char *tr_pp_kind_name(tr_pp_kind k);

/* The pipeline rank that holds global chunk c: c % P, or for zb-v c < P ? c : 2P-1-c. Every
 * place that maps chunks to ranks asks here (the layout, the executor, the planner). */
int tr_pp_rank_of(const tr_pp_schedule *s, int chunk);
int tr_pp_rank_of_kind(tr_pp_kind k, int P, int chunk);

/* Whether this schedule can run P ranks x V chunks x M micro-batches: 0, or -1 with one line
 * in err saying what would work ("interleaved needs microbatches a multiple of pp 4 (4, 8,
 * ...), not 6", "virtual_stages 2 needs schedule \"interleaved\"", ...). 1f1b and zb-h1 accept
 * M < P (fewer warm-up forwards); P * V is at most 256 chunks. */
int tr_pp_check(tr_pp_kind k, int P, int V, int M, char *err, size_t errlen);

/* Generate the lists (after tr_pp_check passed), overwriting *s: 0, or -1 when out of memory.
 * max_inflight[r] is the most the rank's list holds: gpipe M, 1f1b and zb-h1 min(P-r, M),
 * interleaved its warm-up forwards + 1 (at most M*V). */
int tr_pp_generate(tr_pp_schedule *s, tr_pp_kind k, int P, int V, int M);
void tr_pp_free(tr_pp_schedule *s); /* NULL or a zeroed schedule: nothing to free */

/* The schedule's theoretical bubble, by simulation of its lists: 1 - (a rank's compute, 3*V*M
 * units) / (the step's makespan, the latest rank's finish) when a forward takes one unit and a
 * backward two (zb-h1: input and weight parts one each), communication free. The simulation
 * gives gpipe and 1f1b (P-1)/(M+P-1) (also for M < P), interleaved (P-1)/(V*M+P-1) (M >= P)
 * and zb-h1 2(P-1)/(3M+2(P-1)) (also for M < P); tests/test_schedule.c checks these. -1 when
 * the lists fail
 * tr_pp_simulate. */
double tr_pp_bubble(const tr_pp_schedule *s);

/* Simulate the lists with the unit costs above and blocking receives: 0 when every rank
 * finishes, with each rank's finishing time in makespan[0 .. P-1] (may be NULL); -1 with one
 * line in err naming the first problem (a deadlock and which ranks wait for what, a backward
 * before its forward, an action on the wrong rank or of the wrong kind (zb-h1 uses only the
 * split backward, the others only the whole one), an action missing or repeated, more in
 * flight than max_inflight). Tests and tr_pp_bubble. */
int tr_pp_simulate(const tr_pp_schedule *s, double *makespan, char *err, size_t errlen);

/* The makespan of the lists (in tr_pp_simulate's units) when the pipeline ranks share cores:
 * load[r] is what pipeline rank r asks of its node's cores while it computes (the ranks of
 * its stage there times their threads, over the node's cores). Wherever the ranks busy at
 * once ask more than 1 (all of the cores), every one of them slows by that much, and so does
 * the whole timeline, its order unchanged (all slow alike); a waiting rank asks nothing
 * (comm/mpi.c's waits yield their core). -1 when the lists fail tr_pp_simulate. */
double tr_pp_span_shared(const tr_pp_schedule *s, const double *load);

/* zb-v: the gradient buffers chunk c keeps between stages, in pools of their own instead of
 * one per activation slot. *recv for the gradient of its output: 1 when it comes from
 * another rank (the executor posts the receive of a micro-batch's gradient after the input
 * part of the one before, when the buffer is free), or at the V's turn, where one rank holds
 * chunks c and c + 1, the most micro-batches between the input part of c + 1 and that of c
 * (nothing is sent there: chunk c + 1 writes into chunk c's buffer). *send for the gradient of
 * its input: 1 (the send of the one before is complete first), or at the turn chunk c - 1's
 * *recv. Every buffer is taken round robin, micro-batch mb in buffer mb % count. Other
 * schedules: 0 and 0 (a buffer of each per slot, the receive posted after the forward). The
 * simulation (tr_pp_simulate) makes each input part that would overwrite a buffer whose send
 * is not yet received wait for that receive's post, so a schedule that passes it cannot
 * deadlock on these buffers. */
void tr_pp_grad_bufs(const tr_pp_schedule *s, int chunk, int *recv, int *send);

/* The most micro-batches of global chunk c in flight at once on its rank (forward ran, backward
 * (zb-h1: weight part) not yet): how many sets of activations the executor keeps for it. */
int tr_pp_chunk_slots(const tr_pp_schedule *s, int chunk);

#endif
