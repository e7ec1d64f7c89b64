-- The tiny GPT of tiny_gpt.bin (made by make_fixtures.py): 2 blocks, width 32, 4 heads.
model {
    vocab = 64, dim = 32, seq_len = 16,
    embedding {},
    positions {},
    stack { n = 2,
        residual { layernorm {}, attention { heads = 4 } },
        residual { layernorm {}, mlp { hidden = 128, activation = "gelu" } },
    },
    layernorm {},
    lm_head { tied = true },
}
data { text = "unused.txt" }
train { batch_tokens = 32, steps = 10 }
