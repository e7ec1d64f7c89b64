-- expect: missing_required.lua:2: model: field 'dim' is required
model {
  vocab = 256, seq_len = 16,
  embedding {},
  lm_head {},
}
data { text = "corpus.txt" }
train { batch_tokens = 256, steps = 10 }
