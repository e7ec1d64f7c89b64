/* Private header of `trainer run`: the context one run holds from setup to its end-of-run
 * report, shared by trainer/run/setup.c (flags, connecting, the setup steps that every rank
 * agrees on, the output files) and trainer/run/train.c (the step loop and the report). */
#ifndef TR_RUN_H
#define TR_RUN_H

#include <stdio.h>

#include "data/loader.h"
#include "data/task.h"
#include "data/tokenizer.h"
#include "parallel/comm/comm.h"
#include "parallel/dp.h"
#include "parallel/layout.h"
#include "parallel/pipeline.h"
#include "parallel/plan.h"
#include "trainer/checkpoint/checkpoint.h"
#include "trainer/report/ledger.h"
#include "trainer/trainer.h"

/* What this rank did: computing, waiting (communication, and other ranks to catch up), waiting
 * for data; summed over the steps (the table at the end). */
typedef struct {
    double compute_s, wait_s, data_s;
    long steps;
} rank_ledger;

/* Per rank and step, gathered with the ledger's record (extra figures): the pipeline's idle
 * share of the step, the bytes the rank holds as the layout predicts them (its arena and
 * ZeRO's gradient pieces), and the signal that asked this rank to stop (0: none; the ranks
 * agree on a stop through this gather: trainer/run/stop.c). */
enum { FIG_PIPE_IDLE, FIG_MEMORY, FIG_STOP };

typedef struct run_dump run_dump; /* trainer/run/dump.c */

/* The NaN and spike guard's state (trainer/run/guard.c): the losses and gradient norms of the
 * last accepted steps (a ring of train.guard.window), the bad steps in a row, all kept in
 * checkpoints (tr_ckpt_guard); and this attempt's counters, which are not. */
typedef struct {
    double *loss, *norm;
    double *scratch;             /* window doubles: the medians' sorting (not training state) */
    int n, next;                 /* values in the ring; where the next goes */
    int bad;                     /* bad steps in a row */
    int first_bad;               /* the first of them (from 1) */
    int rolled_to;               /* the checkpoint step the last rollback went to; -1: none yet */
    long skipped;                /* steps skipped in this attempt */
    double last_loss, last_norm; /* of the last bad step */
    int rollbacks, redone;       /* rollbacks in this attempt; steps they made train again */
} run_guard;

/* A step's verdict: its update applied, or skipped (metrics.jsonl's "skipped"). */
enum { GUARD_OK = 0, GUARD_NAN, GUARD_SPIKE };

#define RUN_FAULT_STEPS 16 /* steps a TR_FAULT_NAN_STEP or TR_FAULT_SPIKE_STEP list may name */

typedef struct {
    tr_options o;
    tr_comm *world;           /* every process */
    tr_comm *dpc, *ppc, *tpc; /* this process's groups of the dp x pp x tp mesh */
    tr_comm *tiec;            /* pipeline: the first and last stages (a tied embedding) */
    tr_comm *mpc;             /* the ranks holding one copy of the model (tp x pp) */
    tr_pipe *pipe;            /* pipeline parallelism (pp > 1), else NULL */
    tr_trace *trace;          /* --trace: the steps' timeline, else NULL */
    int **mb_in, **mb_tg;     /* pipeline: a step's micro-batches, (B, T) each */
    int rank, nranks;         /* in the world */
    int private_orgs;         /* private gradients: the organisations their sums are masked
                                 between */
    char *orgs;               /* and every rank's, TR_HOST_LEN each (run_private_setup) */
    tr_recipe r;              /* with the layout written back once it is resolved */
    int have_recipe;
    tr_layout lay;
    tr_memory predicted; /* tr_layout_memory of this rank */
    tr_cluster cluster;  /* the job's topology (parallel/topology.h), the same on every rank */
    tr_plan plan;        /* the planner's choice, when it chose (planned) */
    int planned;
    char *plan_json;     /* ... and the search as `trainer plan --json` prints it, for
                            OUT/plan.json (malloc'ed) */
    double plan_step_s, plan_mem; /* the cost model's step time and fullest process's bytes
                                     for the layout that runs */
    double plan_hidden;           /* ... and the share of its data-parallel communication hidden */
    double steps_s;      /* measured: seconds of the steps after each start's first */
    int steps_n;
    char plan_line[2][2048];      /* the plan and its prediction, for the banner: room for a
                                     layout, the cluster's source, replanned and the memory's say */
    char memory_dir[TR_PATH_MAX]; /* TR_PLAN_MEMORY's folder (trainer/plan_memory.c), "": off */
    char memory[TR_PATH_MAX];     /* the plan memory's file for this run, "" when not used */
    char replanned[160];     /* --resume on another number of processes: why it was planned anew */
    double mem_most;         /* the fullest rank's bytes after the last step */
    const tr_backend *be;
    char device[512]; /* the backend, in words */
    char *hosts, *devices; /* every rank's host and device, TR_HOST_LEN and TR_DEVICE_LEN each */
    double peak;      /* GFLOP/s of one process; 0: unknown (no MFU) */
    tr_model *model;
    tr_loader *loader;
    int B, T;
    int *inputs, *targets; /* (B, T) */
    /* eval { } (trainer/run/tasks.c): the tasks, their tokenizer, the last scores */
    tr_task *tasks;
    int n_tasks;
    tr_tokenizer *task_tok;
    tr_task_result task_res[TR_EVAL_MAX_TASKS];
    tr_dp *dp;
    tr_ckpt_writer *ckw;
    FILE *metrics; /* rank 0 */
    int lock_fd;   /* rank 0: OUT/.lock, held for the run's life (-1: none) */
    char out_made[TR_PATH_MAX]; /* rank 0: the first folder of OUT's path this run made ("") */
    char metrics_path[TR_PATH_MAX + 32];
    int start_step;
    int out_failed;          /* an output file could not be written: the run exits with 1 */
    long kill_step, slow_ms; /* tests' fault injection (TR_FAULT_*), for this rank */
    long slow_from;          /* the first step (from 1) that slow_ms slows */
    int kill_alone;          /* TR_FAULT_KILL_RANK: only this rank dies, abruptly */
    int ledger_off;          /* TR_LEDGER=off: no ledger files */
    int dp_sync_refresh;     /* TR_DP_SYNC_REFRESH=1 */
    int dp_sync_reduce;      /* TR_DP_SYNC_REDUCE=1 */
    int ckpt_sync;           /* TR_CKPT_SYNC=1: synchronous checkpoint saves */
    long fault_save_bytes;   /* TR_FAULT_SAVE_BYTES, 0: none */
    int fault_save_hang;     /* TR_FAULT_SAVE_HANG=1 */
    const char *dump_params; /* TR_DUMP_PARAMS: the final parameters' file, NULL: none */
    /* TR_FAULT_NAN_STEP, TR_FAULT_SPIKE_STEP: steps (from 1) whose gradients become non-finite
       or 1000 times larger, each the first time it is trained; 0 once it has been */
    long fault_nan[RUN_FAULT_STEPS], fault_spike[RUN_FAULT_STEPS], fault_loss[RUN_FAULT_STEPS];
    run_guard guard;
    double flops_tok; /* training FLOPs per token */
    long tokens_step; /* B x T x accumulation x dp */
    double t_start, t_train, best_val;
    rank_ledger led;
    tr_ledger *ledger;
    double *all_steps;    /* every rank's figures of the last step (TR_LEDGER_EXTRA each) */
    double *all_compute;  /* every rank's seconds computing in the last step */
    run_dump *dump;       /* TR_DUMP_TENSORS, TR_FAULT_PERTURB: the first step's taps */
    int tty;       /* the progress line is rewritten in place (run_progress_tty) */
    int stop_sig;  /* the signal that asked the run to stop, agreed by every rank; 0: none */
    double win_t;  /* x->t_train when the progress line's window started */
    int win_step;  /* the step that started it */
    char err[1024];
    char msg[TR_PATH_MAX + 1100]; /* a setup step's failure, for the agreement */
} run_ctx;

/* Parse the flags, connect the processes and set everything up, every step agreed by all
 * ranks (the lowest failing rank says why): 0 when training can start, else -1 and the exit
 * status in *status. run_free releases whatever was made, in either case. */
int run_setup(run_ctx *x, int *argc, char ***argv, int *status);
void run_free(run_ctx *x);
/* A setup step that can fail on some ranks only: all say whether theirs failed, the lowest
 * failing rank prints its msg once, and every rank gets 1 when any failed (setup.c). */
int run_setup_failed(tr_comm *world, int bad, const char *msg);
/* parallel { private_gradients } (trainer/run/private.c). Before the plan, run_private_orgs:
 * every rank's organisation (--orgs, else its host) into x->orgs, and run_private_cluster
 * gives them to the detected cluster's hosts for the planner. Once the groups exist,
 * run_private_setup: the tensor- and pipeline-parallel groups checked to stay inside one,
 * and the dp group's keys. 0, or -1 after the line that says why. */
int run_private_orgs(run_ctx *x);
void run_private_cluster(const run_ctx *x, tr_cluster *c);
int run_private_setup(run_ctx *x);

/* The topology, and the planner's choice of what the recipe and flags leave open, into x->o
 * and x->r (trainer/run/plan.c): 0, or -1 with the line in x->msg. After the layout is
 * resolved, run_price predicts its step time and memory (x->plan_step_s, x->plan_mem): 0, or
 * -1 with the line in x->msg when that memory passes --memory-mib (the same on every rank). */
int run_plan(run_ctx *x);
int run_price(run_ctx *x);

/* OUT/provenance.json (trainer/report/provenance_write.c): every rank gives its host name, rank 0
 * writes the file from the resolved run and the command line argv. 0, or -1 after one line. */
int run_provenance(run_ctx *x, int argc, char **argv);

/* trainer/run/dump.c (tools and tests; every rank takes part in each): TR_DUMP_PARAMS, the final
 * parameters as global fp32 tensors into path (0, 1 when not written, -1 out of memory);
 * before the first step's forwards run_dump_arm sets the model's tap when TR_DUMP_TENSORS=DIR
 * or TR_FAULT_PERTURB=NAME asks (-1 after a line: an unknown NAME, out of memory), and after
 * its gradients are summed run_dump_step writes its activations and gradients as global
 * tensors into DIR (0; 1 when not written; -1 out of memory) and removes the tap. */
int run_dump_params(run_ctx *x, const char *path);
int run_dump_arm(run_ctx *x);
int run_dump_step(run_ctx *x);
void run_dump_free(run_ctx *x);

/* The newest checkpoint of a step below `below` (--resume: LONG_MAX) into the model, the AdamW
 * state, the loader and the guard (run_guard_restore), collectively (trainer/run/resume.c): 0
 * and its step in *start; -1 with err when none can be used, -2 when another rank's reason
 * stops this one (said there). */
int run_load_checkpoint(run_ctx *x, long below, int *start, char *err, size_t errlen);
/* This rank's part of the checkpoint of `step` (from 1), the loader's position and the guard's
 * state with it, the stall in the ledger (trainer/run/train.c; the loop's saves and a stop's). */
void run_checkpoint(run_ctx *x, int step);
/* Rank 0: drop metrics.jsonl's records of steps after `step` (they are trained again;
 * trainer/run/resume.c). */
int run_trim_metrics(run_ctx *x, long step);

/* trainer/run/folder.c, rank 0 only. OUT, made with the folders above it that are missing (the
 * first of them in x->out_made); 0, or -1 with x->msg. */
int run_folder_make(run_ctx *x);
/* A set-up that failed: what it made removed again when this run made OUT (its files, its
 * empty checkpoints/, the lock, then the folders up to x->out_made as long as they are empty),
 * so a refused run leaves no folder that a next run would take for a run's. */
void run_folder_unmake(run_ctx *x);
/* The run folder's lock (held until the process ends):
 * 0, or -1 with x->msg naming the run that holds it. */
int run_folder_lock(run_ctx *x);
/* 0, or -1 with x->msg when OUT holds an earlier run and neither --resume nor --overwrite was
 * given (nothing is touched). */
int run_folder_check(run_ctx *x);
/* --overwrite: the earlier run's files (the trainer's own names only) removed; 0, or -1 after
 * one line. */
int run_folder_clear(run_ctx *x);

/* The environment switches (trainer/run/env.c), read once after the ranks connect: the tests'
 * TR_FAULT_*, TR_LEDGER, TR_DP_SYNC_REFRESH, TR_DP_SYNC_REDUCE, TR_CKPT_SYNC and TR_DUMP_PARAMS
 * (whose folder rank 0 checks now) into x's fields; 0, or -1 with the line in x->msg. */
int run_env_settings(run_ctx *x);

/* The guard (trainer/run/guard.c). run_guard_init allocates the window (-1 when out of memory).
 * run_guard_fault: what step
 * `step`'s (from 0) loss scale is multiplied by (1; INFINITY or 1000 at an injected fault);
 * run_guard_targets: at an injected loss spike, a micro-batch's n targets are moved half the
 * vocabulary away (tokens the model does not predict: a real jump of the loss; `last`: the
 * step's last micro-batch, after which the fault is spent). run_guard_judge: the verdict on a step
 * whose loss and gradient norm are reduced over every rank (the same on each), said in one
 * line (rank 0) when it is skipped; -1 when the run must stop (said). run_guard_rollback,
 * collectively, once train.guard.max_bad steps in a row were bad: back to the newest checkpoint
 * before them, the loader left past their batches; 0 and the checkpoint's step in *to, or -1
 * when there is none (the divergence line said). */
int run_guard_init(run_ctx *x);
void run_guard_free(run_ctx *x);
float run_guard_fault(run_ctx *x, int step);
void run_guard_targets(run_ctx *x, int step, int *targets, long n, int last);
int run_guard_judge(run_ctx *x, int step, double loss, double norm);
int run_guard_rollback(run_ctx *x, int step, int *to);
/* The guard's state is training state, in every checkpoint: run_guard_state points s at what
 * the verdicts depend on (the ring, the streak, the last rollback's target) for tr_ckpt_save,
 * NULL when the guard is off; run_guard_restore, on every rank, brings back checkpoint c's
 * (every rank reads the same manifest, so all keep judging alike). A checkpoint without it
 * (an older trainer's, the guard off) or with another window starts the warm-up again with
 * an empty ring, said in one line by rank 0. The attempt's counters (skipped, rollbacks,
 * redone) are not training state and stay. */
const tr_ckpt_guard *run_guard_state(const run_ctx *x, tr_ckpt_guard *s);
void run_guard_restore(run_ctx *x, const tr_ckpt *c);

/* The checkpoint writer, collectively (trainer/run/setup.c): at setup when the recipe saves
 * checkpoints, else at a requested stop, which first checks that OUT is shared
 * (`check_shared`). 0, or -1 after one line. */
int run_open_checkpoints(run_ctx *x, int check_shared);

/* Stopping on request (trainer/run/stop.c). run_stop_listen(1) before the first step makes
 * SIGINT, SIGTERM and SIGUSR1 ask for a stop at the next step boundary (the handler only
 * notes the signal and writes the ledger's "stopped" line); a second signal, or any once
 * listen is 0 again, ends the process at once. run_stop_signal: the signal noted on this
 * rank (0: none), which each step's gather agrees on (FIG_STOP). run_stop_save, collectively
 * after step `step` (1-based) when x->stop_sig is set: saves a checkpoint there unless the
 * step loop just did, waits for it to be published, says so in one line (rank 0, stderr) and
 * in attempts.jsonl; returns the exit status, 128 + the signal (1 when the save failed). */
void run_stop_listen(int on);
int run_stop_signal(void);
int run_stop_save(run_ctx *x, int step, int saved);

/* Whether the progress line is rewritten in place (1) or printed as one line per log step
 * (0): --progress tty|lines, else TR_PROGRESS=tty|lines, else a terminal of the user's own
 * (stdout a terminal and no launcher's variables: under mpirun and srun a rank's stdout can
 * be a pseudo-terminal of the launcher whose output goes to a file). -1 with one line in msg
 * for a bad TR_PROGRESS (trainer/run/train.c). */
int run_progress_tty(const char *flag, char *msg, size_t len);

/* trainer/run/tasks.c: eval { }'s tasks scored through the run's layout. run_tasks_open
 * (setup; -1 with the line in x->msg) reads them; run_tasks_due says whether step (from 0)
 * scores them; run_tasks_score (every rank; -1 said) into x->task_res; run_tasks_write adds
 * `, "tasks": {NAME: {n, acc, acc_norm}}` to a metrics line. */
int run_tasks_open(run_ctx *x);
void run_tasks_free(run_ctx *x);
int run_tasks_due(const run_ctx *x, int step, int last);
int run_tasks_score(run_ctx *x);
void run_tasks_write(const run_ctx *x, FILE *m);

/* trainer/run/outputs.c. One line for an output file that could not be written (opened,
 * written or closed): -1. */
int run_cannot_write(const char *path, int e);
/* text written to path whole or not at all (a temporary beside it, renamed over it): 0, or
 * -1 after the line. */
int run_write_whole(const char *path, const char *text);
/* Close an output file: -1 (and the line) when anything written to it did not reach it. */
int run_close_output(FILE *f, const char *path);

#endif
