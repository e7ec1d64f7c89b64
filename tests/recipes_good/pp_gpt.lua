-- A tiny GPT for the pipeline tests (tests/pp.sh): 8 blocks, so that pp 2 and 4 (and pp 4 x 2
-- virtual stages) each get whole blocks; tied or untied head as a knob.
local k = knobs { tied = true, micro = 0, steps = 10, ckpt = 0, sample = 0, recompute = "none" }
-- recompute "full/none": a level per pipeline rank (train { recompute = { "full", "none" } })
local function levels(s)
    if not s:find("/") then return s end
    local t = {}
    for w in s:gmatch("[^/]+") do t[#t + 1] = w end
    return t
end

model {
    vocab = 256, dim = 32, seq_len = 16,
    embedding {},
    positions {},
    stack { n = 8,
        residual { layernorm {}, attention { heads = 4 } },
        residual { layernorm {}, mlp { hidden = 128 } },
    },
    layernorm {},
    lm_head { tied = k.tied },
}
data { text = "../../data/corpora/tinyshakespeare.txt", tokenizer = "byte" }
-- eps 1e-6: the update is smooth in the gradient, so layouts compare (tests/lib.sh)
optimizer { lr = 3e-3, betas = { 0.9, 0.95 }, eps = 1e-6, weight_decay = 0.1, grad_clip = 1.0 }
schedule { warmup = 3, decay = "cosine" }
train { batch_tokens = 256, micro_batch = k.micro > 0 and k.micro or "auto", steps = k.steps,
        eval_every = 5, eval_tokens = 512, seed = 11, sample_tokens = k.sample, log_every = 5,
        recompute = levels(k.recompute), checkpoint_every = k.ckpt }
