-- expect: missing_model.lua: no model { ... } declared
data { text = "corpus.txt" }
train { batch_tokens = 256, steps = 10 }
