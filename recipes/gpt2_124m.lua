-- GPT-2 small (124M parameters), its exact shape: 12 blocks of width 768 with 12 heads,
-- learned positions over 1024 tokens, LayerNorm, GELU MLP of 3072, head tied to the
-- embedding, vocabulary 50257. The knobs default to GPT-2's training setup (0.5M-token
-- batches); on a CPU, run a few small steps instead:
--   trainer run recipes/gpt2_124m.lua --set seq=256 --set batch_tokens=1024 --steps 5
-- It saves a checkpoint (1.5 GB: weights and AdamW moments) every 1000 steps and after the last;
-- --set checkpoint_every=0 saves none.
-- It reads Tiny Shakespeare through GPT-2's BPE (tokenized into cached shards on first use);
-- for a real corpus: trainer tokenize CORPUS --out DIR, then data { shards = "DIR/train_*.bin", ... }.
local k = knobs {
    layers = 12,
    seq = 1024,
    batch_tokens = 524288,
    lr = 6e-4,
    warmup = 700,
    steps = 19073,
}

model {
    vocab = 50257, dim = 768, seq_len = k.seq,
    embedding {},
    positions {},
    stack { n = k.layers,
        residual { layernorm {}, attention { heads = 12 } },
        residual { layernorm {}, mlp { hidden = 3072, activation = "gelu" } },
    },
    layernorm {},
    lm_head { tied = true },
}

data { text = "../data/corpora/tinyshakespeare.txt", tokenizer = "gpt2", val_fraction = 0.1 }
optimizer { lr = k.lr, betas = { 0.9, 0.95 }, eps = 1e-8, weight_decay = 0.1, grad_clip = 1.0 }
schedule { warmup = k.warmup, decay = "cosine", min_lr = 0.1 * k.lr }
train {
    batch_tokens = k.batch_tokens, steps = k.steps, eval_every = 250, eval_tokens = 32768,
    seed = 1337, out = "runs/gpt2_124m", sample_tokens = 64, checkpoint_every = 1000,
}
