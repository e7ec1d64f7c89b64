#!/usr/bin/python3
"""Generate the PyTorch reference fixtures tiny_gpt.bin and tiny_llama.bin.

Usage (Debian's python3 with python3-torch / python3-numpy):
    /usr/bin/python3 tests/reference/make_fixtures.py            # write + check + selftest
    /usr/bin/python3 tests/reference/make_fixtures.py --check    # re-read and verify existing files
    /usr/bin/python3 tests/reference/make_fixtures.py --selftest # model vs naive loop reference

Binary format (little endian):
    "TRFX" | u32 version=1 | u32 count
    count x: u32 name_len | name | u32 dtype (0 f32, 1 i32) | u32 ndim | u32 dims[ndim] | data
Entries: config, tokens, targets, param:<name>..., logits, loss, grad:<name>...,
         adamw_losses, final:<name>...
"""
import argparse
import os
import struct
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from torch_model import TorchModel  # noqa: E402

MAGIC = b"TRFX"
VERSION = 1
B = 2
ADAMW_STEPS = 10
ADAMW = dict(lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
CLIP = 1.0

CONFIGS = {
    "tiny_gpt": dict(flavour="gpt", vocab=64, dim=32, seq_len=16, n_blocks=2, heads=4,
                     kv_heads=4, hidden=128, seed=1234),
    "tiny_llama": dict(flavour="llama", vocab=64, dim=32, seq_len=16, n_blocks=2, heads=4,
                       kv_heads=2, hidden=64, rope_theta=10000.0, seed=5678),
}


# ---------------------------------------------------------------- file I/O
def write_fixture(path, entries):
    """entries: list of (name, np.ndarray float32 or int32)."""
    with open(path, "wb") as f:
        f.write(MAGIC + struct.pack("<II", VERSION, len(entries)))
        for name, a in entries:
            a = np.asarray(a)
            if a.dtype == np.float32:
                dt = 0
            elif a.dtype == np.int32:
                dt = 1
            else:
                raise TypeError(f"{name}: dtype {a.dtype}")
            nb = name.encode()
            f.write(struct.pack("<I", len(nb)) + nb)
            f.write(struct.pack("<II", dt, a.ndim))
            f.write(struct.pack(f"<{a.ndim}I", *a.shape))
            f.write(np.ascontiguousarray(a).astype(a.dtype.newbyteorder("<")).tobytes())


def read_fixture(path):
    """Returns an ordered list of (name, np.ndarray)."""
    with open(path, "rb") as f:
        buf = f.read()
    assert buf[:4] == MAGIC, "bad magic"
    ver, count = struct.unpack_from("<II", buf, 4)
    assert ver == VERSION, ver
    off = 12
    out = []
    for _ in range(count):
        (nl,) = struct.unpack_from("<I", buf, off); off += 4
        name = buf[off:off + nl].decode(); off += nl
        dt, nd = struct.unpack_from("<II", buf, off); off += 8
        dims = struct.unpack_from(f"<{nd}I", buf, off); off += 4 * nd
        dtype = {0: "<f4", 1: "<i4"}[dt]
        n = int(np.prod(dims)) if nd else 1
        a = np.frombuffer(buf, dtype=dtype, count=n, offset=off).reshape(dims)
        off += 4 * n
        out.append((name, a.copy()))
    assert off == len(buf), f"trailing bytes: {len(buf) - off}"
    return out


# ---------------------------------------------------------------- generation
def init_params(model, rng):
    arrays = []
    for name, p in model.params():
        shape = tuple(p.shape)
        if name.endswith(".bias"):
            a = 0.1 * rng.standard_normal(shape)
        elif p.ndim == 1:  # norm weights
            a = 1.0 + 0.1 * rng.standard_normal(shape)
        else:
            a = rng.normal(0.0, 0.1, shape)
        arrays.append(a.astype(np.float32))
    return arrays


def config_vector(cfg):
    return np.array([0 if cfg["flavour"] == "gpt" else 1, cfg["vocab"], cfg["dim"],
                     cfg["seq_len"], B, cfg["n_blocks"], cfg["heads"], cfg["kv_heads"],
                     cfg["hidden"]], dtype=np.int32)


def build(cfg):
    rng = np.random.default_rng(cfg["seed"])
    model = TorchModel(cfg).double()
    p32 = init_params(model, rng)
    T, V = cfg["seq_len"], cfg["vocab"]
    tokens = rng.integers(0, V, size=(B, T)).astype(np.int32)
    targets = rng.integers(0, V, size=(B, T)).astype(np.int32)
    model.load_numpy([a.astype(np.float64) for a in p32])
    tok = torch.from_numpy(tokens.astype(np.int64))
    tgt = torch.from_numpy(targets.astype(np.int64))

    # forward + backward
    logits, loss = model(tok, tgt)
    loss.backward()
    names = [n for n, _ in model.params()]
    grads = [p.grad.detach().numpy().astype(np.float32) for _, p in model.params()]
    logits32 = logits.detach().numpy().astype(np.float32)
    loss32 = np.array([loss.item()], dtype=np.float32)

    # AdamW on the same batch, from the same initial params
    model.load_numpy([a.astype(np.float64) for a in p32])
    model.zero_grad(set_to_none=True)
    opt = model.adamw(**ADAMW)
    losses = []
    for _ in range(ADAMW_STEPS):
        opt.zero_grad(set_to_none=True)
        _, l = model(tok, tgt)
        losses.append(l.item())
        l.backward()
        torch.nn.utils.clip_grad_norm_([p for _, p in model.params()], CLIP)
        opt.step()
    final = [p.detach().numpy().astype(np.float32) for _, p in model.params()]

    entries = [("config", config_vector(cfg)), ("tokens", tokens), ("targets", targets)]
    entries += [("param:" + n, a) for n, a in zip(names, p32)]
    entries += [("logits", logits32), ("loss", loss32)]
    entries += [("grad:" + n, a) for n, a in zip(names, grads)]
    entries += [("adamw_losses", np.array(losses, dtype=np.float32))]
    entries += [("final:" + n, a) for n, a in zip(names, final)]
    return entries


# ---------------------------------------------------------------- checks
def check(path, expected=None):
    ents = read_fixture(path)
    names = [n for n, _ in ents]
    d = dict(ents)
    cv = d["config"]
    flavour, V, C, T, Bb, nb, H, KV, hidden = [int(x) for x in cv]
    cfg = dict(flavour=["gpt", "llama"][flavour], vocab=V, dim=C, seq_len=T, n_blocks=nb,
               heads=H, kv_heads=KV, hidden=hidden)
    model = TorchModel(cfg).double()
    pn = [n for n, _ in model.params()]
    want = (["config", "tokens", "targets"] + ["param:" + n for n in pn] + ["logits", "loss"]
            + ["grad:" + n for n in pn] + ["adamw_losses"] + ["final:" + n for n in pn])
    assert names == want, "entry order mismatch"
    for n, p in model.params():
        for pre in ("param:", "grad:", "final:"):
            assert d[pre + n].shape == tuple(p.shape), (pre + n, d[pre + n].shape)
            assert d[pre + n].dtype == np.float32
    assert d["tokens"].shape == (Bb, T) and d["tokens"].dtype == np.int32
    assert d["logits"].shape == (Bb, T, V)
    assert d["tokens"].min() >= 0 and d["tokens"].max() < V
    # Byte-exact round trip against freshly generated entries.
    if expected is not None:
        assert [n for n, _ in expected] == names
        for (n, a), (_, b) in zip(expected, ents):
            assert a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b), n
    # Recompute forward/grad from the stored float32 params and compare.
    model.load_numpy([d["param:" + n].astype(np.float64) for n in pn])
    tok = torch.from_numpy(d["tokens"].astype(np.int64))
    tgt = torch.from_numpy(d["targets"].astype(np.int64))
    logits, loss = model(tok, tgt)
    loss.backward()
    assert np.allclose(logits.detach().numpy(), d["logits"], rtol=1e-6, atol=1e-6)
    assert abs(loss.item() - float(d["loss"][0])) < 1e-6
    for n, p in model.params():
        assert np.allclose(p.grad.numpy(), d["grad:" + n], rtol=1e-5, atol=1e-8), n
    assert abs(float(d["adamw_losses"][0]) - float(d["loss"][0])) < 1e-6
    size = os.path.getsize(path)
    print(f"{os.path.basename(path)}: OK  {len(ents)} entries, {size} bytes, "
          f"loss {float(d['loss'][0]):.6f}, adamw_losses "
          + " ".join(f"{x:.4f}" for x in d["adamw_losses"]))


def naive_forward(cfg, arrays, tokens):
    """Independent, loop-based numpy float64 forward (no torch) for cross-checking."""
    flavour = cfg["flavour"]
    V, C, T = cfg["vocab"], cfg["dim"], cfg["seq_len"]
    H, KV, hidden, nb = cfg["heads"], cfg["kv_heads"], cfg["hidden"], cfg["n_blocks"]
    hd = C // H
    theta = cfg.get("rope_theta", 10000.0)
    eps = 1e-5
    it = iter([a.astype(np.float64) for a in arrays])
    nxt = lambda: next(it)  # noqa: E731
    Bn, Tn = tokens.shape

    def ln(x, w, b):
        m = x.mean(); v = ((x - m) ** 2).mean()
        return (x - m) / np.sqrt(v + eps) * w + b

    def rms(x, w):
        return x / np.sqrt((x * x).mean() + eps) * w

    def rope(vec, t):
        out = vec.copy()
        for i in range(hd // 2):
            a = t * theta ** (-2.0 * i / hd)
            c, s = np.cos(a), np.sin(a)
            out[i] = vec[i] * c - vec[i + hd // 2] * s
            out[i + hd // 2] = vec[i + hd // 2] * c + vec[i] * s
        return out

    wte = nxt()
    wpe = nxt() if flavour == "gpt" else None
    x = np.zeros((Bn, Tn, C))
    for b in range(Bn):
        for t in range(Tn):
            x[b, t] = wte[tokens[b, t]] + (wpe[t] if wpe is not None else 0)
    for _ in range(nb):
        if flavour == "gpt":
            l1w, l1b, wqkv, bqkv, wo, bo, l2w, l2b, wfc, bfc, wpr, bpr = [nxt() for _ in range(12)]
        else:
            l1w, wqkv, wo, l2w, wfc, wpr = [nxt() for _ in range(6)]
        for b in range(Bn):
            qs, ks, vs = [], [], []
            for t in range(Tn):
                h = ln(x[b, t], l1w, l1b) if flavour == "gpt" else rms(x[b, t], l1w)
                qkv = wqkv @ h + (bqkv if flavour == "gpt" else 0)
                q = [qkv[hh * hd:(hh + 1) * hd] for hh in range(H)]
                k = [qkv[H * hd + g * hd:H * hd + (g + 1) * hd] for g in range(KV)]
                v = [qkv[(H + KV) * hd + g * hd:(H + KV) * hd + (g + 1) * hd] for g in range(KV)]
                if flavour == "llama":
                    q = [rope(a, t) for a in q]
                    k = [rope(a, t) for a in k]
                qs.append(q); ks.append(k); vs.append(v)
            ys = []
            for t in range(Tn):
                y = []
                for hh in range(H):
                    g = hh // (H // KV)
                    sc = np.array([qs[t][hh] @ ks[s][g] / np.sqrt(hd) for s in range(t + 1)])
                    pr = np.exp(sc - sc.max()); pr /= pr.sum()
                    y.append(sum(pr[s] * vs[s][g] for s in range(t + 1)))
                ys.append(np.concatenate(y))
            for t in range(Tn):
                x[b, t] = x[b, t] + wo @ ys[t] + (bo if flavour == "gpt" else 0)
            for t in range(Tn):
                if flavour == "gpt":
                    h = ln(x[b, t], l2w, l2b)
                    u = wfc @ h + bfc
                    u = 0.5 * u * (1 + np.tanh(np.sqrt(2 / np.pi) * (u + 0.044715 * u ** 3)))
                    x[b, t] = x[b, t] + wpr @ u + bpr
                else:
                    h = rms(x[b, t], l2w)
                    u = wfc @ h
                    gate, up = u[:hidden], u[hidden:]
                    x[b, t] = x[b, t] + wpr @ (gate / (1 + np.exp(-gate)) * up)
    if flavour == "gpt":
        fw, fb = nxt(), nxt()
        x = np.array([[ln(x[b, t], fw, fb) for t in range(Tn)] for b in range(Bn)])
        return x @ wte.T
    fw, head = nxt(), nxt()
    x = np.array([[rms(x[b, t], fw) for t in range(Tn)] for b in range(Bn)])
    return x @ head.T


def selftest():
    for key, cfg in CONFIGS.items():
        rng = np.random.default_rng(99)
        model = TorchModel(cfg).double()
        arrays = init_params(model, rng)
        tokens = rng.integers(0, cfg["vocab"], size=(B, cfg["seq_len"]))
        model.load_numpy([a.astype(np.float64) for a in arrays])
        lt, _ = model(torch.from_numpy(tokens))
        ln_ = naive_forward(cfg, arrays, tokens)
        err = np.abs(lt.detach().numpy() - ln_).max()
        assert err < 1e-10, (key, err)
        # directional finite-difference check of autograd on a shorter sequence
        small = torch.from_numpy(tokens[:, :5])
        tgt = torch.from_numpy(rng.integers(0, cfg["vocab"], size=(B, 5)))
        ps = [p for _, p in model.params()]

        # cheap gradient check: directional finite difference vs autograd
        model.zero_grad()
        _, l = model(small, tgt)
        l.backward()
        dirs = [torch.randn_like(p) for p in ps]
        ana = sum((p.grad * d_).sum() for p, d_ in zip(ps, dirs)).item()
        h = 1e-6
        with torch.no_grad():
            for p, d_ in zip(ps, dirs):
                p.add_(h * d_)
            lp = model(small, tgt)[1].item()
            for p, d_ in zip(ps, dirs):
                p.sub_(2 * h * d_)
            lm = model(small, tgt)[1].item()
        num = (lp - lm) / (2 * h)
        assert abs(num - ana) < 1e-6 * max(1.0, abs(ana)), (key, num, ana)
        print(f"selftest {key}: naive-forward max err {err:.2e}, dir-grad {ana:.6f} vs fd {num:.6f}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--check", action="store_true", help="only re-read and verify existing files")
    ap.add_argument("--selftest", action="store_true", help="only run the model self-test")
    ap.add_argument("--out", default=HERE)
    args = ap.parse_args()
    torch.set_num_threads(1)
    if args.selftest:
        selftest()
        return
    for key, cfg in CONFIGS.items():
        path = os.path.join(args.out, key + ".bin")
        if args.check:
            check(path)
            continue
        entries = build(cfg)
        write_fixture(path, entries)
        check(path, expected=entries)
    if not args.check:
        selftest()


if __name__ == "__main__":
    main()
