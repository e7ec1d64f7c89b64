-- A tiny GPT for the data-parallel tests (tests/dp.sh): the same global batch on 1, 2 or 4
-- processes, ZeRO stage and micro-batch as knobs.
local k = knobs { zero = 0, micro = 0, steps = 20, ckpt = 0, bucket = 0, layers = 2, recompute = "none",
                  sample = 0, shares = "auto" }
-- shares "3,1": parallel { dp_shares = { 3, 1 } } (micro-batches of each dp replica a step)
local function list(s)
    if s == "auto" then return s end
    local t = {}
    for w in s:gmatch("[^,]+") do t[#t + 1] = tonumber(w) end
    return t
end

model {
    vocab = 256, dim = 64, seq_len = 32,
    embedding {},
    positions {},
    stack { n = k.layers,
        residual { layernorm {}, attention { heads = 4 } },
        residual { layernorm {}, mlp { hidden = 256 } },
    },
    layernorm {},
    lm_head {},
}
data { text = "../../data/corpora/tinyshakespeare.txt", tokenizer = "byte" }
-- eps 1e-6: the update is smooth in the gradient, so layouts compare (tests/lib.sh)
optimizer { lr = 3e-3, betas = { 0.9, 0.95 }, eps = 1e-6, weight_decay = 0.1, grad_clip = 1.0 }
schedule { warmup = 5, decay = "cosine" }
train { batch_tokens = 256, micro_batch = k.micro > 0 and k.micro or "auto", steps = k.steps,
        eval_every = 10, eval_tokens = 2048, seed = 7, sample_tokens = k.sample, log_every = 5, recompute = k.recompute,
        checkpoint_every = k.ckpt }
parallel { tp = 1, pp = 1, zero = k.zero, bucket_kb = k.bucket > 0 and k.bucket or nil,
           dp_shares = list(k.shares) }
