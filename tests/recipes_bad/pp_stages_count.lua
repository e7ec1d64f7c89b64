-- expect: pp_stages_count.lua:15: parallel: stages has 3 entries, but pp 2 x virtual_stages 1 = 2 chunks (give 2 starts, the first 0, or stages = "auto")
-- one start per chunk
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
parallel { pp = 2, stages = { 0, 1, 3 } }
