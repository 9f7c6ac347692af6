#!/usr/bin/env bash
# The run folder's rules from the command line, on two ranks of threads
# under ZeRO-1 (and under mpirun when it is given):
#   - a fresh run into a folder that holds a checkpoint is refused, one line,
#     exit 2, nothing touched; --overwrite replaces it;
#   - --async-save writes the same checkpoint files as a synchronous save;
#   - kill -9 in the middle of a save (under mpirun, of one rank): the
#     previous checkpoint resumes, bit for bit;
#   - a second run into a folder in use is refused naming the first (the
#     lock), and takes the folder once the first has ended;
#   - SIGINT (raised on the lead rank after step 5) and SIGTERM (sent from
#     outside while the run is held after step 4, with the second run's
#     refusal in between) stop the run after that step with a checkpoint,
#     one line naming the step and the folder, exit 128+signal;
#   - `--auto-resume` with the same command line then continues each, and
#     every step's loss, gradient norm and learning rate equal those of the
#     run that was never stopped, bit for bit.
#   tests/train/run_folder.sh build/host/examples/train_llama build/host/tests/libtessera_kill_after_step.so [mpirun]
set -euo pipefail
bin=${1:?usage: run_folder.sh path/to/train_llama path/to/libtessera_kill_after_step.so [mpirun]}
preload=${2:?usage: run_folder.sh path/to/train_llama path/to/libtessera_kill_after_step.so [mpirun]}
mpirun=${3:-}
root=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d)
held=
trap '[ -n "$held" ] && kill -9 $held 2> /dev/null; rm -rf "$work"' EXIT
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
args=(--preset small --dim 32 --layers 2 --heads 4 --kv-heads 2 --ffn 64 --data "$root/data/fortunes.txt"
      --steps 12 --global-batch 8 --micro-batch 2 --seq 32 --lr 3e-3 --warmup 3 --eval-every 0
      --eval-windows 8 --checkpoint-every 8 --sample-bytes 0 --no-baseline --dp 2 --zero 1)
run=("$bin")
tag=threads
if [ -n "$mpirun" ]; then
  run=("$mpirun" -np 2 "$bin")
  args+=(--comm mpi)
  tag=mpirun
fi
fail() { echo "run_folder ($tag): $*" >&2; exit 1; }

# Every step of run folder $2 equals run folder $1's, bit for bit.
same_steps() {
  python3 - "$1/metrics.jsonl" "$2/metrics.jsonl" "$tag" <<'PY'
import json, sys
def load(p):
    return {r["step"]: (r["loss"], r["grad_norm"], r["lr"]) for r in map(json.loads, open(p)) if "step" in r}
full, other = load(sys.argv[1]), load(sys.argv[2])
assert sorted(full) == list(range(1, 13)), sorted(full)
assert sorted(other) == sorted(full), f"steps differ: {sorted(other)}"
bad = [s for s in full if full[s] != other[s]]
for s in bad[:5]: print(f"step {s}: {full[s]} vs {other[s]}", file=sys.stderr)
sys.exit(1 if bad else 0)
PY
}

"${run[@]}" "${args[@]}" --out "$work/full" > "$work/full.log" 2>&1 || { cat "$work/full.log" >&2; fail "the reference run failed"; }

# A fresh run into a checkpointed folder: refused at once, nothing touched.
before=$(cd "$work/full" && find . -type f ! -name .lock | sort | xargs sha256sum)
set +e
"${run[@]}" "${args[@]}" --out "$work/full" > "$work/fresh.out" 2> "$work/fresh.err"
rc=$?
set -e
want="train_llama: error: run folder '$work/full' holds the checkpoint of an earlier run (newest: step-000012); give --resume $work/full to continue it (or --auto-resume, which resumes whenever it holds one), or --overwrite to replace it"
[ $rc -eq 2 ] && grep -qxF "$want" "$work/fresh.err" ||
  fail "a fresh run into a checkpointed folder: want exit 2 and '$want', got $rc: $(cat "$work/fresh.err")"
[ "$(cd "$work/full" && find . -type f ! -name .lock | sort | xargs sha256sum)" = "$before" ] || fail "the refused run changed the folder"
echo "run_folder ($tag): a fresh run into a checkpointed folder refused: $(grep -m1 error "$work/fresh.err")"

# --overwrite: the same run again in its place, the same steps, the
# earlier run's checkpoints gone (a planted later one included).
cp -r "$work/full" "$work/over"
cp -r "$work/over/step-000012" "$work/over/step-000099"
"${run[@]}" "${args[@]}" --out "$work/over" --overwrite > "$work/over.log" 2>&1 || { cat "$work/over.log" >&2; fail "--overwrite failed"; }
same_steps "$work/full" "$work/over" || fail "--overwrite: the steps differ"
[ ! -e "$work/over/step-000099" ] || fail "--overwrite left the earlier run's step-000099"
echo "run_folder ($tag): --overwrite replaced it"

# --async-save: the same steps, and the same checkpoint files byte for byte.
"${run[@]}" "${args[@]}" --out "$work/async" --async-save > "$work/async.log" 2>&1 || { cat "$work/async.log" >&2; fail "--async-save failed"; }
same_steps "$work/full" "$work/async" || fail "--async-save: the steps differ"
for f in step-000008/metadata.json step-000008/rank-00000.bin step-000012/rank-00001.bin step-000012/metadata.json; do
  cmp -s "$work/full/$f" "$work/async/$f" || fail "--async-save: $f differs from the synchronous save's"
done
echo "run_folder ($tag): --async-save wrote the same checkpoint files"

# kill -9 in the middle of a save (of step 8; under mpirun, of rank 1
# alone): the folder has no metadata, so the same command line with
# --auto-resume resumes from step 4 and every step equals the run never
# stopped.
set +e
LD_PRELOAD="$preload" TESSERA_KILL_IN_SAVE=8 TESSERA_KILL_RANK=${mpirun:+1} \
  "${run[@]}" "${args[@]}" --checkpoint-every 4 --out "$work/kill9" > "$work/kill9.log" 2>&1
rc=$?
set -e
[ $rc -ne 0 ] && [ -d "$work/kill9/step-000008" ] && [ ! -e "$work/kill9/step-000008/metadata.json" ] &&
  [ -f "$work/kill9/step-000004/metadata.json" ] ||
  { cat "$work/kill9.log" >&2; fail "kill -9 in the save of step 8: want a failed run, step-000004 complete, step-000008 without metadata; got $rc"; }
"${run[@]}" "${args[@]}" --checkpoint-every 4 --out "$work/kill9" --auto-resume > "$work/kill9b.log" 2>&1 ||
  { cat "$work/kill9b.log" >&2; fail "--auto-resume after kill -9 in a save failed"; }
grep -q "resumed from step 4" "$work/kill9b.log" || { cat "$work/kill9b.log" >&2; fail "--auto-resume did not resume from step 4"; }
same_steps "$work/full" "$work/kill9" || fail "kill -9 in a save, then --auto-resume: the steps differ from the run never stopped"
echo "run_folder ($tag): kill -9 in the save of step 8 (exit $rc), then --auto-resume from step 4: all 12 steps identical"

# SIGINT on the lead rank after step 5: stops after step 5 with its checkpoint.
set +e
LD_PRELOAD="$preload" TESSERA_KILL_AFTER_STEP=5 TESSERA_KILL_SIGNAL=INT \
  "${run[@]}" "${args[@]}" --out "$work/int" > "$work/int.log" 2>&1
rc=$?
set -e
line="train_llama: stopped by SIGINT after step 5 of 12 \([0-9.]+ s\): checkpoint $work/int/step-000005 saved; resume from $work/int"
[ $rc -eq 130 ] && grep -Eq "^$line\$" "$work/int.log" && [ -f "$work/int/step-000005/metadata.json" ] ||
  { cat "$work/int.log" >&2; fail "SIGINT after step 5: want exit 130, the stop line and step-000005, got $rc"; }
echo "run_folder ($tag): $(grep -m1 'stopped by' "$work/int.log")"
"${run[@]}" "${args[@]}" --out "$work/int" --auto-resume > "$work/int2.log" 2>&1 || { cat "$work/int2.log" >&2; fail "--auto-resume after SIGINT failed"; }
grep -q "train_llama: --auto-resume: '$work/int' holds a checkpoint: resuming it" "$work/int2.log" || fail "--auto-resume did not say it resumed"
same_steps "$work/full" "$work/int" || fail "SIGINT then --auto-resume: the steps differ from the run never stopped"
echo "run_folder ($tag): SIGINT, then --auto-resume: all 12 steps identical"

# SIGTERM from outside, to a run held after step 4 (the writing thread
# waits for a file): meanwhile a second run into its folder is refused,
# naming the first; the signal goes to a process of the job. With threads
# the ranks share the signal and stop after step 4; under mpirun it goes to
# rank 1, which writes nothing and is already waiting to agree on step 5,
# so the ranks stop after step 5.
LD_PRELOAD="$preload" TESSERA_HOLD_AFTER_STEP=4 TESSERA_HOLD_FILE="$work/go" \
  "${run[@]}" "${args[@]}" --out "$work/term" > "$work/term.log" 2>&1 &
held=$!
for _ in $(seq 600); do
  n=$(grep -c '"step":[0-9]' "$work/term/metrics.jsonl" 2> /dev/null || true)
  [ "${n:-0}" -ge 4 ] && break
  sleep 0.1
done
[ "$(grep -c '"step":[0-9]' "$work/term/metrics.jsonl")" -eq 4 ] || fail "the held run did not reach step 4"
holder=$(sed -n 's/^pid \([0-9]*\) .*/\1/p' "$work/term/.lock")
set +e
"${run[@]}" "${args[@]}" --out "$work/term" --auto-resume > /dev/null 2> "$work/second.err"
rc=$?
set -e
[ $rc -eq 2 ] && grep -Eq "train_llama: error: run folder '$work/term' is in use by another run \(pid $holder on host [^ ]+ since [0-9 :-]+ UTC\): wait for it to end, or give another folder" "$work/second.err" ||
  fail "a second run into a folder in use: want exit 2 naming pid $holder, got $rc: $(cat "$work/second.err")"
echo "run_folder ($tag): a second run refused: $(grep -m1 error "$work/second.err")"
target=$holder
if [ -n "$mpirun" ]; then
  target=$(pgrep -P "$held" | grep -vx "$holder" | head -n1)
  [ -n "$target" ] || fail "no second rank process under mpirun $held"
fi
kill -TERM "$target"
for _ in $(seq 300); do  # the handler's line: the request is recorded
  grep -q "tessera: SIGTERM: stopping after this step" "$work/term.log" && break
  sleep 0.1
done
touch "$work/go"
set +e
wait "$held"
rc=$?
set -e
held=
at=4
[ -n "$mpirun" ] && at=5
line="train_llama: stopped by SIGTERM after step $at of 12 \([0-9.]+ s\): checkpoint $work/term/step-00000$at saved; resume from $work/term"
[ $rc -eq 143 ] && grep -Eq "^$line\$" "$work/term.log" ||
  { cat "$work/term.log" >&2; fail "SIGTERM after step $at: want exit 143 and the stop line, got $rc"; }
echo "run_folder ($tag): $(grep -m1 'stopped by' "$work/term.log")"
"${run[@]}" "${args[@]}" --out "$work/term" --auto-resume > "$work/term2.log" 2>&1 || { cat "$work/term2.log" >&2; fail "--auto-resume after SIGTERM failed"; }
same_steps "$work/full" "$work/term" || fail "SIGTERM then --auto-resume: the steps differ from the run never stopped"
echo "run_folder ($tag): SIGTERM, then --auto-resume (the lock taken again): all 12 steps identical"

# A pipeline run resumed on one stage (threads: the world size changes):
# the schedule run.toml restored is dropped, with a note, and the run
# continues to its last step.
if [ -z "$mpirun" ]; then
  "$bin" "${args[@]}" --pp 2 --schedule zb1 --steps 8 --out "$work/pp" > "$work/pp.log" 2>&1 ||
    { cat "$work/pp.log" >&2; fail "the zb1 pipeline run failed"; }
  "$bin" --resume "$work/pp" --pp 1 --steps 12 > "$work/pp2.log" 2>&1 ||
    { cat "$work/pp2.log" >&2; fail "--resume of a zb1 run with --pp 1 failed"; }
  grep -q "^train_llama: --schedule from run.toml dropped" "$work/pp2.log" ||
    { cat "$work/pp2.log" >&2; fail "no note that --schedule was dropped"; }
  [ "$(grep -c '"step":[0-9]' "$work/pp/metrics.jsonl")" -ge 12 ] ||
    fail "the resumed run did not reach step 12"
  echo "run_folder ($tag): a zb1 pipeline run resumed with --pp 1"
fi
