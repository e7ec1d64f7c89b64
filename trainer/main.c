/* trainer: the command line. Dispatches to the subcommands and parses the options they
 * share; every mistake gets one line naming the flag and a non-zero exit. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "parallel/env.h"
#include "parallel/schedule.h"
#include "trainer/checkpoint.h"
#include "trainer/report.h"
#include "trainer/trainer.h"

#define TR_VERSION "0.1.0"

static void usage(FILE *f) {
    fprintf(f,
            "trainer %s: train transformer language models declared in a Lua recipe\n"
            "\n"
            "usage: trainer COMMAND [options]\n"
            "\n"
            "commands:\n"
            "  run RECIPE     train the model the recipe declares\n"
            "  show RECIPE    print the model tree: parameters, FLOPs and memory per layer\n"
            "  plan RECIPE [--cluster FILE | --gpus N --gpu NAME]\n"
            "                 choose the parallel layout for a cluster, with predictions\n"
            "  export CKPT --format hf --out DIR\n"
            "                 write a checkpoint as a Hugging Face model folder\n"
            "  sample CKPT [--prompt TEXT] [--tokens N]\n"
            "                 generate text from a checkpoint (KV cache)\n"
            "  check RECIPE --a LAYOUT --b LAYOUT\n"
            "                 one step in two layouts, compared tensor by tensor\n"
            "  tokenize INPUT... --out DIR\n"
            "                 text, folders or JSONL to token shards (GPT-2 BPE or bytes)\n"
            "  report RUN_DIR [--out FILE] [--json] [--cluster FILE] [--compare RUN_DIR]\n"
            "                 one HTML page (or JSON) of a run: curves, ranks, timeline, cost\n"
            "  supervise [--restarts N] [--backoff S] [--hostfile FILE] -- COMMAND...\n"
            "                 run a training command, relaunching it with --resume when it\n"
            "                 fails (dropping failing hosts, stopping on a repeated crash)\n"
            "\n"
            "Run `trainer COMMAND --help` for a command's options.\n"
            "Example: trainer run recipes/shakespeare_char.lua --set steps=200\n",
            TR_VERSION);
}

static const char *run_help =
    "usage: trainer run RECIPE [--set NAME=VALUE]... [--steps N] [--out DIR]\n"
    "                          [--micro-batch B] [--eval-every N] [--sample-tokens N]\n"
    "                          [--device auto|cpu|cuda] [--precision bf16|fp32]\n"
    "                          [--peak-gflops X] [--resume | --overwrite] [--timeout SECONDS]\n"
    "                          [--progress tty|lines]\n"
    "                          [--dp D] [--tp T] [--sequence-parallel] [--zero S]\n"
    "                          [--pp P] [--schedule S] [--microbatches M] [--virtual-stages V]\n"
    "       mpirun -np N trainer run RECIPE ...   (N = dp x tp x pp processes)\n"
    "\n"
    "Train the model RECIPE declares. Under mpirun or srun the processes form a dp x tp x pp\n"
    "mesh: each group of tp processes splits the model's heads, hidden units and vocabulary,\n"
    "each of the pp pipeline ranks runs its chunks of the model's blocks on micro-batches in\n"
    "turn, and the dp groups train on their slices of each global batch (parallel { dp, tp,\n"
    "pp, zero, sequence_parallel, schedule, microbatches, virtual_stages, stages } in the\n"
    "recipe, the flags below override it; rank 0 writes the output). What neither fixes\n"
    "(parallel \"auto\", the default) the planner chooses for the detected processes, as\n"
    "`trainer plan` shows; the log names the plan and compares it with the run.\n"
    "\n"
    "  --set NAME=VALUE  override one of the recipe's knobs (repeatable); an unknown NAME\n"
    "                    lists the knobs the recipe declares\n"
    "  --steps N         optimizer steps (overrides the recipe's train.steps)\n"
    "  --out DIR         output folder (overrides train.out)\n"
    "  --micro-batch B   sequences per forward/backward (overrides train.micro_batch)\n"
    "  --eval-every N    evaluate every N steps, 0 = never (overrides train.eval_every)\n"
    "  --sample-tokens N tokens to sample at the end, 0 = none (overrides train.sample_tokens)\n"
    "  --device D        auto (default: CUDA when a GPU is present, else the CPU), cpu, cuda\n"
    "  --precision P     storage precision on CUDA: bf16 (default) or fp32; the CPU is fp32\n"
    "  --resume          continue from the checkpoint the output folder's `latest` names (the\n"
    "                    recipe must match it in model, data, optimizer and batch); with no\n"
    "                    checkpoint there yet but an earlier attempt's records, train from\n"
    "                    step 0 as another attempt\n"
    "  --overwrite       replace the run the output folder holds (its checkpoints and records;\n"
    "                    other files stay); without it or --resume such a folder is refused\n"
    "  --peak-gflops X   the machine's peak for MFU (default: the GPU's dense bf16 rate from\n"
    "                    a table of devices, or the CPU's measured sgemm rate)\n"
    "  --timeout S       seconds any collective may take before every rank exits naming the\n"
    "                    operation (default 300)\n"
    "  --progress P      tty: rewrite one progress line in place; lines: one line per log step\n"
    "                    (default: tty on a terminal of your own, lines in a file or under\n"
    "                    mpirun and srun; TR_PROGRESS=tty|lines sets it too)\n"
    "  --dp D            data-parallel groups, instead of parallel.dp (default: planned);\n"
    "                    D x tp x pp must be the number of processes\n"
    "  --tp T            tensor-parallel processes per group, instead of parallel.tp (default:\n"
    "                    planned); T must divide every attention's heads and MLP's hidden width\n"
    "  --sequence-parallel  with --tp: norms and residuals on 1/T of the tokens (T must\n"
    "                    divide seq_len), instead of parallel.sequence_parallel;\n"
    "                    --no-sequence-parallel keeps it off\n"
    "  --zero S          ZeRO stage 0-3 over the dp group, instead of parallel.zero\n"
    "  --pp P            pipeline ranks, instead of parallel.pp (default: planned); the blocks\n"
    "                    (the repeats of its stacks) are cut into P x V chunks, balanced by\n"
    "                    FLOPs unless parallel.stages says where each starts\n"
    "  --schedule S      the pipeline's schedule: gpipe, 1f1b, interleaved or zb-h1 (planned),\n"
    "                    instead of parallel.schedule\n"
    "  --microbatches M  micro-batches per step on each data-parallel rank (sets the micro-\n"
    "                    batch: the step's sequences / (dp x M)), instead of\n"
    "                    parallel.microbatches\n"
    "  --virtual-stages V  chunks per pipeline rank (interleaved: default 2; else 1), instead\n"
    "                    of parallel.virtual_stages\n"
    "\n"
    "Writes DIR/recipe.lua (the fully resolved recipe, its layout included), DIR/metrics.jsonl\n"
    "(one JSON object per step: step, loss, lr, grad_norm, tokens_per_s, gflops, mfu,\n"
    "step_s, predicted_step_s, memory_bytes, predicted_memory_bytes; val_loss on eval steps),\n"
    "DIR/memory.json (what a process allocated, and what the layout\n"
    "predicted) and DIR/sample.txt (text sampled from the trained model).\n"
    "\n"
    "SIGINT, SIGTERM or SIGUSR1 (to any rank) stop every rank after the same step, which is\n"
    "saved as a checkpoint (even with checkpoint_every 0); the run exits with 128 + the\n"
    "signal's number (130, 143, 138) and --resume continues it. A second signal stops at once.\n";

static const char *show_help =
    "usage: trainer show RECIPE [--set NAME=VALUE]... [--micro-batch B] [--dp D] [--tp T]\n"
    "                           [--sequence-parallel] [--zero S] [--pp P] [--schedule S]\n"
    "                           [--microbatches M] [--virtual-stages V]\n"
    "\n"
    "Print the model tree with the parameters, forward FLOPs per token and activation memory\n"
    "per token of every component, then the layout of a run of D x T x P processes (the\n"
    "flags, else the recipe's parallel { }, else 1 process) and the memory each process would\n"
    "allocate (the same figures `trainer run` predicts for that layout, and a line of exact\n"
    "bytes; show does not plan: what is left \"auto\" takes the plain defaults, and `trainer\n"
    "plan` shows what run would choose); with\n"
    "T > 1, how each kind of tensor is split over the tensor-parallel ranks; with P > 1, the\n"
    "pipeline: each rank's chunks of blocks, their FLOPs, the schedule's bubble, and the\n"
    "memory of each pipeline rank. Runs no training; a bad recipe or layout is reported\n"
    "exactly as `trainer run` would. The flags are those of `trainer run`.\n";

/* Where option mistakes go: stderr, or a buffer (tr_parse_options_msg). */
static FILE *perr_stream;
static FILE *perr(void) {
    return perr_stream ? perr_stream : stderr;
}

static int need_value(const char *cmd, const char *flag, int i, int argc) {
    if (i + 1 >= argc) {
        fprintf(perr(), "trainer %s: %s needs a value (see trainer %s --help)\n", cmd, flag, cmd);
        return -1;
    }
    return 0;
}

static int parse_int(const char *cmd, const char *flag, const char *s, int min, int *out) {
    char *end;
    long v = strtol(s, &end, 10);
    if (*s == '\0' || *end != '\0' || v < min || v > 1000000000L) {
        fprintf(perr(), "trainer %s: %s needs a %s integer, got '%s'\n", cmd, flag,
                min > 0 ? "positive" : "non-negative", s);
        return -1;
    }
    *out = (int)v;
    return 0;
}

int tr_parse_options(tr_options *o, const char *cmd, int argc, char **argv, int first) {
    memset(o, 0, sizeof(*o));
    o->eval_every = o->sample_tokens = o->dp = o->tp = o->zero = o->schedule = -1;
    char err[256];
    for (int i = first; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) return 1;
        if (!strcmp(a, "--set") || !strncmp(a, "--set=", 6)) {
            const char *v = a[5] == '=' ? a + 6 : NULL;
            if (!v) {
                if (need_value(cmd, a, i, argc)) return -1;
                v = argv[++i];
            }
            if (o->n_sets == TR_MAX_SETS) {
                fprintf(perr(), "trainer %s: more than %d --set options\n", cmd, TR_MAX_SETS);
                return -1;
            }
            if (tr_knob_set_parse(&o->sets[o->n_sets], v, err, sizeof(err))) {
                fprintf(perr(), "trainer %s: %s\n", cmd, err);
                return -1;
            }
            o->n_sets++;
        } else if (!strcmp(a, "--steps")) {
            if (need_value(cmd, a, i, argc) || parse_int(cmd, a, argv[++i], 1, &o->steps))
                return -1;
        } else if (!strcmp(a, "--micro-batch")) {
            if (need_value(cmd, a, i, argc) || parse_int(cmd, a, argv[++i], 1, &o->micro_batch))
                return -1;
        } else if (!strcmp(a, "--eval-every")) {
            if (need_value(cmd, a, i, argc) || parse_int(cmd, a, argv[++i], 0, &o->eval_every))
                return -1;
        } else if (!strcmp(a, "--sample-tokens")) {
            if (need_value(cmd, a, i, argc) || parse_int(cmd, a, argv[++i], 0, &o->sample_tokens))
                return -1;
            if (o->sample_tokens > TR_MAX_SAMPLE_TOKENS) { /* as train.sample_tokens */
                fprintf(perr(), "trainer %s: --sample-tokens must be at most %d, got '%s'\n", cmd,
                        TR_MAX_SAMPLE_TOKENS, argv[i]);
                return -1;
            }
        } else if (!strcmp(a, "--device") || !strcmp(a, "--precision")) {
            if (need_value(cmd, a, i, argc)) return -1;
            const char *v = argv[++i];
            int dev = a[2] == 'd';
            if (dev ? strcmp(v, "auto") && strcmp(v, "cpu") && strcmp(v, "cuda")
                    : strcmp(v, "bf16") && strcmp(v, "fp32")) {
                fprintf(perr(), "trainer %s: %s must be %s, got '%s'\n", cmd, a,
                        dev ? "auto, cpu or cuda" : "bf16 or fp32", v);
                return -1;
            }
            if (dev)
                o->device = v;
            else
                o->precision = v;
        } else if (!strcmp(a, "--resume")) {
            o->resume = 1;
        } else if (!strcmp(a, "--overwrite")) {
            o->overwrite = 1;
        } else if (!strcmp(a, "--progress")) {
            if (need_value(cmd, a, i, argc)) return -1;
            o->progress = argv[++i];
            if (strcmp(o->progress, "tty") && strcmp(o->progress, "lines")) {
                fprintf(perr(), "trainer %s: --progress must be tty or lines, got '%s'\n", cmd,
                        o->progress);
                return -1;
            }
        } else if (!strcmp(a, "--timeout")) {
            if (need_value(cmd, a, i, argc)) return -1;
            char *end;
            o->timeout = strtod(argv[++i], &end);
            if (*end != '\0' || !(o->timeout > 0)) {
                fprintf(perr(),
                        "trainer %s: --timeout needs a positive number of seconds, got "
                        "'%s'\n",
                        cmd, argv[i]);
                return -1;
            }
        } else if (!strcmp(a, "--dp") || !strcmp(a, "--tp")) {
            if (need_value(cmd, a, i, argc) ||
                parse_int(cmd, a, argv[++i], 1, a[2] == 'd' ? &o->dp : &o->tp))
                return -1;
        } else if (!strcmp(a, "--pp") || !strcmp(a, "--microbatches") ||
                   !strcmp(a, "--virtual-stages")) {
            int *dst = a[2] == 'p' ? &o->pp : a[2] == 'm' ? &o->microbatches : &o->virtual_stages;
            if (need_value(cmd, a, i, argc) || parse_int(cmd, a, argv[++i], 1, dst)) return -1;
        } else if (!strcmp(a, "--schedule")) {
            if (need_value(cmd, a, i, argc)) return -1;
            o->schedule = tr_pp_kind_parse(argv[++i]);
            if (o->schedule < 0) {
                fprintf(perr(),
                        "trainer %s: --schedule must be gpipe, 1f1b, interleaved or zb-h1, got "
                        "'%s'\n",
                        cmd, argv[i]);
                return -1;
            }
        } else if (!strcmp(a, "--sequence-parallel")) {
            o->sequence_parallel = 1;
        } else if (!strcmp(a, "--no-sequence-parallel")) {
            o->sequence_parallel = -1;
        } else if (!strcmp(a, "--zero")) { /* the stage is checked by the layout */
            if (need_value(cmd, a, i, argc) || parse_int(cmd, a, argv[++i], 0, &o->zero)) return -1;
        } else if (!strcmp(a, "--out")) {
            if (need_value(cmd, a, i, argc)) return -1;
            o->out = argv[++i];
        } else if (!strcmp(a, "--peak-gflops")) {
            if (need_value(cmd, a, i, argc)) return -1;
            char *end;
            o->peak_gflops = strtod(argv[++i], &end);
            if (*end != '\0' || !(o->peak_gflops >= 1e-3 && o->peak_gflops <= 1e9)) {
                fprintf(perr(),
                        "trainer %s: --peak-gflops needs a rate in GFLOP/s from 0.001 to "
                        "1e9, got '%s'\n",
                        cmd, argv[i]);
                return -1;
            }
        } else if (a[0] == '-' && a[1] != '\0') {
            fprintf(perr(), "trainer %s: unknown option '%s' (see trainer %s --help)\n", cmd, a,
                    cmd);
            return -1;
        } else if (!o->recipe) {
            o->recipe = a;
        } else {
            fprintf(perr(), "trainer %s: unexpected argument '%s' (one recipe only)\n", cmd, a);
            return -1;
        }
    }
    if (!o->recipe) {
        fprintf(perr(), "trainer %s: no recipe given (see trainer %s --help)\n", cmd, cmd);
        return -1;
    }
    long pad = 0; /* checked with the flags, so that every subcommand refuses it alike */
    if (tr_env_int("TR_PAD_VOCAB", 1, TR_PAD_VOCAB_MAX, &pad, err, sizeof err) < 0) {
        fprintf(perr(), "trainer %s: %s\n", cmd, err);
        return -1;
    }
    o->pad_vocab = (int)pad;
    if (o->resume && o->overwrite) {
        fprintf(perr(),
                "trainer %s: --resume continues the run in the output folder and "
                "--overwrite replaces it: give one of them\n",
                cmd);
        return -1;
    }
    return 0;
}

int tr_parse_options_msg(tr_options *o, const char *cmd, int argc, char **argv, int first,
                         char *msg, size_t msglen) {
    char *buf = NULL;
    size_t len = 0;
    perr_stream = open_memstream(&buf, &len);
    int rc = tr_parse_options(o, cmd, argc, argv, first);
    if (perr_stream) fclose(perr_stream);
    perr_stream = NULL;
    if (buf && len && buf[len - 1] == '\n') buf[len - 1] = 0;
    snprintf(msg, msglen, "%s", buf ? buf : "");
    free(buf);
    return rc;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "--help") || !strcmp(cmd, "-h") || !strcmp(cmd, "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(cmd, "--version")) {
        printf("trainer %s\n", TR_VERSION);
        return 0;
    }
    int is_run = !strcmp(cmd, "run"), is_show = !strcmp(cmd, "show");
    if (!strcmp(cmd, "tokenize")) return tr_cmd_tokenize(argc, argv);
    if (!strcmp(cmd, "export")) return tr_cmd_export(argc, argv);
    if (!strcmp(cmd, "sample")) return tr_cmd_sample(argc, argv);
    if (!strcmp(cmd, "plan")) return tr_cmd_plan(argc, argv);
    if (!strcmp(cmd, "report")) return tr_cmd_report(argc, argv);
    if (!strcmp(cmd, "check")) return tr_cmd_check(argc, argv);
    if (!strcmp(cmd, "supervise")) return tr_cmd_supervise(argc, argv);
    if (!is_run && !is_show) {
        fprintf(stderr,
                "trainer: unknown command '%s' (commands: run, show, plan, check, tokenize, export, "
                "sample, report, supervise; see "
                "trainer --help)\n",
                cmd);
        return 2;
    }
    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fputs(is_run ? run_help : show_help, stdout);
            return 0;
        }
    }
    return is_run ? tr_cmd_run(argc, argv) : tr_cmd_show(argc, argv);
}
