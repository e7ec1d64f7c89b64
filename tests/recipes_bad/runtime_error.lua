-- expect: runtime_error.lua:6: attempt to call a nil value (global 'attenton')
local width = 32
model {
  vocab = 256, dim = width, seq_len = 16,
  embedding {},
  attenton { heads = 4 },
  lm_head {},
}
