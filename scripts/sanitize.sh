#!/usr/bin/env bash
# Builds host unit tests under a sanitizer preset and runs them with CTest
# (CMakePresets.json):
#   asan  AddressSanitizer (LeakSanitizer at exit) and UndefinedBehavior-
#         Sanitizer, clang++ -O0, over every unit test (tessera_asan_tests):
#         clang compiles it twice as fast as g++ at -O0, and g++ -O1 twice
#         as slowly again (UBSan's instrumentation), which keeps the whole
#         suite inside CI's budget;
#   tsan  ThreadSanitizer, clang++ -O0, over the unit tests that start threads
#         (label `threads`, target tessera_tsan_tests: ranks as threads of
#         comm::local_world or std::thread; tests/CMakeLists.txt finds them),
#         one OpenMP thread per rank (the OpenMP runtime is not built with TSan;
#         scripts/tsan.supp), but for the trainer-layout tests of tests/train
#         (dp, tp, pp, cp, precisions, optimizers: CMakePresets.json names
#         them), whose ranks meet only in comm::local_communicator, which
#         tests/comm, tests/parallel and tests/nn drive under TSan; the job,
#         fault, fit, step and checkpoint-folder tests (the asynchronous
#         writer) stay. Run one of them with scripts/sanitize.sh tsan -R NAME
#         after removing it from the preset's filter.
# The asan preset compiles tests/kernels at -O1 (the emulated kernels run
# seven times faster; every access is still instrumented) and runs without
# detect_stack_use_after_return (its fake stack frames multiplied the -O0
# suite's time).
# Not run under ASan: the four longest block-emulator tests
# (test_kernels_cuda_attention_launch, _emulated_attention_blocks,
# _emulated_optimizer, _emulated_embedding: 11, 17, 44 and 4 s at the host
# preset's -O3; 470, 771, 600 and 107 s under ASan at -O0, together more
# than CI's margin); the emulator checks each of their global accesses
# against the launch's buffers and poisons shared memory itself.
# Not run under either: the golden trajectories (bit-exact at the host
# preset's -O3), the steady-state allocation test, the compile-fail,
# consumer, Python and MPI tests (those are about the build or other
# processes; MPI is off in these presets).
#   scripts/sanitize.sh [asan|tsan|all] [ctest arguments...]
#   scripts/sanitize.sh all                 # CI: both
#   scripts/sanitize.sh tsan -R comm_local  # one test
# Any finding fails the run: UBSan and TSan halt on the first report, ASan
# on its first error and LeakSanitizer at exit.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh  # g++, cmake, BLAS, OpenMP, Catch2: what the build needs
scripts/clang_deps.sh  # clang++ and its sanitizer runtimes (the asan preset)

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
