-- expect: runtime_error.lua:6: unknown layer 'attenton' (layers: attention, embedding, layernorm, lm_head, mlp, positions, residual, rmsnorm, rope, stack; sections: data, eval, hf, knobs, model, optimizer, parallel, schedule, sweep, train)
local width = 32
model {
  vocab = 256, dim = width, seq_len = 16,
  embedding {},
  attenton { heads = 4 },
  lm_head {},
}
