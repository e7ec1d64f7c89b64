-- A small GPT on Tiny Shakespeare through GPT-2's byte-level BPE (50,257 tokens; the
-- vocabulary is padded to 50,304, a multiple of 64, as llm.c does). The first run tokenizes
-- the text into cached shards (data/corpora/cache/tinyshakespeare.txt.gpt2/), later runs
-- read them. Most of the compute is the 50k-way output layer, so it is slower per token than
-- the byte-level recipe; on two CPU cores, try --set steps=50 first.
local k = knobs {
    layers = 4,
    width = 128,
    heads = 4,
    seq = 128,
    batch_tokens = 4096,
    lr = 3e-3,
    steps = 300,
}

model {
    vocab = 50304, dim = k.width, seq_len = k.seq,
    embedding {},
    positions {},
    stack { n = k.layers,
        residual { layernorm {}, attention { heads = k.heads } },
        residual { layernorm {}, mlp { hidden = 4 * k.width, activation = "gelu" } },
    },
    layernorm {},
    lm_head { tied = true },
}

data { text = "../data/corpora/tinyshakespeare.txt", tokenizer = "gpt2", val_fraction = 0.1 }
optimizer { lr = k.lr, betas = { 0.9, 0.95 }, weight_decay = 0.1, grad_clip = 1.0 }
schedule { warmup = 30, decay = "cosine", min_lr = 0.1 * k.lr }
train {
    batch_tokens = k.batch_tokens, micro_batch = "auto", steps = k.steps,
    eval_every = 100, eval_tokens = 16384, seed = 1337,
    out = "runs/shakespeare_bpe", sample_tokens = 100, checkpoint_every = 100,
}
parallel "auto"
