-- expect: data_gpt2_small_vocab.lua:10: data: the gpt2 tokenizer has 50257 tokens but model.vocab is 256
model {
  vocab = 256, dim = 32, seq_len = 16,
  embedding {},
  positions {},
  residual { layernorm {}, attention { heads = 4 } },
  layernorm {},
  lm_head {},
}
data { text = "corpus.txt", tokenizer = "gpt2" }
train { batch_tokens = 256, steps = 10 }
