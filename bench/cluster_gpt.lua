-- A model for bench/cluster.sh (layouts across the hosts of a cluster in a box): 4 GPT blocks
-- of width 256 (MLP 1024), T 128, byte vocabulary, 4096 tokens a step, so that both the
-- gradients (3.3M parameters, 13 MB) and the tensor-parallel activations (tokens x width per
-- collective) are megabytes a step; no evaluation or sampling.
local k = knobs { steps = 6, batch_tokens = 4096, width = 256, heads = 4, layers = 4 }

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
        sample_tokens = 0, log_every = 1 }
