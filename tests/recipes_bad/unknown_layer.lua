-- expect: unknown_layer.lua:7: unknown layer 'flashblock' (layers: attention, embedding, layernorm, lm_head, mlp, positions, residual, rmsnorm, rope, stack; sections: data, eval, hf, knobs, model, optimizer, parallel, schedule, sweep, train)
-- (Lua said: attempt to call a nil value (global 'flashblock'))
model {
  vocab = 256, dim = 32, seq_len = 16,
  embedding {},
  positions {},
  residual { layernorm {}, flashblock { heads = 2 } },
  layernorm {},
  lm_head {},
}
data { text = "corpus.txt" }
train { batch_tokens = 256, steps = 10 }
