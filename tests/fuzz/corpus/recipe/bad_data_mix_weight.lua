-- expect: data_mix_weight.lua:10: data: mix[2]: field 'weight' must be > 0, got -0.5
model {
  vocab = 256, dim = 32, seq_len = 16,
  embedding {},
  positions {},
  residual { layernorm {}, attention { heads = 4 } },
  layernorm {},
  lm_head {},
}
data { mix = { { shards = "a/*.bin", weight = 1 }, { shards = "b/*.bin", weight = -0.5 } } }
train { batch_tokens = 256, steps = 10 }
