-- expect: function_child.lua:5: residual: item 1 is a function, not a layer (did you forget the braces, as in layernorm {}?)
model {
  vocab = 256, dim = 32, seq_len = 16,
  embedding {},
  residual { layernorm, mlp {} },
  lm_head {},
}
data { text = "corpus.txt" }
train { batch_tokens = 256, steps = 10 }
