#!/usr/bin/env bash
# Hugging Face interop, both directions (ctest hf_interop):
#   1. tessera exports a trained grouped-query Llama; tests/python/check_hf.py
#      reads the files with the `safetensors` package and holds an
#      independent float64 NumPy forward pass (and, where transformers is
#      installed, LlamaForCausalLM) to tessera's logits and loss at 1e-5;
#   2. tessera imports models saved by transformers' save_pretrained (float32
#      in one file; bfloat16 with tied embeddings in 9 shards) and gives
#      transformers' logits and loss at 1e-5: freshly saved where
#      transformers is installed, else the copies in tests/python/fixtures/
#      (saved the same way by `check_hf.py make tests/python/fixtures`).
# Usage: hf_interop.sh path/to/hf_interop. Exit 77 (skipped) without numpy
# and safetensors.
set -euo pipefail
bin="$1"
here="$(cd "$(dirname "$0")" && pwd)"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
python3 -c "import numpy, safetensors" 2>/dev/null || {
  echo "hf_interop: numpy and safetensors are not installed (pip install numpy safetensors): skipped"
  exit 77
}
"$bin" export "$tmp/export"
python3 "$here/check_hf.py" check-export "$tmp/export"
if python3 -c "import torch, transformers" 2>/dev/null; then
  python3 "$here/check_hf.py" make "$tmp/saved" 2>/dev/null
  from="$tmp/saved"
else
  echo "hf_interop: transformers is not installed: importing the saved fixtures"
  from="$here/fixtures"
fi
"$bin" import "$from/fp32"
"$bin" import "$from/bf16_tied_sharded"
