"""Load an exported Hugging Face folder with transformers and compare it with trainer.

  hf_check.py tokenizer HF_DIR TEXT IDS
      AutoTokenizer.from_pretrained(HF_DIR) must encode TEXT to IDS (space-separated: the
      ids trainer's tokenizer gave, as `trainer sample --logits-out` prints them). Needs
      transformers (no torch).
  hf_check.py logits HF_DIR LOGITS.bin ARCH IDS
      AutoModelForCausalLM (of architecture ARCH) on IDS must give trainer's logits, LOGITS.bin
      from `trainer sample --logits-out` (float32 little-endian, (len(IDS), trainer's vocab)),
      within 1e-4 (absolute, or relative to the largest logit when that is above 1). The HF
      vocabulary may be smaller than trainer's (an export without the padding rows): the first
      columns are compared. Needs torch.
Exits 1 when they differ."""
import sys

import numpy as np


def tokenizer(hf_dir, text, ids):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(hf_dir)
    got = tok(text)["input_ids"]
    print("%s: %d ids%s" % (type(tok).__name__, len(got), "" if got == ids else
                            "\n  transformers: %s\n  trainer:      %s" % (got, ids)))
    back = tok.decode(ids, clean_up_tokenization_spaces=False)
    if back != text:
        print("  decode of trainer's ids: %r, not %r" % (back, text))
    return got == ids and back == text


def logits(hf_dir, path, arch, ids):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.from_pretrained(hf_dir)
    assert cfg.architectures == [arch], (cfg.architectures, arch)
    model = AutoModelForCausalLM.from_pretrained(hf_dir, torch_dtype=torch.float32)
    assert type(model).__name__ == arch, type(model).__name__
    model.eval()
    with torch.no_grad():
        hf = model(torch.tensor([ids])).logits[0].double().numpy()
    ours = np.fromfile(path, dtype="<f4").reshape(len(ids), -1).astype(np.float64)
    V = hf.shape[1]
    assert V <= ours.shape[1], (V, ours.shape)
    diff = np.abs(hf - ours[:, :V]).max()
    scale = max(1.0, np.abs(ours).max())
    print("%s: max |logit difference| %.3g (largest logit %.3g) over %d x %d logits (trainer's "
          "vocabulary %d)" % (arch, diff, np.abs(ours).max(), len(ids), V, ours.shape[1]))
    return diff <= 1e-4 * scale


mode = sys.argv[1]
if mode == "tokenizer":
    ok = tokenizer(sys.argv[2], sys.argv[3], [int(i) for i in sys.argv[4].split()])
else:
    ok = logits(sys.argv[2], sys.argv[3], sys.argv[4], [int(i) for i in sys.argv[5].split()])
sys.exit(0 if ok else 1)
