-- expect: tp_kv_heads.lua:7: attention: tp 2 and kv_heads 3: tp must divide kv_heads or be a multiple of it (tp 1, 3, 6 or 12 would)
-- args: --tp 2
model {
  vocab = 256, dim = 48, seq_len = 16,
  embedding {},
  positions {},
  residual { layernorm {}, attention { heads = 12, kv_heads = 3 } },
  residual { layernorm {}, mlp {} },
  layernorm {},
  lm_head {},
}
data { text = "corpus.txt" }
train { batch_tokens = 256, steps = 10 }
