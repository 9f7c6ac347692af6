#!/usr/bin/env bash
# Faults of a train_llama job under mpirun, end to end:
#   1. kill -9 of one rank of four mid-step: mpirun ends the job within
#      seconds naming the lost rank, the survivors name the lost rank, their
#      step and the operation they waited in; a restart from nothing but --resume DIR
#      continues bit for bit (every step's loss, norm and lr equal those of
#      a job never stopped);
#   2. a full disk (a small tmpfs) during a checkpoint: every rank ends
#      within 10 s with the writer's message naming world rank 0 and the
#      step, exit status 2, and the previous checkpoint is intact (it
#      resumes). Skipped (77) where tmpfs cannot be mounted (not root, or a
#      container without the capability);
#   3. a setting given to one rank only (--seed): refused at start-up,
#      naming the setting and both ranks;
#   4. metrics.jsonl on a full disk: the run ends with status 2 naming the
#      file (it once went on and exited 0 with the file empty).
#   tests/mpi/train_faults.sh build/host/examples/train_llama build/host/examples/tokenize mpirun
set -euo pipefail
bin=${1:?usage: train_faults.sh train_llama tokenize mpirun}
tok=${2:?usage: train_faults.sh train_llama tokenize mpirun}
mpirun=${3:?usage: train_faults.sh train_llama tokenize mpirun}
root=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d)
mnt="$work/disk"
cleanup() { mountpoint -q "$mnt" 2>/dev/null && umount "$mnt"; rm -rf "$work"; }
trap cleanup EXIT
export OMP_NUM_THREADS=1
"$tok" "$root/data/fortunes.txt" -o "$work/fortunes.tok" > /dev/null
args=(--preset small --dim 32 --layers 2 --heads 4 --kv-heads 2 --ffn 64 --data "$work/fortunes.tok"
      --global-batch 8 --micro-batch 2 --seq 32 --lr 3e-3 --warmup 3 --eval-every 0 --eval-windows 8
      --sample-bytes 0 --no-baseline --comm-timeout 120)
steps_of() {  # step -> (loss, grad_norm, lr) of a metrics.jsonl, as text
  python3 -c 'import json,sys
for r in map(json.loads, open(sys.argv[1])):
    if "step" in r: print(r["step"], repr(r["loss"]), repr(r["grad_norm"]), repr(r["lr"]))' "$1"
}

# ---- 1. kill -9 of world rank 2 of 4 -------------------------------------------------------
"$mpirun" -np 4 "$bin" "${args[@]}" --steps 96 --checkpoint-every 4 --out "$work/full" > "$work/full.log" 2>&1
"$mpirun" -np 4 "$bin" "${args[@]}" --steps 96 --checkpoint-every 4 --out "$work/killed" > "$work/killed.log" 2>&1 &
job=$!
victim=""
for _ in $(seq 1 1200); do
  n=$(grep -c '"step"' "$work/killed/metrics.jsonl" 2>/dev/null || true)
  if [ "${n:-0}" -ge 10 ]; then
    for p in $(pgrep -f -- "--out $work/killed" || true); do
      if tr '\0' '\n' < "/proc/$p/environ" 2>/dev/null | grep -qx 'OMPI_COMM_WORLD_RANK=2'; then victim=$p; fi
    done
    break
  fi
  sleep 0.05
done
[ -n "$victim" ] || { echo "train_faults: no rank 2 to kill (the job ended early?)" >&2; cat "$work/killed.log" >&2; exit 1; }
start=$(date +%s.%N)
kill -9 "$victim"
set +e
wait "$job"
rc=$?
set -e
secs=$(python3 -c "import time; print(round(time.time() - $start, 1))")
lines=$(grep -c '"step"' "$work/killed/metrics.jsonl")
echo "train_faults: killed world rank 2 (pid $victim) after $lines logged steps; mpirun ended in $secs s with status $rc"
if [ "$rc" -eq 0 ] || [ "$lines" -ge 96 ]; then echo "train_faults: the job went on without rank 2" >&2; exit 1; fi
python3 -c "import sys; sys.exit(0 if $secs < 30 else 1)" || { echo "train_faults: the job took $secs s to end" >&2; exit 1; }
grep -Eq "rank 2 .*(signal 9|Killed)" "$work/killed.log" || {
  echo "train_faults: the job's output does not name the lost rank:" >&2; cat "$work/killed.log" >&2; exit 1; }
# The survivors, stopped by mpirun's SIGTERM (SIGKILL follows 1 s later),
# name themselves, the step, the operation they waited in and the lost rank
# (comm/detail/launcher_note.hpp). mpirun may drop a line of a rank it is
# killing, so at least one of the three is required and the count printed.
notes=0
for r in 0 1 3; do
  if grep -Eq "tessera: world rank $r of 4 \(pid [0-9]+\) stopped by SIGTERM from its launcher at step [0-9]+, (waiting in [a-z_]+ #[0-9]+ \(n=[0-9]+ [a-z0-9]+\) as rank [0-9]+ of [0-9]+|computing \(in no communicator operation\)): lost world rank 2 \(pid $victim\), no longer running on this node" "$work/killed.log"; then
    notes=$((notes + 1))
  fi
done
[ "$notes" -ge 1 ] || {
  echo "train_faults: no survivor named the lost rank, its step and its operation:" >&2
  cat "$work/killed.log" >&2; exit 1; }
echo "train_faults: $notes of 3 survivors named the lost rank, their step and operation"
echo "train_faults: a survivor's note: $(grep -m1 'stopped by SIGTERM' "$work/killed.log")"
"$mpirun" -np 4 "$bin" --resume "$work/killed" > "$work/resumed.log" 2>&1 || {
  echo "train_faults: the restart failed:" >&2; cat "$work/resumed.log" >&2; exit 1; }
if ! diff <(steps_of "$work/full/metrics.jsonl") <(steps_of "$work/killed/metrics.jsonl") > "$work/diff"; then
  echo "train_faults: the restarted job differs from the uninterrupted one:" >&2; head "$work/diff" >&2; exit 1
fi
echo "train_faults: restarted with --resume: all 96 steps equal the uninterrupted job's, bit for bit"

# ---- 3. one rank started with another seed -------------------------------------------------
set +e
"$mpirun" -np 2 bash -c 'exec "$0" "$@" --seed $((7 + OMPI_COMM_WORLD_RANK))' "$bin" "${args[@]}" \
  --steps 4 --out "$work/seeds" > "$work/seeds.log" 2>&1
rc=$?
set -e
grep -q "train_llama's options differ between ranks: seed is \"7\" on world rank 0 but \"8\" on world rank 1" "$work/seeds.log" &&
  [ "$rc" -ne 0 ] || { echo "train_faults: a per-rank seed was not refused (status $rc):" >&2; cat "$work/seeds.log" >&2; exit 1; }
echo "train_faults: a seed given to one rank refused: $(grep -m1 'differ between ranks' "$work/seeds.log")"

# ---- 2. disk full during a checkpoint --------------------------------------------------------
mkdir -p "$mnt"
# The size of one checkpoint, from a short run elsewhere: the disk holds
# the first checkpoint, the run's small files and not a second checkpoint.
"$bin" "${args[@]}" --steps 1 --out "$work/probe" > /dev/null 2>&1
ck=$(du -sb "$work/probe/step-000001" | cut -f1)
size=$(( ck * 3 / 2 + 32 * 1024 ))
if ! mount -t tmpfs -o size=$size tmpfs "$mnt" 2>/dev/null; then
  echo "train_faults: cannot mount a tmpfs here (not root or no capability): the full-disk case is skipped"
  exit 77
fi
start=$(date +%s.%N)
set +e
"$mpirun" -np 2 "$bin" "${args[@]}" --steps 8 --checkpoint-every 2 --out "$mnt/run" > "$work/full_disk.log" 2>&1
rc=$?
set -e
secs=$(python3 -c "import time; print(round(time.time() - $start, 1))")
echo "train_faults: disk of $size bytes (checkpoint $ck): the job ended in $secs s with status $rc"
n=$(grep -Ec "checkpoint save to '$mnt/run/step-000004' failed on world rank [01]: .*No space left on device" "$work/full_disk.log" || true)
if [ "$rc" -ne 2 ] || [ "$n" -ne 2 ]; then
  echo "train_faults: want status 2 and the message on both ranks, got $rc and $n:" >&2; cat "$work/full_disk.log" >&2; exit 1
fi
python3 -c "import sys; sys.exit(0 if $secs < 60 else 1)" || { echo "train_faults: $secs s" >&2; exit 1; }
ls "$mnt/run" | grep -q '\.tmp\.' && { echo "train_faults: a temporary was left on the full disk: $(ls "$mnt/run")" >&2; exit 1; }
# The step-2 checkpoint is intact: it resumes (read back elsewhere, the disk being full).
cp -r "$mnt/run" "$work/after_full"
umount "$mnt"
"$mpirun" -np 2 "$bin" --resume "$work/after_full" --out "$work/after_full" > "$work/after.log" 2>&1 || {
  echo "train_faults: the checkpoint before the full disk does not resume:" >&2; cat "$work/after.log" >&2; exit 1; }
grep -q "resumed from step 2" "$work/after.log" || { echo "train_faults: not resumed from step 2:" >&2; cat "$work/after.log" >&2; exit 1; }
echo "train_faults: every rank ended with the writer's message; the step-2 checkpoint resumes"

# ---- 4. metrics.jsonl on a full disk: the run fails naming the file ------------------------
mount -t tmpfs -o size=12k tmpfs "$mnt"
set +e
"$bin" "${args[@]}" --steps 200 --checkpoint-every 0 --out "$mnt/m" > "$work/metrics_full.log" 2>&1
rc=$?
set -e
umount "$mnt"
if [ "$rc" -ne 2 ] || ! grep -Eq "writing (metrics file|'$mnt/m/).*No space left on device" "$work/metrics_full.log"; then
  echo "train_faults: a full disk under metrics.jsonl: status $rc:" >&2; tail -3 "$work/metrics_full.log" >&2; exit 1
fi
echo "train_faults: metrics on a full disk: $(grep -m1 'No space left' "$work/metrics_full.log")"
