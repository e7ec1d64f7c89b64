-- expect: bad_recompute.lua:9: train: field 'recompute' must be one of none, selective, full, auto, got 'some'
model {
  vocab = 256, dim = 32, seq_len = 16,
  embedding {},
  residual { layernorm {}, attention { heads = 4 } },
  lm_head {},
}
data { text = "corpus.txt" }
train { batch_tokens = 256, steps = 10, recompute = "some" }
