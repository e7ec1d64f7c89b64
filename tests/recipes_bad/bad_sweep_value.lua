-- expect: bad_sweep_value.lua:13: sweep: grid.lr[2] must be a number, a boolean or a string of 1 to 63 bytes
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
sweep { grid = { lr = { 1e-3, {} } } }
