/* The run's ledger (trainer/report/ledger.c): where every second of every rank went, which rank the
 * others waited for, and the attempts of a run across restarts. Rank 0 writes two files in the
 * output folder (every line a JSON object; README "The ledger" has the formats):
 *
 *   ledger.jsonl    per window of steps (at most ~500 windows a run, so the file stays small),
 *                   for every rank: seconds computing, in exposed communication, waiting for the
 *                   last rank to arrive, waiting for data, in checkpoint stalls, in the pipeline's
 *                   bubble, evaluating, logging; FLOPs and tokens; who waited for whom. Also each
 *                   checkpoint save, each straggler alarm and, at the end, each rank's totals,
 *                   setup and end included, which sum to its wall time. On a GPU with NVML,
 *                   each window also has every rank's mean power, SM clock and temperature.
 *   attempts.jsonl  each attempt of the run (a fresh start, then one per --resume): when it
 *                   started and where, how it ended: "end", or "stopped" lines that the ranks
 *                   the launcher stopped write from their signal handler, or a "failed" line from
 *                   the rank that found a peer dead or stuck (naming it). A run asked to stop
 *                   (SIGINT, SIGTERM, SIGUSR1: trainer/run/stop.c) writes its ranks' "stopped"
 * lines
 *                   when the signal comes, then a "stop" line (the step, the checkpoint saved)
 *                   before its "end".
 *
 * The clock is partitioned: every interval of a rank's life from the process start is charged
 * to exactly one part, by marks at the seams (tr_ledger_mark). Within a step the waits are
 * measured (communication, data, checkpoint fence, the pipeline's idle time) and computing is
 * the rest. Waiting is split from exposed communication across ranks: the ranks leave every
 * step together (its last collective), so a rank that was busy b_i seconds of a step where the
 * busiest was busy b_max waited up to b_max - b_i of its communication time for that rank; the
 * rest of its communication time was exposed communication. */
#ifndef TR_LEDGER_H
#define TR_LEDGER_H

#include <stdio.h>

#include "parallel/comm/comm.h"

typedef enum {
    LED_SETUP,   /* process start to the first step: connecting, loading, building */
    LED_COMPUTE, /* the step's time less every wait below */
    LED_COMM,    /* exposed communication (before the split: all communication waits) */
    LED_WAIT,    /* waiting for the last rank to arrive (set by the split) */
    LED_DATA,    /* waiting for the loader */
    LED_CKPT,    /* checkpoint stalls: the save's host copy, the fence before the update */
    LED_BUBBLE,  /* the pipeline schedule's idle time */
    LED_MASK,    /* private gradients: buckets into fixed point, masked and unmasked (the
                    scale's sum is communication) */
    LED_EVAL,    /* evaluations */
    LED_LOG,     /* metrics, the progress line, the ledger itself, everything between steps */
    LED_END,     /* after the last step: the last save's wait, the report, the sample */
    LED_PARTS
} tr_ledger_part;

const char *tr_ledger_part_name(tr_ledger_part p); /* "compute_s", ... */

typedef struct tr_ledger tr_ledger;

/* What an attempt is, for attempts.jsonl's start line. */
typedef struct {
    const char *out;    /* the output folder */
    int resume;         /* --resume: append to the files (else they start over) */
    int start_step;     /* steps already done */
    int steps;          /* the recipe's steps */
    const char *hosts;   /* every rank's host name, TR_HOST_LEN bytes each */
    const char *devices; /* every rank's device in words, TR_DEVICE_LEN bytes each */
    const char *layout; /* {"dp": 2, ...}: a JSON object */
    const char *command;
    double flops_step;  /* training FLOPs of one step, the whole job's */
    long tokens_step;   /* tokens of one step, the whole job's */
    int files;          /* write ledger.jsonl and attempts.jsonl, watch for stragglers */
    int tty;            /* stdout is rewritten as a progress line: a message starts a new one */
    /* the device's power (W), SM clock (MHz) and temperature (C), sampled after each step
       (NAN where unknown; -1 when none); NULL: a device without them (the CPU) */
    int (*telemetry)(double out[3]);
} tr_ledger_opts;

/* The process's start: call first thing (setup is charged from here). */
void tr_ledger_clock_start(void);

/* Every rank, once setup is done (collective: rank 0 says the attempt's number). Charges the setup, writes the start line, and installs the
 * handlers that write a "stopped" line when a signal ends the process. NULL when out of
 * memory; a file that cannot be written is said once and the ledger goes on without it. */
tr_ledger *tr_ledger_open(tr_comm *world, const tr_ledger_opts *o);

/* Charge the time since the last mark to `part`. */
void tr_ledger_mark(tr_ledger *L, tr_ledger_part part);

/* A step's waits, measured by the caller over its interval [t0, now]: communication (all of
 * it, bubble included: the host's waits, plus on a GPU what CUDA events timed the compute
 * stream waiting for NCCL), data, checkpoint fence, the pipeline's idle seconds, and the
 * seconds private gradients spent masking (not a wait, but not the model's compute). The
 * interval before t0 is charged to LED_LOG. */
typedef struct {
    double t0, comm_s, data_s, fence_s, idle_s, mask_s;
} tr_ledger_step_waits;
void tr_ledger_step(tr_ledger *L, const tr_ledger_step_waits *w);

/* Figures per rank gathered with each step's record for the caller (memory and the like). */
#define TR_LEDGER_EXTRA 3

/* After every rank's tr_ledger_step of step `step` (0-based), collectively: gather each rank's
 * record (its parts since the last gather, and `extra`), split waiting from communication, add
 * to the window (rank 0 writes it when full) and watch for stragglers. all_extra receives every
 * rank's extra figures (TR_LEDGER_EXTRA per rank); compute_s every rank's computing seconds of
 * the step (may be NULL). */
void tr_ledger_gather(tr_ledger *L, int step, const double *extra, double *all_extra,
                      double *compute_s);

/* A checkpoint save after step `step` (1-based), which stalled the caller stall_s (rank 0
 * writes its line; the time is charged by the caller's mark). */
void tr_ledger_save(tr_ledger *L, int step, double stall_s);

/* A requested stop after step `step` (1-based) by `signal` ("SIGTERM"), which saved
 * `checkpoint` ("step_00000037"; NULL: nothing saved): rank 0 writes a "stop" line to
 * attempts.jsonl, before the attempt's end line. */
void tr_ledger_stop(tr_ledger *L, int step, const char *signal, const char *checkpoint);

/* The "stopped" line of this rank for signal `sig`, async-signal-safe (a handler's): the
 * ledger's own handlers write it before the signal ends the process, trainer/run/stop.c when the
 * signal asks the run to stop at the next step (the line stays if a SIGKILL follows). */
void tr_ledger_signal_line(int sig);

/* The guard's rollback (trainer/run/guard.c) after step `step` (1-based) to the checkpoint of
 * step `to`: rank 0 writes the window so far (none spans a rollback) and a "rollback" line;
 * steps to+1 .. step are trained again, and the totals count every step trained. */
void tr_ledger_rollback(tr_ledger *L, int step, int to);

/* The end of the attempt: with `together` (every rank calls it), the totals line (each rank's
 * parts, which sum to its wall time); the end line with the exit status. Frees the ledger. */
void tr_ledger_close(tr_ledger *L, int status, int together);

/* Rank 0: the seconds of `part` that rank has been charged over the steps so far (0 on other
 * ranks, and for the setup and the end, which the totals line adds). */
double tr_ledger_total(const tr_ledger *L, int rank, tr_ledger_part part);

/* The attempt's number (1: a fresh run); unix seconds now. */
int tr_ledger_attempt(const tr_ledger *L);
double tr_ledger_unix_now(void);

/* Call as soon as a step is done (the stopped lines say it). */
void tr_ledger_step_done(tr_ledger *L, int step);

#endif
