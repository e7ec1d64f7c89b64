# Sourced by the shell tests that compare training runs: ok/bad result lines (bad sets
# fail=1) and the losses of a metrics.jsonl.
fail=0
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
# Data or tensor parallelism against one process with the same global batch. Float32 sums in
# another order round differently (each rank sums its micro-batches, then the ranks' sums are
# added; BLAS blocks a sum differently for a different number of rows) and 20 Adam steps
# amplify that by an amount that depends on the CPU and its BLAS kernels: no constant bounds
# it on every machine (the largest difference of dp.sh's runs from one process was 6e-6 to
# 2e-5 here, by the seed and the OpenBLAS kernels). So the bound is measured where the test
# runs: the single process again with other micro-batch sizes (the same global batch, so
# mathematically the same steps: only the order of the sums and the BLAS blocking change;
# choose sizes that give the shapes the compared runs compute), and the largest difference
# between any two of those runs is the noise that accumulation order alone makes here.
#
# A run is a path prefix P: P/metrics.jsonl (`trainer run --out P`) and P.params (the final
# parameters, float32 little-endian: TR_DUMP_PARAMS=P.params). Between runs A and B:
#   losses      max over the logged steps of |A - B|, loss and val_loss (absolute: printed
#               with 6 decimals; floor 1e-6, one unit of the last digit)
#   grad norms  max over the steps of |A - B| / |B| (printed with 6 significant digits;
#               floor 1e-5, one unit of the last digit at worst). A wrong gradient scale shows
#               here: gradient clipping and Adam's division by sqrt(v) hide most of it from the
#               losses and the parameters
#   params      max |A - B| / max |B| (floor 2^-20, 8 float32 ulps of a parameter in [1, 2):
#               reorderings that agree to the bit mean that the order does not matter here)
# Every run's memory (the fullest rank's, each step) must be what its layout predicted, else
# the comparison fails too. The runs must log the same steps (the last record of a step wins: a resumed run repeats
# steps) and hold the same number of parameters, else the comparison fails.
#
#   noise=$(run_noise P0 P1 P2...)  "L G P": the largest of each difference over every pair
#   cmp_run "$noise" A B            prints A's differences to B, each as a multiple of
#                                   max(noise, floor), and returns 1 if one exceeds noise_k
#
# noise_k: the noise is the largest of a few draws of the rounding noise, and the parallel run
# is one more draw (its own order of the same sums), so it can exceed them. Over dp.sh's
# configs, with seeds 1-5 and 7 and OpenBLAS's Prescott (this machine's), Haswell and
# SkylakeX kernels (OPENBLAS_CORETYPE; Sandybridge with seed 7), the largest data-parallel
# difference of the parameters was 0.75 to 1.61 times the noise (the losses and grad norms
# stayed at their printing floor). 3 leaves room for that spread, and real bugs still stand
# far out (measured, by sabotaging a copy): a bucket left out of the reduction is over 1000
# times the noise, one parameter moved by 1e-3 mid-run 145 times, a gradient scale off by
# 1e-3 100 times (in the grad norms; 3.6 times in the parameters). What is within a few times
# the rounding noise no end-to-end comparison can tell from it (tests/test_comm.c checks the
# collectives themselves).
noise_k=3

_run_diff() { # noise P... | cmp K L G P A B
    python3 - "$@" <<'PY'
import array, itertools, json, math, sys

FLOOR = (1e-6, 1e-5, 2.0**-20)


def fail(msg):  # on stdout: the caller shows it in its FAIL line
    print(msg)
    sys.exit(1)


def load(p):
    rows = {}  # step: (loss, val_loss or None, grad_norm)
    try:
        for line in open(p + "/metrics.jsonl"):
            m = json.loads(line)
            if "step" not in m:  # the plan's record
                continue
            # the planner's prediction of the fullest rank's memory is what it allocates
            if m.get("memory_bytes") != m.get("predicted_memory_bytes"):
                fail(f"{p}: step {m['step']}: memory {m.get('memory_bytes')} bytes, "
                     f"predicted {m.get('predicted_memory_bytes')}")
            rows[m["step"]] = (float(m["loss"]), m.get("val_loss"), float(m["grad_norm"]))
        a = array.array("f")
        with open(p + ".params", "rb") as f:
            b = f.read()
    except (OSError, ValueError, KeyError, TypeError) as e:
        fail(f"{p}: {type(e).__name__}: {e}")
    if not b or len(b) % 4:
        fail(f"{p}.params: {len(b)} bytes, not float32 parameters")
    a.frombytes(b)
    if sys.byteorder != "little":
        a.byteswap()
    return p, rows, a


def top(values):  # the largest; NaN or infinity (a run that diverged) is infinitely far
    m = max(values, default=0.0)
    return m if all(map(math.isfinite, values)) else math.inf


def diff(x, y):
    (na, ra, pa), (nb, rb, pb) = x, y
    if sorted(ra) != sorted(rb) or not ra:
        fail(f"{na} logs {len(ra)} steps, {nb} {len(rb)}, not the same ones")
    if len(pa) != len(pb):
        fail(f"{na} holds {len(pa)} parameters, {nb} {len(pb)}")
    losses, grads = [], []
    for s in ra:
        (la, va, ga), (lb, vb, gb) = ra[s], rb[s]
        if (va is None) != (vb is None):
            fail(f"step {s}: val_loss in one of {na} and {nb} only")
        losses += [abs(la - lb)] + ([abs(va - vb)] if va is not None else [])
        grads.append(abs(ga - gb) / abs(gb) if gb else abs(ga - gb))
    dev = [abs(p - q) for p, q in zip(pa, pb)]
    den = top([abs(v) for v in pb]) or 1.0
    return top(losses), top(grads), top(dev) / den if math.isfinite(den) else math.inf


if sys.argv[1] == "noise":
    runs = [load(p) for p in sys.argv[2:]]
    ds = [diff(a, b) for a, b in itertools.combinations(runs, 2)]
    print(" ".join("%.3e" % max(d[i] for d in ds) for i in range(3)))
else:
    k = float(sys.argv[2])
    noise = [float(v) for v in sys.argv[3:6]]
    d = diff(load(sys.argv[6]), load(sys.argv[7]))
    scale = [max(n, f) for n, f in zip(noise, FLOOR)]
    print(", ".join("%s %.2e (%.1f x)" % (w, v, v / s)
                    for w, v, s in zip(("losses", "grad norms", "params"), d, scale))
          + "; limit %g x" % k)
    sys.exit(0 if all(v <= k * s for v, s in zip(d, scale)) else 1)
PY
}
run_noise() { _run_diff noise "$@"; }
cmp_run() { # "L G P" A B
    local n
    read -r -a n <<<"$1"
    [ "${#n[@]}" -eq 3 ] || { echo "cmp_run: the noise '$1' is not three numbers"; return 1; }
    _run_diff cmp "$noise_k" "${n[@]}" "$2" "$3"
}

# ---- Shared by the layout tests (tp.sh, pp.sh) -----------------------------------------
# They define recipe MODEL (the recipe and its --set), run NAME NP MODEL [flags...], T (the
# trainer), tmp and noise[MODEL] (run_noise's figures).

# Checkpoints across layouts: saved at step 5 (the run then killed), resumed in another layout;
# the ten steps and the final parameters are the single process's.
resume_pair() { # model name np-save "save flags" np-resume "resume flags"
    local model=$1 name=$2 np1=$3 f1=$4 np2=$5 f2=$6
    local save=("$T" run $(recipe "$model") --out "$tmp/$name" --peak-gflops 10 --set ckpt=5 $f1)
    [ "$np1" -gt 1 ] && save=(timeout 300 mpirun -np "$np1" "${save[@]}")
    (TR_FAULT_KILL_AFTER_STEP=5 "${save[@]}" >"$tmp/$name.save.log" 2>&1; true) 2>/dev/null # killed
    [ -f "$tmp/$name/checkpoints/step_00000005/manifest.yaml" ] || { bad "$name: no checkpoint at step 5"; return; }
    run "$name" "$np2" "$model" --set ckpt=5 --resume $f2 || return
    grep -q "resuming from .*step_00000005" "$tmp/$name.log" || { bad "$name: did not resume"; return; }
    if e=$(cmp_run "${noise[$model]}" "$tmp/$name" "$tmp/${model}_one"); then
        ok "$name: resumed in another layout, equal to one process: $e"
    else
        bad "$name: resumed run differs: $e"
    fi
}

# Two Hugging Face model.safetensors files: the same tensors and shapes, and values within
# noise_k times the parameters' noise (or its floor) of the largest; prints the difference.
hf_cmp() { # A B params-noise
    python3 - "$1" "$2" "$3" "$noise_k" <<'PY'
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
top = max(max(abs(x) for x in t) for t in b.values())
d = max(max(abs(x - y) for x, y in zip(a[k], b[k])) for k in a) / top
lim = float(sys.argv[4]) * max(float(sys.argv[3]), 2.0**-20)
print("%d tensors, max diff %.2e of the largest (limit %.2e)" % (len(a), d, lim))
sys.exit(0 if d <= lim else 1)
PY
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
