-- expect: bad_eval_every.lua:13: eval: field 'every' must be >= 1, got 0
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
eval { tasks = { "t.jsonl" }, every = 0 }
