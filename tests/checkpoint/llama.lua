-- A small Llama-shaped model for the checkpoint tests: rope, RMSNorm, grouped-query attention,
-- SwiGLU, untied head, no biases.
local k = knobs { steps = 24, every = 8, keep = 2, width = 32, layers = 2, seq = 32, out = "runs/ckpt_llama" }
model {
    vocab = 256, dim = k.width, seq_len = k.seq,
    embedding {},
    rope { theta = 10000 },
    stack { n = k.layers,
        residual { rmsnorm {}, attention { heads = 4, kv_heads = 2, bias = false } },
        residual { rmsnorm {}, mlp { hidden = 64, activation = "swiglu", bias = false } },
    },
    rmsnorm {},
    lm_head { tied = false },
}
data { text = "../../data/corpora/tinyshakespeare.txt", tokenizer = "byte", val_fraction = 0.1 }
optimizer { lr = 3e-3, betas = { 0.9, 0.95 }, weight_decay = 0.1, grad_clip = 1.0 }
schedule { warmup = 4, decay = "wsd", decay_frac = 0.25 }
train { batch_tokens = 512, micro_batch = 4, steps = k.steps, eval_every = 8, eval_tokens = 2048,
        seed = 11, out = k.out, sample_tokens = 0, log_every = 8,
        checkpoint_every = k.every, keep_checkpoints = k.keep }
