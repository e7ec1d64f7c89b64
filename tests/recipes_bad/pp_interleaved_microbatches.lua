-- expect: pp_interleaved_microbatches.lua:15: parallel: interleaved needs microbatches a multiple of pp 2 (2, 4, ...), not 1
-- interleaved: the micro-batches go round the pipeline ranks in groups of pp
model {
  vocab = 256, dim = 32, seq_len = 16,
  embedding {},
  positions {},
  stack { n = 4,
    residual { layernorm {}, attention { heads = 4 } },
    residual { layernorm {}, mlp {} } },
  layernorm {},
  lm_head {},
}
data { text = "corpus.txt" }
train { batch_tokens = 1024, steps = 10 }
parallel { pp = 2, schedule = "interleaved", microbatches = 1 }
