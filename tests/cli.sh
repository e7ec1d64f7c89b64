#!/usr/bin/env bash
# The command line: help, bad flags, bad files. Every mistake must give one line on stderr
# that names what is wrong, and a non-zero exit.
set -u
T="$1"
fail=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# expect CODE PATTERN -- ARGS: exit status CODE (or "nonzero") and one stderr line matching PATTERN
expect() {
    local code="$1" pat="$2"
    shift 3
    "$T" "$@" >"$tmp/out" 2>"$tmp/err"
    local rc=$? lines
    lines=$(wc -l <"$tmp/err")
    if { [ "$code" = nonzero ] && [ $rc -eq 0 ]; } || { [ "$code" != nonzero ] && [ $rc -ne "$code" ]; } ||
        ! grep -q -- "$pat" "$tmp/err" || [ "$lines" -ne 1 ]; then
        echo "FAIL trainer $*: exit $rc, stderr ($lines lines):"
        sed 's/^/    /' "$tmp/err"
        fail=1
    else
        echo "ok   trainer $*: $(cat "$tmp/err")"
    fi
}

# help goes to stdout with exit 0
for args in "--help" "run --help" "show --help"; do
    if $T $args >"$tmp/out" 2>&1 && grep -q "usage: trainer" "$tmp/out"; then
        echo "ok   trainer $args"
    else
        echo "FAIL trainer $args"; fail=1
    fi
done

# one version: CMake's project version, which provenance.json records too
ver=$(sed -n 's/^project(trainer VERSION \([0-9.]*\).*/\1/p' CMakeLists.txt)
if "$T" --version >"$tmp/out" 2>&1 && grep -q "^trainer $ver (commit " "$tmp/out" &&
    "$T" --help | grep -q "^trainer $ver: "; then
    echo "ok   trainer --version: $(cat "$tmp/out")"
else
    echo "FAIL trainer --version: '$(cat "$tmp/out")', expected trainer $ver"; fail=1
fi

# the README's usage block names every command `trainer --help` lists, with the options each
# command's own --help gives
if e=$(python3 - "$T" <<'PY'
import re, subprocess, sys
T = sys.argv[1]
readme = open("README.md").read()
usage = readme.split("## Using it\n\n```\n", 1)[1].split("```", 1)[0]
top = subprocess.run([T, "--help"], capture_output=True, text=True).stdout
cmds = re.findall(r"^  (\w+) ", top.split("commands:", 1)[1], re.M)
missing = []
for c in cmds:
    if not re.search(r"^trainer %s " % c, usage, re.M):
        missing.append(c)
        continue
    # every usage line of the command (a command may have several forms: report, sweep)
    block = "".join(re.findall(r"^trainer %s .*?(?=^trainer |^mpirun |\Z)" % c, usage, re.M | re.S))
    own = subprocess.run([T, c, "--help"], capture_output=True, text=True).stdout
    own = own.split("\n\n", 1)[0]
    for flag in sorted(set(re.findall(r"--[a-z][a-z-]*", own)) - {"--help"}):
        if flag not in block:
            missing.append("%s %s" % (c, flag))
print(", ".join(missing) if missing else "%d commands: %s" % (len(cmds), " ".join(cmds)))
sys.exit(1 if missing or len(cmds) < 9 else 0)
PY
); then
    echo "ok   the README's usage has every command and its options: $e"
else
    echo "FAIL the README's usage lacks: $e"; fail=1
fi

expect 2 "unknown command 'frobnicate'" -- frobnicate
expect 2 "unknown option '--stepz'" -- run recipes/shakespeare_char.lua --stepz 3
expect 2 "--steps needs a positive integer, got 'three'" -- run recipes/shakespeare_char.lua --steps three
expect 2 "trainer run: --set widht: expected name=value" -- run recipes/shakespeare_char.lua --set widht
expect 2 "no recipe given" -- run
expect 2 "--resume continues the run in the output folder and --overwrite replaces it: give one of them" -- \
    run recipes/shakespeare_char.lua --resume --overwrite
# the stage is checked once, by the layout (the flag parser only reads an integer)
expect 1 "trainer show: --zero must be 0, 1, 2 or 3, got 4" -- show recipes/shakespeare_char.lua --zero 4
expect 1 "trainer run: dp 2 x tp 1 = 2 processes, but 1 started (mpirun -np 2)" -- run recipes/shakespeare_char.lua --dp 2
# tensor parallelism in one process: refused before training, with the mpirun that would fit
expect 1 "trainer run: tp 2 needs a multiple of 2 processes, but 1 started (mpirun -np 2)" -- \
    run recipes/shakespeare_char.lua --tp 2 --out "$tmp/tp2"
if [ ! -e "$tmp/tp2" ] && ! grep -q "^step" "$tmp/out"; then
    echo "ok   run --tp 2 in one process trained nothing and made no output folder"
else
    echo "FAIL run --tp 2 in one process went on"; fail=1
fi
expect 2 "--device must be auto, cpu or cuda, got 'gpu'" -- run recipes/shakespeare_char.lua --device gpu
expect 2 "--precision must be bf16 or fp32, got 'fp8'" -- run recipes/shakespeare_char.lua --precision fp8
expect 2 "--peak-gflops needs a rate in GFLOP/s from 0.001 to 1e9, got .1e-300." -- run recipes/shakespeare_char.lua --peak-gflops 1e-300
# no GPU here (CI has none): asking for CUDA must fail with the reason, not fall back silently
if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
    expect 1 "trainer run: --device cuda: " -- run recipes/shakespeare_char.lua --device cuda --out "$tmp/cuda"
fi
# a machine without a GPU is no error: the CPU run says "no GPU found" (a CUDA build) or that
# the build has no CUDA, never the CUDA runtime's complaint about a driver that is not there;
# --device cpu does not mention a GPU at all
if ! ls /dev/nvidia0 >/dev/null 2>&1; then
    for dev in auto cpu; do
        "$T" run tests/recipes_good/dp_tiny.lua --steps 1 --eval-every 0 --sample-tokens 0 \
            --peak-gflops 10 --device $dev --out "$tmp/dev_$dev" >"$tmp/out" 2>&1
        line=$(grep "^device " "$tmp/out")
        if [ $dev = cpu ]; then
            case "$line" in "device cpu, "*GPU*|"") ok=0 ;; *) ok=1 ;; esac
        else
            case "$line" in
            *"; no GPU found: running on the CPU" | *"; no GPU: this trainer was built without CUDA"*) ok=1 ;;
            *) ok=0 ;;
            esac
        fi
        [ $ok = 1 ] && echo "ok   --device $dev without a GPU: $line" ||
            { echo "FAIL --device $dev without a GPU: '$line'"; fail=1; }
    done
fi
# the device transport's variable is checked on every build, also where nothing reads it
TR_COMM_DEVICE=ncll expect 1 "^trainer run: TR_COMM_DEVICE must be nccl or staged, got 'ncll'$" -- \
    run recipes/shakespeare_char.lua --out "$tmp/cd"
# so is the ledger's switch, and a malformed fault variable (tests' own, still one line)
TR_LEDGER=of expect 1 "^trainer run: TR_LEDGER must be on or off, got 'of'$" -- \
    run recipes/shakespeare_char.lua --out "$tmp/led"
TR_DP_SYNC_REFRESH=yes expect 1 "^trainer run: TR_DP_SYNC_REFRESH must be 0 or 1, got 'yes'$" -- \
    run recipes/shakespeare_char.lua --out "$tmp/dpsync"
TR_DP_SYNC_REDUCE=2 expect 1 "^trainer run: TR_DP_SYNC_REDUCE must be 0 or 1, got '2'$" -- \
    run recipes/shakespeare_char.lua --out "$tmp/dpsync2"
TR_FAULT_NAN_STEP=3,x expect 1 "^trainer run: TR_FAULT_NAN_STEP must be a list of steps" -- \
    run recipes/shakespeare_char.lua --out "$tmp/nan"
# every variable is checked once, at start, by one helper (parallel/comm/env.h): an integer in a
# range, 0|1, or one of a list of words. TR_PAD_VOCAB's huge value crashed the planner with
# SIGFPE; the others were taken as some value (TR_FAULT_SAVE_HANG=no turned the hang on)
TR_PAD_VOCAB=2147483647 expect 2 "^trainer run: TR_PAD_VOCAB must be an integer from 1 to 4096, got '2147483647'$" -- \
    run recipes/shakespeare_char.lua --out "$tmp/pad"
TR_PAD_VOCAB=abc expect 2 "^trainer show: TR_PAD_VOCAB must be an integer from 1 to 4096, got 'abc'$" -- \
    show recipes/shakespeare_char.lua
TR_PAD_VOCAB=0 expect 2 "^trainer plan: TR_PAD_VOCAB must be an integer from 1 to 4096, got '0'$" -- \
    plan recipes/shakespeare_char.lua --cluster recipes/clusters/h100x8.yaml
TR_CKPT_SYNC=2 expect 1 "^trainer run: TR_CKPT_SYNC must be 0 or 1, got '2'$" -- \
    run recipes/shakespeare_char.lua --out "$tmp/ckpts"
TR_COMM_PROGRESS=x expect 1 "^trainer run: TR_COMM_PROGRESS must be 0, 1 or auto, got 'x'$" -- \
    run recipes/shakespeare_char.lua --out "$tmp/prog"
TR_CUDA_ATTENTION=fancy expect 1 "^trainer run: TR_CUDA_ATTENTION must be tc, simple, cudnn or auto, got 'fancy'$" -- \
    run recipes/shakespeare_char.lua --device cpu --out "$tmp/attn"
TR_FAULT_SAVE_HANG=no expect 1 "^trainer run: TR_FAULT_SAVE_HANG must be 0 or 1, got 'no'$" -- \
    run recipes/shakespeare_char.lua --out "$tmp/hang"
TR_FAULT_SAVE_BYTES=-5 expect 1 "^trainer run: TR_FAULT_SAVE_BYTES must be an integer from 1 to " -- \
    run recipes/shakespeare_char.lua --out "$tmp/bytes"
# TR_HOSTNAME names this process's host in the run's records: set but empty (a launcher's
# template that expanded to nothing), or not a host name, is refused, not taken as gethostname
TR_HOSTNAME= expect 1 "^trainer run: TR_HOSTNAME must be a name of 1 to 63 letters, digits, '.', '-' or '_', got ''$" -- \
    run recipes/shakespeare_char.lua --out "$tmp/host"
TR_HOSTNAME="node 1" expect 1 "^trainer run: TR_HOSTNAME must be a name of 1 to 63 .*, got 'node 1'$" -- \
    run recipes/shakespeare_char.lua --out "$tmp/host2"
# TR_DUMP_PARAMS into a folder that is not there: refused at start, before any training
TR_DUMP_PARAMS="$tmp/nowhere/p.params" expect 1 "^trainer run: TR_DUMP_PARAMS must be a file in a writable folder, got '$tmp/nowhere/p.params'$" -- \
    run recipes/shakespeare_char.lua --out "$tmp/dumpp"
[ ! -e "$tmp/dumpp/metrics.jsonl" ] && echo "ok   TR_DUMP_PARAMS: no training before the refusal" ||
    { echo "FAIL TR_DUMP_PARAMS: the run trained before refusing"; fail=1; }
expect 1 "nope.lua: cannot read recipe" -- show nope.lua
# sizes: --sample-tokens is bounded like train.sample_tokens (it grew memory silently); a width
# whose counts overflowed 64 bits is refused by the schema, naming the knob the value came from
expect 2 "^trainer run: --sample-tokens must be at most 1000000, got '1000000000'$" -- \
    run recipes/shakespeare_char.lua --sample-tokens 1000000000 --out "$tmp/st"
expect 1 "shakespeare_char.lua:20: mlp: field 'hidden' must be <= 1048576, got 2147483632 (from --set width=536870908)$" -- \
    show recipes/shakespeare_char.lua --set width=536870908
expect 1 "shakespeare_char.lua:20: mlp: field 'hidden' must be >= 1, got 0 (from --set width=0)$" -- \
    show recipes/shakespeare_char.lua --set width=0
expect 1 "unknown knob (knobs: batch_tokens, heads, layers, lr, seq, steps, width)" -- show recipes/shakespeare_char.lua --set widht=3
expect 1 "knob 'layers'" -- show recipes/shakespeare_char.lua --set layers=many
expect 1 "micro-batch 5 does not divide" -- show recipes/shakespeare_char.lua --micro-batch 5
# pipeline flags: a schedule name the flag does not know, a pipeline that needs more processes
expect 2 "trainer show: --schedule must be gpipe, 1f1b, interleaved, zb-h1 or zb-v, got 'fast'" -- \
    show recipes/shakespeare_char.lua --pp 2 --schedule fast
expect 2 "--microbatches needs a positive integer, got '0'" -- show recipes/shakespeare_char.lua --microbatches 0
expect 1 "trainer run: dp 1 x tp 1 x pp 2 = 2 processes, but 1 started (mpirun -np 2)" -- \
    run recipes/shakespeare_char.lua --dp 1 --pp 2 --out "$tmp/pp2"
expect 1 "trainer show: --microbatches 3: interleaved needs microbatches a multiple of pp 2" -- \
    show recipes/shakespeare_char.lua --pp 2 --schedule interleaved --microbatches 3 --set batch_tokens=6144

# a recipe whose corpus is missing: the loader names the file
sed 's#../data/corpora/tinyshakespeare.txt#missing/corpus.txt#' recipes/shakespeare_char.lua >"$tmp/r.lua"
expect 1 "missing/corpus.txt': No such file" -- run "$tmp/r.lua" --out "$tmp/run/deep"
# a set-up that fails leaves no folder it made (a next run would take one holding recipe.lua
# for an earlier run's), and one it did not make stays
mkdir "$tmp/kept"
"$T" run "$tmp/r.lua" --out "$tmp/kept/run" >/dev/null 2>&1
left=""
for d in cd led dpsync nan run kept/run; do [ -e "$tmp/$d" ] && left="$left $d"; done
if [ -z "$left" ] && [ -d "$tmp/kept" ]; then
    echo "ok   failed set-ups left no folder behind (missing corpus, bad environment variables)"
else
    echo "FAIL failed set-ups left folders behind:$left"; fail=1
fi

# a learning rate that makes the loss NaN stops the run with one line (the NaN once reached
# undefined behaviour in the CPU exp, which the sanitizer build reported instead)
expect 1 "step [0-9]*: loss is .*training diverged" -- run recipes/shakespeare_char.lua --set lr=1e30 \
    --set layers=1 --set width=32 --set heads=2 --set seq=16 --set batch_tokens=64 --steps 5 \
    --eval-every 0 --sample-tokens 0 --out "$tmp/nan2"

# output files that cannot be written give one line and exit 1, never a silent empty file:
# /dev/full fails every write with ENOSPC, as a full disk does
tiny="--set layers=1 --set width=32 --set heads=2 --set seq=16 --set batch_tokens=64 --steps 2 --eval-every 0"
mkdir -p "$tmp/full1" "$tmp/full2"
ln -s /dev/full "$tmp/full1/metrics.jsonl"
expect 1 "cannot write '$tmp/full1/metrics.jsonl': No space left on device (training goes on" -- \
    run recipes/shakespeare_char.lua $tiny --sample-tokens 0 --out "$tmp/full1"
ln -s /dev/full "$tmp/full2/sample.txt"
expect 1 "cannot write '$tmp/full2/sample.txt': No space left on device" -- \
    run recipes/shakespeare_char.lua $tiny --sample-tokens 8 --out "$tmp/full2"

# show prints the tree and the totals of every shipped recipe
for r in recipes/*.lua; do
    if $T show "$r" >"$tmp/out" 2>&1 && grep -q "parameters" "$tmp/out" && grep -q "attention" "$tmp/out"; then
        echo "ok   trainer show $r"
    else
        echo "FAIL trainer show $r"; cat "$tmp/out"; fail=1
    fi
done
# show predicts exactly what a run allocates: its bytes are memory.json's "predicted" figures
# and, at ZeRO-0 (no transient bucket buffers), the measured ones
"$T" show tests/recipes_good/dp_tiny.lua --micro-batch 4 >"$tmp/show.txt" 2>&1
"$T" run tests/recipes_good/dp_tiny.lua --micro-batch 4 --steps 2 --eval-every 0 --sample-tokens 0 \
    --peak-gflops 10 --out "$tmp/mem" >/dev/null 2>&1
if e=$(python3 - "$tmp/show.txt" "$tmp/mem/memory.json" <<'PY'
import json, re, sys
line = [l for l in open(sys.argv[1]) if l.startswith("memory bytes per process:")]
shown = dict((k, int(v)) for k, v in re.findall(r"(\w+) (\d+)", line[0].split(":", 1)[1])) if line else {}
m = json.load(open(sys.argv[2]))
keys = ["params", "grads", "optimizer", "activations", "scratch"]
print(" ".join("%s %s/%s/%s" % (k, shown.get(k), m["predicted"][k], m[k]) for k in keys))
sys.exit(0 if all(shown.get(k) == m["predicted"][k] == m[k] for k in keys) else 1)
PY
); then
    echo "ok   show's bytes = the run's predicted = measured at ZeRO-0 (show/predicted/measured: $e)"
else
    echo "FAIL show's bytes against memory.json: ${e:-no figures}"; fail=1
fi
# show with a pipeline: each rank's chunks, the bubble, the memory of each pipeline rank
if "$T" show recipes/gpt2_124m.lua --pp 4 --microbatches 8 >"$tmp/out" 2>&1 &&
    grep -q "dp 1 x tp 1 x pp 4: pipeline 1f1b over 8 micro-batches" "$tmp/out" &&
    grep -q "rank p0 .*blocks 0-[0-9]* (+ embedding, positions)" "$tmp/out" &&
    grep -q "rank p3 .*block.*11 (+ final norm, head)" "$tmp/out" &&
    grep -q "bubble 27.3% of a step" "$tmp/out" &&
    [ "$(grep -c "^memory bytes per process (pipeline rank" "$tmp/out")" -eq 4 ]; then
    echo "ok   trainer show gpt2_124m --pp 4: chunks, bubble, memory of each pipeline rank"
else
    echo "FAIL trainer show gpt2_124m --pp 4"; cat "$tmp/out"; fail=1
fi
grep -q "124.44M" <("$T" show recipes/gpt2_124m.lua) && echo "ok   GPT-2 small shows 124.44M parameters" ||
    { echo "FAIL GPT-2 small parameter count"; fail=1; }

[ $fail -eq 0 ] && echo "cli: all passed" || echo "cli: FAILED"
exit $fail
