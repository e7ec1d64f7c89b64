-- expect: sp_without_tp.lua:13: parallel: sequence_parallel needs tp > 1 (tp is 1)
model {
  vocab = 256, dim = 32, seq_len = 16,
  embedding {},
  positions {},
  residual { layernorm {}, attention { heads = 4 } },
  residual { layernorm {}, mlp {} },
  layernorm {},
  lm_head {},
}
data { text = "corpus.txt" }
train { batch_tokens = 256, steps = 10 }
parallel { sequence_parallel = true }
