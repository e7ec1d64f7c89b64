#!/usr/bin/env bash
# Tensor and sequence parallelism with real MPI processes (mpirun --oversubscribe): dp x tp in
# 1x2, 1x4 and 2x2 for a GPT shape (tied and untied head) and a Llama shape (grouped-query
# attention whose 2 kv heads tp 2 splits and tp 4 shares), with and without sequence
# parallelism, ZeRO 0-3 where dp > 1. Every run's losses, gradient norms and final parameters
# (the global tensors: TR_DUMP_PARAMS) equal the single process's within the limits a
# reordering of float32 sums stays within on any CPU (tests/lib.sh); sequence
# parallelism gives the losses it gives without; the memory `trainer show` predicts for each
# layout is what the run allocates; checkpoints saved in one layout resume in another; the
# sample drawn with the KV cache at the end and the Hugging Face export equal one process's;
# a layout that does not fit the processes is refused in one line.
set -u
. "$(dirname "$0")/lib.sh"
layout_setup "$1" tests/recipes_good/tp

# the single process each layout is compared with, and the same in micro-batches of 1, 2, 4
for model in gpt gptu llama; do one_process "$model" || exit 1; done

# show's exact per-process bytes for a layout against the run's memory.json (measured, less
# ZeRO's transient bucket buffers, which show leaves out)
memory_check() { # name model show-flags...
    local name=$1 model=$2
    shift 2
    "$T" show $(layout_recipe "$model") "$@" >"$tmp/$name.show" 2>&1
    python3 - "$tmp/$name.show" "$tmp/$name/memory.json" <<'PY'
import json, re, sys
line = [l for l in open(sys.argv[1]) if l.startswith("memory bytes per process:")]
shown = dict((k, int(v)) for k, v in re.findall(r"(\w+) (\d+)", line[0].split(":", 1)[1])) if line else {}
m = json.load(open(sys.argv[2]))
meas = {k: m[k] for k in ["params", "grads", "optimizer", "activations", "scratch"]}
meas["params"] -= m["param_buffers"]
meas["grads"] -= m["grad_buffers"]
print(" ".join("%s %s/%s" % (k, shown.get(k), meas[k]) for k in meas))
sys.exit(0 if all(shown.get(k) == meas[k] for k in meas) else 1)
PY
}

layouts=(
    "gpt tp2 2 --tp 2"
    "gpt tp2_sp 2 --tp 2 --sequence-parallel"
    "gpt tp4 4 --tp 4"
    "gpt tp4_sp 4 --tp 4 --sequence-parallel"
    "gpt dp2tp2_z0 4 --dp 2 --tp 2"
    "gpt dp2tp2_z1 4 --dp 2 --tp 2 --zero 1"
    "gpt dp2tp2_z2_sp 4 --dp 2 --tp 2 --zero 2 --sequence-parallel"
    "gpt dp2tp2_z3 4 --dp 2 --tp 2 --zero 3"
    "gptu tp2_sp 2 --tp 2 --sequence-parallel"
    "gptu dp2tp2_z2 4 --dp 2 --tp 2 --zero 2"
    "llama tp2 2 --tp 2"
    "llama tp4 4 --tp 4"
    "llama tp4_sp 4 --tp 4 --sequence-parallel"
    "llama dp2tp2_z3_sp 4 --dp 2 --tp 2 --zero 3 --sequence-parallel"
)
for l in "${layouts[@]}"; do
    set -- $l
    model=$1 name="$1_$2" np=$3
    shift 3
    layout_run "$name" "$np" "$model" "$@" || continue
    grep -q "^tensor parallel: [0-9]* collectives" "$tmp/$name.log" || bad "$name: no tensor-parallel report"
    if e=$(cmp_run "$tmp/$name" "$tmp/${model}_one"); then
        ok "$name: equal to one process: $e"
    else
        bad "$name: differs from one process: $e"
    fi
    if e=$(memory_check "$name" "$model" "$@"); then
        ok "$name: show predicts what the run allocates (show/measured: $e)"
    else
        bad "$name: show and the run's memory differ: $e"
    fi
done
# sequence parallelism computes what its absence does
for p in gpt_tp2 gpt_tp4 llama_tp4; do
    if e=$(cmp_run "$tmp/${p}_sp" "$tmp/$p"); then
        ok "$p: with sequence parallelism as without: $e"
    else
        bad "$p: sequence parallelism changes the run: $e"
    fi
done

resume_pair gpt ckpt_tp2_to_1 2 "--tp 2" 1 ""
resume_pair gpt ckpt_1_to_tp4sp 1 "" 4 "--tp 4 --sequence-parallel"
resume_pair gpt ckpt_dp2tp2z2_to_dp4z1 4 "--dp 2 --tp 2 --zero 2" 4 "--dp 4 --zero 1"
resume_pair llama ckpt_tp4_to_tp2 4 "--tp 4" 2 "--tp 2"

# the sample drawn with the KV cache at the end of a tensor-parallel run (every rank decodes
# its heads, the logits are gathered) and the Hugging Face export of its checkpoint
for model in gpt llama; do
    sample_export "${model}_tp2_sample" 2 "$model" --tp 2 --sequence-parallel
done

# a layout that does not fit the processes: one line, before training
layout_refused bad_tp4 2 "tp 4 needs a multiple of 4 processes, but 2 started" --tp 4

[ "$fail" -eq 0 ] && echo "tp: all passed" || echo "tp: FAILED"
exit "$fail"
