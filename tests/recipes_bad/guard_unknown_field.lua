-- expect: guard_unknown_field.lua:12: train: guard: unknown field 'z' (fields: max_bad, norm_ratio, warmup, window, z_loss, z_norm)
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
train { batch_tokens = 256, steps = 10, guard = { z = 6 } }
