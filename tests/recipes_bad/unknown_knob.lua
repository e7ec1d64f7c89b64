-- expect: unknown_knob.lua:4: unknown knob 'widht' (knobs: layers, width)
local k = knobs { width = 32, layers = 2 }
model {
  vocab = 256, dim = k.widht, seq_len = 16,
  embedding {},
  lm_head {},
}
data { text = "corpus.txt" }
train { batch_tokens = 256, steps = 10 }
