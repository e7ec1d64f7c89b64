#!/usr/bin/python3
"""Expected GPT-2 BPE ids for tricky strings, from an independent reference: the published
GPT-2 algorithm (OpenAI's encoder.py: bytes_to_unicode, the pre-tokenization pattern, the
merge loop by rank) written out here with Debian's python3-regex, reading the project's
data/gpt2/encoder.json and vocab.bpe. Invalid UTF-8 is decoded with surrogateescape, so each
invalid byte is a character of its own outside \\p{L}, \\p{N} and \\s, and maps back to its byte.

Writes tests/data/bpe_fixtures.txt: one case per line, `HEX_OF_INPUT_BYTES<TAB>ID ID ...`,
and a last line `shakespeare<TAB>COUNT<TAB>FNV1A64_OF_IDS` for the whole shipped corpus.
Run: /usr/bin/python3 tests/data/make_bpe_fixtures.py
"""
import json
import os
import random

import regex

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
PAT = regex.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""")


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, [chr(c) for c in cs]))


def get_pairs(word):
    return {(word[i], word[i + 1]) for i in range(len(word) - 1)}


class Encoder:
    def __init__(self):
        with open(os.path.join(ROOT, "data/gpt2/encoder.json"), encoding="utf-8") as f:
            self.encoder = json.load(f)
        with open(os.path.join(ROOT, "data/gpt2/vocab.bpe"), encoding="utf-8") as f:
            lines = f.read().split("\n")[1:-1]
        merges = [tuple(l.split()) for l in lines]
        self.ranks = dict(zip(merges, range(len(merges))))
        self.byte_encoder = bytes_to_unicode()
        self.cache = {}

    def bpe(self, token):
        if token in self.cache:
            return self.cache[token]
        word = tuple(token)
        pairs = get_pairs(word)
        if not pairs:
            return [token]
        while True:
            bigram = min(pairs, key=lambda p: self.ranks.get(p, float("inf")))
            if bigram not in self.ranks:
                break
            first, second = bigram
            new_word = []
            i = 0
            while i < len(word):
                try:
                    j = word.index(first, i)
                except ValueError:
                    new_word.extend(word[i:])
                    break
                new_word.extend(word[i:j])
                i = j
                if word[i] == first and i < len(word) - 1 and word[i + 1] == second:
                    new_word.append(first + second)
                    i += 2
                else:
                    new_word.append(word[i])
                    i += 1
            word = tuple(new_word)
            if len(word) == 1:
                break
            pairs = get_pairs(word)
        self.cache[token] = list(word)
        return list(word)

    def encode(self, data):
        text = data.decode("utf-8", "surrogateescape")
        ids = []
        for piece in PAT.findall(text):
            b = piece.encode("utf-8", "surrogateescape")
            mapped = "".join(self.byte_encoder[x] for x in b)
            ids.extend(self.encoder[t] for t in self.bpe(mapped))
        return ids


TRICKY = [
    "Hello world", "hello, world!", "", " ", "  ", "   ", "\t", "\n", "\n\n", "\r\n",
    "a  b", "a   b", "a\tb", "a \tb", "a\t b", "a \n b", "foo   \n\n  bar", "trailing   ",
    " leading", "x\u3000y", "x\u3000\u3000y", "x \u00a0y", "\u2028\u2029", "a\x0bb\x0cc",
    "a\x1cb\x1fc", "a\x85b",
    "I'm you're they've he'll she'd it's don't", "'s'S'T 'll'LL", "''s", "o'clock", "'",
    "DON'T I'M", "y'all' 're", "123", "1234567890", " 42", "3.14159", "x1y2", "½ ¾ ⅓ Ⅻ ٣٤٥ १२३",
    "café naïve résumé", "Ünïcödé", "Привет мир", "こんにちは世界", "你好，世界！", "안녕하세요",
    "مرحبا بالعالم", "שלום", "Ελληνικά", "ǅungla", "ﬁne", "e\u0301", "Z\u0351\u0368a",
    "emoji 😀😃😄 👍🏽 👨‍👩‍👧‍👦 🇫🇷", "🙂🙂🙂", "$$$ !!! ??? ...", "<|endoftext|>",
    "a<|endoftext|>b", "http://example.com/path?q=1&r=2#frag", "snake_case camelCase",
    "def f(x):\n    return x  # comment\n", "    indented\n\tline\n",
    "   \n   \n", "x" * 300, " " * 200, "ab" * 150, "\u200b\u200d", "\ufeffBOM",
    "\U0001F600\U0001F600 text", "tab\t\t\tstop", "mixed 12abc 3.4e5",
]
INVALID = [
    b"\xff", b"\xfe\xff", b"abc\x80def", b"\xc3(", b"\xe2\x82", b"\xe2\x82 x", b"\xf0\x9f\x98",
    b"\xed\xa0\x80", b"\xc0\xaf", b"\xf4\x90\x80\x80", b" \xff\xfe", b"caf\xc3\xa9 \xff word",
    b"\x80\x80\x80abc", b"a \xe9t\xe9", b"\xf8\x88\x80\x80\x80", b"x\x00y",
]


def random_cases(rng, n):
    pool = (list("abcXYZ019 '\t\n.,!?-_") + [" ", " ", "  ", "'s", "'ll", "é", "ß", "Ω", "ж", "中",
            "語", "٣", "½", "\u3000", "\u00a0", "\u2003", "😀", "👍🏽", "\u0301", "\r\n"])
    out = []
    for _ in range(n):
        s = "".join(rng.choice(pool) for _ in range(rng.randint(1, 24))).encode("utf-8")
        if rng.random() < 0.15:
            k = rng.randint(0, len(s))
            s = s[:k] + bytes([rng.choice([0x80, 0xbf, 0xc3, 0xe2, 0xf0, 0xff])]) + s[k:]
        out.append(s)
    return out


def fnv1a64_ids(ids):
    h = 0xcbf29ce484222325
    for i in ids:
        for b in int(i).to_bytes(4, "little"):
            h = ((h ^ b) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return h


def main():
    enc = Encoder()
    cases = [s.encode("utf-8") for s in TRICKY] + INVALID + random_cases(random.Random(1), 300)
    out = os.path.join(ROOT, "tests/data/bpe_fixtures.txt")
    with open(out, "w") as f:
        for c in cases:
            f.write("%s\t%s\n" % (c.hex(), " ".join(str(i) for i in enc.encode(c))))
        with open(os.path.join(ROOT, "data/corpora/tinyshakespeare.txt"), "rb") as g:
            ids = enc.encode(g.read())
        f.write("shakespeare\t%d\t%016x\n" % (len(ids), fnv1a64_ids(ids)))
    print("wrote %s: %d cases, shakespeare %d tokens" % (out, len(cases), len(ids)))


if __name__ == "__main__":
    main()
