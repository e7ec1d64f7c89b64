-- expect: first_not_embedding.lua:4: model: the first layer must be embedding {}, got layernorm
model {
  vocab = 256, dim = 32, seq_len = 16,
  layernorm {},
  embedding {},
  lm_head {},
}
data { text = "corpus.txt" }
train { batch_tokens = 256, steps = 10 }
