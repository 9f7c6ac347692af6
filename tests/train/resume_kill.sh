#!/usr/bin/env bash
# Kills train_llama with SIGKILL mid-run, resumes it from its last checkpoint,
# and checks that every step's loss, gradient norm and learning rate equal,
# bit for bit, those of a run that was never stopped (same seed and thread
# count). The steps before the kill also check that two runs replay exactly.
#   tests/train/resume_kill.sh build/host/examples/train_llama
set -euo pipefail
bin=${1:?usage: resume_kill.sh path/to/train_llama}
root=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
args=(--preset small --dim 32 --layers 2 --heads 4 --kv-heads 2 --ffn 64 --data "$root/data/fortunes.txt" --steps 24 --global-batch 8 --micro-batch 4
      --seq 32 --lr 3e-3 --warmup 3 --eval-every 0 --eval-windows 8 --checkpoint-every 4
      --sample-bytes 0 --no-baseline)
"$bin" "${args[@]}" --out "$work/full" > "$work/full.log"

"$bin" "${args[@]}" --out "$work/killed" > "$work/killed.log" &
pid=$!
# wait until step 14 is logged (checkpoints at 4, 8, 12), then kill without warning
for _ in $(seq 1 600); do
  n=$({ wc -l < "$work/killed/metrics.jsonl"; } 2>/dev/null || echo 0)
  [ "$n" -ge 14 ] && break
  sleep 0.05
done
kill -9 "$pid" 2>/dev/null || true
wait "$pid" 2>/dev/null || true
lines=$(wc -l < "$work/killed/metrics.jsonl")
if [ "$lines" -ge 24 ]; then echo "resume_kill: run finished before the kill; test inconclusive" >&2; exit 1; fi
echo "resume_kill: killed after $lines logged steps"
"$bin" "${args[@]}" --resume "$work/killed" > "$work/resumed.log"

python3 - "$work/full/metrics.jsonl" "$work/killed/metrics.jsonl" <<'PY'
import json, sys
def load(p):
    return {r["step"]: (r["loss"], r["grad_norm"], r["lr"]) for r in map(json.loads, open(p))}
full, resumed = load(sys.argv[1]), load(sys.argv[2])
assert sorted(full) == list(range(1, 25)), sorted(full)
assert sorted(resumed) == sorted(full), f"steps differ: {sorted(resumed)}"
bad = [s for s in full if full[s] != resumed[s]]  # exact float equality: bit for bit
if bad:
    for s in bad[:5]: print(f"step {s}: full {full[s]} vs resumed {resumed[s]}", file=sys.stderr)
    sys.exit(1)
print(f"resume_kill: all {len(full)} steps identical (loss, grad_norm, lr)")
PY
