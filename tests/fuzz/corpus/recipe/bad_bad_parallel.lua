-- expect: bad_parallel.lua:13: parallel: expected "auto" or a table { dp = ..., tp = ..., pp = ..., zero = ... }, got 'fast'
model {
  vocab = 256, dim = 32, seq_len = 16,
  embedding {},
  positions {},
  residual { layernorm {}, attention { heads = 4 } },
  residual { layernorm {}, mlp {} },
  layernorm {},
  lm_head {},
}
data { text = "corpus.txt" }
train { batch_tokens = 256, steps = 10 }
parallel "fast"
