#!/usr/bin/env bash
# The exported Hugging Face folders load in transformers: AutoTokenizer encodes a text to the
# ids trainer's tokenizer gives (the byte tokenizer, and GPT-2's BPE with the vocabulary
# unpadded from 50304 to 50257), and GPT2LMHeadModel / LlamaForCausalLM give the logits that
# `trainer sample --logits-out` prints, within 1e-4. Uses $TR_HF_PYTHON, else the first of
# python3 and /usr/bin/python3 that has transformers (and torch, preferred), else installs
# transformers into a virtual environment (${TR_HF_VENV:-~/.cache/trainer-hf-venv}, over the
# system's packages, so a system torch is used); the logits are compared only where torch is
# there (its wheels are gigabytes: not installed here), the tokenizers always. Exits 77
# (skipped) where transformers can be neither found nor installed.
# usage: tests/hf_check.sh path/to/trainer   (from the repository root)
set -u
T="$1"
has() { "$1" -c "import $2" >/dev/null 2>&1; }
PY=""
V=${TR_HF_VENV:-$HOME/.cache/trainer-hf-venv}
for want in "torch, transformers, numpy" "transformers, numpy"; do
    for p in ${TR_HF_PYTHON:-} python3 /usr/bin/python3 "$V/bin/python"; do
        if command -v "$p" >/dev/null 2>&1 && has "$p" "$want"; then PY=$p; break 2; fi
    done
done
if [ -z "$PY" ]; then
    for base in python3 /usr/bin/python3; do
        command -v "$base" >/dev/null 2>&1 || continue
        pin="transformers"
        has "$base" torch && "$base" -c 'import torch, sys; sys.exit(int(torch.__version__.split(".")[0]) >= 2)' &&
            pin="transformers>=4.38,<4.45"
        echo "installing $pin into $V (once)"
        rm -rf "$V"
        "$base" -m venv --system-site-packages "$V" >/dev/null 2>&1 &&
            timeout 900 "$V/bin/pip" install -q "$pin" safetensors numpy >/dev/null 2>&1 &&
            has "$V/bin/python" "transformers, numpy" && { PY=$V/bin/python; break; }
    done
fi
if [ -z "$PY" ]; then
    echo "skipped: no Python with transformers, and it could not be installed"
    exit 77
fi
TORCH=0
has "$PY" torch && TORCH=1
echo "using $PY ($([ $TORCH = 1 ] && echo "with torch" || echo "without torch: tokenizers only"))"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
# a prompt of at most seq_len (32) bytes: punctuation, a digit, a newline, a two-byte letter
text="KING: 'Tis 3 o'clock... café!
"
# gpt_bpe: the GPT model on GPT-2's BPE, its vocabulary padded to 50304 as the shipped recipe's
sed -e 's#"\.\./\.\./data/#"'"$PWD"'/data/#' -e 's/vocab = 256/vocab = 50304/' \
    -e 's/tokenizer = "byte"/tokenizer = "gpt2"/' tests/checkpoint/gpt.lua >"$tmp/gpt_bpe.lua"
for flavour in gpt llama gpt_bpe; do
    arch=$([ $flavour = llama ] && echo LlamaForCausalLM || echo GPT2LMHeadModel)
    recipe=tests/checkpoint/$flavour.lua
    [ $flavour = gpt_bpe ] && recipe=$tmp/gpt_bpe.lua
    "$T" run "$recipe" --set steps=4 --set every=4 --out "$tmp/$flavour" --peak-gflops 100 \
        >"$tmp/log" 2>&1 || { echo "FAIL $flavour: training failed"; cat "$tmp/log"; fail=1; continue; }
    "$T" export "$tmp/$flavour" --format hf --out "$tmp/$flavour-hf" >"$tmp/log" 2>&1 ||
        { echo "FAIL $flavour: export failed"; cat "$tmp/log"; fail=1; continue; }
    ids=$("$T" sample "$tmp/$flavour" --prompt "$text" --logits-out "$tmp/$flavour.bin" |
        sed -n 's/.*prompt ids: //p')
    [ -n "$ids" ] || { echo "FAIL $flavour: sample --logits-out gave no ids"; fail=1; continue; }
    if "$PY" tests/reference/hf_check.py tokenizer "$tmp/$flavour-hf" "$text" "$ids"; then
        echo "ok   $flavour: AutoTokenizer gives trainer's ids ($(echo $ids | wc -w) of them)"
    else
        echo "FAIL $flavour: AutoTokenizer's ids differ"; fail=1
    fi
    if [ $flavour = gpt_bpe ]; then
        v=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["vocab_size"])' "$tmp/$flavour-hf/config.json")
        [ "$v" = 50257 ] && echo "ok   gpt_bpe: exported with vocab_size 50257 (the model's 50304 unpadded)" ||
            { echo "FAIL gpt_bpe: vocab_size $v, not 50257"; fail=1; }
        # and back: init = hf of the unpadded folder into the padded model
        { cat "$recipe"; echo "init = hf \"$tmp/$flavour-hf\""; } >"$tmp/init.lua"
        "$T" run "$tmp/init.lua" --steps 1 --set checkpoint_every=0 --out "$tmp/init" >"$tmp/log" 2>&1 &&
            grep -q "initialized from the Hugging Face model" "$tmp/log" &&
            echo "ok   gpt_bpe: init = hf loads the unpadded export into the 50304-row model" ||
            { echo "FAIL gpt_bpe: init = hf of the unpadded export"; tail -3 "$tmp/log"; fail=1; }
    fi
    [ $TORCH = 1 ] || continue
    if "$PY" tests/reference/hf_check.py logits "$tmp/$flavour-hf" "$tmp/$flavour.bin" "$arch" "$ids"; then
        echo "ok   $flavour: transformers' $arch gives trainer's logits within 1e-4"
    else
        echo "FAIL $flavour: logits differ"; fail=1
    fi
done
[ $TORCH = 1 ] || echo "note: logits not compared (no torch in $PY)"
exit $fail
