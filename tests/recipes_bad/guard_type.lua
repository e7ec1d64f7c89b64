-- expect: guard_type.lua:12: train: field 'guard' must be a table of fields or a boolean, as in guard = { ... } or guard = false, got number
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
train { batch_tokens = 256, steps = 10, guard = 3 }
