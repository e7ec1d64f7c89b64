-- The GPT models of Narayanan et al. 2021 ("Efficient Large-Scale Language Model Training on
-- GPU Clusters", Table 1): vocabulary 51200, 2048 tokens, learned positions, LayerNorm, a GELU
-- MLP of 4 x the width, tied head. The knobs pick a row; tests/test_plan.c and
-- bench/planner.sh plan each on A100-80GB servers and compare with the published layout and
-- throughput. Planned, not trained here (the data line only makes it a complete recipe).
local k = knobs {
    layers = 24,
    width = 2304,
    heads = 24,
    batch = 512,        -- sequences per optimizer step
    steps = 1000,
}

model {
    vocab = 51200, dim = k.width, seq_len = 2048,
    embedding {},
    positions {},
    stack { n = k.layers,
        residual { layernorm {}, attention { heads = k.heads } },
        residual { layernorm {}, mlp { hidden = 4 * k.width, activation = "gelu" } },
    },
    layernorm {},
    lm_head { tied = true },
}

data { text = "../data/corpora/tinyshakespeare.txt", tokenizer = "byte", val_fraction = 0.1 }
train { batch_tokens = k.batch * 2048, steps = k.steps, recompute = "full" }
