-- expect: empty_residual.lua:5: residual: needs at least one layer inside it
model {
  vocab = 256, dim = 32, seq_len = 16,
  embedding {},
  residual {},
  lm_head {},
}
data { text = "corpus.txt" }
train { batch_tokens = 256, steps = 10 }
