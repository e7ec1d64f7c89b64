#!/usr/bin/env bash
# Provenance (trainer/report/provenance.h): a tiny recipe trained on the CPU, in one process and in
# two
# (dp 2 under mpirun), then OUT/recipe.lua run again into another folder: the losses must be
# the same strings and the final parameters the same bytes, and the two provenance.json files
# must agree on every field that can change the numbers (tr_provenance_diff, through
# test_provenance --compare). Then every field a run must fill is checked, a layout change is
# told apart, and a --resume records its attempt.
# Usage: provenance.sh TRAINER TEST_PROVENANCE (from the source folder).
set -u
T="$1"
P="$2"
. tests/lib.sh
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
export OMP_NUM_THREADS=1
R=tests/recipes_good/dp_tiny.lua
q="--peak-gflops 10 --timeout 60"

# run NAME LAUNCH... -- ARGS: trainer run ARGS into $tmp/NAME, parameters in $tmp/NAME.params
run() {
    local name="$1"
    shift
    local launch=()
    while [ "$1" != -- ]; do launch+=("$1"); shift; done
    shift
    if ! TR_DUMP_PARAMS="$tmp/$name.params" timeout 120 "${launch[@]}" "$T" run "$@" \
        --out "$tmp/$name" $q >"$tmp/$name.log" 2>&1; then
        bad "$name: trainer run $* failed"
        tail -5 "$tmp/$name.log"
        return 1
    fi
}

# "step loss" as metrics.jsonl writes them: the text of each loss, not a number read back
loss_text() { sed -n 's/^{"step": \([0-9]*\), "loss": \([^,]*\),.*/\1 \2/p' "$1/metrics.jsonl"; }

# same NAME RERUN: bitwise equal losses and parameters, provenance bitwise comparable
same() {
    local a="$tmp/$1" b="$tmp/$2" v
    if [ -s "$a/metrics.jsonl" ] && [ "$(loss_text "$a" | wc -l)" -ge 4 ] &&
        [ "$(loss_text "$a")" = "$(loss_text "$b")" ]; then
        ok "$1: the rerun of OUT/recipe.lua logs the same loss strings ($(loss_text "$a" | wc -l) steps)"
    else
        bad "$1: the rerun's losses differ:"; diff <(loss_text "$a") <(loss_text "$b") | head -5
    fi
    if [ -s "$a.params" ] && cmp -s "$a.params" "$b.params"; then
        ok "$1: the rerun's final parameters are the same $(stat -c %s "$a.params") bytes"
    else
        bad "$1: the rerun's final parameters differ (or are missing)"
    fi
    "$P" --compare "$a/provenance.json" "$b/provenance.json" >"$tmp/cmp.txt" 2>&1
    v=$(sed -n 's/^verdict: //p' "$tmp/cmp.txt")
    if [[ "$v" == "bitwise comparable"* ]] && ! grep -q "^numbers" "$tmp/cmp.txt"; then
        ok "$1: provenance agrees on every field that can change the numbers: $v"
    else
        bad "$1: provenance: ${v:-no verdict}"; cat "$tmp/cmp.txt"
    fi
}

run one -- "$R" --steps 6 &&
    run one_again -- "$tmp/one/recipe.lua" && same one one_again
if command -v mpirun >/dev/null; then
    run dp2 mpirun -np 2 -- "$R" --steps 6 &&
        run dp2_again mpirun -np 2 -- "$tmp/dp2/recipe.lua" && same dp2 dp2_again
    # one process against two: the same experiment done another way
    v=$("$P" --compare "$tmp/one/provenance.json" "$tmp/dp2/provenance.json" | sed -n 's/^verdict: //p')
    [[ "$v" == "comparable within tolerance: differ in "*layout.dp* ]] &&
        ok "one process against dp 2: $v" || bad "one process against dp 2: '$v'"
else
    echo "(no mpirun: the dp 2 runs are skipped)"
fi

# the fields every run fills, with the shapes they must have
python3 - "$tmp/one/provenance.json" "$tmp/dp2/provenance.json" >"$tmp/fields.txt" 2>&1 <<'PY'
import json, os, re, sys
for path in sys.argv[1:]:
    if not os.path.exists(path):
        continue
    p = json.load(open(path))
    def get(dotted):
        v = p
        for k in dotted.split("."):
            v = v[k]
        return v
    must = ["trainer.version", "trainer.commit", "trainer.built", "trainer.binary", "build.type",
            "build.compiler", "build.flags", "build.cuda", "build.emulator", "build.sanitize",
            "build.native", "backend", "device", "libraries.blas", "libraries.mpi",
            "libraries.lua", "libraries.yaml", "command", "cwd", "data.train", "time"]
    for f in must:
        assert isinstance(get(f), str) and get(f).strip(), f"{f} is empty: {get(f)!r}"
    hexes = ["trainer.binary", "data.fingerprint", "recipe.file", "recipe.training"]
    for f in hexes:
        assert re.fullmatch(r"[0-9a-f]{16}", get(f)), f"{f} is not 16 hex digits: {get(f)!r}"
    assert re.fullmatch(r"\d+\.\d+\.\d+", p["trainer"]["version"]), p["trainer"]["version"]
    assert re.fullmatch(r"([0-9a-f]{7,40}(-dirty)?|unknown)", p["trainer"]["commit"])
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", p["time"]), p["time"]
    assert p["backend"] == "cpu" and p["driver"] is None, "the CPU has no driver"
    assert "peak" not in p["device"], "the device names no measured peak: " + p["device"]
    # the CUDA libraries a build links are named even when this run is on the CPU; a build
    # without CUDA names none (cuDNN: the backend does not link it)
    cuda = p["build"]["cuda"] == "ON"
    for f in ["cuda", "cublaslt"]:
        v = p["libraries"][f]
        assert (isinstance(v, str) and re.fullmatch(r"\d+(\.\d+)+", v)) if cuda else v is None, \
            f"libraries.{f} on a build with cuda {p['build']['cuda']}: {v!r}"
    assert p["libraries"]["cudnn"] is None, p["libraries"]["cudnn"]
    assert cuda or p["libraries"]["nccl"] is None, p["libraries"]["nccl"]
    n = p["ranks"]
    lay = p["layout"]
    assert lay["dp"] * lay["tp"] * lay["pp"] == n and lay["micro_batch"] >= 1, lay
    assert len(p["hosts"]) >= 1 and all(p["hosts"]), p["hosts"]
    assert p["seeds"]["train"] == 7, p["seeds"]
    assert " run " in p["command"] and p["resume"] is None and p["attempt"] == 1
    print(f"{path}: every field filled ({n} rank(s), dp {lay['dp']}, hosts {p['hosts']})")
PY
[ $? -eq 0 ] && ok "$(tr '\n' ' ' <"$tmp/fields.txt")" || { bad "provenance fields:"; cat "$tmp/fields.txt"; }

# --resume: the attempt and the step it resumed from; the first attempt's record kept (its
# command differs)
if run ck -- "$R" --steps 4 --set ckpt=2 &&
    run ck -- "$R" --steps 6 --set ckpt=2 --resume; then
    python3 - "$tmp/ck" <<'PY' >"$tmp/ck.txt" 2>&1
import json, sys
p = json.load(open(sys.argv[1] + "/provenance.json"))
first = json.load(open(sys.argv[1] + "/provenance.1.json"))
assert p["attempt"] == 2 and p["resume"] == 4, (p["attempt"], p["resume"])
assert first["attempt"] == 1 and first["resume"] is None and "--resume" not in first["command"]
print("attempt 2 resumed from step 4; attempt 1's record kept in provenance.1.json")
PY
    [ $? -eq 0 ] && ok "--resume: $(cat "$tmp/ck.txt")" || { bad "--resume:"; cat "$tmp/ck.txt"; }
fi

[ $fail -eq 0 ] && echo "provenance: all passed" || echo "provenance: FAILED"
exit $fail
