-- expect: batch_not_multiple.lua:12: train: batch_tokens (1000) must be a multiple of the model's seq_len (16)
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
train { batch_tokens = 1000, steps = 10 }
