-- expect: bad_recompute_list.lua:9: train: field 'recompute[2]' must be one of none, selective, full, got 'most'
model {
  vocab = 256, dim = 32, seq_len = 16,
  embedding {},
  residual { layernorm {}, attention { heads = 4 } },
  lm_head {},
}
data { text = "corpus.txt" }
train { batch_tokens = 256, steps = 10, recompute = { "full", "most" } }
