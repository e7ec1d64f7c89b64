-- GPT-2 XL's shape (1.56B parameters): 48 blocks of width 1600 with 25 heads (head size 64),
-- learned positions over 1024 tokens, LayerNorm, GELU MLP of 6400, tied head, vocabulary 50257.
-- The larger model of bench/gpu.sh (one GPU, bf16); it reads Tiny Shakespeare as bytes.
local k = knobs {
    seq = 1024,
    batch_tokens = 8192,
    lr = 2e-4,
    warmup = 10,
    steps = 20,
}

model {
    vocab = 50257, dim = 1600, seq_len = k.seq,
    embedding {},
    positions {},
    stack { n = 48,
        residual { layernorm {}, attention { heads = 25 } },
        residual { layernorm {}, mlp { hidden = 6400, activation = "gelu" } },
    },
    layernorm {},
    lm_head { tied = true },
}

data { text = "../data/corpora/tinyshakespeare.txt", tokenizer = "byte", val_fraction = 0.1 }
optimizer { lr = k.lr, betas = { 0.9, 0.95 }, eps = 1e-8, weight_decay = 0.1, grad_clip = 1.0 }
schedule { warmup = k.warmup, decay = "cosine", min_lr = 0.1 * k.lr }
train {
    batch_tokens = k.batch_tokens, steps = k.steps, eval_every = 0, eval_tokens = 8192,
    seed = 1337, out = "runs/gpt2_xl", sample_tokens = 0,
}
