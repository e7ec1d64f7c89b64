-- expect: out_of_range.lua:5: layernorm: field 'eps' must be > 0, got -1
model {
  vocab = 256, dim = 32, seq_len = 16,
  embedding {},
  layernorm { eps = -1 },
  lm_head {},
}
data { text = "corpus.txt" }
train { batch_tokens = 256, steps = 10 }
