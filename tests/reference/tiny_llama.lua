-- The tiny Llama of tiny_llama.bin (made by make_fixtures.py): 2 blocks, width 32, 4 query
-- heads sharing 2 kv heads, rotary positions, RMSNorm, SwiGLU, untied head.
model {
    vocab = 64, dim = 32, seq_len = 16,
    embedding {},
    rope { theta = 10000 },
    stack { n = 2,
        residual { rmsnorm {}, attention { heads = 4, kv_heads = 2, bias = false } },
        residual { rmsnorm {}, mlp { hidden = 64, activation = "swiglu", bias = false } },
    },
    rmsnorm {},
    lm_head { tied = false },
}
data { text = "unused.txt" }
train { batch_tokens = 32, steps = 10 }
