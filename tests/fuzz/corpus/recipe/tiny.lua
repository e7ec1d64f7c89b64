-- A tiny GPT-like recipe for test_recipe: loaded from a file, so data.text resolves against
-- this folder and train.out defaults to runs/tiny.
model {
  vocab = 256, dim = 16, seq_len = 8,
  embedding {},
  positions {},
  residual { layernorm {}, attention { heads = 2 } },
  residual { layernorm {}, mlp {} },
  layernorm {},
  lm_head {},
}
data { text = "../../data/corpora/tinyshakespeare.txt" }
train { batch_tokens = 64, steps = 10 }
