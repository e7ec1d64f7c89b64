-- expect: rope_odd_head.lua:6: attention: with rope, the head size dim/heads (24/8 = 3) must be even
model {
  vocab = 256, dim = 24, seq_len = 16,
  embedding {},
  rope { theta = 10000 },
  residual { rmsnorm {}, attention { heads = 8 } },
  lm_head {},
}
data { text = "corpus.txt" }
train { batch_tokens = 256, steps = 10 }
