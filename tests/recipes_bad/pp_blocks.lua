-- expect: pp_blocks.lua:15: parallel: pp 8 x virtual_stages 1 = 8 stages, but the model has 4 blocks (pp 1, 2, 3 or 4 would)
-- pp larger than the model's blocks (the 4 repeats of its stack)
model {
  vocab = 256, dim = 32, seq_len = 16,
  embedding {},
  positions {},
  stack { n = 4,
    residual { layernorm {}, attention { heads = 4 } },
    residual { layernorm {}, mlp {} } },
  layernorm {},
  lm_head {},
}
data { text = "corpus.txt" }
train { batch_tokens = 1024, steps = 10 }
parallel { pp = 8 }
