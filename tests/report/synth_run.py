#!/usr/bin/env python3
"""A well-formed run folder of STEPS steps on 8 ranks (2 hosts) without training it, for
tests/report.sh: metrics.jsonl, ledger.jsonl (a window every 10 steps, saves, one straggler),
attempts.jsonl (attempt 1 killed at 62% of the steps, rank 5 with exit status 137, `trainer
supervise`'s record of the downtime and its cause, attempt 2 resumed from the last save to the
end), ranks.json, memory.json and provenance.json, in the formats trainer/train.c, ledger.c,
supervise_records.c and provenance_write.c write them. Deterministic (seeded).

usage: synth_run.py OUT_DIR STEPS"""
import json
import math
import os
import random
import sys

out, steps = sys.argv[1], int(sys.argv[2])
os.makedirs(out, exist_ok=True)
rng = random.Random(7)
R, hosts = 8, ["node-a"] * 4 + ["node-b"] * 4
T0, step_s, pred_s, tokens = 1700000000.0, 0.35, 0.33, 65536
mem = 20070400  # the fullest rank's bytes, measured = predicted (the lines coincide)
kill_at = max(2, int(steps * 0.62))
ckpt = max(1, steps // 10)
resume = kill_at // ckpt * ckpt
parts = ["compute_s", "comm_s", "wait_s", "data_s", "ckpt_s", "bubble_s", "eval_s", "log_s"]
dump = lambda f, rows: open(os.path.join(out, f), "w").write("".join(json.dumps(r) + "\n" for r in rows))

met, led, att = [], [], []
t = T0 + 3.0  # setup
att.append({"event": "start", "attempt": 1, "t": T0, "start_step": 0, "steps": steps, "ranks": R,
            "hosts": hosts, "devices": ["cpu, fp32"] * R, "layout": {"dp": R, "tp": 1, "pp": 1, "zero": 1},
            "command": f"mpirun -np {R} trainer run recipe.lua --steps {steps}"})


def train(attempt, first, last, t):
    win = []
    for s in range(first, last + 1):
        slow = 1.6 if 0.3 * steps <= s <= 0.34 * steps else 1.0  # rank 3 straggles for a while
        rc = [0.28 * (1 + 0.03 * rng.random()) * (slow if k == 3 else 1) for k in range(R)]
        dt = max(rc) + 0.05 + 0.01 * rng.random()
        t += dt
        loss = 2.0 + 3.5 * math.exp(-s / (steps / 5)) + 0.05 * rng.random()
        m = {"step": s, "loss": loss, "lr": 3e-4, "grad_norm": 1.2, "tokens_per_s": round(tokens / dt, 1),
             "gflops": round(150.0 / dt, 2), "time": round(t, 3), "attempt": attempt, "mfu": round(0.28 / (dt / 0.33), 4),
             "comm_hidden": 0.5, "rank_compute_s": [round(x, 6) for x in rc], "step_s": round(dt, 6),
             "predicted_step_s": pred_s, "memory_bytes": mem, "predicted_memory_bytes": mem}
        if s % max(1, steps // 20) == 0:
            m["val_loss"] = loss + 0.1
        met.append(m)
        win.append((s, t - dt, t, rc, dt))
        if len(win) == 10 or s == last:
            n = len(win)
            comp = [sum(w[3][k] for w in win) for k in range(R)]
            span = win[-1][2] - win[0][1]
            p = {"compute_s": [round(c, 6) for c in comp], "comm_s": [round(0.03 * n, 6)] * R,
                 "wait_s": [round(max(span - c - 0.05 * n, 0), 6) for c in comp],
                 "data_s": [round(0.002 * n, 6)] * R, "ckpt_s": [0.0] * R, "bubble_s": [0.0] * R,
                 "eval_s": [0.0] * R, "log_s": [round(0.001 * n, 6)] * R}
            led.append({"kind": "window", "attempt": attempt, "steps": [win[0][0], s],
                        "t": [round(win[0][1], 3), round(win[-1][2], 3)], "parts": p,
                        "flops": [1.5e10 * n] * R, "tokens": [tokens // R * n] * R,
                        "waited_on_s": [round(0.2 * n if k == 3 and 0.3 * steps <= s <= 0.35 * steps else 0.0, 6) for k in range(R)],
                        "waited_for": [3] * R})
            win = []
        if s % ckpt == 0:
            led.append({"kind": "save", "attempt": attempt, "step": s, "t": round(t, 3), "stall_s": 0.12})
        if s == int(0.32 * steps):
            led.append({"kind": "straggler", "attempt": attempt, "step": s, "rank": 3, "host": hosts[3],
                        "t": round(t, 3), "slowdown": 1.6, "cost_s_per_step": 0.17})
    return t


t = train(1, 1, kill_at, t)
att += [{"event": "stopped", "attempt": 1, "t": round(t + 0.5, 3), "rank": k, "host": hosts[k], "last_step": kill_at}
        for k in range(R) if k != 5]
last_seen = t + 0.5
# the supervisor noticed 1.134 s after the last record; it measured 2.31 s of downtime
att.append({"event": "supervisor", "attempt": 1, "t": round(last_seen + 1.134, 3), "down_s": 2.31,
            "steps_redone": kill_at - resume, "last_step": kill_at, "resume_step": resume,
            "cause": {"rank": 5, "host": hosts[5], "exit": "exit status 137"}, "action": "relaunch"})
t2 = last_seen + 1.176
att.append({"event": "start", "attempt": 2, "t": round(t2, 3), "start_step": resume, "steps": steps, "ranks": R,
            "hosts": hosts, "devices": ["cpu, fp32"] * R, "layout": {"dp": R, "tp": 1, "pp": 1, "zero": 1},
            "command": f"mpirun -np {R} trainer run recipe.lua --steps {steps} --resume"})
t = train(2, resume + 1, steps, t2 + 2.0)
att.append({"event": "end", "attempt": 2, "t": round(t + 0.2, 3), "last_step": steps, "status": 0})
att.append({"event": "supervisor", "attempt": 2, "t": round(t + 0.3, 3), "action": "done", "wall_s": round(t - T0, 3),
            "train_s": 1.0, "goodput": 0.9, "relaunches": 1, "steps_redone": kill_at - resume, "down_s": 2.31})
dump("metrics.jsonl", met)
dump("ledger.jsonl", led)
dump("attempts.jsonl", att)
kinds = [4718592, 4718592, 9437184, 1048576, 147456]  # sums to mem
json.dump([{"rank": k, "host": hosts[k], "device": "cpu, fp32", "steps": steps, "compute_s": 0.28 * steps,
            "wait_s": 0.05 * steps, "data_wait_s": 0.002 * steps, "memory_bytes": kinds, "predicted_bytes": kinds}
           for k in range(R)], open(os.path.join(out, "ranks.json"), "w"))
json.dump({"trainer": {"version": "0.17.0", "commit": "0000000"}, "backend": "cpu", "device": "cpu, fp32",
           "layout": {"dp": R, "tp": 1, "pp": 1, "zero": 1, "ranks": R, "hosts": sorted(set(hosts))},
           "seeds": {"train": 7}, "data": {"fingerprint": "0123456789abcdef", "val_fraction": 0.100000001},
           "recipe": "9f86d081884c7d65", "time": "2023-11-14T22:13:20Z", "resume": None},
          open(os.path.join(out, "provenance.json"), "w"))
