/* The pipeline executor: runs one rank's list of a schedule (parallel/schedule.h) over the
 * model's chunks, moving activations forward and their gradients backward between
 * neighbouring stages with non-blocking sends and receives, each receive posted as soon as
 * the buffer it fills is free, so that transfers overlap compute. Also evaluation and
 * incremental decoding through the stages, and the measured bubble: the time each rank
 * waited on its neighbours. The model's buffers on either backend: on a device over NCCL,
 * device to device through comm.h's channels (one into each chunk for activations, one for
 * gradients, opened at init; each chunk's micro-batches in order keep their messages matched),
 * ordered with events and no host wait; staged through host memory on the staged transport. */
#ifndef TR_PIPELINE_H
#define TR_PIPELINE_H

#include "model/model.h"
#include "parallel/comm/comm.h"
#include "parallel/schedule.h"
#include "parallel/trace.h"

typedef struct tr_pipe tr_pipe;

typedef struct { /* over the steps after the first (a warm-up) */
    long steps;
    double step_s; /* the schedule's span, first action to last, summed over steps */
    double idle_s; /* of which waiting for a neighbour's activation or gradient */
    double bytes;  /* sent to the neighbours */
} tr_pipe_stats;

/* For the model `m` (built with this rank's chunks and the schedule's slots), over the
 * pipeline group `pp` (rank p = this rank's stage), schedule kind/P/V/M: 0, or -1 with a
 * message (out of memory, or a model whose chunks do not match). Every rank of pp calls it at
 * the same point: the stages agree first, so that when one fails every one returns -1 at once
 * (the others with "another stage failed"), then on device memory it opens the pipeline's
 * channels (comm.h). */
int tr_pipe_init(tr_pipe **out, tr_model *m, tr_comm *pp, tr_pp_kind kind, int V, int M, char *err,
                 size_t errlen);
void tr_pipe_free(tr_pipe *p);

/* Called after each backward (or its weight part) of a micro-batch of a chunk, e.g. for
 * ZeRO-3 to free the parameters gathered for it. */
void tr_pipe_set_backward_hook(tr_pipe *p, void (*fn)(void *ctx), void *ctx);

/* Record each action's compute and each wait in t (trace.h; NULL: stop). */
void tr_pipe_set_trace(tr_pipe *p, tr_trace *t);

/* With on = 1, the model's gradient hook is called only in each chunk's last backward of a
 * step (for a split backward: its last input part and its last weight part), when its
 * gradients are final: data parallelism with ZeRO 0 or 1 (armed before the step) then reduces
 * each bucket as soon as it is complete, during the schedule's last backwards. */
void tr_pipe_final_hooks(tr_pipe *p, int on);

/* One optimizer step's forwards and backwards: M micro-batches of B x T tokens (tokens[k],
 * targets[k]), each loss scaled by grad_scale into the accumulated gradients. Returns the
 * sum of the M micro-batches' mean losses, on every rank of the pipeline. */
double tr_pipe_step(tr_pipe *p, const int *const *tokens, const int *const *targets, int B, int T,
                    float grad_scale);

/* The mean loss of one batch through every stage (no gradients), on every rank. */
double tr_pipe_eval(tr_pipe *p, const int *tokens, const int *targets, int B, int T);

/* Incremental decoding through the stages: token at position pos; the logits (V) of the next
 * token on every rank. */
void tr_pipe_decode(tr_pipe *p, tr_kv_cache *c, int token, int pos, float *logits);

tr_pipe_stats tr_pipe_get_stats(const tr_pipe *p);
/* The last step's idle fraction on this rank (0 before the first), and its idle seconds. */
double tr_pipe_last_idle(const tr_pipe *p);
double tr_pipe_last_idle_seconds(const tr_pipe *p);
const tr_pp_schedule *tr_pipe_schedule(const tr_pipe *p);

#endif
