#!/usr/bin/python3
"""PyTorch side of trainer's CPU benchmark.

Times full float32 training steps (forward, backward, clip_grad_norm_(1.0),
AdamW step, zero_grad) of the reference model in tests/reference/torch_model.py
(plain PyTorch ops, manual masked-softmax causal attention) and prints ONE JSON
line: {"tokens_per_s", "step_s" (median of timed steps), "threads", "torch"}.

Example:
  /usr/bin/python3 bench/torch_cpu.py --flavour gpt --vocab 256 --dim 256 --layers 4 \
      --heads 4 --kv-heads 4 --hidden 1024 --seq 128 --batch 64 --steps 10 --warmup 3 --threads 2
"""
import argparse
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "reference"))
from torch_model import TorchModel  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--flavour", choices=["gpt", "llama"], default="gpt")
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=None, help="default: --heads")
    ap.add_argument("--hidden", type=int, default=None, help="default: 4*dim")
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    cfg = dict(flavour=args.flavour, vocab=args.vocab, dim=args.dim, seq_len=args.seq,
               n_blocks=args.layers, heads=args.heads,
               kv_heads=args.kv_heads if args.kv_heads is not None else args.heads,
               hidden=args.hidden if args.hidden is not None else 4 * args.dim)
    model = TorchModel(cfg).float()
    opt = model.adamw(lr=args.lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    params = [p for _, p in model.params()]
    g = torch.Generator().manual_seed(args.seed)
    tokens = torch.randint(0, args.vocab, (args.batch, args.seq), generator=g)
    targets = torch.randint(0, args.vocab, (args.batch, args.seq), generator=g)

    times = []
    for i in range(args.warmup + args.steps):
        t0 = time.perf_counter()
        _, loss = model(tokens, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss_val = loss.item()  # forces completion (CPU is synchronous anyway)
        dt = time.perf_counter() - t0
        if i >= args.warmup:
            times.append(dt)
    step_s = statistics.median(times)
    assert loss_val == loss_val, "loss is NaN"
    print(json.dumps({"tokens_per_s": args.batch * args.seq / step_s, "step_s": step_s,
                      "threads": args.threads, "torch": torch.__version__}))


if __name__ == "__main__":
    main()
