-- A tiny Llama for the pipeline tests (tests/pp.sh): 4 blocks of RMSNorm, rotary positions,
-- grouped-query attention (4 query heads, 2 kv heads), SwiGLU, untied head, no biases.
local k = knobs { micro = 0, steps = 10, ckpt = 0, sample = 0 }

model {
    vocab = 256, dim = 32, seq_len = 16,
    embedding {},
    rope { theta = 10000 },
    stack { n = 4,
        residual { rmsnorm {}, attention { heads = 4, kv_heads = 2, bias = false } },
        residual { rmsnorm {}, mlp { hidden = 64, activation = "swiglu", bias = false } },
    },
    rmsnorm {},
    lm_head { tied = false },
}
data { text = "../../data/corpora/tinyshakespeare.txt", tokenizer = "byte" }
-- eps 1e-6: the update is smooth in the gradient, so layouts compare (tests/lib.sh)
optimizer { lr = 3e-3, betas = { 0.9, 0.95 }, eps = 1e-6, weight_decay = 0.1, grad_clip = 1.0 }
schedule { warmup = 3, decay = "cosine" }
train { batch_tokens = 256, micro_batch = k.micro > 0 and k.micro or "auto", steps = k.steps,
        eval_every = 5, eval_tokens = 512, seed = 11, sample_tokens = k.sample, log_every = 5,
        checkpoint_every = k.ckpt }
