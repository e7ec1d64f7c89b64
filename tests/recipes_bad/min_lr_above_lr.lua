-- expect: min_lr_above_lr.lua:14: schedule: min_lr (0.01) must not exceed optimizer.lr (0.001)
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
optimizer { lr = 1e-3 }
schedule { warmup = 2, min_lr = 1e-2 }
