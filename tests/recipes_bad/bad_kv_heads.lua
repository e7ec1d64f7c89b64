-- expect: bad_kv_heads.lua:6: attention: kv_heads (3) must divide heads (8)
model {
  vocab = 256, dim = 32, seq_len = 16,
  embedding {},
  rope {},
  residual { rmsnorm {}, attention { heads = 8, kv_heads = 3 } },
  lm_head { tied = false },
}
data { text = "corpus.txt" }
train { batch_tokens = 256, steps = 10 }
