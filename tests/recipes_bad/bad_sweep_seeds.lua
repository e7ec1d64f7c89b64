-- expect: bad_sweep_seeds.lua:13: sweep: seeds must be an integer from 1 to 64
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
sweep { seeds = 0 }
