-- expect: bad_sweep_axis.lua:13: sweep: grid.lr must be a list of values, as in lr = { 1, 2 }
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
sweep { grid = { lr = 1e-3 } }
