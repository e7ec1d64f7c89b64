-- expect: bad_keep_checkpoints.lua:8: train: field 'keep_checkpoints' must be >= 1, got 0
model {
  vocab = 256, dim = 32, seq_len = 16,
  embedding {},
  lm_head {},
}
data { text = "corpus.txt" }
train { batch_tokens = 256, steps = 10, checkpoint_every = 5, keep_checkpoints = 0 }
