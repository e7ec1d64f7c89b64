/* Private header of `trainer supervise` (trainer/ops/supervise.c: the command line, launching and
 * the loop; trainer/ops/supervise_records.c: the run's records and the host file). */
#ifndef TR_SUPERVISE_H
#define TR_SUPERVISE_H

#include <stddef.h>

#include "trainer/ops/spawn.h"
#include "trainer/ops/witness.h"
#include "trainer/report/ledger.h"
#include "trainer/trainer.h"

#define SV_HOST_LEN 64

typedef struct {
    char name[SV_HOST_LEN];
    int slots, fails, dropped;
} sv_host;

/* What one failed attempt came to, from its wait status and the run's records. */
typedef struct {
    int attempt;            /* its number in attempts.jsonl (the next one when it wrote none) */
    int started;            /* it wrote its start line (got through setup) */
    int start_step;         /* the steps done when it started */
    int last_step;          /* the last step it finished */
    int rank;               /* the rank that failed, -1 when not known */
    int others_stopped;     /* it was found as the one host none of whose ranks wrote a
                               "stopped" line, every other host having one that did */
    int witnesses[8];       /* ranks that blamed it and told the supervisor (witness.h) */
    int n_witnesses;
    char host[SV_HOST_LEN]; /* the failed rank's host, "" when not known */
    int status;             /* the command's wait status */
    double t_last;          /* unix seconds of its last progress (a step, else its start) */
    char why[256];          /* a rank's reason ("failed" line), or the run's own exit */
    char stop[16];          /* the run stopped on request ("stop" line): its signal, else "" */
    char stop_ckpt[32];     /* the checkpoint that stop saved, "" when none */
} sv_attempt;

typedef struct {
    int restarts;         /* --restarts */
    double backoff;       /* --backoff, seconds */
    double grace;         /* --grace, seconds: the launcher's to end a job a rank aborted */
    const char *hostfile; /* --hostfile, NULL */
    char **cmd;           /* the command, edited between launches; NULL-terminated */
    int n, run_at;        /* its length; the index of its "run" */
    char out[TR_PATH_MAX];
    int steps; /* the recipe's */
    sv_host *hosts;
    int nhosts;
    int np_at, dp_at; /* the command's -np value and --dp value (indices), -1 */
    int np_pre;       /* the bytes before -np's value in its argument ("--np=": 5), 0 */
    int launches, relaunches;
    int redone;    /* steps trained again, in all */
    double down_s; /* seconds down, in all */
    double t0;     /* the supervisor's start (tr_now) */
    tr_witness *witness; /* the ranks' reports that they gave up (witness.h), NULL */
    int *heard;          /* (attempt, rank) pairs of those reports */
    int nheard, heard_cap;
} sv_run;


/* --hostfile: the hosts and their slots, and the command's arguments the supervisor edits when
 * it drops one (-1 with one line when the file or the command will not do). */
int sv_read_hostfile(sv_run *s);
int sv_host_find(const sv_run *s, const char *name);
/* Drop host h: OUT/supervise.hostfile, the command's host file arguments, -np and --dp; -1 and
 * why when the run cannot go on without it. */
int sv_drop_host(sv_run *s, int h, char *why, size_t wlen);

/* When a rank of the run launched at unix time `since` or later first announced that it gives
 * up on the job (a "failed" line in OUT/attempts.jsonl: a peer dead, stuck or cut off): its
 * unix time, 0 when none has. */
double sv_abort_announced(const sv_run *s, double since);
/* The "start" lines in OUT/attempts.jsonl. */
int sv_count_starts(const sv_run *s);
/* Rank `rank` of attempt `attempt` told the supervisor over the network that it gave up. */
void sv_heard(void *s, int attempt, int rank);
/* The attempt the last launch (at unix time t_launch) made, failing with wait status `status`. */
void sv_read_attempt(sv_run *s, int status, double t_launch, sv_attempt *a);
/* The step of the newest complete checkpoint in OUT (0: none): where --resume goes on. */
int sv_checkpoint_step(const sv_run *s);
/* The "supervisor" line of attempt a in attempts.jsonl (and the totals of lost work). */
void sv_write_event(sv_run *s, const sv_attempt *a, int resume_step, double wait,
                    const char *action);
/* The end: goodput printed (and with done, the "done" line written). */
void sv_goodput(sv_run *s, int done);
void sv_finish(sv_run *s);

#endif
