"""tiktoken's GPT-2 encoding built from the project's data/gpt2/ files (no download):
mergeable ranks from encoder.json (GPT-2's ids are its BPE ranks), the GPT-2 pattern, and
<|endoftext|> = 50256. Imported by bench/data.sh's helpers."""
import json
import os

import tiktoken

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
PAT = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


def bytes_to_unicode():
    bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def gpt2_encoding():
    dec = bytes_to_unicode()
    with open(os.path.join(ROOT, "data/gpt2/encoder.json"), encoding="utf-8") as f:
        enc = json.load(f)
    ranks = {bytes(dec[ch] for ch in tok): i for tok, i in enc.items() if tok != "<|endoftext|>"}
    return tiktoken.Encoding("gpt2_local", pat_str=PAT, mergeable_ranks=ranks,
                             special_tokens={"<|endoftext|>": 50256}, explicit_n_vocab=50257)
