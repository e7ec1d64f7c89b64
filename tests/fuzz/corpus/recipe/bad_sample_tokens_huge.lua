-- expect: sample_tokens_huge.lua:10: train: field 'sample_tokens' must be <= 1000000, got 1000000000
model {
  vocab = 256, dim = 32, seq_len = 16,
  embedding {},
  positions {},
  layernorm {},
  lm_head {},
}
data { text = "corpus.txt" }
train { batch_tokens = 256, steps = 10, sample_tokens = 1000000000 }
