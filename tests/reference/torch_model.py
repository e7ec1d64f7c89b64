"""Plain-PyTorch reference transformer matching trainer's C model exactly.

Two flavours, selected by cfg["flavour"] ("gpt" or "llama"):

GPT:   x = wte[tok] + wpe[t]; blocks x += attn(LN1(x)); x += mlp(LN2(x));
       x = LNf(x); logits = x @ wte^T (tied). LayerNorm eps 1e-5, GELU (tanh).
Llama: x = wte[tok]; blocks x += attn(RMS1(x)); x += mlp(RMS2(x));
       x = RMSf(x); logits = x @ lm_head^T (untied). RMSNorm eps 1e-5, no biases,
       grouped-query attention, RoPE ("rotate half", theta), SwiGLU MLP whose fc
       weight is [gate (hidden rows) | up (hidden rows)].

qkv weight rows are [q heads (H*hd) | k heads (KV*hd) | v heads (KV*hd)];
query head h reads kv head h // (H // KV).

Config keys: flavour, vocab, dim, seq_len, n_blocks, heads, kv_heads, hidden,
optional rope_theta (default 10000.0), eps (default 1e-5).

`model.params()` returns [(name, Parameter)] in the exact order the C side
reads fixture parameters.
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


def layer_norm(x, w, b, eps):
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    return (x - mean) * torch.rsqrt(var + eps) * w + b


def rms_norm(x, w, eps):
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps) * w


def rope_cos_sin(T, hd, theta, dtype, device):
    half = hd // 2
    i = torch.arange(half, dtype=torch.float64, device=device)
    inv_freq = theta ** (-2.0 * i / hd)                       # (half,)
    t = torch.arange(T, dtype=torch.float64, device=device)
    ang = t[:, None] * inv_freq[None, :]                      # (T, half)
    return ang.cos().to(dtype), ang.sin().to(dtype)


def apply_rope(x, cos, sin):
    # x: (B, nh, T, hd); cos/sin: (T, hd/2)
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class TorchModel(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = dict(cfg)
        self.flavour = cfg["flavour"]
        assert self.flavour in ("gpt", "llama"), self.flavour
        V, C, T = cfg["vocab"], cfg["dim"], cfg["seq_len"]
        H, KV, hidden = cfg["heads"], cfg["kv_heads"], cfg["hidden"]
        assert C % H == 0 and H % KV == 0
        self.V, self.C, self.T, self.H, self.KV, self.hidden = V, C, T, H, KV, hidden
        self.hd = C // H
        self.nb = cfg["n_blocks"]
        self.eps = float(cfg.get("eps", 1e-5))
        self.theta = float(cfg.get("rope_theta", 10000.0))
        qkv_rows = (H + 2 * KV) * self.hd

        shapes = []  # (name, shape) in C order
        if self.flavour == "gpt":
            shapes += [("wte", (V, C)), ("wpe", (T, C))]
            for l in range(self.nb):
                p = f"h.{l}."
                shapes += [
                    (p + "ln1.weight", (C,)), (p + "ln1.bias", (C,)),
                    (p + "attn.qkv.weight", (qkv_rows, C)), (p + "attn.qkv.bias", (qkv_rows,)),
                    (p + "attn.out.weight", (C, H * self.hd)), (p + "attn.out.bias", (C,)),
                    (p + "ln2.weight", (C,)), (p + "ln2.bias", (C,)),
                    (p + "mlp.fc.weight", (hidden, C)), (p + "mlp.fc.bias", (hidden,)),
                    (p + "mlp.proj.weight", (C, hidden)), (p + "mlp.proj.bias", (C,)),
                ]
            shapes += [("lnf.weight", (C,)), ("lnf.bias", (C,))]
        else:
            shapes += [("wte", (V, C))]
            for l in range(self.nb):
                p = f"h.{l}."
                shapes += [
                    (p + "rms1.weight", (C,)),
                    (p + "attn.qkv.weight", (qkv_rows, C)),
                    (p + "attn.out.weight", (C, H * self.hd)),
                    (p + "rms2.weight", (C,)),
                    (p + "mlp.fc.weight", (2 * hidden, C)),
                    (p + "mlp.proj.weight", (C, hidden)),
                ]
            shapes += [("rmsf.weight", (C,)), ("lm_head.weight", (V, C))]

        self._names = [n for n, _ in shapes]
        self._plist = nn.ParameterList([nn.Parameter(torch.empty(s)) for _, s in shapes])
        self._by_name = {n: p for n, p in zip(self._names, self._plist)}
        self.init_default()

    # ---- parameters -------------------------------------------------------
    def params(self):
        """[(name, Parameter)] in the C model's order."""
        return list(zip(self._names, self._plist))

    def p(self, name):
        return self._by_name[name]

    @torch.no_grad()
    def init_default(self, std=0.02, generator=None):
        for n, p in self.params():
            if n.endswith(".bias"):
                p.zero_()
            elif p.ndim == 1:
                p.fill_(1.0)
            else:
                p.normal_(0.0, std, generator=generator)

    @torch.no_grad()
    def load_numpy(self, arrays):
        """arrays: list of numpy arrays in params() order."""
        for (n, p), a in zip(self.params(), arrays):
            t = torch.as_tensor(a)
            assert tuple(t.shape) == tuple(p.shape), (n, t.shape, p.shape)
            p.copy_(t.to(p.dtype))

    # ---- forward ----------------------------------------------------------
    def _attn(self, x, l, cos_sin):
        B, T, _ = x.shape
        H, KV, hd = self.H, self.KV, self.hd
        pre = f"h.{l}.attn."
        w = self.p(pre + "qkv.weight")
        if self.flavour == "gpt":
            qkv = F.linear(x, w, self.p(pre + "qkv.bias"))
        else:
            qkv = F.linear(x, w)
        q, k, v = qkv.split([H * hd, KV * hd, KV * hd], dim=-1)
        q = q.view(B, T, H, hd).transpose(1, 2)   # (B,H,T,hd)
        k = k.view(B, T, KV, hd).transpose(1, 2)  # (B,KV,T,hd)
        v = v.view(B, T, KV, hd).transpose(1, 2)
        if cos_sin is not None:
            cos, sin = cos_sin
            q = apply_rope(q, cos, sin)
            k = apply_rope(k, cos, sin)
        if KV != H:
            rep = H // KV  # query head h -> kv head h // rep
            k = k.repeat_interleave(rep, dim=1)
            v = v.repeat_interleave(rep, dim=1)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
        mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
        att = att.masked_fill(~mask, float("-inf"))
        att = F.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, H * hd)
        if self.flavour == "gpt":
            return F.linear(y, self.p(pre + "out.weight"), self.p(pre + "out.bias"))
        return F.linear(y, self.p(pre + "out.weight"))

    def _mlp(self, x, l):
        pre = f"h.{l}.mlp."
        if self.flavour == "gpt":
            h = F.linear(x, self.p(pre + "fc.weight"), self.p(pre + "fc.bias"))
            h = F.gelu(h, approximate="tanh")
            return F.linear(h, self.p(pre + "proj.weight"), self.p(pre + "proj.bias"))
        h = F.linear(x, self.p(pre + "fc.weight"))
        gate, up = h.split([self.hidden, self.hidden], dim=-1)
        return F.linear(F.silu(gate) * up, self.p(pre + "proj.weight"))

    def forward(self, tokens, targets=None):
        B, T = tokens.shape
        assert T <= self.T
        eps = self.eps
        if self.flavour == "gpt":
            x = self.p("wte")[tokens] + self.p("wpe")[:T][None]
            cos_sin = None
        else:
            x = self.p("wte")[tokens]
            cos_sin = rope_cos_sin(T, self.hd, self.theta, x.dtype, x.device)
        for l in range(self.nb):
            pre = f"h.{l}."
            if self.flavour == "gpt":
                x = x + self._attn(layer_norm(x, self.p(pre + "ln1.weight"),
                                              self.p(pre + "ln1.bias"), eps), l, None)
                x = x + self._mlp(layer_norm(x, self.p(pre + "ln2.weight"),
                                             self.p(pre + "ln2.bias"), eps), l)
            else:
                x = x + self._attn(rms_norm(x, self.p(pre + "rms1.weight"), eps), l, cos_sin)
                x = x + self._mlp(rms_norm(x, self.p(pre + "rms2.weight"), eps), l)
        if self.flavour == "gpt":
            x = layer_norm(x, self.p("lnf.weight"), self.p("lnf.bias"), eps)
            logits = F.linear(x, self.p("wte"))
        else:
            x = rms_norm(x, self.p("rmsf.weight"), eps)
            logits = F.linear(x, self.p("lm_head.weight"))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
        return logits, loss

    def adamw(self, lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1):
        """AdamW with decay on ndim >= 2 params only (two groups)."""
        decay = [p for _, p in self.params() if p.ndim >= 2]
        no_decay = [p for _, p in self.params() if p.ndim < 2]
        groups = [{"params": decay, "weight_decay": weight_decay},
                  {"params": no_decay, "weight_decay": 0.0}]
        return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps)
