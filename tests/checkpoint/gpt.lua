-- A small GPT-2-shaped model for the checkpoint tests (tests/resume.sh, tests/hf_check.sh):
-- learned positions, LayerNorm with bias, GELU, tied head; a few seconds on two cores.
local k = knobs { steps = 24, every = 8, keep = 2, width = 32, layers = 2, seq = 32, out = "runs/ckpt_gpt" }
model {
    vocab = 256, dim = k.width, seq_len = k.seq,
    embedding {},
    positions {},
    stack { n = k.layers,
        residual { layernorm {}, attention { heads = 4 } },
        residual { layernorm {}, mlp { hidden = 4 * k.width, activation = "gelu" } },
    },
    layernorm {},
    lm_head { tied = true },
}
data { text = "../../data/corpora/tinyshakespeare.txt", tokenizer = "byte", val_fraction = 0.1 }
optimizer { lr = 3e-3, betas = { 0.9, 0.95 }, weight_decay = 0.1, grad_clip = 1.0 }
schedule { warmup = 4, decay = "cosine" }
train { batch_tokens = 512, micro_batch = 8, steps = k.steps, eval_every = 8, eval_tokens = 2048,
        seed = 7, out = k.out, sample_tokens = 0, log_every = 8,
        checkpoint_every = k.every, keep_checkpoints = k.keep }
