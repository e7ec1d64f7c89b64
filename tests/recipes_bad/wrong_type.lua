-- expect: wrong_type.lua:5: attention: field 'heads' must be an integer, got string
model {
  vocab = 256, dim = 32, seq_len = 16,
  embedding {},
  residual { layernorm {}, attention { heads = "4" } },
  lm_head {},
}
data { text = "corpus.txt" }
train { batch_tokens = 256, steps = 10 }
