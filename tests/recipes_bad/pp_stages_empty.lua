-- expect: pp_stages_empty.lua:15: parallel: stages[3] = 2 repeats stages[2]: the chunk starting there would be empty (stages[3] = 3 would)
-- a stage without blocks
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
parallel { pp = 3, stages = { 0, 2, 2 } }
