-- expect: dim_too_large.lua:4: model: field 'dim' must be <= 65536, got 536870908 (from --set width=536870908)
-- args: --set width=536870908
local k = knobs { width = 32 }
model {
  vocab = 256, dim = k.width, seq_len = 16,
  embedding {},
  positions {},
  layernorm {},
  lm_head {},
}
data { text = "corpus.txt" }
train { batch_tokens = 256, steps = 10 }
