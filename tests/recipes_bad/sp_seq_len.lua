-- expect: sp_seq_len.lua:3: model: sequence parallelism needs tp to divide seq_len: tp 4 does not divide 6 (tp 2, 3 or 6 would)
-- args: --tp 4 --sequence-parallel
model {
  vocab = 256, dim = 32, seq_len = 6,
  embedding {},
  positions {},
  residual { layernorm {}, attention { heads = 4 } },
  residual { layernorm {}, mlp {} },
  layernorm {},
  lm_head {},
}
data { text = "corpus.txt" }
train { batch_tokens = 96, steps = 10 }
