-- The resolved recipe of the report fixture (tests/report/run_2ranks): two ranks, dp = 2.
model {
    vocab = 256, dim = 64, seq_len = 32,
    embedding {}, positions {},
    stack { n = 2, residual { layernorm {}, attention { heads = 4 } },
                   residual { layernorm {}, mlp { hidden = 256 } } },
    layernorm {}, lm_head {},
}
data { text = "tiny.txt", tokenizer = "byte" }
optimizer { lr = 3e-3, betas = { 0.9, 0.95 }, weight_decay = 0.1, grad_clip = 1.0 }
train { batch_tokens = 512, micro_batch = 4, steps = 20, eval_every = 10, seed = 7,
        checkpoint_every = 10, out = "run_2ranks" }
parallel { dp = 2, tp = 1, pp = 1, zero = 1 }
