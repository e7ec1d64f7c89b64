-- expect: bad_heads.lua:7: attention: heads (5) must divide dim (32)
model {
  vocab = 256, dim = 32, seq_len = 16,
  embedding {},
  positions {},
  residual { layernorm {},
    attention { heads = 5 } },
  lm_head {},
}
data { text = "corpus.txt" }
train { batch_tokens = 256, steps = 10 }
