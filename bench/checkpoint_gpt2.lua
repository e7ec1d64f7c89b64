-- bench/checkpoint.sh: GPT-2 small's exact shape (124M parameters, vocabulary 50257), trained
-- for a few short steps so that a checkpoint (parameters + AdamW m and v: 1.5 GB) is saved
-- while training goes on. Byte-level data: the checkpoint, not the tokenizer, is measured.
local k = knobs { steps = 4, every = 2, seq = 128, batch_tokens = 512, out = "runs/bench_ckpt" }
model {
    vocab = 50257, dim = 768, seq_len = k.seq,
    embedding {},
    positions {},
    stack { n = 12,
        residual { layernorm {}, attention { heads = 12 } },
        residual { layernorm {}, mlp { hidden = 3072, activation = "gelu" } },
    },
    layernorm {},
    lm_head { tied = true },
}
data { text = "../data/corpora/tinyshakespeare.txt", tokenizer = "byte", val_fraction = 0.1 }
optimizer { lr = 6e-4, betas = { 0.9, 0.95 }, eps = 1e-8, weight_decay = 0.1, grad_clip = 1.0 }
schedule { warmup = 2, decay = "cosine" }
train { batch_tokens = k.batch_tokens, micro_batch = 4, steps = k.steps, eval_every = 0,
        seed = 1337, out = k.out, sample_tokens = 0, log_every = 1,
        checkpoint_every = k.every, keep_checkpoints = 1 }
