-- expect: bad_recompute_auto.lua:9: train: field 'recompute[1]' must be one of none, selective, full, got 'auto'
model {
  vocab = 256, dim = 32, seq_len = 16,
  embedding {},
  residual { layernorm {}, attention { heads = 4 } },
  lm_head {},
}
data { text = "corpus.txt" }
train { batch_tokens = 256, steps = 10, recompute = { "auto", "none" } }
