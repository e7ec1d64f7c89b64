-- A model for bench/pp.sh: 8 equal GPT blocks of width 256 (so that pp 2 and 4, and 2 virtual
-- stages, get whole blocks and the stages weigh the same), a byte vocabulary (the head is small
-- beside a block), T 64; no evaluation or sampling.
local k = knobs { steps = 10, batch_tokens = 1024, width = 256, heads = 4, layers = 8 }

model {
    vocab = 256, dim = k.width, seq_len = 64,
    embedding {},
    positions {},
    stack { n = k.layers,
        residual { layernorm {}, attention { heads = k.heads } },
        residual { layernorm {}, mlp { hidden = 4 * k.width } },
    },
    layernorm {},
    lm_head {},
}
data { text = "../data/corpora/tinyshakespeare.txt", tokenizer = "byte" }
optimizer { lr = 1e-3 }
schedule { warmup = 2 }
train { batch_tokens = k.batch_tokens, micro_batch = "auto", steps = k.steps, eval_every = 0,
        sample_tokens = 0, log_every = 5 }
