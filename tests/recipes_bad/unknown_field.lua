-- expect: unknown_field.lua:5: attention: unknown field 'head' (fields: bias, heads, kv_heads)
model {
  vocab = 256, dim = 32, seq_len = 16,
  embedding {},
  residual { layernorm {}, attention { head = 4 } },
  lm_head {},
}
data { text = "corpus.txt" }
train { batch_tokens = 256, steps = 10 }
