-- expect: bad_init.lua: init must be hf "path/to/model" (a Hugging Face model directory)
model {
  vocab = 256, dim = 32, seq_len = 16,
  embedding {},
  lm_head {},
}
data { text = "corpus.txt" }
train { batch_tokens = 256, steps = 10 }
init = "gpt2"
