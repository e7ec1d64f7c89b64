-- Llama 3 70B's shape: 80 blocks of width 8192, 64 heads with 8 kv heads, SwiGLU of 28672,
-- rotary positions over 4096 tokens, untied head, vocabulary 128256; 4M tokens a step.
-- Planned, not trained here: tests/test_plan.c times the planner on it
-- for 1,024 and 16,384 GPUs.
local k = knobs { recompute = "auto", steps = 1000 }

model {
    vocab = 128256, dim = 8192, seq_len = 4096,
    embedding {},
    rope { theta = 500000 },
    stack { n = 80,
        residual { rmsnorm {}, attention { heads = 64, kv_heads = 8, bias = false } },
        residual { rmsnorm {}, mlp { hidden = 28672, activation = "swiglu", bias = false } },
    },
    rmsnorm {},
    lm_head { tied = false },
}

data { text = "../data/corpora/tinyshakespeare.txt", tokenizer = "byte", val_fraction = 0.1 }
train { batch_tokens = 4194304, steps = k.steps, recompute = k.recompute }
