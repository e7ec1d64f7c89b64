-- The default recipe's model (4 blocks of width 192, T = 128) for bench/dp.sh, with the ZeRO
-- stage as a knob and no evaluation, sampling or checkpoints in the way.
local k = knobs { zero = 0, steps = 12, batch_tokens = 8192 }

model {
    vocab = 256, dim = 192, seq_len = 128,
    embedding {},
    positions {},
    stack { n = 4,
        residual { layernorm {}, attention { heads = 4 } },
        residual { layernorm {}, mlp { hidden = 768 } },
    },
    layernorm {},
    lm_head {},
}
data { text = "../data/corpora/tinyshakespeare.txt", tokenizer = "byte" }
optimizer { lr = 2e-3 }
schedule { warmup = 2 }
train { batch_tokens = k.batch_tokens, steps = k.steps, sample_tokens = 0, log_every = 4 }
parallel { zero = k.zero }
