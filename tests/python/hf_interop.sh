#!/usr/bin/env bash
# Hugging Face interop, both directions (ctest hf_interop):
#   1. tessera exports a trained grouped-query Llama, and one with Llama
#      3.1's RoPE scaling; tests/python/check_hf.py reads the files with the
#      `safetensors` package and holds an independent float64 NumPy forward
#      pass (and, where transformers is installed, LlamaForCausalLM) to
#      tessera's logits and loss at 1e-5;
#   2. tessera imports models saved by transformers' save_pretrained (float32
#      in one file; bfloat16 with tied embeddings in 9 shards) and gives
#      transformers' logits and loss at 1e-5, and a Llama 3.2-shaped float64
#      model with rope_type "llama3" (llama3_rope_fp64) whose logits at 128
#      positions, 64 of them past original_max_position_embeddings, equal
#      transformers' float64 ones to 1e-12 (and its float32 ones to 1e-6),
#      and the same with tied embeddings as Llama 3.2 1B and 3B
#      (llama3_2_tied_fp64: no lm_head.weight), which tessera then trains a
#      few steps from and exports tied (tie_word_embeddings, no
#      lm_head.weight), check_hf.py holding the export to tessera's logits
#      and checking transformers builds it tied: freshly saved where
#      transformers is installed, else the copies in tests/python/fixtures/
#      (saved the same way by `check_hf.py make tests/python/fixtures`).
#   3. a NumPy .npy array saved by numpy.save reads as the same ids;
#   4. where Hugging Face tokenizers is installed: scripts/tokenizer.py
#      trains a byte-level BPE on a part of the bundled corpus, and tessera's
#      decoder (data::hf_tokenizer) turns the token file back into the text,
#      byte for byte.
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
"$bin" export-llama3 "$tmp/export_llama3"
python3 "$here/check_hf.py" check-export "$tmp/export_llama3"
if python3 -c "import torch, transformers" 2>/dev/null; then
  python3 "$here/check_hf.py" make "$tmp/saved" 2>/dev/null
  from="$tmp/saved"
else
  echo "hf_interop: transformers is not installed: importing the saved fixtures"
  from="$here/fixtures"
fi
"$bin" import "$from/fp32"
"$bin" import "$from/bf16_tied_sharded"
"$bin" import "$from/llama3_rope_fp64"
"$bin" import "$from/llama3_2_tied_fp64"
"$bin" train-export "$from/llama3_2_tied_fp64" "$tmp/export_tied"
python3 "$here/check_hf.py" check-export "$tmp/export_tied"

python3 - "$tmp/a.npy" "$tmp/a.ids" <<'PY'
import sys, numpy as np
ids = np.random.default_rng(5).integers(0, 50257, 1000).astype(np.uint16)
np.save(sys.argv[1], ids)
open(sys.argv[2], "w").write(" ".join(map(str, [int(ids.max()) + 1] + ids.tolist())) + "\n")
PY
"$bin" ids "$tmp/a.npy" > "$tmp/a.got"
cmp -s "$tmp/a.ids" "$tmp/a.got" || { echo "hf_interop: numpy.save's .npy read differently"; exit 1; }
echo "hf_interop: numpy.save's .npy of 1000 uint16 ids read back exactly"

if python3 -c "import tokenizers" 2>/dev/null; then
  head -c 300000 "$here/../../data/fortunes.txt" > "$tmp/part.txt"
  python3 "$here/../../scripts/tokenizer.py" train "$tmp/part.txt" --vocab 1024 --out "$tmp/bpe"
  "$bin" decode "$tmp/bpe/part.tok" "$tmp/bpe/tokenizer.json" "$tmp/part.back"
  cmp "$tmp/part.txt" "$tmp/part.back" || { echo "hf_interop: the BPE decode differs from the text"; exit 1; }
  echo "hf_interop: the trained BPE decodes back to the text byte for byte"
  # Encoding with the existing tokenizer.json gives the same token file.
  python3 "$here/../../scripts/tokenizer.py" encode "$tmp/part.txt" --tokenizer "$tmp/bpe/tokenizer.json" --out "$tmp/bpe/again.tok"
  cmp "$tmp/bpe/part.tok" "$tmp/bpe/again.tok" || { echo "hf_interop: encode differs from train's encoding"; exit 1; }
  echo "hf_interop: encoding with the saved tokenizer.json gives the same token file"
else
  echo "hf_interop: Hugging Face tokenizers is not installed: the BPE round trip is skipped"
fi
