#!/usr/bin/env bash
# Bad settings to a train_llama job under mpirun: every rank refuses them
# alike, so exactly one line names the value and the limit (rank 0's), the
# job exits non-zero, and no output folder is left behind. Rank 0 alone
# prepares the folder and the token file; the others wait for it (they once
# printed other messages, reading a token file rank 0 had just removed, and
# left the folder behind).
#   tests/mpi/cli_refusals.sh build/host/examples/train_llama mpirun
set -uo pipefail
bin=${1:?usage: cli_refusals.sh train_llama mpirun}
mpirun=${2:?usage: cli_refusals.sh train_llama mpirun}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMP_NUM_THREADS=1
fail=0
refused() {  # refused <name> <pattern> <args...>
  local name=$1 pat=$2; shift 2
  "$mpirun" -np 2 "$bin" --preset tiny --steps 2 --no-baseline --sample-bytes 0 --out "$work/out" "$@" \
    > "$work/log" 2>&1
  local rc=$? lines; lines=$(grep -c "^train_llama: error" "$work/log")
  if [ $rc -eq 0 ] || [ "$lines" -ne 1 ] || ! grep -q -- "$pat" "$work/log" || [ -e "$work/out" ]; then
    echo "FAIL $name: rc=$rc, $lines error lines, folder $([ -e "$work/out" ] && echo left || echo removed):"
    grep "train_llama" "$work/log"; fail=1
  else
    echo "ok   $name: $(grep "^train_llama: error" "$work/log")"
  fi
  rm -rf "$work/out"
}
refused "not a ZeRO stage" "--zero 5 is not a ZeRO stage" --zero 5
refused "a sequence beyond max_seq" "sequence length T=4096 exceeds the model's max_seq=64" --micro-batch 8 --seq 4096
refused "G not divisible by B x dp" "G=12 is not divisible by micro-batch B=8 x dp=2" --global-batch 12 --micro-batch 8
refused "heads that do not divide dim" "n_heads=3 does not divide dim=16" --heads 3
printf 'far too short' > "$work/short.txt"
refused "thread ranks under a launch of processes" "--comm local runs the ranks as threads of one process, but the launcher started 2 processes" --comm local --dp 2 --micro-batch 8
refused "a corpus smaller than one window" "smaller than one window" --data "$work/short.txt" --micro-batch 8
exit $fail
