-- expect: nested_embedding.lua:6: embedding: only allowed at the top level of model, not inside residual
model {
  vocab = 256, dim = 32, seq_len = 16,
  embedding {},
  stack { n = 2,
    residual { embedding {} },
  },
  lm_head {},
}
data { text = "corpus.txt" }
train { batch_tokens = 256, steps = 10 }
