/* A timeline of a few training steps (`trainer run --trace N`): every process records spans
 * of what it did (a pipeline action's compute, a wait for a neighbour, the step's end, the
 * optimizer) on its own clock, relative to the moment it left a barrier that every process
 * of the world entered at the start of the window; at the window's end the spans are gathered
 * to rank 0, which writes them in Chrome's trace event format (a JSON array of "X" events,
 * one thread per rank), which Perfetto (ui.perfetto.dev) and chrome://tracing open.
 * bench/pp_bubble.py reads the file to say where a pipeline's bubble goes. Ranks' clocks are
 * aligned only as well as they leave one barrier together (microseconds on one host, about a
 * round trip between hosts). */
#ifndef TR_TRACE_H
#define TR_TRACE_H

#include <stddef.h>

#include "parallel/comm/comm.h"

typedef enum {
    TR_SPAN_FWD = 0,  /* a pipeline chunk's forward of a micro-batch */
    TR_SPAN_BWD,      /* its whole backward */
    TR_SPAN_BWD_IN,   /* zero-bubble: the input gradient */
    TR_SPAN_BWD_W,    /* zero-bubble: the weight gradient */
    TR_SPAN_WAIT_IN,  /* waiting for a neighbour's activation or gradient to arrive */
    TR_SPAN_WAIT_OUT, /* waiting for a send to finish before its buffer is written again */
    TR_SPAN_GATHER,   /* tensor-parallel all-gather of a sliced arrival */
    TR_SPAN_STEP_END, /* the pipeline's step-end reduction (every stage leaves it together) */
    TR_SPAN_MODEL,    /* a whole forward and backward (no pipeline) */
    TR_SPAN_GRADS,    /* the data-parallel gradient reductions still pending at step end */
    TR_SPAN_UPDATE,   /* the optimizer step */
    TR_SPAN_STEP,     /* the whole step */
    TR_SPAN_KINDS
} tr_span_kind;

typedef struct tr_trace tr_trace;

/* A trace of `steps` steps from step `first` (0-based) written by rank 0 of `world` to path;
 * NULL with err when out of memory. Every rank of world calls it. */
tr_trace *tr_trace_new(tr_comm *world, int first, int steps, const char *path, char *err,
                       size_t errlen);
/* At the start of each step (every rank, the same steps): begins the window at its first step
 * (a barrier), ends it after its last (tr_trace_end's work, collective). Returns 1 while the
 * step is recorded. */
int tr_trace_step(tr_trace *t, int step);
/* A span [t0, t1] of tr_now() seconds; mb and chunk -1 where they mean nothing. NULL t or a
 * step outside the window: nothing. */
void tr_trace_span(tr_trace *t, tr_span_kind kind, double t0, double t1, int mb, int chunk);
/* Gathers the window's spans to rank 0, which writes the file (atomically); collective. 0, or
 * -1 with err on rank 0 (the file could not be written). Done once: a later call does nothing. */
int tr_trace_end(tr_trace *t, char *err, size_t errlen);
void tr_trace_free(tr_trace *t);

/* "F", "B", "Bi", "W", "wait in", ... */
const char *tr_span_name(tr_span_kind k);

#endif
