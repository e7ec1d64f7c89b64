-- A tiny GPT for tests/sweep.sh: learning rate, depth and steps as knobs, a validation split,
-- and a checkpoint every few steps (so a point cut short resumes).
local k = knobs { lr = 3e-3, layers = 1, steps = 24, ckpt = 4 }

model {
    vocab = 256, dim = 32, seq_len = 32,
    embedding {},
    positions {},
    stack { n = k.layers,
        residual { layernorm {}, attention { heads = 2 } },
        residual { layernorm {}, mlp { hidden = 128 } },
    },
    layernorm {},
    lm_head {},
}
data { text = "../../data/corpora/tinyshakespeare.txt", tokenizer = "byte", val_fraction = 0.1 }
-- eps 1e-6: the update is smooth in the gradient, so layouts compare (tests/lib.sh)
optimizer { lr = k.lr, betas = { 0.9, 0.95 }, eps = 1e-6, weight_decay = 0.1, grad_clip = 1.0 }
schedule { warmup = 4, decay = "cosine" }
train { batch_tokens = 256, micro_batch = 8, steps = k.steps, eval_every = 8, eval_tokens = 2048,
        seed = 11, sample_tokens = 0, log_every = 4, checkpoint_every = k.ckpt }
parallel { dp = 1, tp = 1, pp = 1, zero = 0 }
