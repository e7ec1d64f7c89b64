-- A tiny GPT for the tensor-parallel tests (tests/tp.sh): 4 heads, MLP width 256 and a
-- 256-byte vocabulary split over tp = 1, 2 or 4 ranks; tied or untied head as a knob.
local k = knobs { tied = true, micro = 0, steps = 10, ckpt = 0, sample = 0, recompute = "none" }

model {
    vocab = 256, dim = 64, seq_len = 32,
    embedding {},
    positions {},
    stack { n = 2,
        residual { layernorm {}, attention { heads = 4 } },
        residual { layernorm {}, mlp { hidden = 256 } },
    },
    layernorm {},
    lm_head { tied = k.tied },
}
data { text = "../../data/corpora/tinyshakespeare.txt", tokenizer = "byte" }
-- eps 1e-6: the update is smooth in the gradient, so layouts compare (tests/lib.sh)
optimizer { lr = 3e-3, betas = { 0.9, 0.95 }, eps = 1e-6, weight_decay = 0.1, grad_clip = 1.0 }
schedule { warmup = 3, decay = "cosine" }
train { batch_tokens = 256, micro_batch = k.micro > 0 and k.micro or "auto", steps = k.steps,
        eval_every = 5, eval_tokens = 1024, seed = 11, sample_tokens = k.sample, log_every = 5,
        recompute = k.recompute, checkpoint_every = k.ckpt }
-- the tests give the layout by flags; what they do not give is fixed here, not planned
parallel { pp = 1, zero = 0, sequence_parallel = false }
