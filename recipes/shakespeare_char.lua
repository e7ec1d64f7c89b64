-- The default recipe: a small GPT on Tiny Shakespeare, one token per byte.
-- Trains in about twenty-five minutes on two CPU cores. Override any knob from the command line:
--   trainer run recipes/shakespeare_char.lua --set layers=6 --set steps=500
local k = knobs {
    layers = 4,         -- transformer blocks
    width = 192,        -- residual stream width
    heads = 4,          -- attention heads (must divide width)
    seq = 128,          -- context length in bytes
    batch_tokens = 4096,-- tokens per optimizer step
    lr = 2e-3,
    steps = 1200,
}

model {
    vocab = 256, dim = k.width, seq_len = k.seq,
    embedding {},
    positions {},                                   -- learned absolute positions
    stack { n = k.layers,
        residual { layernorm {}, attention { heads = k.heads } },
        residual { layernorm {}, mlp { hidden = 4 * k.width, activation = "gelu" } },
    },
    layernorm {},
    lm_head { tied = true },
}

data { text = "../data/corpora/tinyshakespeare.txt", tokenizer = "byte", val_fraction = 0.1 }
optimizer { lr = k.lr, betas = { 0.9, 0.99 }, weight_decay = 0.1, grad_clip = 1.0 }
schedule { warmup = 50, decay = "cosine", min_lr = 0.1 * k.lr }
train {
    batch_tokens = k.batch_tokens, micro_batch = "auto", steps = k.steps,
    eval_every = 200, eval_tokens = 65536, seed = 1337,
    out = "runs/shakespeare_char", sample_tokens = 400, checkpoint_every = 400,
}
parallel "auto"
