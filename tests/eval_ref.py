#!/usr/bin/env python3
"""An independent reference for `trainer eval`'s multiple-choice scores (tests/eval.sh).

Reads the task files itself (the rules README.md gives for the two formats), gets every logit
of each (context + completion) from `trainer sample CKPT --prompt TEXT --logits-out FILE`,
computes log-softmax and the completions' log-likelihoods in float64 (plain Python: math.fsum,
no numpy needed), and checks them, and acc / acc_norm, against what
`trainer eval --json --details FILE` reported.

usage: eval_ref.py TRAINER CKPT byte|gpt2 SEQ_LEN EVAL_JSON DETAILS TASK...
Exits 1 with the differences listed; prints one summary line when all agree.
"""
import array, json, math, os, subprocess, sys, tempfile

trainer, ckpt, tokenizer, L, eval_json, details = sys.argv[1:7]
tasks, L = sys.argv[7:], int(L)
tmp = tempfile.mkdtemp()


def sample_logits(prompt):
    """The prompt's ids (its last L) and their logits (N, V) as sample writes them."""
    path = os.path.join(tmp, "logits.bin")
    out = subprocess.run([trainer, "sample", ckpt, "--prompt", prompt, "--logits-out", path],
                         capture_output=True, check=True).stdout.decode()
    ids = [int(i) for i in out.split("prompt ids:")[1].split()]
    flat = array.array("f", open(path, "rb").read())  # float32, little-endian like the host
    V = len(flat) // len(ids)
    return ids, [flat[r * V:(r + 1) * V] for r in range(len(ids))]


def log_softmax_at(row, target):
    m = max(row)
    return row[target] - (m + math.log(math.fsum(math.exp(x - m) for x in row)))


def examples(path):
    """(line, context, completions, lengths, answer) per example, as README.md describes."""
    for no, line in enumerate(open(path, encoding="utf-8"), 1):
        if not line.strip():
            continue
        d = json.loads(line)
        if "endings" in d:  # HellaSwag: " " + each ending; acc_norm divides by len(ending)
            ctx = d["ctx"] if "ctx" in d else d["ctx_a"] + " " + d["ctx_b"]
            yield no, ctx, [" " + e for e in d["endings"]], [len(e) for e in d["endings"]], int(d["label"])
        else:
            yield no, d["context"], d["choices"], [len(c) for c in d["choices"]], d["answer"]


def loglik(ctx, comp):
    """lm-evaluation-harness's rule: trailing whitespace of the context moves to the
    completion; the completion's tokens are what encoding the whole adds to the context's."""
    stripped = ctx.rstrip(" \t\n\r\v\f")
    comp, ctx = ctx[len(stripped):] + comp, stripped
    whole = (ctx + comp).encode()
    if tokenizer == "byte":
        # bytes are tokens: the window eval runs is the last L + 1 of them, inputs the first L
        ids, ncomp = list(whole), len(comp.encode())
        s = max(0, len(ids) - (L + 1))
        got, logits = sample_logits(whole[s:-1])
        assert got == ids[s:-1], (got, ids)
        targets = ids[s + 1:]
    else:  # the fixtures stay under L tokens: no truncation to mirror
        ids, logits = sample_logits(whole)
        nctx = len(sample_logits(ctx.encode())[0])
        assert len(ids) < L, "a BPE fixture longer than seq_len"
        ncomp, targets, logits = len(ids) - nctx, ids[1:], logits[:-1]
    k = min(ncomp, len(targets))
    rows = range(len(targets) - k, len(targets))
    return math.fsum(log_softmax_at(logits[r], targets[r]) for r in rows), k


got = json.load(open(eval_json))
det = {}
for line in open(details):
    d = json.loads(line)
    det[(d["task"], d["line"])] = d
bad, worst, checked = [], 0.0, 0
for ti, path in enumerate(tasks):
    name = os.path.splitext(os.path.basename(path))[0]
    acc = acc_norm = n = 0
    for no, ctx, comps, lens, answer in examples(path):
        ref = [loglik(ctx, c) for c in comps]
        lls = [r[0] for r in ref]
        mine = det[(name, no)]
        for k, (ll, ntok) in enumerate(ref):
            # Both sides start from the same float32 logits (the same model, the same window).
            # trainer's head takes the log-sum-exp in float32: about 1e-6 relative per token
            # on values of a few tens; summed over ntok tokens, 2e-5 per token is ample and
            # still far below the gaps between choices that decide acc.
            err = abs(mine["loglik"][k] - ll)
            worst = max(worst, err)
            checked += 1
            if err > 2e-5 * ntok + 1e-6 * abs(ll):
                bad.append(f"{name}:{no} choice {k}: eval {mine['loglik'][k]!r}, numpy {ll!r} ({ntok} tokens)")
        if mine["length"] != lens:
            bad.append(f"{name}:{no}: lengths {mine['length']} != {lens}")
        pred = max(range(len(lls)), key=lambda k: (lls[k], -k))  # the first of equals
        pred_norm = max(range(len(lls)), key=lambda k: (lls[k] / lens[k], -k))
        if (mine["pred"], mine["pred_norm"]) != (pred, pred_norm):
            bad.append(f"{name}:{no}: pred {mine['pred']},{mine['pred_norm']} != {pred},{pred_norm}")
        acc += pred == answer
        acc_norm += pred_norm == answer
        n += 1
    t = got["tasks"][ti]
    if (t["name"], t["n"], t["acc"], t["acc_norm"]) != (name, n, acc / n, acc_norm / n):
        bad.append(f"{name}: eval {t}, numpy n {n} acc {acc / n} acc_norm {acc_norm / n}")
if bad:
    print("\n".join(bad))
    sys.exit(1)
print(f"{checked} choices' log-likelihoods within tolerance (largest difference {worst:.2g})")
