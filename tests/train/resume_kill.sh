#!/usr/bin/env bash
# Kills train_llama with SIGKILL mid-run, resumes it from its last checkpoint,
# and checks that every step's loss, gradient norm and learning rate equal,
# bit for bit, those of a run that was never stopped (same seed and thread
# count). The resume is given nothing but --resume DIR: the settings come
# from DIR/run.toml. The steps before the kill also check that two runs
# replay exactly. Then the finished run is extended with a larger --steps,
# and a resume with conflicting settings is refused listing all of them.
#   tests/train/resume_kill.sh build/host/examples/train_llama build/host/tests/libtessera_kill_after_step.so
set -euo pipefail
bin=${1:?usage: resume_kill.sh path/to/train_llama path/to/libtessera_kill_after_step.so}
preload=${2:?usage: resume_kill.sh path/to/train_llama path/to/libtessera_kill_after_step.so}
root=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
args=(--preset small --dim 32 --layers 2 --heads 4 --kv-heads 2 --ffn 64 --data "$root/data/fortunes.txt" --steps 24 --global-batch 8 --micro-batch 4
      --seq 32 --lr 3e-3 --warmup 3 --eval-every 0 --eval-windows 8 --checkpoint-every 4
      --sample-bytes 0 --no-baseline)
"$bin" "${args[@]}" --out "$work/full" > "$work/full.log"

# SIGKILL right after step 14 is logged (checkpoints at 4, 8, 12), sent by
# the process to itself from a preloaded write() (tests/support/kill_after_step.cpp):
# the same point on every machine, however fast.
set +e
LD_PRELOAD="$preload" TESSERA_KILL_AFTER_STEP=14 "$bin" "${args[@]}" --out "$work/killed" > "$work/killed.log"
rc=$?
set -e
lines=$(grep -c '"step":[0-9]' "$work/killed/metrics.jsonl")
if [ $rc -ne 137 ] || [ "$lines" -ne 14 ]; then
  echo "resume_kill: expected a SIGKILL (exit 137) after 14 logged steps, got exit $rc after $lines" >&2; exit 1
fi
echo "resume_kill: killed after $lines logged steps"
"$bin" --resume "$work/killed" > "$work/resumed.log"

python3 - "$work/full/metrics.jsonl" "$work/killed/metrics.jsonl" <<'PY'
import json, sys
def load(p):
    return {r["step"]: (r["loss"], r["grad_norm"], r["lr"]) for r in map(json.loads, open(p)) if "step" in r}
full, resumed = load(sys.argv[1]), load(sys.argv[2])
assert sorted(full) == list(range(1, 25)), sorted(full)
assert sorted(resumed) == sorted(full), f"steps differ: {sorted(resumed)}"
bad = [s for s in full if full[s] != resumed[s]]  # exact float equality: bit for bit
if bad:
    for s in bad[:5]: print(f"step {s}: full {full[s]} vs resumed {resumed[s]}", file=sys.stderr)
    sys.exit(1)
print(f"resume_kill: all {len(full)} steps identical (loss, grad_norm, lr)")
PY

# Extended: 6 more steps on the schedule of the new total, the 24 steps kept.
"$bin" --resume "$work/killed" --steps 30 > "$work/extended.log"
grep -q "the schedule now runs to step 30 (the checkpoint's run planned 24)" "$work/extended.log" || {
  echo "resume_kill: the extension's log does not state the new schedule" >&2; cat "$work/extended.log" >&2; exit 1; }
python3 - "$work/killed/metrics.jsonl" <<'PY'
import json, sys
rows = list(map(json.loads, open(sys.argv[1])))
steps = [r["step"] for r in rows if "step" in r]
assert steps == list(range(1, 31)), steps
assert "config" in rows[0] and all("time" in r for r in rows), rows[0]
resumes = [r["resumed_at"] for r in rows if "resumed_at" in r]
assert len(resumes) == 2 and resumes[1] == 24, resumes
print("resume_kill: extended to 30 steps; the configuration and both resumes recorded")
PY

# Conflicting settings: one message naming every differing field, exit 2.
set +e
"$bin" --resume "$work/killed" --steps 30 --lr 0.01 --global-batch 16 > /dev/null 2> "$work/conflict.err"
rc=$?
set -e
if [ $rc -ne 2 ] || [ "$(grep -c . "$work/conflict.err")" -ne 1 ] ||
   ! grep -q "global_batch=8 in the checkpoint, 16 in this run" "$work/conflict.err" ||
   ! grep -q "lr=0.003 in the checkpoint, 0.01 in this run" "$work/conflict.err"; then
  echo "resume_kill: conflicting resume: rc $rc, $(cat "$work/conflict.err")" >&2; exit 1
fi
echo "resume_kill: conflicting settings refused at once: $(cat "$work/conflict.err")"
