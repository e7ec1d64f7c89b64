-- expect: tp_heads.lua:7: attention: tp 4 does not divide heads 6 (tp 1, 2, 3 or 6 would)
-- args: --tp 4
model {
  vocab = 256, dim = 48, seq_len = 16,
  embedding {},
  positions {},
  residual { layernorm {}, attention { heads = 6 } },
  residual { layernorm {}, mlp {} },
  layernorm {},
  lm_head {},
}
data { text = "corpus.txt" }
train { batch_tokens = 256, steps = 10 }
