#!/usr/bin/env bash
# Builds and runs the host tests under the sanitizers (presets asan and tsan,
# CMakePresets.json): AddressSanitizer with UndefinedBehaviorSanitizer, and
# ThreadSanitizer over the thread communicator (comm::local_communicator).
#   scripts/sanitize.sh [asan|tsan|all] [--full] [ctest arguments...]
# Without --full it builds and runs the CI selection below (about 7 minutes
# for both on 2 cores); --full builds every host test and runs them all
# (ctest --preset asan|tsan; an hour or more on 2 cores). Any finding fails
# the run: UBSan and TSan halt on the first report, ASan on its first error
# and LeakSanitizer at exit.
#   scripts/sanitize.sh all                 # CI
#   scripts/sanitize.sh asan --full         # every test under ASan + UBSan
#   scripts/sanitize.sh tsan -R comm_local  # one test of the selection
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh  # g++, cmake, BLAS, OpenMP, Catch2: what the build needs

which=all
full=0
args=()
for a in "$@"; do
  case "$a" in
    asan | tsan | all) which="$a" ;;
    --full) full=1 ;;
    *) args+=("$a") ;;
  esac
done

# The CI selection, chosen by measured cost (CPU seconds of one core at
# -O1, 2026-12: ASan + UBSan compiles the Catch2 main in 30 s, most tests in
# 2-15 s, the trainer-level ones in 40-95 s; the whole host suite is about
# 21 CPU-minutes to build, over CI's budget). ASan + UBSan: the file readers
# (untrusted input), the caching allocator, the thread collectives, every
# host kernel's index arithmetic, the optimizers, ZeRO's shard offsets and
# buckets, the model and the trainer (checkpoint, resume, token files).
asan_tests=(
  test_core_caching_allocator test_core_numeric
  test_comm_local test_comm_device_mesh
  test_data_token_file test_data_fingerprint test_data_safetensors test_data_tokenizer
  test_data_hf_tokenizer
  test_data_sampler test_data_device_loader_bookkeeping
  test_kernels_attention test_kernels_cross_entropy test_kernels_gemm test_kernels_rmsnorm
  test_kernels_rope test_kernels_swiglu test_kernels_embedding test_kernels_exp
  test_optim_adamw test_optim_sgd
  test_parallel_zero test_parallel_buckets
  test_nn_llama test_nn_llama_reference
  test_train_trainer test_train_checkpoint
)
# TSan (10-45 s each): every test that runs ranks as threads of
# local_communicator: the collectives and their failure paths, ZeRO 0-3,
# buckets, the data-parallel, tensor-parallel and pipeline trainers, the
# trainer's agreement on a failed write and on settings across ranks.
tsan_tests=(
  test_comm_local
  test_parallel_zero test_parallel_buckets
  test_nn_tensor_parallel
  test_train_data_parallel test_train_tensor_parallel test_train_pipeline test_train_faults
)

now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.0f", b - a }'; }

run_preset() {
  local preset="$1"
  shift
  local tests=("$@")
  local t0 t1 t2 t3
  echo "== sanitize: $preset$([ "$full" = 1 ] && echo ' (full)')"
  t0=$(now)
  local selected=""
  [ "$full" = 1 ] || selected="$(IFS=';'; echo "${tests[*]}")"
  cmake --preset "$preset" "-DTESSERA_TEST_TARGETS=$selected" >/dev/null
  t1=$(now)
  if [ "$full" = 1 ]; then
    cmake --build --preset "$preset"
  else
    # One target for the selection, so make builds it in parallel.
    cmake --build --preset "$preset" --target tessera_selected_tests
  fi
  t2=$(now)
  local status=0
  if [ "$full" = 1 ]; then
    ctest --preset "$preset" ${args[@]+"${args[@]}"} || status=$?
  else
    local regex
    regex="^($(IFS='|'; echo "${tests[*]}"))\$"
    ctest --preset "$preset" -R "$regex" ${args[@]+"${args[@]}"} || status=$?
  fi
  t3=$(now)
  echo "== sanitize: $preset: configure $(elapsed "$t0" "$t1") s, build $(elapsed "$t1" "$t2") s," \
       "test $(elapsed "$t2" "$t3") s"
  return "$status"
}

status=0
if [ "$which" = asan ] || [ "$which" = all ]; then
  run_preset asan "${asan_tests[@]}" || status=$?
fi
if [ "$which" = tsan ] || [ "$which" = all ]; then
  run_preset tsan "${tsan_tests[@]}" || status=$?
fi
exit "$status"
