#!/usr/bin/env bash
# The planner against the machine, in one run:
#  1. For two recipes (bench/pp_gpt.lua: 8 blocks of width 256; bench/tp_gpt.lua: 2 blocks of
#     width 768) on 1, 2 and 4 MPI ranks of this machine: every mesh dp x tp x pp with ZeRO 0,
#     1 and 3 (the micro-batch and what else is open planned), run briefly; each run's
#     predicted step time (the cost model, for the topology the run detected) beside its
#     measured one (the median step after two of warm-up; each layout runs `reps` times, the
#     repetitions in separate passes over all layouts, and the fastest counts), Spearman's rank
#     correlation between them, and for each world size the planner's own choice (parallel
#     "auto", run the same way) against the fastest layout measured.
#  2. Narayanan et al. 2021, Table 1: each GPT planned on that many A100-80GB, 8 per node; the
#     published tp x pp and TFLOP/s per GPU beside the planner's (priced at the published
#     layout, and its own choice).
#  3. Planning time for a 70B model on 1,024 and 16,384 H100s.
# 4 ranks on 2 cores share them: the cost model sees that (the sgemm rate is measured on all
# ranks at once), but the runs are noisy; times are ratios within one run of this script.
# Usage: bench/planner.sh [steps] [reps]    (needs build/trainer built with MPI, and mpirun)
set -euo pipefail
cd "$(dirname "$0")/.."
steps="${1:-8}"
reps="${2:-2}"
T=${TRAINER:-build/trainer}
command -v mpirun >/dev/null || { echo "bench: needs mpirun (apt-get install openmpi-bin)"; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 - "$T" "$steps" "$tmp" "$reps" <<'PY'
import json, os, statistics, subprocess, sys, time

T, steps, tmp, reps = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
cores = os.cpu_count() or 1


def run(recipe, np, flags, name):
    out = os.path.join(tmp, name)
    cmd = [T, "run", recipe, "--set", "steps=%d" % steps, "--out", out, "--overwrite", "--peak-gflops", "1"] + flags
    if np > 1:
        cmd = ["mpirun", "-np", str(np)] + cmd
    env = dict(os.environ, OMP_NUM_THREADS=str(max(1, cores // np)))
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True)
    if r.returncode:
        return None
    rows = [json.loads(l) for l in open(out + "/metrics.jsonl")]
    rows = [x for x in rows if "step" in x][2:]
    plan = [l for l in r.stdout.splitlines() if l.startswith("plan: ")]
    return (statistics.median(x["predicted_step_s"] for x in rows),
            statistics.median(x["step_s"] for x in rows), plan[0][6:] if plan else "")


def ranks(v):
    order = sorted(range(len(v)), key=lambda i: v[i])
    r = [0.0] * len(v)
    i = 0
    while i < len(order):  # ties share their mean rank
        j = i
        while j + 1 < len(order) and v[order[j + 1]] == v[order[i]]:
            j += 1
        for k in range(i, j + 1):
            r[order[k]] = (i + j) / 2.0
        i = j + 1
    return r


def spearman(a, b):
    ra, rb = ranks(a), ranks(b)
    ma, mb = statistics.mean(ra), statistics.mean(rb)
    num = sum((x - ma) * (y - mb) for x, y in zip(ra, rb))
    den = (sum((x - ma) ** 2 for x in ra) * sum((y - mb) ** 2 for y in rb)) ** 0.5
    return num / den if den else float("nan")


def meshes(w):
    for tp in (1, 2, 4):
        for pp in (1, 2, 4):
            if w % (tp * pp) == 0:
                yield w // (tp * pp), tp, pp


def layouts(recipe):  # (world, label, flags): every mesh and ZeRO stage, then the planner's
    for w in (1, 2, 4):
        for dp, tp, pp in meshes(w):
            for zero in ((0, 1, 3) if dp > 1 else (0,)):
                yield w, "dp %d x tp %d x pp %d, ZeRO-%d" % (dp, tp, pp, zero), \
                    ["--dp", str(dp), "--tp", str(tp), "--pp", str(pp), "--zero", str(zero),
                     "--no-sequence-parallel"]
        yield w, "auto", []


def measure_all(recipe):  # label -> (predicted, fastest measured, plan line)
    got = {}
    for rep in range(reps):
        for w, label, flags in layouts(recipe):
            name = "%s_%d_%s_%d" % (os.path.basename(recipe), w, label.replace(" ", ""), rep)
            r = run(recipe, w, flags, name)
            key = (w, label)
            if r is None:
                got.setdefault(key, None)
            elif got.get(key) is None or r[1] < got[key][1]:
                got[key] = r
    return got


print("== 1. predicted and measured step time on this machine (%d cores), %d steps a run, "
      "the fastest of %d" % (cores, steps, reps))
for recipe in ("bench/pp_gpt.lua", "bench/tp_gpt.lua"):
    got = measure_all(recipe)
    print("\n%s" % recipe)
    print("%-3s %-34s %10s %10s %7s" % ("np", "layout", "predicted", "measured", "pred/meas"))
    pred, meas = [], []
    for w in (1, 2, 4):
        best = None
        for ww, label, flags in layouts(recipe):
            if ww != w or label == "auto":
                continue
            r = got[(w, label)]
            if r is None:
                print("%-3d %-34s %10s" % (w, label, "refused"))
                continue
            print("%-3d %-34s %9.4fs %9.4fs %7.2f" % (w, label, r[0], r[1], r[0] / r[1]))
            pred.append(r[0])
            meas.append(r[1])
            if best is None or r[1] < best[1]:
                best = (label, r[1])
        auto = got[(w, "auto")]
        if auto and best:
            print("%-3d planner's choice: %s" % (w, auto[2]))
            print("    measured %.4fs, the fastest above %.4fs (%s): %+.1f%%" %
                  (auto[1], best[1], best[0], 100 * (auto[1] / best[1] - 1)))
    if len(pred) > 1:
        print("Spearman's rank correlation of predicted and measured step times: %.3f over %d "
              "runs" % (spearman(pred, meas), len(pred)))

print("\n== 2. Narayanan et al. 2021, Table 1, on A100-80GB x 8 per node (recompute full)")
table = [(24, 2304, 24, 512, 32, 1, 1, 137), (30, 3072, 32, 512, 64, 2, 1, 138),
         (36, 4096, 32, 512, 128, 4, 1, 142), (40, 6144, 48, 1024, 256, 8, 1, 135),
         (48, 8192, 64, 1536, 512, 8, 2, 138), (60, 10240, 80, 1792, 1024, 8, 4, 140),
         (80, 12288, 96, 2304, 1536, 8, 8, 148), (96, 16384, 128, 2160, 1920, 8, 16, 155),
         (105, 20480, 128, 2520, 2520, 8, 35, 163), (128, 25600, 160, 3072, 3072, 8, 64, 163)]
print("%-7s %5s | %-10s %6s | %-44s %6s %6s | %6s" % ("model", "GPUs", "published", "TF/GPU",
      "planned", "TF/GPU", "vs pub", "at pub"))


def plan(args):
    r = subprocess.run([T, "plan"] + args + ["--json", "--alternatives", "0"],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return json.loads(r.stdout) if r.stdout.startswith("{") else None


for l, h, a, b, g, tp, pp, pub in table:
    s, V = 2048, 51200
    flops = 96 * b * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))
    params = (12 * l * h * h + 13 * l * h + (V + s) * h) / 1e9
    base = ["bench/megatron_gpt.lua", "--set", "layers=%d" % l, "--set", "width=%d" % h,
            "--set", "heads=%d" % a, "--set", "batch=%d" % b, "--gpus", str(g), "--gpu",
            "A100-80GB"]
    own, at = plan(base), plan(base + ["--tp", str(tp), "--pp", str(pp)])
    tf = lambda d: flops / d["plan"]["predicted"]["step_s"] / g / 1e12 if d and d["fits"] else 0
    p = own["plan"] if own else {}
    desc = "dp %d x tp %d x pp %d, ZeRO-%d, mb %d" % (p.get("dp", 0), p.get("tp", 0),
                                                    p.get("pp", 0), p.get("zero", 0),
                                                    p.get("micro_batch", 0))
    print("%6.1fB %5d | tp %d x pp %2d %6d | %-44s %6.0f %+5.0f%% | %6.0f" %
          (params, g, tp, pp, pub, desc, tf(own), 100 * (tf(own) / pub - 1), tf(at)))

print("\n== 3. planning time (the search and the exact check of the plans shown)")
for n in (1024, 16384):
    t0 = time.time()
    d = plan(["bench/llama_70b.lua", "--gpus", str(n), "--gpu", "H100-80GB"])
    wall = time.time() - t0
    p = d["plan"]
    print("70B on %5d H100s: search %.3f s (%d layouts), the whole command %.2f s: "
          "dp %d x tp %d x pp %d %s, ZeRO-%d, MFU %.1f%%" %
          (n, d["search"]["seconds"], d["search"]["evaluated"], wall, p["dp"], p["tp"], p["pp"],
           p["schedule"], p["zero"], 100 * p["predicted"]["mfu"]))
PY
