-- A tiny Llama for the tensor-parallel tests (tests/tp.sh): RMSNorm, rotary positions,
-- grouped-query attention (4 query heads, kv_heads 2: split by tp 2, each kv head shared by two
-- ranks at tp 4), SwiGLU, untied head, no biases.
local k = knobs { kv = 2, micro = 0, steps = 10, ckpt = 0, sample = 0 }

model {
    vocab = 256, dim = 64, seq_len = 32,
    embedding {},
    rope { theta = 10000 },
    stack { n = 2,
        residual { rmsnorm {}, attention { heads = 4, kv_heads = k.kv, bias = false } },
        residual { rmsnorm {}, mlp { hidden = 128, activation = "swiglu", bias = false } },
    },
    rmsnorm {},
    lm_head { tied = false },
}
data { text = "../../data/corpora/tinyshakespeare.txt", tokenizer = "byte" }
-- eps 1e-6: the update is smooth in the gradient, so layouts compare (tests/lib.sh)
optimizer { lr = 3e-3, betas = { 0.9, 0.95 }, eps = 1e-6, weight_decay = 0.1, grad_clip = 1.0 }
schedule { warmup = 3, decay = "cosine" }
train { batch_tokens = 256, micro_batch = k.micro > 0 and k.micro or "auto", steps = k.steps,
        eval_every = 5, eval_tokens = 1024, seed = 11, sample_tokens = k.sample, log_every = 5,
        checkpoint_every = k.ckpt }
-- the tests give the layout by flags; what they do not give is fixed here, not planned
parallel { pp = 1, zero = 0, sequence_parallel = false }
