#!/usr/bin/env bash
# The main job: builds tessera (host preset) and trains the `small` Llama on
# the bundled corpus (data/fortunes.txt) on the CPU, printing a step log
# with the validation loss beside the 4-gram baseline, then renders the loss
# curve to runs/main/loss.png. Extra arguments go to train_llama.
#   scripts/main_job.sh                 # the main job (about 10 minutes on 2 cores)
#   scripts/main_job.sh --steps 30      # a short smoke run
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
cmake --preset host >/dev/null
cmake --build --preset host --target train_llama tokenize -j "$(nproc)" >/dev/null
build/host/examples/train_llama "$@"
out=runs/main
for ((i = 1; i <= $#; i++)); do
  case "${!i}" in
    --out) j=$((i + 1)); out="${!j}" ;;
    --out=*) out="${!i#--out=}" ;;
  esac
done
if [ -f "$out/metrics.jsonl" ]; then
  /usr/bin/python3 scripts/plot_loss.py "$out/metrics.jsonl" -o "$out/loss.png" || true
fi
