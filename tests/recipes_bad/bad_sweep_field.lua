-- expect: bad_sweep_field.lua:13: sweep: unknown field (fields: grid, seeds)
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
sweep { grid = {}, seed = 3 }
