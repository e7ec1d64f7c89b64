-- expect: parallel_unknown_field.lua:13: parallel: unknown field 'sp' (fields: bucket_kb, dp, dp_shares, microbatches, pp, private_gradients, schedule, sequence_parallel, stages, tp, virtual_stages, zero)
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
parallel { tp = 2, sp = true }
