-- expect: guard_window.lua:12: train: guard: field 'window' must be >= 2, got 1
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
train { batch_tokens = 256, steps = 10, guard = { window = 1, z_loss = 4 } }
