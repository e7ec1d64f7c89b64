-- expect: data_no_source.lua:10: data: one of 'text', 'shards' or 'mix' is required
model {
  vocab = 256, dim = 32, seq_len = 16,
  embedding {},
  positions {},
  residual { layernorm {}, attention { heads = 4 } },
  layernorm {},
  lm_head {},
}
data { tokenizer = "byte" }
train { batch_tokens = 256, steps = 10 }
