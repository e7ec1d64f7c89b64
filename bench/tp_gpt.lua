-- A model wide enough for tensor parallelism to matter on a CPU (bench/tp.sh): GPT-2 small's
-- width (768, 12 heads, MLP 3072), two blocks, byte vocabulary; no evaluation or sampling.
local k = knobs { steps = 8, batch_tokens = 1024, width = 768, heads = 12, layers = 2 }

model {
    vocab = 256, dim = k.width, seq_len = 128,
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
        sample_tokens = 0, log_every = 4 }
