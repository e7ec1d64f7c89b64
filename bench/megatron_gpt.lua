-- A GPT as Megatron-LM and MosaicML's MPT build it: learned positions, LayerNorm, a GELU MLP
-- of 4 x the width, a tied head (or not); by default the models of Narayanan et al. 2021 ("Efficient
-- Large-Scale Language Model Training on GPU Clusters", Table 1: vocabulary 51200, 2048
-- tokens). The knobs pick a published run (tests/published_runs.tsv); tests/test_plan.c
-- plans each on its GPUs and compares with the published throughput. Planned, not trained here (the data line only makes it a complete recipe).
local k = knobs {
    layers = 24,
    width = 2304,
    heads = 24,
    batch = 512,        -- sequences per optimizer step
    vocab = 51200,
    seq = 2048,
    micro = 0,          -- sequences per micro-batch; 0: "auto"
    recompute = "full",
    tied = true,        -- the head shares the embedding's matrix (Megatron-LM 2024's do not)
    steps = 1000,
}

model {
    vocab = k.vocab, dim = k.width, seq_len = k.seq,
    embedding {},
    positions {},
    stack { n = k.layers,
        residual { layernorm {}, attention { heads = k.heads } },
        residual { layernorm {}, mlp { hidden = 4 * k.width, activation = "gelu" } },
    },
    layernorm {},
    lm_head { tied = k.tied },
}

data { text = "../data/corpora/tinyshakespeare.txt", tokenizer = "byte", val_fraction = 0.1 }
train { batch_tokens = k.batch * k.seq, steps = k.steps, recompute = k.recompute,
        micro_batch = k.micro > 0 and k.micro or "auto" }
