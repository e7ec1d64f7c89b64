-- expect: non_layer_child.lua:5: residual: item 2 is a plain table, not a layer (name the layer before the braces, as in attention { heads = 4 })
model {
  vocab = 256, dim = 32, seq_len = 16,
  embedding {},
  residual { layernorm {}, { heads = 4 } },
  lm_head {},
}
data { text = "corpus.txt" }
train { batch_tokens = 256, steps = 10 }
