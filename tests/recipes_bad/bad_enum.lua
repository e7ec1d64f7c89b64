-- expect: bad_enum.lua:5: mlp: field 'activation' must be one of gelu, swiglu, got 'relu'
model {
  vocab = 256, dim = 32, seq_len = 16,
  embedding {},
  residual { layernorm {}, mlp { activation = "relu" } },
  lm_head {},
}
data { text = "corpus.txt" }
train { batch_tokens = 256, steps = 10 }
