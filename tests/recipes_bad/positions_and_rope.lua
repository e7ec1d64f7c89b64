-- expect: positions_and_rope.lua:6: rope: a model has positions {} or rope {}, not both (positions at line 5)
model {
  vocab = 256, dim = 32, seq_len = 16,
  embedding {},
  positions {},
  rope {},
  lm_head {},
}
data { text = "corpus.txt" }
train { batch_tokens = 256, steps = 10 }
