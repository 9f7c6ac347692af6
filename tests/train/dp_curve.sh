#!/usr/bin/env bash
# train_llama's loss curve does not depend on the data-parallel degree, the
# ZeRO stage or the communicator: the same --global-batch run with dp 1 (the
# single-rank path), --comm local --dp 4 under zero 0..3, and, when mpirun
# is given, mpirun -np 2 --dp 2 under zero 1 and 3, log losses and gradient
# norms equal within float32 rounding (1e-5 relative).
#   tests/train/dp_curve.sh build/host/examples/train_llama [mpirun]
set -euo pipefail
bin=${1:?usage: dp_curve.sh path/to/train_llama [mpirun]}
mpirun=${2:-}
root=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive
args=(--preset small --dim 32 --layers 2 --heads 4 --kv-heads 2 --ffn 64 --data "$root/data/fortunes.txt"
      --steps 5 --global-batch 8 --micro-batch 1 --seq 32 --lr 3e-3 --warmup 1 --grad-clip 0.5
      --eval-every 0 --eval-windows 8 --checkpoint-every 0 --sample-bytes 0 --no-baseline)
"$bin" "${args[@]}" --out "$work/dp1" > "$work/dp1.log"
runs=()
for z in 0 1 2 3; do
  "$bin" "${args[@]}" --dp 4 --zero "$z" --comm local --out "$work/local_z$z" > "$work/local_z$z.log"
  runs+=("local_z$z")
done
if [ -n "$mpirun" ]; then
  for z in 1 3; do
    # --dp defaults to the world size under mpirun (zero 3 gives it anyway).
    dp=(); [ "$z" = 3 ] && dp=(--dp 2)
    "$mpirun" -np 2 "$bin" "${args[@]}" "${dp[@]}" --zero "$z" --comm mpi --out "$work/mpi_z$z" \
      > "$work/mpi_z$z.log"
    runs+=("mpi_z$z")
  done
  # A refused setting is reported once, by rank 0, not by every rank.
  set +e
  "$mpirun" -np 2 "$bin" "${args[@]}" --heads 3 --comm mpi --out "$work/mpi_bad" > /dev/null 2> "$work/mpi_bad.err"
  rc=$?
  set -e
  n=$(grep -c "n_heads=3 does not divide" "$work/mpi_bad.err" || true)
  if [ "$rc" -eq 0 ] || [ "$n" -ne 1 ]; then
    echo "FAIL mpirun refusal: rc $rc, the message $n times: $(cat "$work/mpi_bad.err")"; exit 1
  fi
  echo "ok   mpirun refusal reported once: $(grep "n_heads=3" "$work/mpi_bad.err")"
fi
python3 - "$work" "${runs[@]}" <<'PY'
import json, sys
work, runs = sys.argv[1], sys.argv[2:]
def curve(name):
    return [r for r in map(json.loads, open(f"{work}/{name}/metrics.jsonl")) if "step" in r]
ref = curve("dp1")
assert len(ref) == 5, ref
bad = 0
for name in runs:
    got = curve(name)
    assert len(got) == len(ref), (name, len(got))
    for a, b in zip(ref, got):
        for k in ("loss", "grad_norm", "val_loss"):
            if k not in a: continue
            rel = abs(a[k] - b[k]) / abs(a[k])
            if rel > 1e-5:
                print(f"FAIL {name} step {a['step']} {k}: {b[k]} vs dp 1 {a[k]} (rel {rel:.2e})")
                bad = 1
    print(f"ok   {name}: {len(got)} steps, final loss {got[-1]['loss']:.6f} (dp 1: {ref[-1]['loss']:.6f})")
sys.exit(bad)
PY
