-- expect: bad_recompute_named.lua:9: train: field 'recompute' must be a list of names, as in recompute = { "full", "none" }, without named fields or gaps
model {
  vocab = 256, dim = 32, seq_len = 16,
  embedding {},
  residual { layernorm {}, attention { heads = 4 } },
  lm_head {},
}
data { text = "corpus.txt" }
train { batch_tokens = 256, steps = 10, recompute = { first = "full" } }
