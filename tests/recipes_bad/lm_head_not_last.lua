-- expect: lm_head_not_last.lua:5: lm_head: must be the last layer of model, but layernorm (line 6) follows it
model {
  vocab = 256, dim = 32, seq_len = 16,
  embedding {},
  lm_head {},
  layernorm {},
}
data { text = "corpus.txt" }
train { batch_tokens = 256, steps = 10 }
