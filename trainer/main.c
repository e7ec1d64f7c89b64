/* trainer: the command line. Dispatches to the subcommands (their shared options are parsed
 * in options.c); every mistake gets one line naming it and a non-zero exit. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "trainer/checkpoint/checkpoint.h"
#include "trainer/report/provenance.h"
#include "trainer/report/report.h"
#include "trainer/trainer.h"

static void usage(FILE *f) {
    fprintf(f,
            "trainer %s: train transformer language models declared in a Lua recipe\n"
            "\n"
            "usage: trainer COMMAND [options]\n"
            "\n"
            "commands:\n"
            "  run RECIPE     train the model the recipe declares\n"
            "  show RECIPE    print the model tree: parameters, FLOPs and memory per layer\n"
            "  show CKPT      a checkpoint's model tree, and the layout and pipeline that saved it\n"
            "  plan RECIPE [--cluster FILE | --gpus N --gpu NAME]\n"
            "                 choose the parallel layout for a cluster, with predictions\n"
            "  export CKPT --format hf --out DIR\n"
            "                 write a checkpoint as a Hugging Face model folder\n"
            "  sample CKPT [--prompt TEXT] [--tokens N]\n"
            "                 generate text from a checkpoint (KV cache)\n"
            "  eval CKPT [--task FILE]... [--shards DIR] [--json]\n"
            "                 validation loss and perplexity, multiple-choice tasks' accuracy\n"
            "  check RECIPE --a LAYOUT --b LAYOUT\n"
            "                 one step in two layouts, compared tensor by tensor\n"
            "  tokenize INPUT... --out DIR\n"
            "                 text, folders or JSONL to token shards (GPT-2 BPE or bytes)\n"
            "  report RUN_DIR [--out FILE] [--json] [--cluster FILE] [--compare RUN_DIR]\n"
            "                 one HTML page (or JSON) of a run: curves, ranks, timeline, cost\n"
            "  sweep RECIPE --out EXP [--grid NAME=V1,V2]... [--seeds N]\n"
            "                 a grid of runs with seeds, one folder each, resumable; locally,\n"
            "                 as a Slurm job array or through a launcher\n"
            "  supervise [--restarts N] [--backoff S] [--hostfile FILE] -- COMMAND...\n"
            "                 run a training command, relaunching it with --resume when it\n"
            "                 fails (dropping failing hosts, stopping on a repeated crash)\n"
            "\n"
            "Run `trainer COMMAND --help` for a command's options, `trainer --version` for the\n"
            "version and the commit it was built from.\n"
            "Example: trainer run recipes/shakespeare_char.lua --set steps=200\n",
            tr_build.version);
}

static const char *run_help =
    "usage: trainer run RECIPE [--set NAME=VALUE]... [--steps N] [--out DIR]\n"
    "                          [--micro-batch B] [--eval-every N] [--sample-tokens N]\n"
    "                          [--device auto|cpu|cuda] [--precision bf16|fp32]\n"
    "                          [--peak-gflops X] [--memory-mib M]\n"
    "                          [--resume | --overwrite] [--timeout SECONDS]\n"
    "                          [--progress tty|lines] [--trace N]\n"
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
    "  --set NAME=VALUE  override one of the recipe's knobs, or any field of its train { }\n"
    "                    (checkpoint_every, steps, eval_every, log_every, seed, ...) as\n"
    "                    train.NAME=VALUE, or as NAME when no knob is so named; repeatable;\n"
    "                    an unknown NAME lists the knobs and the fields. A flag (--steps,\n"
    "                    --out, ...) wins over a --set of the same field\n"
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
    "  --memory-mib M    plan for, and keep within, M MiB per process (at most what its device\n"
    "                    has; a layout pinned past it is refused): fit a GPU's budget on the\n"
    "                    CPU, or leave room on a shared GPU\n"
    "  --timeout S       seconds any collective may take before every rank exits naming the\n"
    "                    operation (default 300)\n"
    "  --trace N         write OUT/trace.json: a timeline of N steps after the first (each\n"
    "                    rank's pipeline actions, waits, gradient reductions and update;\n"
    "                    Chrome's trace format: open it in ui.perfetto.dev)\n"
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
    "  --private-gradients  mask the data-parallel gradient sums between hosts, as\n"
    "                    parallel.private_gradients = true (README \"Private gradients\")\n"
    "  --orgs FILE       with private gradients: each host's organisation (lines \"HOST ORG\");\n"
    "                    sums are masked between organisations, tp and pp stay inside one\n"
    "                    (default: every host its own)\n"
    "  --pp P            pipeline ranks, instead of parallel.pp (default: planned); the blocks\n"
    "                    (the repeats of its stacks) are cut into P x V chunks, balanced by\n"
    "                    FLOPs unless parallel.stages says where each starts\n"
    "  --schedule S      the pipeline's schedule: gpipe, 1f1b, interleaved, zb-h1 or zb-v\n"
    "                    (planned), instead of parallel.schedule\n"
    "  --microbatches M  micro-batches per step on each data-parallel rank (sets the micro-\n"
    "                    batch: the step's sequences / (dp x M)), instead of\n"
    "                    parallel.microbatches\n"
    "  --virtual-stages V  chunks per pipeline rank (interleaved: default 2; zb-v: 2; else 1),\n"
    "                    instead of parallel.virtual_stages\n"
    "\n"
    "Writes DIR/recipe.lua (the fully resolved recipe, its layout included), DIR/metrics.jsonl\n"
    "(one JSON object per step: step, loss, lr, grad_norm, tokens_per_s, gflops, mfu,\n"
    "step_s, predicted_step_s, memory_bytes, predicted_memory_bytes; val_loss on eval steps),\n"
    "DIR/memory.json (what a process allocated, and what the layout\n"
    "predicted), DIR/plan.json (the planner's search, when it chose the layout: as\n"
    "trainer plan --json prints it) and DIR/sample.txt (text sampled from the trained model).\n"
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
    "exactly as `trainer run` would. The flags are those of `trainer run`.\n"
    "\n"
    "trainer show CKPT (a checkpoint folder, or a run folder: its newest checkpoint) prints the\n"
    "saved recipe's model tree, the step, and the layout that saved it: dp x tp x pp, ZeRO and\n"
    "the pipeline (schedule, virtual stages, micro-batches, each stage's blocks).\n";

int main(int argc, char **argv) {
    tr_backend_cpu_blas_core(argv); /* before anything: it may start the program again */
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
        printf("trainer %s (commit %s, built %s)\n", tr_build.version, tr_build.commit,
               tr_build.built);
        return 0;
    }
    int is_run = !strcmp(cmd, "run"), is_show = !strcmp(cmd, "show");
    if (!strcmp(cmd, "tokenize")) return tr_cmd_tokenize(argc, argv);
    if (!strcmp(cmd, "export")) return tr_cmd_export(argc, argv);
    if (!strcmp(cmd, "sample")) return tr_cmd_sample(argc, argv);
    if (!strcmp(cmd, "eval")) return tr_cmd_eval(argc, argv);
    if (!strcmp(cmd, "plan")) return tr_cmd_plan(argc, argv);
    if (!strcmp(cmd, "report")) return tr_cmd_report(argc, argv);
    if (!strcmp(cmd, "check")) return tr_cmd_check(argc, argv);
    if (!strcmp(cmd, "supervise")) return tr_cmd_supervise(argc, argv);
    if (!strcmp(cmd, "sweep")) return tr_cmd_sweep(argc, argv);
    if (!is_run && !is_show) {
        fprintf(stderr,
                "trainer: unknown command '%s' (commands: run, show, plan, check, tokenize, export, "
                "sample, eval, report, sweep, supervise; see "
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
