#!/usr/bin/env bash
# Builds the libFuzzer targets of tessera's file readers (preset fuzz:
# clang++, ASan + UBSan; tests/fuzz) and runs each for SECONDS (default 30)
# on a copy of its seed corpus, tests/fuzz/corpus/<name>/, one per core at a
# time (FUZZ_JOBS=N to change).
#   scripts/fuzz.sh [SECONDS] [TARGET...]    # targets: token_file checkpoint checkpoint_index safetensors hf_config
# Exit status 1 on any finding (a crash, an exception other than
# tessera::error, a leak, undefined behaviour, a timeout or running out of
# memory); the input that caused it is kept under build/fuzz/findings/<name>/.
# Add it to the corpus with the fix. As root, installs clang and the
# libFuzzer runtime if missing (Debian 12: clang, libclang-rt-14-dev, libomp-14-dev).
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-30}
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(token_file checkpoint checkpoint_index safetensors hf_config)
[[ "$secs" =~ ^[0-9]+$ ]] || { echo "usage: scripts/fuzz.sh [SECONDS] [TARGET...]" >&2; exit 2; }

scripts/deps.sh  # cmake, BLAS, OpenMP, nlohmann-json: what configuring tessera needs
scripts/clang_deps.sh  # clang++, libFuzzer and the sanitizer runtimes

cmake --preset fuzz >/dev/null
cmake --build --preset fuzz

work=$(mktemp -d "${TMPDIR:-/tmp}/tessera_fuzz.XXXXXX")
trap 'kill $(jobs -p) 2>/dev/null || true; wait || true; rm -rf "$work"' EXIT
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
# One fuzzer per core at a time (FUZZ_JOBS, default nproc): each still runs
# SECONDS on one core.
jobs=${FUZZ_JOBS:-$(nproc)}
[[ "$jobs" =~ ^[1-9][0-9]*$ ]] || { echo "tessera: FUZZ_JOBS must be a positive integer, not '$jobs'" >&2; exit 2; }
run_one() {  # target -> its log and artifacts under $work/<target>/, status in rc
  local t=$1 bin=build/fuzz/tests/fuzz/fuzz_$1 rc=0
  "$bin" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -max_len=4096 \
    -print_final_stats=1 -artifact_prefix="$work/$t/artifacts/" "$work/$t/corpus" \
    >"$work/$t/log" 2>&1 || rc=$?
  echo "$rc" > "$work/$t/rc"
}
for t in "${targets[@]}"; do
  bin=build/fuzz/tests/fuzz/fuzz_$t
  [ -x "$bin" ] || { echo "tessera: no fuzz target '$t' ($bin)" >&2; exit 2; }
  mkdir -p "$work/$t/corpus" "$work/$t/artifacts"
  cp -r tests/fuzz/corpus/"$t"/. "$work/$t/corpus/"  # the committed corpus stays as it is
done
echo "== fuzz: ${targets[*]}: ${secs}s each, $jobs at a time"
running=0
for t in "${targets[@]}"; do
  if [ "$running" -ge "$jobs" ]; then wait -n || true; running=$((running - 1)); fi
  run_one "$t" &
  running=$((running + 1))
done
wait
failed=()
for t in "${targets[@]}"; do
  log=$work/$t/log
  rc=$(cat "$work/$t/rc" 2>/dev/null || echo 1)
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || true)
  cov=$(grep -E '^#[0-9]+.*cov: ' "$log" | tail -1 | grep -oE 'cov: [0-9]+ ft: [0-9]+ corp: [^ ]+' || true)
  echo "fuzz_$t: ${execs:-?} executions; ${cov:-no coverage line}"
  if [ "$rc" -ne 0 ] || grep -qE '^==[0-9]+==ERROR|runtime error:|SUMMARY: ' "$log"; then
    keep=build/fuzz/findings/$t
    mkdir -p "$keep"
    cp "$work/$t/artifacts/"* "$keep/" 2>/dev/null || true
    cp "$log" "$keep/log" 2>/dev/null || true
    echo "fuzz_$t: FINDING (exit $rc); inputs and log in $keep/:" >&2
    grep -E 'ERROR|runtime error|SUMMARY|what\(\)|property failed|Test unit written' "$log" | head -20 >&2
    failed+=("$t")
  fi
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "tessera: fuzzing found problems in: ${failed[*]}" >&2
  exit 1
fi
echo "tessera: no findings in ${targets[*]} (${secs}s each)"
