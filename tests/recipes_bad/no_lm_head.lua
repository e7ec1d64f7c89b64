-- expect: no_lm_head.lua:6: model: the last layer must be lm_head {}, got layernorm
model {
  vocab = 256, dim = 32, seq_len = 16,
  embedding {},
  residual { layernorm {}, mlp {} },
  layernorm {},
}
data { text = "corpus.txt" }
train { batch_tokens = 256, steps = 10 }
