/* `trainer report RUN_DIR`: a run folder's records (metrics.jsonl, ledger.jsonl,
 * attempts.jsonl, ranks.json, memory.json, provenance.json) read into one struct of computed
 * figures, which feeds both outputs: `--json` (report.c) and the HTML page (report/html.c), so
 * the page shows exactly the numbers the JSON holds. Records that are missing leave their
 * figures empty (the page says so in one line); JSONL lines that do not parse or lack their
 * fields are skipped and their line numbers kept. */
#ifndef TR_REPORT_H
#define TR_REPORT_H

#include <stdint.h>
#include <stdio.h>

#include "trainer/report/provenance.h"

#include "dsl/cluster.h"

/* The ledger's parts of a rank's time, in this order (ledger.jsonl's "parts", without "_s"). */
#define TR_REPORT_PARTS 11
#define TR_REPORT_MASK 7 /* "mask": private gradients' masking */
extern const char *const tr_report_part_names[TR_REPORT_PARTS];

/* The bounds every number read from a file is checked against before it sizes or indexes
 * anything: a line whose field is outside them is left out with one line naming FILE:LINE
 * and the field. Steps are 64-bit, up to 2^53 (every integer a JSON number holds exactly). */
#define TR_REPORT_MAX_RANKS 4096
#define TR_REPORT_MAX_STEP 9007199254740992LL

/* The files a report reads; each has its own list of skipped lines. */
enum { TR_RF_METRICS, TR_RF_LEDGER, TR_RF_ATTEMPTS, TR_RF_FILES };
extern const char *const tr_report_file_names[TR_RF_FILES];

typedef struct {
    int n, cap;
    int *line; /* 1-based line numbers */
} tr_report_lines;

/* One step of metrics.jsonl (the last line of a step wins). NAN where the line had no value. */
typedef struct {
    int64_t step;
    int attempt, seq;
    double time_unix; /* metrics.jsonl's "time", NAN when absent */
    double time_s;    /* since the run's start (t0), or the sum of step_s when no "time" */
    double loss, val_loss, tokens_per_s, mfu, gflops, step_s, pred_step_s, mem, pred_mem;
    double *rank_compute; /* rank_compute_s (n_rank_compute entries), or NULL */
    int n_rank_compute;
} tr_report_step;

typedef struct {
    int rank;
    char host[64], device[96], provider[64];
    double price_hour;                     /* per hour: the cluster file's price, else 1 unit */
    double parts[TR_REPORT_PARTS];         /* seconds, totals over the run */
    double wall_s;                         /* the sum of the parts */
    double flops, waited_on_s, downtime_s; /* delivered; others waited on it; caused */
    int has_mem;
    double mem[5], pred[5]; /* params, grads, optimizer, activations, scratch (ranks.json) */
    double cost_downtime, cost_waiting, cost_flops, cost; /* the split (see tr_report_cost) */
} tr_report_rank;

/* A host or provider: the sums of its ranks. */
typedef struct {
    char name[96];
    int ranks;
    double flops, compute_s, wait_s, waited_on_s, downtime_s, cost;
} tr_report_group;

/* What `trainer supervise` recorded after an attempt ended (its "supervisor" line in
 * attempts.jsonl, trainer/supervise_records.c): the downtime it measured and the cause. */
typedef struct {
    int has;
    double down_s;
    int64_t steps_redone; /* -1: not recorded */
    int rank;             /* -1: not known */
    char host[64], exit[96], action[96];
} tr_report_sv;

typedef struct {
    int attempt, ranks;
    int64_t start_step, steps;
    int ended, status;      /* an "end" line, and its status */
    int64_t last_step;      /* the last completed step */
    int failed_rank;        /* -1: unknown or none */
    double t_start, t_last; /* unix seconds: its start and the last time any record saw it */
    char failed_host[64], why[160], command[512];
    int n_stopped;
    int *stopped; /* the ranks that wrote a "stopped" line */
    tr_report_sv sv;
} tr_report_attempt;

typedef struct {
    int after; /* between attempts after and after + 1 */
    double downtime_s;
    int64_t steps_redone;
    int rank; /* charged to (-1: no failure known, not charged) */
    char host[64];
    char cause[264];  /* supervise's "exit status 137", the failed line's why, or "" */
    const char *from; /* "supervise" (attempts.jsonl's supervisor line) or "records" */
    double cost;
} tr_report_down;

typedef struct {
    int attempt;
    int64_t step;
    double t, stall_s;
} tr_report_save;

typedef struct {
    int attempt, rank;
    int64_t step;
    double t, slowdown, cost_s_per_step;
    char host[64];
} tr_report_straggler;

/* A column of the heat map: steps [a, b] and each rank's compute seconds there. */
typedef struct {
    int64_t a, b;
    double *v;
} tr_report_col;

/* A provenance field: its value as text (a number: the shortest that reads back exactly). */
typedef struct {
    char key[128], val[256];
    int is_num;
    double num;
} tr_report_kv;

/* A ledger.jsonl "window" or "total" line as read: per rank (n_ranks entries each) the parts,
 * then flops, tokens and waited_on_s. */
#define TR_REPORT_LV (TR_REPORT_PARTS + 3)
typedef struct {
    int attempt, total;
    int64_t a, b;
    double t0, t1;
    double *v; /* v[rank * TR_REPORT_LV + k] */
} tr_report_led;


typedef struct {
    char dir[1024];
    int missing[TR_RF_FILES]; /* the file is not there */
    int has_ranks_json, has_memory_json, has_provenance;
    tr_report_lines skipped[TR_RF_FILES];
    int n_ranks;

    int n_steps;
    tr_report_step *steps;
    double t0;     /* unix seconds of the run's start; 0 when unknown */
    int have_time; /* metrics.jsonl has "time" */

    int at_file, at_line; /* the JSONL line being read, for the messages of its bounds */

    /* the summary */
    int attempts;
    int64_t last_step;
    double wall_s, tokens, tokens_per_s, mfu, best_val_loss;
    double plan_step_s, plan_pred_step_s, plan_mem, plan_pred_mem; /* means; the fullest */
    const char
        *wall_from; /* "attempts.jsonl", "ledger.jsonl", "metrics.jsonl time", "sum of step_s" */

    tr_report_rank *ranks;
    const char *parts_from; /* "ledger.jsonl", "ranks.json", "metrics.jsonl step_s" */
    const char *flops_from; /* "ledger.jsonl", "metrics.jsonl gflops split by compute_s" */
    int n_hosts, n_providers;
    tr_report_group *hosts, *providers;

    int n_cols;
    tr_report_col *cols;
    const char *heat_from; /* "ledger.jsonl" or "metrics.jsonl rank_compute_s" */

    int n_attempts, n_down, n_saves, n_stragglers;
    tr_report_attempt *att;
    tr_report_down *down;
    tr_report_save *saves;
    tr_report_straggler *strag;

    int n_prov;
    tr_report_kv *prov;
    /* as read, for the figures */
    int cap_steps, cap_led, cap_saves, cap_strag, cap_att; /* the arrays' capacities */
    int n_led, led_ranks;
    tr_report_led *led;
    int n_start_hosts; /* the last attempt's "start" line: hosts and devices per rank */
    char (*start_hosts)[64];
    char (*start_devices)[96];
    int n_rjson; /* ranks.json's rows (r->ranks is filled from them) */
    tr_report_rank *rjson;
    int mem_single; /* memory.json's figures, for a run without ranks.json */
    double mem1[5], pred1[5];
    /* --compare */
    char other[1024];
    int compared, comparable, n_diffs;
    tr_prov_diff diffs[TR_PROV_MAX_DIFFS]; /* trainer/report/provenance.h's comparison */
    char verdict[512];                     /* tr_provenance_verdict's line */

    /* the cost rule's figures */
    int priced; /* --cluster gave prices */
    char cluster[512];
    double booked_h, cost_total, cost_downtime, cost_waiting, cost_flops;
} tr_report;

/* Read RUN_DIR (and the cluster file when not NULL) into r. -1 with one line in err naming
 * what and where when the folder or metrics.jsonl is missing or the cluster cannot be read. */
int tr_report_load(tr_report *r, const char *dir, const char *cluster, char *err, size_t errlen);
/* The provenance of OTHER beside r's: r->compared, comparable and diffs. -1 with err when
 * OTHER has no readable provenance.json. */
int tr_report_load_compare(tr_report *r, const char *other, char *err, size_t errlen);
void tr_report_free(tr_report *r);

/* The figures as JSON, and as the HTML page. */
void tr_report_write_json(const tr_report *r, FILE *f);
void tr_report_write_html(const tr_report *r, FILE *f);
/* The run's record files the report did not find, by name, in a fixed order: their count,
 * at most TR_REPORT_RECORDS (metrics.jsonl is never among them: the report needs it). */
#define TR_REPORT_RECORDS 5
int tr_report_missing(const tr_report *r, const char *names[TR_REPORT_RECORDS]);
/* "metrics.jsonl: skipped 2 damaged line(s): 7, 19" for file k, or "" when none. */
void tr_report_skipped_line(const tr_report *r, int k, char *buf, size_t len);

/* After reading: every figure above from the records (report/figures.c). -1 with err when out
 * of memory or the cluster has fewer devices than the run has ranks. */
int tr_report_figures(tr_report *r, const tr_cluster *c, char *err, size_t errlen);

int tr_cmd_report(int argc, char **argv);

#endif
