-- expect: pp_schedule_unknown.lua:15: parallel: field 'schedule' must be one of gpipe, 1f1b, interleaved, zb-h1, zb-v or "auto", got '1f2b'
-- a schedule name the DSL does not know
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
parallel { pp = 2, schedule = "1f2b" }
