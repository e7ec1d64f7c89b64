-- expect: bad_betas.lua:13: optimizer: field 'betas[2]' must be < 1, got 1
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
optimizer { betas = { 0.9, 1.0 } }
