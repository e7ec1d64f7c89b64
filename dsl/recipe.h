/* The recipe: what a Lua recipe file declares, as plain C structs.
 * dsl/recipe.c runs the recipe once in a sandboxed Lua state, validates every field against a
 * schema and copies the result here; nothing calls Lua after tr_recipe_load returns. */
#ifndef TR_RECIPE_H
#define TR_RECIPE_H

#include <stddef.h>
#include <stdio.h>

#define TR_NAME_MAX 64
#define TR_PATH_MAX 1024
#define TR_MAX_KNOBS 64
#define TR_MAX_SETS 64
/* Bounds of the model's and the run's sizes, checked by the recipe's schema: well past any
 * model trained today, and small enough that every count and byte count of the model (a
 * matrix of vocab x dim elements, activations of seq_len x hidden, ...) fits in 64 bits. */
#define TR_MAX_VOCAB 16777216       /* 2^24 */
#define TR_MAX_DIM 65536            /* model.dim */
#define TR_MAX_SEQ_LEN 1048576      /* model.seq_len, 2^20 */
#define TR_MAX_HIDDEN 1048576       /* mlp.hidden */
#define TR_MAX_HEADS 4096           /* attention.heads and kv_heads */
#define TR_MAX_BATCH_TOKENS (1L << 40)
#define TR_MAX_SAMPLE_TOKENS 1000000 /* train.sample_tokens and --sample-tokens */

/* The model is a tree of nodes. Containers: SEQUENCE (the model itself), STACK (children
 * repeated `repeat` times), RESIDUAL (x + children(x)). Everything else is a leaf layer. */
typedef enum {
    TR_NODE_SEQUENCE = 0,
    TR_NODE_STACK,
    TR_NODE_RESIDUAL,
    TR_NODE_EMBEDDING, /* token embedding, (vocab, dim) */
    TR_NODE_POSITIONS, /* learned absolute positions, (seq_len, dim), added to x */
    TR_NODE_ROPE,      /* rotary positions: every attention after it rotates q and k */
    TR_NODE_LAYERNORM,
    TR_NODE_RMSNORM,
    TR_NODE_ATTENTION, /* causal self-attention */
    TR_NODE_MLP,
    TR_NODE_LM_HEAD, /* projection to the vocabulary + cross entropy */
    TR_NODE_KIND_COUNT
} tr_node_kind;

typedef enum { TR_ACT_GELU = 0, TR_ACT_SWIGLU } tr_activation;

typedef struct tr_node {
    tr_node_kind kind;
    int line; /* recipe line of the constructor call, for messages */
    /* containers */
    int repeat; /* STACK: how many times the children repeat */
    int n_children;
    struct tr_node *children;
    /* leaves (only the fields of the node's kind are meaningful) */
    int heads;    /* ATTENTION */
    int kv_heads; /* ATTENTION: grouped-query heads; == heads for plain multi-head */
    int hidden;   /* MLP: hidden width (per branch for SwiGLU) */
    tr_activation activation; /* MLP */
    int bias;                 /* ATTENTION, MLP, LAYERNORM: learn a bias */
    float eps;                /* LAYERNORM, RMSNORM */
    float rope_theta;         /* ROPE: base; ATTENTION: copied from the ROPE before it, 0 = none */
    int tied;                 /* LM_HEAD: reuse the embedding matrix */
} tr_node;

typedef struct {
    int vocab;   /* vocabulary size */
    int dim;     /* width of the residual stream */
    int seq_len; /* context length (the longest sequence the model sees) */
    tr_node root; /* kind SEQUENCE */
} tr_model_desc;

typedef enum { TR_TOKENIZER_BYTE = 0, TR_TOKENIZER_GPT2 } tr_tokenizer_kind;

#define TR_MAX_MIX 8

/* One source of a blend: token shards and their share of the training batches. */
typedef struct {
    char shards[TR_PATH_MAX]; /* glob, resolved against the recipe's folder */
    float weight;             /* > 0; weights are normalized over the mix */
} tr_data_source;

/* Exactly one of text, shards and mix (n_mix > 0) is set; paths are resolved against the
 * recipe's folder. */
typedef struct {
    char text[TR_PATH_MAX]; /* corpus path; "" when the data are shards */
    tr_tokenizer_kind tokenizer;
    float val_fraction; /* held-out tail of the corpus (text only) */
    char shards[TR_PATH_MAX];     /* glob of training shards; "" = none */
    char val_shards[TR_PATH_MAX]; /* glob of validation shards; "" = none (shards, mix) */
    int n_mix;
    tr_data_source mix[TR_MAX_MIX];
    char encoder[TR_PATH_MAX]; /* gpt2: encoder.json (default: the project's data/gpt2/) */
    char merges[TR_PATH_MAX];  /* gpt2: vocab.bpe */
} tr_data_desc;

typedef struct {
    float lr;
    float beta1, beta2, eps;
    float weight_decay; /* applied to matrices (parameters of 2 or more dimensions) only */
    float grad_clip;    /* clip by global norm; 0 = off */
} tr_optim_desc;

typedef enum {
    TR_DECAY_COSINE = 0,
    TR_DECAY_LINEAR,
    TR_DECAY_CONSTANT,
    TR_DECAY_WSD /* warmup-stable-decay: constant, then linear to min_lr over the last decay_frac */
} tr_decay_kind;

typedef struct {
    int warmup;        /* steps of linear warmup from 0 */
    tr_decay_kind decay;
    float min_lr;      /* the floor the decay ends at */
    float decay_frac;  /* WSD: fraction of steps spent decaying */
} tr_schedule_desc;

/* Storage precision on GPUs (the CPU backend always computes in fp32). */
typedef enum { TR_PRECISION_BF16 = 0, TR_PRECISION_FP32 } tr_precision;

/* train { guard = { ... } }: the NaN and spike guard (trainer/run/guard.c). A step whose loss or
 * gradient norm is not finite, or (after step `warmup`, once the window is half full) whose
 * loss lies more than z_loss robust deviations (1.4826 x the median absolute deviation, at
 * least 1% of the median) above the median of the last `window` accepted steps' losses, or
 * whose gradient norm is more than norm_ratio times their median, is skipped: no update. The
 * norm is judged by a ratio since healthy norms are heavy-tailed and clipping tames a rise.
 * max_bad bad steps in a row roll back to the newest checkpoint saved before them.
 * guard = false: a non-finite step stops the run, spikes are not judged. */
typedef struct {
    int on;
    int window;           /* accepted steps the medians are taken over (2..10000) */
    float z_loss;         /* > 0 */
    float norm_ratio;     /* > 1 */
    int warmup;           /* the first steps, whose spikes are not judged (NaNs are) */
    int max_bad;          /* bad steps in a row that roll back (>= 1) */
    int z_norm_unused;    /* the recipe gave z_norm, which norm_ratio replaced (said at start) */
} tr_guard_desc;

#define TR_MAX_STAGES 256 /* pipeline chunks: pp x virtual_stages (= TR_MAX_CHUNKS, model.h) */
#define TR_MAX_DP_SHARES 64 /* data-parallel replicas a dp_shares list may name */

typedef struct {
    long batch_tokens;  /* tokens per optimizer step (global) */
    int micro_batch;    /* sequences per forward/backward; 0 = auto */
    int steps;
    int eval_every;     /* 0 = never */
    long eval_tokens;   /* tokens of validation data per evaluation */
    unsigned long long seed;
    char out[TR_PATH_MAX];
    int sample_tokens;  /* bytes of text sampled at the end; 0 = none */
    int log_every;      /* progress line period in steps */
    int checkpoint_every; /* save a checkpoint every N steps (and at the end); 0 = never */
    int keep_checkpoints; /* newest checkpoints kept; older ones are deleted once a newer one is complete */
    tr_precision precision; /* "bf16" (default) | "fp32" */
    int recompute;          /* activation recomputation: 0 "none", 1 "selective", 2 "full",
                               -1 "auto" (the planner's choice; without one "none"); with a
                               list, the most of its levels */
    int n_stage_recompute;  /* recompute = { ... }: one level per pipeline rank (0: one for all) */
    signed char stage_recompute[TR_MAX_STAGES];
    double peak_tflops;     /* the peak MFU divides by; 0 = the device table / measured sgemm */
    tr_guard_desc guard;
} tr_train_desc;

/* parallel { ... }: what the recipe asks of the layout; parallel/layout.h resolves it with the
 * command line's flags and the number of processes, and checks it. */

typedef struct {
    int is_auto; /* "auto" (the default), or every field below left to "auto" */
    int dp, tp, pp, zero; /* -1 = auto (dp: the processes / (tp * pp); tp, pp 1; ZeRO 0) */
    int sequence_parallel; /* -1 = auto (off), 0, 1 (needs tp > 1) */
    int bucket_kb;        /* gradient communication bucket, KiB; 0 = auto (4096) */
    /* pipeline parallelism (pp > 1) */
    int schedule;       /* -1 = auto (1f1b); else tr_pp_kind (parallel/schedule.h): 0 "gpipe",
                           1 "1f1b", 2 "interleaved", 3 "zb-h1", 4 "zb-v" */
    int microbatches;   /* micro-batches per optimizer step on each dp rank; 0 = auto */
    int virtual_stages; /* chunks per pipeline rank; 0 = auto (1) */
    int n_stages;       /* entries of stages = { ... }; 0 = auto (balanced by FLOPs) */
    int stages[TR_MAX_STAGES]; /* the block each of the pp x virtual_stages chunks starts at,
                                  in model order (as written: checked by the layout) */
    int n_dp_shares;           /* entries of dp_shares = { ... }; 0 = auto (even) */
    int dp_shares[TR_MAX_DP_SHARES]; /* micro-batches of each dp replica per step (faster
                                  replicas more: checked by the layout) */
    int private_gradients; /* -1 = auto (off), 0, 1: data-parallel sums masked between
                              hosts (parallel/masked.h) */
} tr_parallel_desc;

typedef enum { TR_KNOB_NUMBER = 0, TR_KNOB_STRING, TR_KNOB_BOOL } tr_knob_type;

typedef struct {
    char name[TR_NAME_MAX];
    tr_knob_type type;
    double number;
    char string[TR_NAME_MAX * 2];
    int boolean;
    int overridden; /* set from the command line */
} tr_knob;

/* sweep { grid = { NAME = { V1, V2, ... }, ... }, seeds = N }: the experiment `trainer sweep`
 * runs from this recipe (dsl/recipe_sections.c); every other command ignores it. The axes are in
 * the order of their names (a Lua table keeps none); each value as its text (a number in the
 * fewest digits that read back to the same double, true/false, a string as written). */
#define TR_SWEEP_MAX_AXES 8
#define TR_SWEEP_MAX_VALUES 64
#define TR_SWEEP_VALUE_MAX 64
typedef struct {
    int line; /* where sweep { } is; 0: the recipe has none */
    int n_axes;
    char names[TR_SWEEP_MAX_AXES][TR_NAME_MAX];
    int n_values[TR_SWEEP_MAX_AXES];
    char values[TR_SWEEP_MAX_AXES][TR_SWEEP_MAX_VALUES][TR_SWEEP_VALUE_MAX];
    int seeds; /* 0: not given (one run per combination) */
} tr_sweep_desc;

/* eval { tasks = { "FILE.jsonl", ... }, every = N, max_examples = N }: multiple-choice tasks
 * (data/task.h) scored during training every N steps (default: train.eval_every) and at the
 * last step, into metrics.jsonl; the files resolved against the recipe's folder. */
#define TR_EVAL_MAX_TASKS 8
typedef struct {
    int line; /* where eval { } is; 0: the recipe has none */
    int n_tasks;
    char tasks[TR_EVAL_MAX_TASKS][TR_PATH_MAX];
    int every;         /* 0: train.eval_every */
    long max_examples; /* 0: every example of each file */
} tr_eval_desc;

typedef struct {
    char path[TR_PATH_MAX]; /* the recipe file as given */
    tr_model_desc model;
    tr_data_desc data;
    tr_optim_desc optim;
    tr_schedule_desc schedule;
    tr_train_desc train;
    tr_parallel_desc parallel;
    char init_hf[TR_PATH_MAX]; /* `init = hf "DIR"`: start from a Hugging Face model directory; "" = none */
    tr_sweep_desc sweep;
    tr_eval_desc eval;
    int train_line, parallel_line; /* where train { } and parallel { } are (0: not declared),
                                      for the messages of later checks (the layout's) */
    int n_knobs;
    tr_knob knobs[TR_MAX_KNOBS];
} tr_recipe;

/* A command-line override: `--set name=value`. */
typedef struct {
    char name[TR_NAME_MAX];
    char value[TR_NAME_MAX * 2];
} tr_knob_set;

/* Run the recipe file at `path` with the overrides `sets` (may be NULL when n_sets is 0).
 * Returns 0 and fills *out, or -1 and writes one line to err, in the form
 * `path:line: message` when a line is known. */
int tr_recipe_load(tr_recipe *out, const char *path, const tr_knob_set *sets, int n_sets,
                   char *err, size_t errlen);

/* Same, from text in memory; `chunkname` names it in messages and `basedir` resolves paths. */
int tr_recipe_load_string(tr_recipe *out, const char *text, const char *chunkname,
                          const char *basedir, const tr_knob_set *sets, int n_sets, char *err,
                          size_t errlen);

/* Parse "name=value" into a tr_knob_set; -1 with a message when there is no '='. */
int tr_knob_set_parse(tr_knob_set *out, const char *arg, char *err, size_t errlen);

/* path made absolute (realpath; a glob or a missing file: joined to the working folder when
 * relative), as the written recipe names its data; cut to fit len. */
void tr_recipe_abs_path(const char *path, char *out, size_t len);

/* Write the fully resolved recipe as a Lua recipe that loads back to the same structs. */
int tr_recipe_write_lua(const tr_recipe *r, FILE *f);
/* The same into a malloc'ed, NUL-terminated string of *len bytes (len may be NULL); NULL when
 * memory runs out. */
char *tr_recipe_text(const tr_recipe *r, size_t *len);

/* Free the node tree. tr_recipe_free(NULL) is a no-op. */
void tr_recipe_free(tr_recipe *r);

const char *tr_node_kind_name(tr_node_kind k);
/* A recompute level's name as a recipe writes it: 0 "none", 1 "selective", 2 "full",
 * anything else "auto". */
const char *tr_recompute_name(int level);

#endif
