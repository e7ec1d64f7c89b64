# Sourced by the shell tests that compare training runs: ok/bad result lines (bad sets
# fail=1) and the losses of a metrics.jsonl.
fail=0
# the plan memory (trainer/plan_memory.c) off, as ctest sets it: a test's plan must not depend
# on what planned before it (tests/plan.sh turns it on in a folder of its own)
export TR_PLAN_MEMORY=off
ok() { echo "ok   $*"; }
bad() { echo "FAIL $*"; fail=1; }

# "step loss" for every step of a metrics.jsonl, the last occurrence winning (a resumed run
# repeats steps)
losses() {
    python3 - "$1" <<'PY'
import json, sys
seen = {}
for line in open(sys.argv[1]):
    m = json.loads(line)
    if "step" in m:  # the last record is the plan's, without a step
        seen[m["step"]] = "%.6f" % m["loss"]
for s in sorted(seen):
    print(s, seen[s])
PY
}

# ---- Comparing runs that compute the same training in another order ----------------------
# Data, tensor or pipeline parallelism against one process with the same global batch: the
# same sums of float32 terms added in another order (per rank, then across ranks; BLAS blocks a
# product differently for other shapes). Such a run cannot be bitwise equal, and how far it
# lands from the single process must not depend on the CPU or its BLAS kernels, so the limits
# are fixed fractions of each quantity's own scale, chosen from float32's unit roundoff
# u = 2^-24 (6e-8) and the sizes of the sums, and the same on every machine:
#
#   losses      every logged loss and val_loss, |A - B| / |B| <= 2^-16 (1.5e-5, 256 u). One
#               step's loss is a mean over 256-2048 tokens of sums over <= 256 logits: a
#               reordering moves it by a few u (measured: <= 3e-7 relative)
#   grad norms  every step's |A - B| / |B| <= 2^-13 (1.2e-4). metrics.jsonl prints the norm
#               with 6 significant digits, so one unit of the last digit is up to 1e-5;
#               the norm of a reordered sum moves by a few u more (measured: <= 1e-5)
#   params      every final parameter, |A - B| <= 2^-10 x the sum over the steps of the
#               learning rate (the path length: the runs start from bitwise the same
#               parameters, so every difference came in through an update, and an AdamW update
#               moves an element by about lr). Tolerated: a thousandth of the distance the
#               training moved; measured: <= 5e-5 of it
#
# This holds only where the update is a smooth function of the gradient. AdamW's is not near
# g = 0: lr g / (|g| + eps) swings through 2 lr as g crosses zero, so an element whose
# gradient sums nearly cancel (a rarely used unit, a rare token's row) takes an update set by
# its rounding: with eps = 1e-8 (the default) a reordering moved one such element by 1% of lr
# a step on one BLAS kernel and not on another, and the old rule (a multiple of the noise
# measured between runs with other micro-batch sizes on the machine itself) failed on one
# Intel CPU and passed on the next. So the recipes compared here set optimizer eps = 1e-6: the
# update's slope in g is then at most lr / eps, and a rounding of the gradient (<= 1e-12 for
# these models) cannot move a parameter by more than about 1e-9 a step.
#
# Measured on an Intel Xeon (AVX-512) with OpenBLAS's Prescott (SSE3), Haswell (AVX2, FMA) and
# SkylakeX (AVX-512) kernels (OPENBLAS_CORETYPE): over every comparison of tp.sh, dp.sh and
# pp.sh the largest share of a limit was 0.016 for the losses, 0.038 for the grad norms and
# 0.093 for the parameters; the old rule failed 12 of tp.sh's cases with the SkylakeX kernels
# (one parameter 4.8 times the measured noise). Real bugs stand far out (a sabotaged build,
# dp 2 at ZeRO-0): a bucket left out of the reduction 630 times the grad norms' limit and 930
# times the parameters', one parameter moved by 1e-3 after step 10 29 times the parameters',
# every gradient scaled by 1.001 8.2 times the grad norms'.
#
# A run is a path prefix P: P/metrics.jsonl (`trainer run --out P`) and P.params (the final
# parameters, float32 little-endian: TR_DUMP_PARAMS=P.params). The runs must log the same
# steps (the last record of a step wins: a resumed run repeats steps) and hold the same number
# of parameters, and every run's memory (the fullest rank's, each step) must be what its layout
# predicted, else the comparison fails.
#
#   cmp_run A B     prints A's differences to B, each as a share of its limit, and returns 1
#                   when one is over
#   path_length P   the sum of P's learning rates over its steps (the params' scale)
TOL_LOSS=$(python3 -c 'print(2.0**-16)')
TOL_GRAD=$(python3 -c 'print(2.0**-13)')
TOL_PARAM=$(python3 -c 'print(2.0**-10)')

_run_diff() { # cmp A B | path P
    python3 - "$TOL_LOSS" "$TOL_GRAD" "$TOL_PARAM" "$@" <<'PY'
import array, json, math, sys

TOL = [float(v) for v in sys.argv[1:4]]


def fail(msg):  # on stdout: the caller shows it in its FAIL line
    print(msg)
    sys.exit(1)


def load(p, params=True):
    rows = {}  # step: (loss, val_loss or None, grad_norm, lr)
    try:
        for line in open(p + "/metrics.jsonl"):
            m = json.loads(line)
            if "step" not in m:  # the plan's record
                continue
            # the planner's prediction of the fullest rank's memory is what it allocates
            if m.get("memory_bytes") != m.get("predicted_memory_bytes"):
                fail(f"{p}: step {m['step']}: memory {m.get('memory_bytes')} bytes, "
                     f"predicted {m.get('predicted_memory_bytes')}")
            rows[m["step"]] = (float(m["loss"]), m.get("val_loss"), float(m["grad_norm"]),
                               float(m["lr"]))
        a = array.array("f")
        if params:
            with open(p + ".params", "rb") as f:
                b = f.read()
            if not b or len(b) % 4:
                fail(f"{p}.params: {len(b)} bytes, not float32 parameters")
            a.frombytes(b)
            if sys.byteorder != "little":
                a.byteswap()
    except (OSError, ValueError, KeyError, TypeError) as e:
        fail(f"{p}: {type(e).__name__}: {e}")
    return p, rows, a


def top(values):  # the largest; NaN or infinity (a run that diverged) is infinitely far
    m = max(values, default=0.0)
    return m if all(map(math.isfinite, values)) else math.inf


def rel(a, b):
    return abs(a - b) / abs(b) if b else abs(a - b)


def path(rows):
    return sum(r[3] for r in rows.values())


def diff(x, y):
    (na, ra, pa), (nb, rb, pb) = x, y
    if sorted(ra) != sorted(rb) or not ra:
        fail(f"{na} logs {len(ra)} steps, {nb} {len(rb)}, not the same ones")
    if len(pa) != len(pb):
        fail(f"{na} holds {len(pa)} parameters, {nb} {len(pb)}")
    losses, grads = [], []
    for s in ra:
        (la, va, ga, _), (lb, vb, gb, _) = ra[s], rb[s]
        if (va is None) != (vb is None):
            fail(f"step {s}: val_loss in one of {na} and {nb} only")
        losses += [rel(la, lb)] + ([rel(va, vb)] if va is not None else [])
        grads.append(rel(ga, gb))
    scale = path(rb)
    if not scale > 0:
        fail(f"{nb}: the learning rates sum to {scale}: no scale for the parameters")
    return top(losses), top(grads), top([abs(p - q) for p, q in zip(pa, pb)]) / scale


if sys.argv[4] == "path":
    print("%.9g" % path(load(sys.argv[5], params=False)[1]))
else:
    d = diff(load(sys.argv[5]), load(sys.argv[6]))
    print(", ".join("%s %.2e (%.2g of the limit)" % (w, v, v / t)
                    for w, v, t in zip(("losses", "grad norms", "params"), d, TOL)))
    sys.exit(0 if all(v <= t for v, t in zip(d, TOL)) else 1)
PY
}
cmp_run() { _run_diff cmp "$1" "$2"; }
path_length() { _run_diff path "$1"; }

# ---- Shared by the layout tests (tp.sh, pp.sh) -----------------------------------------
# mpi_env: the environment of the tests' mpirun (as root, more processes than cores, one
# OpenMP thread each), or a skip (exit 77) without mpirun.
mpi_env() {
    command -v mpirun >/dev/null || { echo "SKIP no mpirun (apt-get install openmpi-bin)"; exit 77; }
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
    export OMP_NUM_THREADS=1
}

# layout_setup TRAINER PREFIX starts one: T (the trainer), tmp (removed at the exit), the
# environment of mpirun --oversubscribe (without mpirun: skipped, exit 77); its models are
# gpt (PREFIX_gpt.lua), gptu (the same, untied head) and llama (PREFIX_llama.lua).
# layout_launch (empty) is put before every mpirun: tests/cluster/layouts.sh runs them on a
# cluster in a box with (cluster.sh run NAME --).
layout_setup() { # trainer recipe-prefix
    T=$1 layout_prefix=$2
    layout_launch=()
    mpi_env
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
}

layout_recipe() { # model: the recipe and its --set
    case $1 in
    gpt) echo "${layout_prefix}_gpt.lua" ;;
    gptu) echo "${layout_prefix}_gpt.lua --set tied=false" ;;
    llama) echo "${layout_prefix}_llama.lua" ;;
    esac
}

layout_run() { # name np model [flags...]: TRAIN OUT=$tmp/name, final parameters in $tmp/name.params
    local name=$1 np=$2 model=$3
    shift 3
    local cmd=("$T" run $(layout_recipe "$model") --out "$tmp/$name" --peak-gflops 10 "$@")
    if [ "$np" -eq 1 ]; then
        TR_DUMP_PARAMS="$tmp/$name.params" "${cmd[@]}" >"$tmp/$name.log" 2>&1
    else
        TR_DUMP_PARAMS="$tmp/$name.params" timeout 300 "${layout_launch[@]}" mpirun -np "$np" "${cmd[@]}" \
            >"$tmp/$name.log" 2>&1
    fi || { bad "$name exited $?: $(grep -v '^--\|^ \|^$' "$tmp/$name.log" | tail -2 | tr '\n' ' ')"; return 1; }
}

# The single process (NAME_one: a checkpoint at step 10 and a 40-token sample) and the same
# global batch in micro-batches of 1, 2 and 4 sequences (the shapes of the layouts'
# micro-batches): the same sums in another order, held to cmp_run's limits like every layout.
one_process() { # model
    local model=$1 m e
    layout_run "${model}_one" 1 "$model" --set ckpt=10 --set sample=40 || return 1
    for m in 1 2 4; do
        layout_run "${model}_m$m" 1 "$model" --set micro=$m || continue
        if e=$(cmp_run "$tmp/${model}_m$m" "$tmp/${model}_one"); then
            ok "${model}_m$m: micro-batches of $m equal one process: $e"
        else
            bad "${model}_m$m: micro-batches of $m differ from one process: $e"
        fi
    done
}

# Checkpoints across layouts: saved at step 5 (the run then killed), resumed in another layout;
# the ten steps and the final parameters are the single process's.
resume_pair() { # model name np-save "save flags" np-resume "resume flags"
    local model=$1 name=$2 np1=$3 f1=$4 np2=$5 f2=$6
    local save=("$T" run $(layout_recipe "$model") --out "$tmp/$name" --peak-gflops 10 --set ckpt=5 $f1)
    [ "$np1" -gt 1 ] && save=(timeout 300 mpirun -np "$np1" "${save[@]}")
    (TR_FAULT_KILL_AFTER_STEP=5 "${save[@]}" >"$tmp/$name.save.log" 2>&1; true) 2>/dev/null # killed
    [ -f "$tmp/$name/checkpoints/step_00000005/manifest.yaml" ] || { bad "$name: no checkpoint at step 5"; return; }
    layout_run "$name" "$np2" "$model" --set ckpt=5 --resume $f2 || return
    grep -q "resuming from .*step_00000005" "$tmp/$name.log" || { bad "$name: did not resume"; return; }
    if e=$(cmp_run "$tmp/$name" "$tmp/${model}_one"); then
        ok "$name: resumed in another layout, equal to one process: $e"
    else
        bad "$name: resumed run differs: $e"
    fi
}

# Two Hugging Face model.safetensors files: the same tensors and shapes, and values within the
# parameters' limit of cmp_run (TOL_PARAM x the path length of B's run); prints the difference.
hf_cmp() { # A B path-length
    python3 - "$1" "$2" "$3" "$TOL_PARAM" <<'PY'
import array, json, struct, sys
def load(p):
    b = open(p, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    h.pop("__metadata__", None)
    return {k: array.array("f", b[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]])
            for k, v in h.items()}, {k: v["shape"] for k, v in h.items()}
a, sa = load(sys.argv[1])
b, sb = load(sys.argv[2])
if sa != sb:
    print("tensors or shapes differ"); sys.exit(1)
d = max(max(abs(x - y) for x, y in zip(a[k], b[k])) for k in a) / float(sys.argv[3])
lim = float(sys.argv[4])
print("%d tensors, max diff %.2e of the path length (limit %.2e)" % (len(a), d, lim))
sys.exit(0 if d <= lim else 1)
PY
}

# The sample drawn at the end of a parallel run (40 tokens, through every rank's KV cache) and
# the Hugging Face export of its checkpoint at step 10 against one process's.
sample_export() { # name np model flags...
    local name=$1 np=$2 model=$3 r e
    shift 3
    layout_run "$name" "$np" "$model" "$@" --set ckpt=10 --set sample=40 || return
    if cmp -s "$tmp/$name/sample.txt" "$tmp/${model}_one/sample.txt"; then
        ok "$name: the 40-token sample equals one process's"
    else
        bad "$name: the sample differs from one process's"
    fi
    for r in "$name" "${model}_one"; do
        "$T" export "$tmp/$r" --format hf --out "$tmp/$r.hf" >"$tmp/$r.export.log" 2>&1 ||
            bad "$r: export failed: $(tail -1 "$tmp/$r.export.log")"
    done
    if e=$(hf_cmp "$tmp/$name.hf/model.safetensors" "$tmp/${model}_one.hf/model.safetensors" \
        "$(path_length "$tmp/${model}_one")"); then
        ok "$name: the Hugging Face export equals one process's: $e"
    else
        bad "$name: the Hugging Face export differs: $e"
    fi
}

# A bad layout of the gpt model: one line of ours naming the problem, a non-zero exit, before
# training.
layout_refused() { # name np expected-text flags...
    local name=$1 np=$2 want=$3 rc n
    shift 3
    timeout 60 mpirun -np "$np" "$T" run $(layout_recipe gpt) --out "$tmp/$name" "$@" \
        >"$tmp/$name.log" 2>&1
    rc=$?
    n=$(grep -c "^trainer\|^tests/recipes_good" "$tmp/$name.log")
    if [ "$rc" -ne 0 ] && [ "$n" -eq 1 ] && grep -qF -- "$want" "$tmp/$name.log" &&
        ! [ -e "$tmp/$name/metrics.jsonl" ]; then
        ok "$name: refused in one line: $(grep -F -- "$want" "$tmp/$name.log" | head -1)"
    else
        bad "$name: exit $rc, $n line(s) of ours"; cat "$tmp/$name.log"
    fi
}

# compare A B TOL: the worst relative difference of two "step loss" lists (losses) over the
# steps both have, and how many; fails above TOL (the device runs against the CPU's)
compare() {
    python3 - "$1" "$2" "$3" <<'PY'
import sys
a = dict(l.split() for l in open(sys.argv[1]))
b = dict(l.split() for l in open(sys.argv[2]))
steps = sorted(set(a) & set(b), key=int)
if not steps:
    print("no steps in common")
    sys.exit(1)
worst = max(abs(float(a[s]) - float(b[s])) / abs(float(b[s])) for s in steps)
print("%d steps, worst rel diff %.2e" % (len(steps), worst))
sys.exit(0 if worst <= float(sys.argv[3]) else 1)
PY
}
