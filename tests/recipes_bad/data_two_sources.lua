-- expect: data_two_sources.lua:10: data: give only one of 'text', 'shards' and 'mix'
model {
  vocab = 256, dim = 32, seq_len = 16,
  embedding {},
  positions {},
  residual { layernorm {}, attention { heads = 4 } },
  layernorm {},
  lm_head {},
}
data { text = "corpus.txt", shards = "shards/train_*.bin" }
train { batch_tokens = 256, steps = 10 }
