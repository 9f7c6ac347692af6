#!/usr/bin/env bash
# Builds every host unit test (target tessera_unit_tests) under a sanitizer
# preset and runs them all with CTest (CMakePresets.json):
#   asan  AddressSanitizer (LeakSanitizer at exit) and UndefinedBehavior-
#         Sanitizer, at -O0: UBSan's instrumentation makes -O1 compile about
#         twice as slowly, and -O0 keeps the whole suite inside CI's budget;
#   tsan  ThreadSanitizer at -O1 over the thread communicator
#         (comm::local_communicator: ranks as threads), one OpenMP thread per
#         rank (libgomp is not built with TSan; scripts/tsan.supp).
# Not run under either: the golden trajectories (bit-exact at the host
# preset's -O3), the steady-state allocation test, the compile-fail,
# consumer, Python and MPI tests (those are about the build or other
# processes; MPI is off in these presets).
#   scripts/sanitize.sh [asan|tsan|all] [ctest arguments...]
#   scripts/sanitize.sh all                 # CI: both, every unit test
#   scripts/sanitize.sh tsan -R comm_local  # one test
# Any finding fails the run: UBSan and TSan halt on the first report, ASan
# on its first error and LeakSanitizer at exit.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh  # g++, cmake, BLAS, OpenMP, Catch2: what the build needs

which=all
args=()
for a in "$@"; do
  case "$a" in
    asan | tsan | all) which="$a" ;;
    *) args+=("$a") ;;
  esac
done

now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.0f", b - a }'; }

run_preset() {
  local preset="$1"
  local t0 t1 t2 t3
  echo "== sanitize: $preset"
  t0=$(now)
  cmake --preset "$preset" >/dev/null
  t1=$(now)
  cmake --build --preset "$preset" --target "tessera_${preset}_tests"
  t2=$(now)
  local status=0
  ctest --preset "$preset" ${args[@]+"${args[@]}"} || status=$?
  t3=$(now)
  echo "== sanitize: $preset: configure $(elapsed "$t0" "$t1") s, build $(elapsed "$t1" "$t2") s," \
       "test $(elapsed "$t2" "$t3") s"
  return "$status"
}

status=0
if [ "$which" = asan ] || [ "$which" = all ]; then
  run_preset asan || status=$?
fi
if [ "$which" = tsan ] || [ "$which" = all ]; then
  run_preset tsan || status=$?
fi
exit "$status"
