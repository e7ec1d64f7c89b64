-- expect: model: 3e+09 layers once the repeats are unrolled (at most 1000000)
model {
  vocab = 256, dim = 32, seq_len = 16,
  embedding {},
  positions {},
  stack { n = 1000000000,
    residual { layernorm {}, attention { heads = 4 } },
  },
  layernorm {},
  lm_head {},
}
data { text = "corpus.txt" }
train { batch_tokens = 256, steps = 10 }
