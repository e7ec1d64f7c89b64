#!/usr/bin/env bash
# Pipeline parallelism with real MPI processes (mpirun --oversubscribe): dp x tp x pp in 1x1x2,
# 1x1x4, 2x1x2, 1x2x2 and 2x2x2, every schedule (gpipe, 1f1b, interleaved, zb-h1, zb-v) for a GPT
# shape (8 blocks, tied head) and the Llama shape (4 blocks, untied) in a few of them, every
# schedule x ZeRO 0-3 x tied or untied head on dp 2 x pp 2 (untied but at ZeRO-1; and ZeRO-2 with
# interleaved and with zb-v on dp 2 x tp 2 x pp 2). Every run's losses, gradient norms and final
# parameters (the global tensors: TR_DUMP_PARAMS) equal the single process's within the limits a
# reordering of float32 sums stays within on any CPU (tests/lib.sh); every rank allocates the
# memory the layout predicted for it (ranks.json), and `trainer show` prints each stage's; the run
# reports each stage's idle share beside the schedule's theory; checkpoints saved in one layout
# resume in another (five pairs with pp, one of them ZeRO-3 to ZeRO-2 with the tied head), and
# `trainer show CHECKPOINT` names the pipeline that saved them; the sample drawn through the stages
# and the Hugging Face export equal one process's; bad layouts are refused in one line before
# training; a stage killed mid-run ends the job instead of hanging its neighbour; zb-h1 allocates
# 1f1b's activation memory on every rank (pp 2 x M 4, pp 4 x M 8), zb-v peaks at it but for its
# chunks' own input streams (and runs untied, at every ZeRO stage (untied: 0, 2 and 3), dp 2 x
# tp 2 x pp 2 at ZeRO-2, and resumes to and from other layouts); recompute by stage (full on the
# first rank, none on the last) equals one process and shrinks rank 0 only.
# TR_TEST_QUICK=1 (the sanitizer build in CI, where every run is a few times slower): each
# layout with one schedule, every schedule at least once, two checkpoint pairs, one sample.
set -u
. "$(dirname "$0")/lib.sh"
layout_setup "$1" tests/recipes_good/pp
quick=${TR_TEST_QUICK:-0}

# the single process each layout is compared with, and the same in micro-batches of 1, 2, 4
for model in gpt gptu llama; do one_process "$model" || exit 1; done

# every rank's allocation against its prediction (ranks.json, written by rank 0)
memory_check() { # name
    python3 - "$tmp/$1/ranks.json" <<'PY'
import json, sys
rows = json.load(open(sys.argv[1]))
bad = [r["rank"] for r in rows if r["memory_bytes"] != r["predicted_bytes"]]
acts = sorted(set(r["memory_bytes"][3] for r in rows))
print("%d ranks, activation bytes %s" % (len(rows), "/".join(str(a) for a in acts)))
sys.exit(1 if bad else 0)
PY
}

check_layout() { # name model np flags...: equal to one process, memory as predicted, the report
    local name=$1 model=$2 np=$3
    shift 3
    layout_run "$name" "$np" "$model" "$@" || return
    grep -q "^pipeline .*idle share of the step by stage.*(theory" "$tmp/$name.log" ||
        bad "$name: no pipeline report"
    if e=$(cmp_run "$tmp/$name" "$tmp/${model}_one"); then
        ok "$name: equal to one process: $e"
    else
        bad "$name: differs from one process: $e"
    fi
    if e=$(memory_check "$name"); then
        ok "$name: every rank allocates what the layout predicted ($e)"
    else
        bad "$name: a rank's memory differs from its prediction: $e"
    fi
}

# every schedule in every layout for GPT; micro-batches of 2 sequences (dp 1: M 8, dp 2: M 4)
layouts=("1x1x2 2 --pp 2" "1x1x4 4 --pp 4" "2x1x2 4 --dp 2 --pp 2" "1x2x2 4 --tp 2 --pp 2"
         "2x2x2 8 --dp 2 --tp 2 --pp 2")
i=0
for l in "${layouts[@]}"; do
    set -- $l
    lname=$1 np=$2
    shift 2
    i=$((i + 1))
    k=0
    for s in gpipe 1f1b interleaved zb-h1 zb-v; do
        k=$((k + 1))
        [ "$quick" = 1 ] && [ $(((i + k) % 4)) -ne 0 ] && continue
        # dp 2 x pp 2 at ZeRO-0: in the ZeRO matrix below, with every schedule
        [ "$quick" != 1 ] && [ "$lname" = 2x1x2 ] && continue
        extra=()
        [ "$s" = interleaved ] && extra=(--virtual-stages 2)
        check_layout "gpt_${lname}_$s" gpt "$np" "$@" --schedule "$s" --micro-batch 2 "${extra[@]}"
    done
done
# Llama (4 blocks, untied), sequence parallelism inside the stages, ZeRO over dp with pp 2
if [ "$quick" != 1 ]; then
check_layout llama_1x1x2_interleaved llama 2 --pp 2 --schedule interleaved --virtual-stages 2 --micro-batch 2
check_layout llama_1x1x4_zb-h1 llama 4 --pp 4 --schedule zb-h1 --micro-batch 2
check_layout llama_1x2x2_1f1b_sp llama 4 --tp 2 --pp 2 --sequence-parallel --schedule 1f1b --micro-batch 2
check_layout llama_2x2x2_gpipe llama 8 --dp 2 --tp 2 --pp 2 --schedule gpipe --micro-batch 2
# every schedule x ZeRO stage x tied or untied head on 4 ranks (dp 2 x pp 2): the buckets follow
# each schedule's backward (another chunk, a split backward's other part), the tied embedding
# is summed over the first and the last stage at every stage. Untied but at ZeRO-1, whose
# gradients take ZeRO-0's path (all-reduced whole) and whose parameters ZeRO-2's (brought back
# during the next forward): both run untied at ZeRO-0 and 2.
for s in gpipe 1f1b interleaved zb-h1 zb-v; do
    extra=()
    [ "$s" = interleaved ] && extra=(--virtual-stages 2)
    for z in 0 1 2 3; do
        for model in gpt gptu; do
            [ "$model$z" = gptu1 ] && continue
            check_layout "${model}_2x1x2_${s}_z$z" "$model" 4 --dp 2 --pp 2 --zero "$z" \
                --schedule "$s" --micro-batch 2 "${extra[@]}"
        done
    done
done
check_layout gpt_2x2x2_interleaved_z2 gpt 8 --dp 2 --tp 2 --pp 2 --zero 2 --schedule interleaved --virtual-stages 2 --micro-batch 2
# zb-v (the first and last chunk on rank 0): untied on 2 and 4 stages, Llama, and dp x tp x pp
zbv=("gptu_1x1x2 gptu 2 --pp 2" "gptu_1x1x4 gptu 4 --pp 4" "llama_1x1x2 llama 2 --pp 2"
     "gpt_2x2x2_z2 gpt 8 --dp 2 --tp 2 --pp 2 --zero 2")
for z in "${zbv[@]}"; do
    set -- $z
    name=$1 model=$2 np=$3
    shift 3
    check_layout "zbv_$name" "$model" "$np" "$@" --schedule zb-v --micro-batch 2
done
else
check_layout llama_1x2x2_1f1b_sp llama 4 --tp 2 --pp 2 --sequence-parallel --schedule 1f1b --micro-batch 2
check_layout llama_2x1x2_1f1b_z3 llama 4 --dp 2 --pp 2 --zero 3 --schedule 1f1b --micro-batch 2
check_layout gpt_2x1x2_zb-h1_z3 gpt 4 --dp 2 --pp 2 --zero 3 --schedule zb-h1 --micro-batch 2
fi

# ZB-H1 at 1F1B's activation memory: every rank allocates (ranks.json, what the run measured)
# the activation bytes 1F1B's same rank does in the same layout, pp 2 x M 4 and pp 4 x M 8
same_act() { # name-a name-b
    python3 - "$tmp/$1/ranks.json" "$tmp/$2/ranks.json" <<'PY'
import json, sys
a, b = ([r["memory_bytes"][3] for r in sorted(json.load(open(f)), key=lambda r: r["rank"])]
        for f in sys.argv[1:3])
print("activation bytes by rank %s, 1f1b's %s" % ("/".join(map(str, a)), "/".join(map(str, b))))
sys.exit(0 if a == b else 1)
PY
}
# ZB-V's peak (the largest rank's activation bytes, as allocated) at 1F1B's: its ranks hold 2P
# half-stage micro-batches, 1F1B's rank 0 P whole stages, the same blocks' activations; but
# each of the V's chunks keeps an input stream of its own (the stage one), and its gradient
# buffers: at most P + 1 micro-batch streams (tokens x width 32 x 4 bytes) more, a quarter of
# one micro-batch's half-stage here or less, so that one micro-batch too many on a chunk fails
peak_le() { # name-a name-b pp microbatches
    python3 - "$tmp/$1/ranks.json" "$tmp/$2/ranks.json" "$3" "$4" <<'PY'
import json, sys
a, b = ([r["memory_bytes"][3] for r in sorted(json.load(open(f)), key=lambda r: r["rank"])]
        for f in sys.argv[1:3])
P, M = int(sys.argv[3]), int(sys.argv[4])
stream = 256 // M * 32 * 4  # the recipe's batch of 256 tokens in M micro-batches, width 32
print("activation bytes by rank %s (peak %d), 1f1b's %s (peak %d): %+d bytes, %.1f streams "
      "(at most %d)" % ("/".join(map(str, a)), max(a), "/".join(map(str, b)), max(b),
                        max(a) - max(b), (max(a) - max(b)) / stream, P + 1))
sys.exit(0 if max(a) <= max(b) + (P + 1) * stream else 1)
PY
}
for pm in "2 4" "4 8"; do
    set -- $pm
    for s in 1f1b zb-h1 zb-v; do
        check_layout "gpt_pp$1_M$2_$s" gpt "$1" --pp "$1" --microbatches "$2" --schedule "$s"
    done
    if e=$(same_act "gpt_pp$1_M$2_zb-h1" "gpt_pp$1_M$2_1f1b"); then
        ok "zb-h1 pp $1 M $2 holds 1f1b's activation memory on every rank: $e"
    else
        bad "zb-h1 pp $1 M $2 holds more activation memory than 1f1b: $e"
    fi
    if e=$(peak_le "gpt_pp$1_M$2_zb-v" "gpt_pp$1_M$2_1f1b" "$1" "$2"); then
        ok "zb-v pp $1 M $2 peaks at 1f1b's activation memory but for its chunks' streams: $e"
    else
        bad "zb-v pp $1 M $2 peaks above 1f1b's activation memory: $e"
    fi
done

# recompute by stage: the first rank (which holds the most micro-batches) recomputes, the last
# does not; equal to one process, and only rank 0's activations shrink against recompute none
check_layout gpt_pp2_M4_full_none gpt 2 --pp 2 --microbatches 4 --schedule 1f1b --set recompute=full/none
if e=$(python3 - "$tmp/gpt_pp2_M4_full_none/ranks.json" "$tmp/gpt_pp2_M4_1f1b/ranks.json" <<'PY'
import json, sys
a, b = ([r["memory_bytes"][3] for r in sorted(json.load(open(f)), key=lambda r: r["rank"])]
        for f in sys.argv[1:3])
print("activation bytes by rank %s, at recompute none %s" % ("/".join(map(str, a)), "/".join(map(str, b))))
sys.exit(0 if a[0] < b[0] and a[1] == b[1] else 1)
PY
); then
    ok "recompute full/none at pp 2: rank 0 recomputes, rank 1 keeps its activations: $e"
else
    bad "recompute full/none at pp 2: $e"
fi

resume_pair gpt ckpt_tp2pp2dp2_to_1 8 "--dp 2 --tp 2 --pp 2 --micro-batch 2" 1 ""
resume_pair gpt ckpt_pp4_to_tp2pp2 4 "--pp 4 --micro-batch 2" 4 "--tp 2 --pp 2 --micro-batch 2"

# `trainer show CHECKPOINT` names the pipeline it was saved with (the schedule the run planned),
# the pp 4 save's and the newest of the run that resumed it with tp 2 x pp 2 (its run folder)
show_ckpt() { # what folder pattern
    local out
    out=$("$T" show "$2" 2>&1)
    if grep -qE "^pipeline +$3$" <<<"$out"; then
        ok "show $1: $(grep "^pipeline" <<<"$out" | sed 's/  */ /g')"
    else
        bad "show $1: no line 'pipeline $3' in: $(grep -E "^(pipeline|saved|trainer)" <<<"$out" | tr "\n" " ")"
    fi
}
blk="blocks 0(-[0-9]+)?( [|] [0-9]+(-[0-9]+)?)" sched="(gpipe|1f1b|interleaved|zb-h1|zb-v)"
show_ckpt pp4_checkpoint "$tmp/ckpt_pp4_to_tp2pp2/checkpoints/step_00000005" \
    "$sched, pp 4 x 1 virtual stage, 8 micro-batches, stages: $blk{3}"
show_ckpt tp2pp2_run "$tmp/ckpt_pp4_to_tp2pp2" "$sched, pp 2 x 1 virtual stage, 8 micro-batches, stages: $blk{1}"
if [ "$quick" != 1 ]; then
    resume_pair gpt ckpt_1_to_pp2_zbh1 1 "" 2 "--pp 2 --schedule zb-h1 --micro-batch 2"
    # zb-v's V (the first and last chunk on rank 0) saved, resumed as 1f1b, and the other way
    resume_pair gpt ckpt_zbv_to_pp4 2 "--pp 2 --schedule zb-v --micro-batch 2" 4 "--pp 4 --micro-batch 2"
    resume_pair gptu ckpt_pp2_to_zbv 2 "--pp 2 --micro-batch 2" 4 "--pp 4 --schedule zb-v --micro-batch 2"
    resume_pair llama ckpt_pp2_to_tp2 2 "--pp 2 --micro-batch 2" 2 "--tp 2"
    # the tied head's pieces at ZeRO-3 (zb-h1) resumed as ZeRO-2's (interleaved)
    resume_pair gpt ckpt_z3zbh1_to_z2il 4 "--dp 2 --pp 2 --zero 3 --schedule zb-h1 --micro-batch 2" \
        4 "--dp 2 --pp 2 --zero 2 --schedule interleaved --virtual-stages 2 --micro-batch 2"
fi

# the sample drawn through the stages with their KV caches, and the Hugging Face export of the
# pipeline run's checkpoint
samples=(gpt llama)
[ "$quick" = 1 ] && samples=(gpt)
for model in "${samples[@]}"; do
    sample_export "${model}_pp2_sample" 2 "$model" --pp 2 --micro-batch 2
done
# zb-v's V: rank 0 decodes the first chunk and the last, the turn passes the row on rank 1
[ "$quick" = 1 ] || sample_export gpt_pp2_zbv_sample 2 gpt --pp 2 --schedule zb-v --micro-batch 2

# bad layouts: one line of ours, a non-zero exit, before training
layout_refused bad_world 2 "4 processes, but 2 started" --pp 4
layout_refused bad_blocks 2 "the model has 8 blocks (virtual_stages 2, 3 or 4 would)" --pp 2 --virtual-stages 8 --schedule interleaved
layout_refused bad_interleaved 4 "interleaved needs microbatches a multiple of pp 4" --pp 4 --schedule interleaved --microbatches 2
layout_refused bad_zbv_v 2 "schedule \"zb-v\" needs virtual_stages 2 (its two chunks per rank), not 3" --pp 2 --schedule zb-v --virtual-stages 3
layout_refused bad_zbv_m 4 "zb-v needs microbatches at least pp 4, not 2" --pp 4 --schedule zb-v --microbatches 2

# a stage killed mid-run: its neighbour, waiting for its activations or gradients, exits
# within the timeout with a line naming a rank (no hang)
start=$(date +%s)
TR_FAULT_KILL_AFTER_STEP=5 TR_FAULT_KILL_RANK=1 timeout 120 mpirun -np 2 "$T" run \
    tests/recipes_good/pp_gpt.lua --pp 2 --micro-batch 2 --timeout 10 --out "$tmp/dead" \
    >"$tmp/dead.log" 2>&1
rc=$? took=$(($(date +%s) - start))
line=$(grep -iE "^trainer.*rank [0-9]|process rank [0-9]" "$tmp/dead.log" | head -1)
if [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ $took -le 60 ] && [ -n "$line" ]; then
    ok "a killed stage ends the job in ${took}s (exit $rc): $line"
else
    bad "killed stage: exit $rc after ${took}s"; tail -5 "$tmp/dead.log"
fi

[ "$fail" -eq 0 ] && echo "pp: all passed" || echo "pp: FAILED"
exit "$fail"
