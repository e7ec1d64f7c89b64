/* Private header of the trainer binary: the subcommands and the small helpers they share. */
#ifndef TR_TRAINER_H
#define TR_TRAINER_H

#include <stddef.h>
#include <stdio.h>

#include "data/tokenizer.h"
#include "dsl/cluster.h"
#include "dsl/recipe.h"
#include "model/model.h"
#include "parallel/comm/base.h"
#include "parallel/layout.h"
#include "parallel/plan.h"
#include "trainer/checkpoint/checkpoint.h"

/* Options shared by the subcommands that read a recipe. */
typedef struct {
    const char *recipe;
    tr_knob_set sets[TR_MAX_SETS];
    int n_sets;
    int steps;             /* --steps, 0 = the recipe's */
    const char *out;       /* --out, NULL = the recipe's */
    double peak_gflops;    /* --peak-gflops, 0 = measure */
    double memory_mib;     /* --memory-mib: each process's memory to plan for and keep within
                              (at most what its device has), 0 = the device's */
    int eval_every;        /* --eval-every, -1 = the recipe's */
    const char *device;    /* --device auto|cpu|cuda, NULL = auto */
    double timeout;        /* --timeout: seconds any collective may take (0 = 300) */
    /* what the command line fixes of the layout, in the resolver's own record: --dp --tp --pp
       --zero --schedule --microbatches --virtual-stages --[no-]sequence-parallel
       --micro-batch, and TR_PAD_VOCAB (parallel/layout.h: -1 or 0 = the recipe's) */
    tr_layout_flags layout;
    const char *precision; /* --precision bf16|fp32, NULL = the device's default */
    int sample_tokens;     /* --sample-tokens, -1 = the recipe's */
    int resume;    /* --resume: continue from the newest good checkpoint in the output folder */
    int overwrite; /* --overwrite: replace the run the output folder holds */
    const char *progress; /* --progress tty|lines, NULL = decide (run_progress_tty) */
    int trace; /* --trace N: OUT/trace.json, the timeline of N steps after the first; 0: none */
    const char *orgs; /* --orgs FILE: each host's organisation for private gradients (lines
                         "HOST ORG"); NULL: every host its own */
} tr_options;
/* TR_PAD_VOCAB (tests: a GPU's vocabulary padding on the CPU; layout.pad_vocab, 0 = the
 * backend's) is read with the flags, 1 to TR_PAD_VOCAB_MAX */
#define TR_PAD_VOCAB_MAX 4096

/* Parse argv[first..argc) into opts. Returns 0, 1 when --help was asked, -1 on a bad flag
 * (message printed). `cmd` names the subcommand in messages. */
int tr_parse_options(tr_options *opts, const char *cmd, int argc, char **argv, int first);
/* The same, with the message in msg instead of printed. */
int tr_parse_options_msg(tr_options *opts, const char *cmd, int argc, char **argv, int first,
                         char *msg, size_t msglen);

int tr_cmd_run(int argc, char **argv);
int tr_cmd_show(int argc, char **argv);
int tr_cmd_plan(int argc, char **argv);
/* A plan search's result as `trainer plan --json` prints it (trainer/plan.c): the chosen plan
 * under the recipe's names with its predictions, the cluster, the tie, the model's measured
 * rate and the alternatives; `trainer run` keeps the same in OUT/plan.json. */
void tr_plan_write_json(const tr_plan_result *res, const tr_cluster *c, FILE *f);
/* The plan memory (trainer/plan_memory.c): the layout a recipe last got on a detected cluster,
 * kept while it stays tied with the fastest plan on the new start-up's probes.
 * tr_plan_memory_dir: its folder, read and checked once at start: TR_PLAN_MEMORY's ("off":
 * none, dir ""), else $XDG_CACHE_HOME/trainer/plans or $HOME/.cache/trainer/plans; -1 with the
 * line in msg when TR_PLAN_MEMORY is neither "off" nor a folder. tr_plan_memory_wanted: whether
 * a plan with opts po goes through the memory: a job's (job: its processes plan for themselves,
 * not a --cluster's or --gpus'), not resumed (resume: a resumed run keeps its own layout), for
 * its time with no deadline, no layout field fixed by a flag. tr_plan_memory_path: the file
 * in dir for recipe r on cluster c with --memory-mib mem_mib (0: none); 1 with path set, 0
 * (path "") when dir is "" or c is not a detected job's. tr_plan_memory_read: every rank of w
 * (NULL: one process) at once, whatever it plans, so that ranks whose flags or environment
 * differ meet in it: rank 0's path decides (*on: not ""), rank 0 reads it, and every rank gets
 * its text (NULL: none yet, or not readable; free it). tr_plan_memory_keep, after
 * tr_plan_search with opts po gave res, on that text: when the layout there, priced on c
 * (pinned, as the search prices a layout the flags fix), ties with the fastest plan
 * (tr_plan_tied), it becomes res->best and the search's choice the first runner-up;
 * res->memory says what happened (path names the file in it). 1 when kept, else 0.
 * tr_plan_memory_save: p's layout into path, atomically (the folders made); 0, or -1 with
 * err. tr_plan_pin: the flags and recipe fields that make l the resolved layout (f's
 * pad_vocab kept), as a planned run applies a plan. */
int tr_plan_memory_dir(char *dir, size_t n, char *msg, size_t msglen);
int tr_plan_memory_wanted(const tr_plan_opts *po, int job, int resume);
int tr_plan_memory_path(const char *dir, const tr_recipe *r, const tr_cluster *c, double mem_mib,
                        char *path, size_t n);
char *tr_plan_memory_read(tr_comm *w, const char *path, int *on);
int tr_plan_memory_keep(const char *text, int on, const char *path, const tr_recipe *r,
                        const tr_cluster *c, const tr_plan_opts *po, tr_plan_result *res);
int tr_plan_memory_save(const char *path, const tr_plan *p, char *err, size_t errlen);
void tr_plan_pin(const tr_layout *l, tr_layout_flags *f, tr_recipe *r);
int tr_cmd_tokenize(int argc, char **argv);
int tr_cmd_sample(int argc, char **argv);
int tr_cmd_eval(int argc, char **argv);
int tr_cmd_check(int argc, char **argv);
int tr_cmd_supervise(int argc, char **argv);
int tr_cmd_sweep(int argc, char **argv);

/* Load the recipe named by opts and apply the command-line overrides; prints the error. */
int tr_load_recipe(tr_recipe *r, const tr_options *opts, const char *cmd);
/* The same, with the message in err instead of printed. */
int tr_load_recipe_msg(tr_recipe *r, const tr_options *opts, const char *cmd, char *err,
                       size_t errlen);

/* The layout of a run of `world` processes (parallel/layout.h) from the recipe and the flags
 * in opts (--dp, --tp, --pp, --zero, --sequence-parallel, --micro-batch, --schedule,
 * --microbatches, --virtual-stages; TR_PAD_VOCAB, else the
 * backend's vocabulary padding), for backend `be` (its dtype sizes an "auto" micro-batch):
 * -1 with one line in err, which starts with the recipe's path when the mistake is located
 * there and with "trainer CMD: " otherwise. */
int tr_resolve_layout(tr_layout *l, const tr_recipe *r, const tr_options *o, int world,
                      const tr_backend *be, const char *cmd, char *err, size_t errlen);
/* The flags' layout record with the vocabulary padding filled in: TR_PAD_VOCAB's, else
 * backend_pad (the backend's own: be->pad_vocab, or TR_CUDA_PAD_VOCAB for a GPU cluster that
 * is planned, not run). What tr_resolve_layout, run's planner and `trainer plan` all use. */
tr_layout_flags tr_options_layout(const tr_options *o, int backend_pad);

/* The backend for --device (auto: CUDA when a GPU is there, else the CPU) and --precision
 * (else the recipe's train.precision; r may be NULL).
 * Fills the peak rate MFU is measured against (FLOP/s; 0 = measure the CPU's sgemm) and a
 * one-line description of the choice. Returns NULL with a message when the choice is
 * impossible (--device cuda without a GPU). */
const tr_backend *tr_choose_backend(const tr_options *o, const tr_recipe *r, double *peak,
                                    char *desc, size_t desclen, char *err, size_t errlen);

/* Sample n_new tokens after the prompt into out, with the KV cache (trainer/sample.c).
 * Temperature 0 is greedy; top_k 0 keeps the whole vocabulary. */
int tr_sample_tokens(tr_model *m, const int *prompt, int n_prompt, int n_new, float temperature,
                     int top_k, unsigned long long seed, int *out, char *err, size_t errlen);
/* The same, each token through `decode` (tr_model_decode when NULL; a pipeline's runs every
 * stage): with one, every process of the model takes part and draws the same tokens. */
typedef void (*tr_decode_fn)(void *ctx, tr_kv_cache *c, int token, int pos, float *logits);
int tr_sample_tokens_via(tr_model *m, tr_decode_fn decode, void *ctx, const int *prompt,
                         int n_prompt, int n_new, float temperature, int top_k,
                         unsigned long long seed, int *out, char *err, size_t errlen);

/* A flag's number: s must be all of one, in [lo, hi]; else -1 after "trainer CMD: FLAG needs
 * a number in [lo, hi], got 's'" on stderr. */
int tr_number_arg(const char *cmd, const char *flag, const char *s, double lo, double hi,
                  double *out);

/* A checkpoint loaded for inference on one process (trainer sample, trainer eval): ARG is a
 * step folder or a run folder (the checkpoint its `latest` names, tr_ckpt_open_arg), its
 * recipe, the backend for `device` (auto|cpu|cuda, NULL = auto), the run's tokenizer and the
 * model (micro-batches of 1 x seq_len) with the checkpoint's weights. -1 with one line in err
 * (then tr_loaded_free what was made). tr_loaded_free on a zeroed or failed one is fine. */
typedef struct {
    tr_ckpt ckpt;
    tr_recipe recipe;
    int have_recipe;
    const tr_backend *be;
    tr_tokenizer *tok;
    tr_model *model;
} tr_loaded;
int tr_load_checkpoint(tr_loaded *L, const char *arg, const char *device, char *err,
                       size_t errlen);
void tr_loaded_free(tr_loaded *L);

/* The cluster this job runs on (parallel/topology.h) for backend `be` of peak FLOP/s `peak`
 * (a GPU's; the CPU's sgemm is measured on every rank at once), each process given at most
 * `mem` bytes (--memory-mib; 0: its device's): every rank of `world` calls it and gets the
 * same. On the CPU with recipe r (NULL: none), also how fast r's own model
 * runs at each micro-batch (tr_cluster.model_eff). 0, or -1 with one line in err. */
int tr_detect_cluster(tr_comm *world, const tr_backend *be, double peak, double mem,
                      const tr_recipe *r,
                      tr_cluster *out, char *err, size_t errlen);

/* This host's name as the run's records give it: TR_HOSTNAME when set (for launchers whose
 * host names are not meaningful, and tests that make one machine look like several), else
 * gethostname(); "?" when neither works. TR_HOSTNAME is read and checked once, by
 * tr_hostname_init (-1 with the line in msg when it is empty or not a host name). */
int tr_hostname_init(char *msg, size_t msglen);
void tr_hostname(char *buf, size_t n);
/* Room for a host name and a device's description in the records every rank's are gathered
 * into (run/setup.c gathers them once: provenance.json, the ledger). */
#define TR_HOST_LEN 64
#define TR_DEVICE_LEN 96
/* A JSON-lines file made to end at a line boundary before anything is appended to it: a last
 * record cut short by a kill (no '\n' after it) is truncated away, said in one line on log
 * (may be NULL). 0, also when the file does not exist; -1 with err when it cannot be. */
int tr_jsonl_repair(const char *path, FILE *log, char *err, size_t errlen);
double tr_measure_peak_gflops(void);
void tr_fmt_count(double x, char *buf, size_t n);
void tr_fmt_bytes(double x, char *buf, size_t n);
/* Human units for pages and tables (trainer report), one place: no exponent, a few digits.
 * tr_fmt_si: 3 significant digits and an SI prefix (p n µ m k M G T P E) before the unit:
 * "96.7 GFLOP/s", "512 tok/s", "16.4M" (no unit: no space). tr_fmt_seconds: "12.3 s",
 * "450 ms" under a minute, else tr_fmt_hms's h:mm:ss ("1:02:03"). tr_fmt_percent: a share
 * as "27.8%". tr_fmt_bytes: "19.1 MiB" (KiB, MiB, GiB, TiB...). tr_fmt_real: the shortest
 * text that reads back as v, or, for a value that a float printed with %.9g gave
 * (0.100000001), the shortest that reads back as that float ("0.1"). Not finite: "-" (but
 * tr_fmt_real: "nan", "inf"). */
void tr_fmt_si(double x, const char *unit, char *buf, size_t n);
void tr_fmt_seconds(double s, char *buf, size_t n);
void tr_fmt_hms(double s, char *buf, size_t n);
void tr_fmt_percent(double share, char *buf, size_t n);
void tr_fmt_real(double v, char *buf, size_t n);
/* A plain number with 4 significant digits ("5.38", "0.002778"; whole numbers whole), an SI
 * prefix past a million or below a millionth ("16.4M"). */
void tr_fmt_num(double x, char *buf, size_t n);
/* The building block the above share (and axis ticks, which share one prefix and precision):
 * x / base^power (base 1000, or 1024 when binary) with `decimals` decimals, then the power's
 * prefix (binary: Ki, Mi...) and the unit. tr_fmt_power: the power that puts |x| in [1, base). */
void tr_fmt_scaled(double x, int power, int binary, int decimals, const char *unit, char *buf,
                   size_t n);
int tr_fmt_power(double x, int binary);
/* The command line as a shell would take it back: arguments joined by spaces, each quoted
 * when it holds anything but [A-Za-z0-9_./:=,+-@%]. Malloc'd; NULL when out of memory. */
char *tr_shell_join(int argc, char **argv);
/* A signal's name ("SIGTERM"), or "a signal" for one not listed; async-signal-safe (a
 * switch over constant strings), so the ledger's signal handler may call it. */
const char *tr_signal_name(int sig);

#endif
