-- A tiny Llama: RMSNorm, rotary positions, grouped-query attention, SwiGLU, untied head.
-- Byte-level Tiny Shakespeare, so it runs anywhere the default recipe does.
local k = knobs {
    layers = 4,
    width = 256,
    heads = 8,
    kv_heads = 2,       -- grouped-query attention: 4 query heads share each kv head
    hidden = 688,       -- SwiGLU width: about 8/3 x width, rounded to a multiple of 16
    seq = 128,
    batch_tokens = 4096,
    lr = 2e-3,
    steps = 600,
}

model {
    vocab = 256, dim = k.width, seq_len = k.seq,
    embedding {},
    rope { theta = 10000 },
    stack { n = k.layers,
        residual { rmsnorm {}, attention { heads = k.heads, kv_heads = k.kv_heads, bias = false } },
        residual { rmsnorm {}, mlp { hidden = k.hidden, activation = "swiglu", bias = false } },
    },
    rmsnorm {},
    lm_head { tied = false },
}

data { text = "../data/corpora/tinyshakespeare.txt", tokenizer = "byte", val_fraction = 0.1 }
optimizer { lr = k.lr, betas = { 0.9, 0.95 }, weight_decay = 0.1, grad_clip = 1.0 }
schedule { warmup = 50, decay = "wsd", decay_frac = 0.2, min_lr = 0.0 }
train {
    batch_tokens = k.batch_tokens, steps = k.steps, eval_every = 200, eval_tokens = 65536,
    seed = 1337, out = "runs/llama_tiny", sample_tokens = 300, checkpoint_every = 200,
}
