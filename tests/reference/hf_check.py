"""Load an exported Hugging Face folder with transformers and compare its logits on the fixed
input of tests/hf_logits.c (token t = (37 t + 11) mod vocab) with trainer's.
usage: hf_check.py HF_DIR LOGITS.bin VOCAB SEQ_LEN ARCH; exits 1 when they differ by more
than 1e-4 (absolute, or relative to the largest logit when that is above 1)."""
import sys

import numpy as np
import torch
from transformers import AutoConfig, AutoModelForCausalLM

hf_dir, path, V, T, arch = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
cfg = AutoConfig.from_pretrained(hf_dir)
assert cfg.architectures == [arch], (cfg.architectures, arch)
model = AutoModelForCausalLM.from_pretrained(hf_dir, torch_dtype=torch.float32)
assert type(model).__name__ == arch, type(model).__name__
model.eval()
ids = torch.tensor([[(37 * t + 11) % V for t in range(T)]])
with torch.no_grad():
    hf = model(ids).logits[0].double().numpy()
ours = np.fromfile(path, dtype="<f4").reshape(T, V).astype(np.float64)
diff = np.abs(hf - ours).max()
scale = max(1.0, np.abs(ours).max())
print("%s: max |logit difference| %.3g (largest logit %.3g) over %d x %d logits"
      % (arch, diff, np.abs(ours).max(), T, V))
sys.exit(0 if diff <= 1e-4 * scale else 1)
