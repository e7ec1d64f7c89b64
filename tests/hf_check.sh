#!/usr/bin/env bash
# The exported Hugging Face folders load in transformers (GPT2LMHeadModel, LlamaForCausalLM)
# and give trainer's logits within 1e-4. Needs Python with torch and transformers: uses
# $TR_HF_PYTHON, else the first of python3 and /usr/bin/python3 that has both, else tries to
# install transformers into a virtual environment over a Python that has torch (cached in
# ${TR_HF_VENV:-~/.cache/trainer-hf-venv}); exits 77 (skipped) where none of that works.
# usage: tests/hf_check.sh path/to/trainer path/to/hf_logits   (from the repository root)
set -u
T="$1"
L="${2:-$(dirname "$1")/tests/hf_logits}"
has() { "$1" -c 'import torch, transformers, numpy' >/dev/null 2>&1; }
PY=""
for p in ${TR_HF_PYTHON:-} python3 /usr/bin/python3; do
    if command -v "$p" >/dev/null 2>&1 && has "$p"; then PY=$p; break; fi
done
if [ -z "$PY" ]; then
    V=${TR_HF_VENV:-$HOME/.cache/trainer-hf-venv}
    if [ -x "$V/bin/python" ] && has "$V/bin/python"; then
        PY=$V/bin/python
    else
        for base in python3 /usr/bin/python3; do
            command -v "$base" >/dev/null 2>&1 && "$base" -c 'import torch' >/dev/null 2>&1 || continue
            pin="transformers"
            "$base" -c 'import torch, sys; sys.exit(int(torch.__version__.split(".")[0]) >= 2)' && pin="transformers>=4.38,<4.45"
            echo "installing $pin into $V (once)"
            rm -rf "$V"
            "$base" -m venv --system-site-packages "$V" >/dev/null 2>&1 &&
                timeout 900 "$V/bin/pip" install -q "$pin" safetensors >/dev/null 2>&1 &&
                has "$V/bin/python" && { PY=$V/bin/python; break; }
        done
    fi
fi
if [ -z "$PY" ]; then
    echo "skipped: no Python with torch and transformers, and they could not be installed"
    exit 77
fi
echo "using $PY"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
for flavour in gpt llama; do
    arch=$([ $flavour = gpt ] && echo GPT2LMHeadModel || echo LlamaForCausalLM)
    "$T" run tests/checkpoint/$flavour.lua --set steps=16 --set every=16 --out "$tmp/$flavour" \
        --peak-gflops 100 >"$tmp/log" 2>&1 || { echo "FAIL $flavour: training failed"; cat "$tmp/log"; fail=1; continue; }
    "$T" export "$tmp/$flavour" --format hf --out "$tmp/$flavour-hf" ||
        { echo "FAIL $flavour: export failed"; fail=1; continue; }
    read -r vocab seq < <("$L" "$tmp/$flavour" "$tmp/$flavour.bin") ||
        { echo "FAIL $flavour: hf_logits failed"; fail=1; continue; }
    if "$PY" tests/reference/hf_check.py "$tmp/$flavour-hf" "$tmp/$flavour.bin" "$vocab" "$seq" "$arch"; then
        echo "ok   $flavour: transformers' $arch gives trainer's logits within 1e-4"
    else
        echo "FAIL $flavour: logits differ"; fail=1
    fi
done
exit $fail
