-- expect: knob_width_zero.lua:9: mlp: field 'hidden' must be >= 1, got 0 (from --set width=0)
-- args: --set width=0
local k = knobs { width = 32 }
model {
  vocab = 256, dim = 32, seq_len = 16,
  embedding {},
  positions {},
  residual { layernorm {}, attention { heads = 2 } },
  residual { layernorm {}, mlp { hidden = 4 * k.width } },
  layernorm {},
  lm_head {},
}
data { text = "corpus.txt" }
train { batch_tokens = 256, steps = 10 }
