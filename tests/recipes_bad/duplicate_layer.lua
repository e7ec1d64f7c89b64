-- expect: duplicate_layer.lua:6: positions: appears twice in model (first at line 5)
model {
  vocab = 256, dim = 32, seq_len = 16,
  embedding {},
  positions {},
  positions {},
  lm_head {},
}
data { text = "corpus.txt" }
train { batch_tokens = 256, steps = 10 }
