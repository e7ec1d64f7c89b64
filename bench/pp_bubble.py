#!/usr/bin/env python3
"""Where a pipeline's bubble goes, from a run's trace (`trainer run --trace N`: OUT/trace.json).

For each traced step, each rank's actions (F, B, or zero-bubble's Bi and W, with micro-batch
and chunk) run again in a simulation, in the order the rank ran them, each starting when the
rank is free and what it needs has been computed (a forward the previous chunk's forward of its
micro-batch, a backward the next chunk's backward, or its own chunk's forward on the last),
with transfers free:
  theory     every forward 1 unit, every backward 2 (Bi and W 1 each): the schedule's own
             bubble (tr_pp_bubble's assumption)
  durations  each action as long as it measured: what the schedule gives with this machine's
             real (and unequal) forwards, backwards, weight parts and stages
  measured   each rank's idle share of its step as the executor measured it (1 - compute /
             span, the span ending when the stages leave the step's closing reduction)
so that measured - theory = (durations - theory: the actions' real lengths)
                          + (measured - durations: transfers, waits for sends and the
                             executor's own work between actions).
Idle shares are means over the ranks, and medians over the traced steps.
Usage: bench/pp_bubble.py TRACE.json [--json]"""
import json
import statistics
import sys

COMPUTE = ("F", "B", "Bi", "W")


def steps_of(events):
    """{step: {rank: [event, ...] in time order}}"""
    out = {}
    for e in events:
        if e.get("ph") != "X":
            continue
        out.setdefault(e["args"]["step"], {}).setdefault(e["tid"], []).append(e)
    for ranks in out.values():
        for evs in ranks.values():
            evs.sort(key=lambda e: e["ts"])
    return out


def simulate(order, dur):
    """order: {rank: [(name, mb, chunk), ...]}; dur(rank, action) -> length. Returns each rank's
    idle share of the span (every rank starts at 0; the span ends with the last action)."""
    done, free, busy = {}, {r: 0.0 for r in order}, {r: 0.0 for r in order}
    last = max(c for acts in order.values() for (_, _, c) in acts)
    pos = {r: 0 for r in order}
    left = sum(len(a) for a in order.values())
    while left:
        moved = False
        for r, acts in order.items():
            while pos[r] < len(acts):
                name, mb, c = acts[pos[r]]
                if name == "F":
                    need = ("F", mb, c - 1) if c > 0 else None
                elif name == "W":
                    need = ("Bi", mb, c)
                else:  # B or Bi: the next chunk's input gradient, or this chunk's forward
                    need = ("B", mb, c + 1) if c < last else ("F", mb, c)
                if need and need[0] == "B" and need not in done:
                    need = ("Bi", mb, c + 1)  # zero-bubble: the input-gradient part
                if need and need not in done:
                    break
                start = max(free[r], done[need] if need else 0.0)
                d = dur(r, acts[pos[r]])
                free[r] = start + d
                busy[r] += d
                done[(name, mb, c)] = free[r]
                pos[r] += 1
                left -= 1
                moved = True
        if not moved:
            raise SystemExit("pp_bubble: the trace's actions cannot complete (a step cut short?)")
    span = max(free.values())
    return {r: 1 - busy[r] / span for r in order}


def analyse(path):
    d = json.load(open(path))
    per_step = []
    for step, ranks in sorted(steps_of(d["traceEvents"]).items()):
        order, length, measured = {}, {}, {}
        for r, evs in ranks.items():
            acts = [e for e in evs if e["name"] in COMPUTE]
            if not acts:
                continue
            order[r] = [(e["name"], e["args"]["mb"], e["args"]["chunk"]) for e in acts]
            for e in acts:
                length[(r, e["name"], e["args"]["mb"], e["args"]["chunk"])] = e["dur"]
            pipe = [e for e in evs if e["name"] not in ("step", "update", "grads", "model")]
            end = [e for e in evs if e["name"] == "step end"]
            t0 = pipe[0]["ts"]
            t1 = end[-1]["ts"] + end[-1]["dur"] if end else acts[-1]["ts"] + acts[-1]["dur"]
            measured[r] = 1 - sum(e["dur"] for e in acts) / (t1 - t0)
        if len(order) < 2:
            continue
        unit = {"F": 1, "B": 2, "Bi": 1, "W": 1}
        theory = simulate(order, lambda r, a: unit[a[0]])
        real = simulate(order, lambda r, a: length[(r,) + a])
        means = {k: statistics.mean(v for (r, n, _, _), v in length.items() if n == k)
                 for k in COMPUTE if any(n == k for (_, n, _, _) in length)}
        per_step.append({"stage_ms": {r: sum(v for (q, _, _, _), v in length.items() if q == r) / 1e3
                                      for r in order},
                         "theory": statistics.mean(theory.values()),
                         "durations": statistics.mean(real.values()),
                         "measured": statistics.mean(measured.values()),
                         "ms": {k: v / 1e3 for k, v in means.items()}})
    if not per_step:
        raise SystemExit("pp_bubble: %s holds no pipeline step of two ranks or more" % path)
    med = lambda k: statistics.median(s[k] for s in per_step)
    ms = {k: statistics.median(s["ms"][k] for s in per_step if k in s["ms"])
          for k in COMPUTE if any(k in s["ms"] for s in per_step)}
    stage = [statistics.median(s["stage_ms"][r] for s in per_step if r in s["stage_ms"])
             for r in sorted(per_step[0]["stage_ms"])]
    return {"steps": len(per_step), "theory": med("theory"), "durations": med("durations"),
            "measured": med("measured"), "action_ms": ms, "stage_compute_ms": stage}


def main():
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    a = analyse(sys.argv[1])
    if "--json" in sys.argv[2:]:
        print(json.dumps(a))
        return
    print("steps %d: bubble theory %.1f%%, at the measured durations %.1f%%, measured %.1f%%"
          % (a["steps"], 100 * a["theory"], 100 * a["durations"], 100 * a["measured"]))
    print("  actions' lengths: %.1f pts; transfers and the executor: %.1f pts"
          % (100 * (a["durations"] - a["theory"]), 100 * (a["measured"] - a["durations"])))
    print("  mean action ms: " + ", ".join("%s %.2f" % kv for kv in a["action_ms"].items()))
    print("  each stage's compute per step, ms: " +
          ", ".join("%.1f" % v for v in a["stage_compute_ms"]))


if __name__ == "__main__":
    main()
