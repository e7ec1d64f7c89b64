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
    seen[m["step"]] = "%.6f" % m["loss"]
for s in sorted(seen):
    print(s, seen[s])
PY
}
