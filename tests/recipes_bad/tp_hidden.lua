-- expect: tp_hidden.lua:7: mlp: tp 8 does not divide hidden 100 (tp 1, 2, 4, 5, 10, 20, 25, 50 or 100 would)
model {
  vocab = 256, dim = 64, seq_len = 16,
  embedding {},
  positions {},
  residual { layernorm {}, attention { heads = 8 } },
  residual { layernorm {}, mlp { hidden = 100 } },
  layernorm {},
  lm_head {},
}
data { text = "corpus.txt" }
train { batch_tokens = 256, steps = 10 }
parallel { tp = 8 }
