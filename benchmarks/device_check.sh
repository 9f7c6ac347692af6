#!/usr/bin/env bash
# device_check.sh: the GPU session in one command. Configures and builds the
# `cuda` preset (Release), runs the GPU tests, checks the kernel library for
# register spills, runs the kernel benchmark and the full llama2_7b step, and
# writes one JSON and one markdown table (ready to paste into
# benchmarks/RESULTS.md) with the GPU targets marked pass or fail.
#
#   benchmarks/device_check.sh                      # from the repository root
#   benchmarks/device_check.sh --jobs 16 --build-dir build/cuda
#   benchmarks/device_check.sh --dry-run            # print the stages, run nothing
#
# On the GPU machine lent through the device tool (a bare CUDA image: nvcc,
# g++, CMake, ninja, python3; no apt, no network, none of Debian's -dev
# packages) the build dependencies come from .devdeps/, made on the
# development machine by scripts/device_bundle.sh and carried along:
#   run(command="benchmarks/device_check.sh", carry=[".devdeps"], timeout_s=600)
# (benchmarks/RESULTS.md, "Device check", has the whole recipe.) When
# .devdeps/ exists it is copied out of the source tree (CMake refuses an
# exported include directory inside it) to DC_DEVDEPS_DIR (default
# ${TMPDIR:-/tmp}/tessera-devdeps-<checksum of the repository path>), configure
# finds Catch2, nlohmann_json and CLI11 there first (CMAKE_PREFIX_PATH) and
# OpenBLAS (TESSERA_OPENBLAS_LIBRARY, TESSERA_CBLAS_INCLUDE_DIR), and the GPU
# stages run with its libraries first on LD_LIBRARY_PATH (libgfortran, which
# libopenblas needs). Without .devdeps/ the system's packages are used.
#
# The machine is probed, not assumed: nvcc from DC_NVCC, PATH,
# /usr/local/cuda/bin or /usr/local/cuda-*/bin; g++ from DC_CXX, g++ or
# g++-<N>; the Ninja generator when ninja is found (else Unix Makefiles;
# DC_GENERATOR chooses; an existing build directory keeps its own).
#
# Stages. Each has its own timeout, and the whole run has a deadline
# (DC_DEADLINE, 540 s from the start): a stage gets at most what is left
# before it, less 20 s for the report, so the script ends inside one 600 s
# device call. A failed or timed-out stage is recorded and the next one runs.
# Worst case 9 minutes; about 5 when all goes well on 16 cores and one H200.
#
#   stage        what                                                  timeout
#   env          the machine: OS, glibc, nvcc, g++, cmake, ninja, make,   30 s
#                python3, nvidia-smi, cuobjdump, MPI, NCCL, .devdeps
#   configure    cmake --preset cuda -B <build> -G Ninja, Release, with   60 s
#                the nvcc and g++ found, MPI off (DC_MPI=ON: as found;
#                without MPI or NCCL their blocks are skipped)
#   build        the GPU tests, cuda_* benchmarks, llama7b_step, the     240 s
#                kernel library, the nvcc header check and the header-only
#                consumer (tessera_cuda_consumer: tessera installed, then
#                tests/consumer_cuda's trainer compiled by nvcc from the
#                headers, about 2 min of one core), -j <jobs>, going on
#                past a failure (DC_BUILD_ALL=1: every target); about
#                2 min at -j16, 6 min at -j2
#   spills       ptxas -v lines of the kernel library (its objects are    60 s
#                rebuilt if the build log has none), and cuobjdump
#                --dump-resource-usage when installed
#   gpu          nvidia-smi: name, driver, CUDA version                   30 s
#   ctest        ctest -L cuda --output-on-failure, 90 s a test          120 s
#   cuda_bench   <build>/benchmarks/cuda_bench --json (the GEMMs, bf16    60 s
#                and FP8 8192^3, attention, AdamW, RMSNorm, ...)
#   llama7b      <build>/examples/llama7b_step --backend cuda --preset   120 s
#                llama2_7b --precision bf16_mixed_bf16_grads --seq 4096 --micro-batch 1
#                --warmup-steps 1 --steps 3 --json (init ~10 s, ~1 s a step)
#   main_job     <build>/examples/train_llama --backend cuda --precision 120 s
#                bf16_mixed_bf16_grads: the main job (2400 steps of `small`) on the GPU
#   llama7b_none llama7b with --checkpointing none                     120 s
#
# Timeouts: DC_TIMEOUT_{ENV,CONFIGURE,BUILD,SPILLS,GPU,CTEST,CTEST_TEST,BENCH,
# LLAMA,MAIN} (seconds) and DC_DEADLINE, e.g. DC_TIMEOUT_BUILD=900 DC_DEADLINE=1500
# on a machine with few cores. g++ warnings are not errors here (the image's
# g++ is not the one CI holds to -Werror; they are counted in the report):
# DC_WERROR=1 keeps -Werror. DC_CUDA_ARCHS overrides the preset's "90a;80".
#
# Outputs: benchmarks/device_check.json and benchmarks/device_check.md (or
# --out DIR), rewritten after every stage (so a run cut short still leaves
# them), benchmarks/cuda_bench.json when the benchmark ran, and every stage's
# log under <build>/device_check/. When $OUT is set (the device tool), the
# JSON, the table, and configure.log, build.log, ptxas.log (the ptxas -v
# lines), ctest.log, cuda_bench.log and llama7b_step.log are copied there
# after every stage (8 files).
#
# Without a GPU the GPU stages are recorded as skipped with the reason (the
# test and benchmark binaries still run: they must report "skipped"), the
# JSON and the table are still written, and the exit status is 0.
#
# Exit status: 0 when every stage that ran succeeded (or was skipped for want
# of a device); 1 when a GPU stage failed or timed out (tests failed, a
# benchmark check failed, a crash, the deadline); 2 when configure or build
# failed (the GPU stages still run what was built). Missed performance
# targets do not change the exit status: they are marked in the JSON and the
# table.

set -u -o pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build_dir=build/cuda
out_dir=benchmarks
jobs=$(nproc 2>/dev/null || echo 4)
dry_run=0
command_line="$0 $*"

usage() {
  sed -n '2,/^# table\.$/p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
  echo "options: --build-dir DIR (default build/cuda)  --jobs N (default nproc)"
  echo "         --out DIR (default benchmarks)  --dry-run  --help"
}
while [[ $# -gt 0 ]]; do
  case "$1" in
    --build-dir|--jobs|-j|--out)
      if [[ $# -lt 2 || -z $2 ]]; then
        echo "device_check.sh: $1 needs a non-empty value (see --help)" >&2; exit 2
      fi
      case "$1" in
        --build-dir) build_dir=$2 ;;
        --jobs|-j) jobs=$2 ;;
        --out) out_dir=$2 ;;
      esac
      shift 2 ;;
    --dry-run) dry_run=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "device_check.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done

# Numbers are checked before anything is written.
positive_int() {  # NAME VALUE
  if ! [[ $2 =~ ^[0-9]+$ ]] || (( 10#$2 < 1 )); then
    echo "device_check.sh: $1 must be a positive integer, got '$2'" >&2; exit 2
  fi
}
positive_int --jobs "$jobs"
for v in DC_TIMEOUT_ENV DC_TIMEOUT_CONFIGURE DC_TIMEOUT_BUILD DC_TIMEOUT_SPILLS DC_TIMEOUT_GPU \
         DC_TIMEOUT_CTEST DC_TIMEOUT_CTEST_TEST DC_TIMEOUT_BENCH DC_TIMEOUT_LLAMA DC_TIMEOUT_MAIN \
         DC_DEADLINE; do
  [[ -n ${!v:-} ]] && positive_int "$v" "${!v}"
done
# Relative --build-dir and --out are relative to where the script was
# started, as for any command; the defaults are inside the repository.
[[ $build_dir != /* && $build_dir != build/cuda ]] && build_dir="$PWD/$build_dir"
[[ $out_dir != /* && $out_dir != benchmarks ]] && out_dir="$PWD/$out_dir"

cd "$repo" || exit 2
start_all=$(date +%s)
build=$build_dir
work=$build/device_check
bench_json=$out_dir/cuda_bench.json
llama_json=$work/llama7b_step.json
llama_none_json=$work/llama7b_step_none.json

t_env=${DC_TIMEOUT_ENV:-30}
t_configure=${DC_TIMEOUT_CONFIGURE:-60}
t_build=${DC_TIMEOUT_BUILD:-240}
t_spills=${DC_TIMEOUT_SPILLS:-60}
t_gpu=${DC_TIMEOUT_GPU:-30}
t_ctest=${DC_TIMEOUT_CTEST:-120}
t_ctest_test=${DC_TIMEOUT_CTEST_TEST:-90}
t_bench=${DC_TIMEOUT_BENCH:-60}
t_llama=${DC_TIMEOUT_LLAMA:-120}
t_main=${DC_TIMEOUT_MAIN:-120}
deadline=$(( start_all + ${DC_DEADLINE:-540} ))

# ---- the machine's tools ------------------------------------------------------------------------
# pip's cmake and ninja live beside the python3 that has them (the image's
# /opt/torch/.venv): reachable even where that folder is not on PATH.
for d in "$(dirname "$(command -v python3 2>/dev/null || echo /nonexistent/x)")" /opt/torch/.venv/bin; do
  [[ -d $d && :$PATH: != *:$d:* ]] && PATH=$PATH:$d
done
first_exe() { local c; for c in "$@"; do [[ -n $c && -x $c && ! -d $c ]] && { echo "$c"; return 0; }; done; return 1; }
nvcc=$(first_exe "${DC_NVCC:-}" "$(command -v nvcc)" /usr/local/cuda/bin/nvcc /usr/local/cuda-13*/bin/nvcc \
       /usr/local/cuda-1*/bin/nvcc /opt/cuda/bin/nvcc) || nvcc=""
[[ -n $nvcc && :$PATH: != *:$(dirname "$nvcc"):* ]] && PATH=$PATH:$(dirname "$nvcc")   # cuobjdump beside it
cxx=$(first_exe "${DC_CXX:-}" "$(command -v g++)" "$(command -v g++-14)" "$(command -v g++-13)" \
      "$(command -v g++-12)" "$(command -v g++-11)") || cxx=""
export PATH

generator=${DC_GENERATOR:-}
if [[ -f $build/CMakeCache.txt ]]; then   # an existing build directory keeps its generator
  generator=$(sed -n 's/^CMAKE_GENERATOR:INTERNAL=//p' "$build/CMakeCache.txt")
elif [[ -z $generator ]]; then
  if command -v ninja > /dev/null 2>&1; then generator=Ninja
  elif command -v make > /dev/null 2>&1; then generator="Unix Makefiles"
  fi
fi

# .devdeps/ (scripts/device_bundle.sh), copied out of the source tree.
devdeps=""
if [[ -d $repo/.devdeps/usr ]]; then
  devdeps=${DC_DEVDEPS_DIR:-${TMPDIR:-/tmp}/tessera-devdeps-$(printf '%s' "$repo" | cksum | cut -d' ' -f1)}
fi
dd_blas_dir=$devdeps/usr/lib/x86_64-linux-gnu/openblas-openmp
dd_lib_dir=$devdeps/usr/lib/x86_64-linux-gnu

cmd_configure=(cmake --preset cuda -B "$build" -DCMAKE_BUILD_TYPE=Release "-DTESSERA_ENABLE_MPI=${DC_MPI:-OFF}")
[[ -n $generator ]] && cmd_configure+=(-G "$generator")
# The compilers found, where they are not the preset's (/usr/local/cuda/bin/nvcc,
# g++ on the PATH): an existing cache then keeps its compilers unchanged.
[[ -n $nvcc && $nvcc != /usr/local/cuda/bin/nvcc ]] && cmd_configure+=("-DCMAKE_CUDA_COMPILER=$nvcc")
if [[ -n $cxx && $cxx != "$(command -v g++)" ]]; then
  cmd_configure+=("-DCMAKE_CXX_COMPILER=$cxx" "-DCMAKE_CUDA_HOST_COMPILER=$cxx")
fi
[[ -n ${DC_CUDA_ARCHS:-} ]] && cmd_configure+=("-DCMAKE_CUDA_ARCHITECTURES=$DC_CUDA_ARCHS")
if [[ -n $devdeps ]]; then
  cmd_configure+=("-DCMAKE_PREFIX_PATH=$devdeps/usr"
                  "-DTESSERA_OPENBLAS_LIBRARY=$dd_blas_dir/libopenblas.so"
                  "-DTESSERA_CBLAS_INCLUDE_DIR=$devdeps/usr/include/x86_64-linux-gnu/openblas-openmp")
fi
# g++ warnings stay warnings (DC_WERROR=1 keeps -Werror): a launcher that
# appends -Wno-error to g++'s compile lines, handed to the top-level
# CMakeLists.txt as its compiler launcher (CCACHE_PROGRAM; it calls ccache
# itself when there is one). nvcc's lines pass unchanged.
case $work in /*) launcher=$work/compiler_launcher.sh ;; *) launcher=$repo/$work/compiler_launcher.sh ;; esac
if [[ ${DC_WERROR:-0} != 1 ]]; then
  cmd_configure+=("-DCCACHE_PROGRAM=$launcher")
else
  cmd_configure+=("-DCCACHE_PROGRAM=$(command -v ccache || echo CCACHE_PROGRAM-NOTFOUND)")
fi

# Keep going past a failed target; GNU make >= 4 keeps each target's output
# together (-Otarget), so ptxas -v lines of parallel kernel TUs do not
# interleave (ninja prints each command's output whole anyway).
build_args=()
if [[ $generator == Ninja* ]]; then
  build_args=(-- -k 0)
elif [[ $generator == *Makefiles* ]]; then
  build_args=(-- -k)
  if make --version 2>/dev/null | head -1 | grep -Eq 'GNU Make ([4-9]|[1-9][0-9])'; then
    build_args+=(-Otarget)
  fi
fi
cmd_spills=(cmake --build "$build" -j "$jobs" --target tessera_cuda_kernels "${build_args[@]}")
cmd_ctest=(ctest --test-dir "$build" -L cuda --output-on-failure --timeout "$t_ctest_test")
cmd_bench=("$build/benchmarks/cuda_bench" --json "$bench_json")
cmd_llama=("$build/examples/llama7b_step" --backend cuda --preset llama2_7b
           --precision bf16_mixed_bf16_grads --seq 4096 --micro-batch 1 --warmup-steps 1 --steps 3
           --json "$llama_json")
# The same step without activation checkpointing (it fits one H200 too, and
# recomputes nothing: plan --gpu-step --checkpointing none).
cmd_llama_none=("$build/examples/llama7b_step" --backend cuda --preset llama2_7b
                --precision bf16_mixed_bf16_grads --seq 4096 --micro-batch 1 --warmup-steps 1
                --steps 3 --checkpointing none --json "$llama_none_json")
# The main job on the GPU (README's set-up command with --backend cuda):
# 2400 steps of the small preset on the bundled text, final validation loss
# over the whole held-out split (host: 1.5982 nats/byte, benchmarks/RESULTS.md).
cmd_main=("$build/examples/train_llama" --backend cuda --precision bf16_mixed_bf16_grads
          --out "$work/main-gpu" --no-baseline --sample-bytes 200)

# The targets the check needs (DC_BUILD_ALL=1: all): the GPU test
# executables (from ctest's list; test_cuda_nccl_npN is test_cuda_nccl), the
# cuda_* benchmarks, llama7b_step, the kernel library, the nvcc header
# check and the header-only consumer (test_cuda_consumer runs what
# tessera_cuda_consumer builds); only those the generated build files define.
device_targets() {
  local t names=()
  names+=($(ctest --test-dir "$build" -N -L cuda 2>/dev/null \
            | sed -n 's/^ *Test *#[0-9]*: *\([A-Za-z0-9_]*\).*/\1/p' | sed 's/_np[0-9]*$//' | sort -u))
  for t in benchmarks/cuda_*.cpp; do [[ -f $t ]] && names+=("$(basename "$t" .cpp)"); done
  names+=(llama7b_step train_llama tessera_cuda_kernels tessera_cuda_headers_check
          tessera_trainer_check tessera_cuda_consumer)
  for t in "${names[@]}"; do
    if [[ -f $build/build.ninja ]]; then grep -q "^build $t: phony" "$build/build.ninja" && echo "$t"
    elif [[ -f $build/Makefile ]]; then grep -q "^$t: " "$build/Makefile" && echo "$t"
    fi
  done | sort -u
}

if [[ $dry_run == 1 ]]; then
  echo "device_check.sh --dry-run: would run, from $repo (deadline ${DC_DEADLINE:-540} s):"
  printf '  env        (%4s s)  nvcc: %s; g++: %s; generator: %s; .devdeps: %s\n' "$t_env" \
    "${nvcc:-NOT FOUND}" "${cxx:-NOT FOUND}" "${generator:-NONE (no ninja, no make)}" \
    "${devdeps:-not present (system packages)}"
  printf '  configure  (%4s s)  %s\n' "$t_configure" "${cmd_configure[*]}"
  printf '  build      (%4s s)  cmake --build %s -j %s --target <%s> %s\n' "$t_build" "$build" "$jobs" \
    "$([[ ${DC_BUILD_ALL:-0} == 1 ]] && echo all || echo 'GPU tests, cuda_bench, llama7b_step, kernels, header check, header-only consumer')" \
    "${build_args[*]}"
  printf '  spills     (%4s s)  ptxas -v lines of %s (kernel objects rebuilt if none), cuobjdump --dump-resource-usage\n' \
    "$t_spills" "$build/cuda/libtessera_cuda_kernels.a"
  printf '  gpu        (%4s s)  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader\n' "$t_gpu"
  printf '  ctest      (%4s s)  %s\n' "$t_ctest" "${cmd_ctest[*]}"
  # The GPU tests that ctest would run: from the configured build's list, or
  # from tests/cuda/ when the build folder is not configured yet.
  if [[ -f $build/CTestTestfile.cmake ]]; then
    gpu_tests=$(ctest --test-dir "$build" -N -L cuda 2>/dev/null |
                sed -n 's/^ *Test *#[0-9]*: *\([A-Za-z0-9_]*\).*/\1/p')
  else
    gpu_tests=$(for t in tests/cuda/*.cpp; do
                  b=$(basename "$t" .cpp)
                  case $b in main|nccl_main|nccl_trainer) ;; nccl) for n in 1 2 4 8; do echo "test_cuda_nccl_np$n"; done ;;
                                                   *) echo "test_cuda_$b" ;; esac
                done; echo test_cuda_consumer)
  fi
  for t in $gpu_tests; do
    case $t in
      test_cuda_llama) what="llama<P, cuda> and trainer<P, cuda> against the host, checkpointing, the plan, resume" ;;
      test_cuda_nccl_np*) what="nccl_communicator (its own stream ordered by events: follow, order_before); trainer<P, cuda, adamw, zero<0..3>, nccl_communicator>, tp 2/4, pp 2 (gpipe, 1f1b, zb1, interleaved) and cp 2/4 (ring, Ulysses) over NCCL against one GPU (tp, pp and cp need >= 2 GPUs)" ;;
      test_cuda_kernels) what="every CUDA kernel against the host kernels" ;;
      test_cuda_attention) what="flash attention against float64" ;;
      test_cuda_cross_entropy) what="the fused LM head and cross-entropy against float64, its vocabulary-parallel form over two thread ranks" ;;
      test_cuda_loader) what="the pinned double-buffered loader" ;;
      test_cuda_gemm) what="cuBLASLt GEMMs" ;;
      test_cuda_core) what="caching allocator, streams, events" ;;
      test_cuda_weight_init) what="the initial weights drawn on the device (Thrust) against the host's, llama2_7b whole" ;;
      test_cuda_consumer) what="the header-only build (tests/consumer_cuda: kernels compiled from the headers in its one .cu): trainer<bf16_mixed, cuda> against trainer<bf16_mixed, host>, 10 steps" ;;
      *) what="" ;;
    esac
    printf '               %-26s %s\n' "$t" "$what"
  done
  # What the host has confirmed only under emulation so far, and which GPU
  # test confirms it on the device (benchmarks/RESULTS.md, 2026-12-06).
  echo "               confirmed so far only under emulation on the host, confirmed on the device by:"
  while IFS='|' read -r fam host gpu; do
    printf '                 %-40s %-42s -> %s\n' "$fam" "$host" "$gpu"
  done <<'MAP'
rmsnorm forward, backward|tests/kernels/emulated_rmsnorm.cpp|test_cuda_kernels, test_cuda_llama
swiglu forward, backward|tests/kernels/emulated_swiglu.cpp|test_cuda_kernels, test_cuda_llama
embedding forward, backward|tests/kernels/emulated_embedding.cpp|test_cuda_kernels, test_cuda_llama
embedding_local_ids (vocab slice)|tests/kernels/emulated_embedding.cpp|test_cuda_cross_entropy
casts float <-> bf16|tests/kernels/emulated_elementwise.cpp|test_cuda_kernels
residual_add, count_nonfinite|tests/kernels/emulated_elementwise.cpp|test_cuda_cross_entropy
grad_sum_squares, clip_coefficient|tests/kernels/emulated_grad_norm.cpp|test_cuda_kernels; clip: test_cuda_llama
fp8 amax, scale, cast, cast-transpose|tests/kernels/emulated_fp8.cpp|none yet (no tests/cuda FP8 test)
adamw_step, sgd_step|tests/kernels/emulated_optimizer.cpp|test_cuda_kernels (adamw), test_cuda_llama
rope forward, backward|tests/kernels/emulated_rope.cpp|test_cuda_kernels
cross-entropy row kernels (+ vocab-par.)|tests/kernels/emulated_cross_entropy.cpp|test_cuda_cross_entropy
fused LM head's chunk loop|tests/kernels/emulated_lm_head.cpp|test_cuda_cross_entropy, test_cuda_llama
flash attention forward, backward|tests/kernels/cuda_attention_launch.cpp|test_cuda_attention
cuBLASLt descriptors (interpreted)|tests/kernels/cuda_gemm_plan.cpp|test_cuda_gemm
initial weights (Thrust, OMP backend)|tests/kernels/weight_init.cpp|test_cuda_weight_init, test_cuda_llama
the kernels compiled header-only|(nvcc, CI: tessera_cuda_consumer)|test_cuda_consumer
dp collectives on their own stream|tests/parallel/stream_order.cpp|test_cuda_nccl_np2 (follow, order_before; zero<0..3>)
attention blocks at offsets, merge (cp)|tests/kernels/emulated_attention_blocks.cpp|test_cuda_nccl_np2 (cp ring; needs 2 GPUs)
rope at global positions (cp)|tests/kernels/emulated_rope.cpp|test_cuda_kernels (rope_positions)
MAP
  printf '  cuda_bench (%4s s)  %s\n' "$t_bench" "${cmd_bench[*]}"
  printf '  llama7b    (%4s s)  %s\n' "$t_llama" "${cmd_llama[*]}"
  printf '  main_job   (%4s s)  %s\n' "$t_main" "${cmd_main[*]}"
  printf '  llama7b_none (%4s s)  %s\n' "$t_llama" "${cmd_llama_none[*]}"
  echo "  report               $out_dir/device_check.json, $out_dir/device_check.md; logs in $work/${OUT:+; copies in \$OUT=$OUT}"
  exit 0
fi

mkdir -p "$work" "$out_dir" || exit 2
stages=$work/stages.tsv
: > "$stages"
rm -f "$work"/*.log "$work"/env/* "$work/ldd.txt"
echo "device_check.sh: logs in $work/"

if [[ ${DC_WERROR:-0} != 1 ]]; then
  cat > "$launcher" <<'SH'
#!/bin/sh
# Written by benchmarks/device_check.sh: g++ compile lines get -Wno-error
# appended (the last word wins over the targets' -Werror); nvcc's pass as
# they are. Goes through ccache when there is one.
c=$(command -v ccache 2>/dev/null)
case "$1" in
  *nvcc) exec $c "$@" ;;
  *) exec $c "$@" -Wno-error ;;
esac
SH
  chmod +x "$launcher"
fi

# record NAME STATUS RC SECONDS TIMEOUT LOG REASON
record() {
  local reason=${7//$'\t'/ }
  reason=${reason//$'\n'/ }
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" "$5" "$6" "$reason" >> "$stages"
  printf 'device_check.sh: %-10s %-8s (%s s)%s\n' "$1" "$2" "$4" "${7:+  $7}"
  report
}

# stage_limit TIMEOUT: the timeout, cut to what is left before the deadline
# less 20 s (the report, and timeout's --kill-after grace).
stage_limit() {
  local left=$(( deadline - $(date +%s) - 20 ))
  if (( left < $1 )); then echo $(( left > 0 ? left : 0 )); else echo "$1"; fi
}

# run_stage NAME TIMEOUT LOG CMD...: runs CMD under timeout (cut to the
# deadline), output to LOG; sets stage_rc, stage_s and stage_limit_s.
run_stage() {
  local name=$1 limit=$2 log=$3
  shift 3
  stage_limit_s=$(stage_limit "$limit")
  local t0
  t0=$(date +%s)
  if (( stage_limit_s < 5 )); then
    echo "device_check.sh: $name not started: the run's deadline (DC_DEADLINE=${DC_DEADLINE:-540} s) is reached" | tee "$log"
    stage_rc=124
  else
    echo "device_check.sh: $name: $* (timeout ${stage_limit_s} s)"
    timeout --kill-after=15 "$stage_limit_s" "$@" > "$log" 2>&1
    stage_rc=$?
  fi
  stage_s=$(( $(date +%s) - t0 ))
}

# Last line of a log that says why (for the reason column).
why() { grep -v '^\s*$' "$1" 2>/dev/null | tail -n "${2:-1}" | tr '\t\n' '  ' | sed 's/ *$//' | cut -c1-300; }

# Copies for the device tool: what is under $OUT comes back (8 files at
# most, 16 MiB each, plain names).
export_out() {
  [[ -n ${OUT:-} && -d ${OUT:-} ]] || return 0
  local f
  for f in "$out_dir/device_check.json" "$out_dir/device_check.md" \
           "$work/ctest.log" "$work/cuda_bench.log" "$work/llama7b_step.log"; do
    [[ -f $f ]] && cp -f "$f" "$OUT/" 2>/dev/null
  done
  [[ -f $work/spills.log ]] && cp -f "$work/spills.log" "$OUT/ptxas.log" 2>/dev/null
  # Eight files at most: configure.log goes in front of build.log, and the
  # extra runs (llama7b_step without checkpointing, the main job) share runs.log.
  { [[ -f $work/configure.log ]] && { echo "==== configure.log"; cat "$work/configure.log"; echo "==== build.log"; }
    [[ -f $work/build.log ]] && tail -c 14000000 "$work/build.log"; } > "$OUT/build.log" 2>/dev/null
  { for f in "$work/llama7b_none.log" "$work/main_job.log"; do
      [[ -f $f ]] && { echo "==== $(basename "$f")"; tail -c 4000000 "$f"; }
    done; } > "$OUT/runs.log" 2>/dev/null
  return 0
}

# ---- the report: JSON and markdown, rewritten after every stage ----------------------------------
have_gpu=0
no_gpu_reason=""
build_ok=0
final=0
if [[ $(git -C "$repo" rev-parse --show-toplevel 2>/dev/null) == "$(cd "$repo" && pwd -P)" ]]; then
  git_rev=$(git -C "$repo" rev-parse --short HEAD 2>/dev/null)$(git -C "$repo" diff --quiet HEAD 2>/dev/null || echo "+dirty")
elif [[ -f $repo/.devdeps/source_rev ]]; then
  # No .git (the device tool's copy of the tree): the commit the bundle was made at.
  git_rev="$(cat "$repo/.devdeps/source_rev") (no .git here; .devdeps/source_rev, written when the bundle was made)"
else
  git_rev="unknown (no .git)"
fi

report() {
  local total_s=$(( $(date +%s) - start_all ))
  local nvcc_version
  nvcc_version=$(grep -o 'release [0-9.]*, V[0-9.]*' "$work/env/nvcc.txt" 2>/dev/null | head -1)
  DC_FINAL=$final DC_DEVDEPS=$devdeps DC_GENERATOR_USED=${generator:-} \
  DC_LLAMA_NONE_JSON=$llama_none_json DC_MAIN_LOG=$work/main_job.log \
  python3 - "$stages" "$work" "$bench_json" "$llama_json" "$out_dir" "$command_line" "$total_s" \
    "$nvcc_version" "$git_rev" "$have_gpu" "$no_gpu_reason" "$build" "$jobs" <<'PY'
import json, os, re, sys, datetime

(stages_path, work, bench_json, llama_json, out_dir, command, total_s, nvcc_version, git_rev,
 have_gpu, no_gpu_reason, build, jobs) = sys.argv[1:]
have_gpu = have_gpu == "1"
final = os.environ.get("DC_FINAL") == "1"

def read(path):
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""

stages = []
for line in read(stages_path).splitlines():
    name, status, rc, secs, limit, log, reason = (line.split("\t") + [""] * 7)[:7]
    stages.append({"stage": name, "status": status, "rc": int(rc) if rc.strip() else None,
                   "seconds": int(secs or 0), "timeout_s": int(limit or 0), "log": log or None,
                   "reason": reason or None})
by = {s["stage"]: s for s in stages}

# The machine (the env stage): one file per probe under <work>/env/.
machine = {}
env_dir = os.path.join(work, "env")
if os.path.isdir(env_dir):
    for name in sorted(os.listdir(env_dir)):
        if name.endswith(".txt"):
            machine[name[:-4]] = read(os.path.join(env_dir, name)).strip()[:4000]
build_log = read(os.path.join(work, "build.log"))
build_warnings = len(re.findall(r"\bwarning:", build_log))
libs = [l.strip() for l in read(os.path.join(work, "ldd.txt")).splitlines()
        if re.search(r"openblas|gfortran|quadmath|gomp|cudart|cublas|not found", l)]

# GPU: nvidia-smi --query-gpu=name,driver_version,memory.total
gpu = {"present": have_gpu, "name": None, "driver": None, "memory": None, "cuda_driver_version": None,
       "reason": None if have_gpu else no_gpu_reason}
if have_gpu:
    first = read(os.path.join(work, "gpu.txt")).strip().splitlines()[0].split(",")
    gpu["name"] = first[0].strip()
    gpu["driver"] = first[1].strip() if len(first) > 1 else None
    gpu["memory"] = first[2].strip() if len(first) > 2 else None
    m = re.search(r"CUDA Version:\s*([0-9.]+)", read(os.path.join(work, "nvidia-smi.txt")))
    gpu["cuda_driver_version"] = m.group(1) if m else None

# ctest: per-test lines "1/9 Test #1: name ....   Passed  0.1 sec" / "***Failed" / "***Skipped"
ctest = {"passed": 0, "failed": 0, "skipped": 0, "timeout": 0, "not_run": 0, "tests": []}
for m in re.finditer(r"Test\s+#\d+:\s+(\S+)\s+\.*\s*(\**)\s*(Passed|Failed|Skipped|Timeout|Not Run|Exception[^\d]*)",
                     read(os.path.join(work, "ctest.log"))):
    name, verdict = m.group(1), m.group(3).strip()
    key = {"Passed": "passed", "Failed": "failed", "Skipped": "skipped", "Timeout": "timeout"}.get(verdict, "not_run")
    if verdict.startswith("Exception"):
        key = "failed"
    ctest[key] += 1
    ctest["tests"].append({"name": name, "result": key})
for m in re.finditer(r"(\S+) \((Not Run|Skipped|Disabled)\)", read(os.path.join(work, "ctest.log"))):
    if m.group(2) == "Not Run" and not any(t["name"] == m.group(1) for t in ctest["tests"]):
        ctest["not_run"] += 1
        ctest["tests"].append({"name": m.group(1), "result": "not_run"})
ctest["total"] = len(ctest["tests"])
if "ctest" in by and by["ctest"]["status"] != "skipped" or ctest["total"]:
    counts = (f'{ctest["passed"]} passed, {ctest["failed"]} failed, {ctest["skipped"]} skipped, '
              f'{ctest["timeout"]} timed out, {ctest["not_run"]} not run (of {ctest["total"]})')
    if "ctest" in by:
        by["ctest"]["reason"] = (f"no GPU ({no_gpu_reason}): " if not have_gpu else "") + counts

# spills: ptxas -v lines ("Compiling entry function 'f' for 'sm_X'", "Function properties
# for f", "N bytes stack frame, S bytes spill stores, L bytes spill loads")
spills = {"source": by.get("spills", {}).get("reason"), "functions_checked": 0, "with_spills": [],
          "with_stack": 0, "status": "skipped"}
cur, arch = None, None
for line in read(os.path.join(work, "spills.log")).splitlines():
    m = re.search(r"Compiling entry function '([^']+)' for '(sm_\w+)'", line)
    if m:
        cur, arch = m.group(1), m.group(2)
        continue
    m = re.search(r"Function properties for (\S+)", line)
    if m:
        cur = m.group(1)
        continue
    m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
    if m:
        stack, st, ld = map(int, m.groups())
        spills["functions_checked"] += 1
        spills["with_stack"] += stack > 0
        if st or ld:
            spills["with_spills"].append({"function": cur, "arch": arch, "spill_store_bytes": st,
                                          "spill_load_bytes": ld, "stack_bytes": stack})
if spills["functions_checked"]:
    spills["status"] = "pass" if not spills["with_spills"] else "fail"
ru = read(os.path.join(work, "resource_usage.log"))
local = [m.group(1) for m in re.finditer(r"Function (\S+):.*?LOCAL:([1-9]\d*)", ru)]
spills["cuobjdump"] = ("not installed" if "not installed" in ru else
                       {"functions": len(re.findall(r"Function \S+:", ru)),
                        "with_local_memory": local})

def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None

# Only this run's files (both are removed before their stage runs).
bench = load(bench_json) if by.get("cuda_bench", {}).get("status") in ("ok", "failed") else None
llama = load(llama_json) if by.get("llama7b", {}).get("status") in ("ok", "failed") else None
llama_none = (load(os.environ.get("DC_LLAMA_NONE_JSON", ""))
              if by.get("llama7b_none", {}).get("status") in ("ok", "failed") else None)
# The main job on the GPU: its final validation loss from the log.
main_job = None
if by.get("main_job", {}).get("status") in ("ok", "failed"):
    m = re.search(r"final val loss ([0-9.]+) nats/byte", read(os.environ.get("DC_MAIN_LOG", "")))
    main_job = {"final_val_loss": float(m.group(1)) if m else None, "host_final_val_loss": 1.5982,
                "four_gram_baseline": 1.7542, "seconds": by["main_job"].get("seconds")}

# Targets: GEMMs >= 0.85 of the 8192^3 rate, attention
# forward >= 0.50 of it, AdamW >= 0.85 of the copy bandwidth, 7B step MFU >= 0.45.
def target(name, value, threshold, what, detail=None):
    status = "not measured" if value is None else ("pass" if value >= threshold else "fail")
    return {"target": name, "what": what, "threshold": threshold, "value": value,
            "status": status, "detail": detail}

targets = []
if bench:
    gemm = [r for r in bench.get("rows", []) if r.get("group") == "gemm"]
    low = [f'{r["name"]} {r["ratio"]:.3f}' for r in gemm if r["ratio"] < 0.85]
    targets.append(target("gemm", min((r["ratio"] for r in gemm), default=None), 0.85,
                          "every llama2_7b GEMM (fwd, dinp, dweight) / cuBLASLt bf16 8192^3",
                          ("below: " + ", ".join(low)) if low else None))
    s = bench.get("summary", {})
    targets.append(target("attention_forward", s.get("attention_forward_ratio"), 0.50,
                          "flash attention forward TFLOP/s / cuBLASLt bf16 8192^3"))
    targets.append(target("adamw", s.get("adamw_ratio"), 0.85, "AdamW bytes/s / D2D copy bytes/s"))
    # Hopper's dense FP8 peak is twice its bf16 peak; 1.5x is what a TN matmul at this size reaches.
    fp8 = [r for r in bench.get("rows", []) if r.get("name", "").startswith("cuBLASLt FP8 GEMM")]
    targets.append(target("fp8_gemm", fp8[0]["ratio"] if fp8 else None, 1.5,
                          "cuBLASLt FP8 (E4M3) GEMM 8192^3 / cuBLASLt bf16 8192^3"))
else:
    targets += [target("gemm", None, 0.85, "every llama2_7b GEMM / cuBLASLt bf16 8192^3"),
                target("attention_forward", None, 0.50, "flash attention forward / cuBLASLt bf16 8192^3"),
                target("adamw", None, 0.85, "AdamW bytes/s / D2D copy bytes/s"),
                target("fp8_gemm", None, 1.5, "cuBLASLt FP8 (E4M3) GEMM 8192^3 / cuBLASLt bf16 8192^3")]
targets.append(target("llama7b_mfu", llama.get("mfu") if llama else None, 0.45,
                      "llama2_7b full step, bf16, seq 4096, micro-batch 1, full checkpointing: MFU"))
targets.append(target("llama7b_mfu_no_checkpointing", llama_none.get("mfu") if llama_none else None,
                      0.45, "the same step without activation checkpointing: MFU"))
# Spills: the share of kernel/arch entries without any (1.00 = none spill).
checked = spills["functions_checked"]
targets.append(target("no_spills", 1 - len(spills["with_spills"]) / checked if checked else None, 1.0,
                      "kernel library: share of kernels (per arch) without register spills",
                      ("spilling: " + ", ".join(x["function"] for x in spills["with_spills"][:8]))
                      if spills["with_spills"] else None))

result = {
    "schema": "tessera.device_check/1",
    "complete": final,
    "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    "host": os.uname().nodename, "cpus": os.cpu_count(), "jobs": int(jobs),
    "command": command, "git": git_rev, "build_dir": build,
    "cuda_toolkit": nvcc_version or None, "gpu": gpu, "total_seconds": int(total_s),
    "machine": machine, "generator": os.environ.get("DC_GENERATOR_USED") or None,
    "devdeps": os.environ.get("DC_DEVDEPS") or None, "build_warnings": build_warnings,
    "libraries": libs,
    "stages": stages, "ctest": ctest, "spills": spills,
    "cuda_bench": bench, "llama7b_step": llama, "llama7b_step_no_checkpointing": llama_none,
    "main_job": main_job, "targets": targets,
}

def write(path, text):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)

write(os.path.join(out_dir, "device_check.json"), json.dumps(result, indent=2) + "\n")

# ---- markdown ----
L = []
day = result["date"][:10]
gpu_words = (f'{gpu["name"]}, driver {gpu["driver"]}, CUDA {gpu["cuda_driver_version"]}' if have_gpu
             else f"no GPU ({no_gpu_reason})")
json_path = os.path.join(out_dir, "device_check.json")
L.append(f"## {day} — device check: {gpu_words}\n")
if not final:
    L.append(f"**Incomplete**: the run stopped after stage `{stages[-1]['stage'] if stages else 'none'}` "
             "(this file is rewritten after every stage).\n")
L.append(f"Command: `{command}` (commit {git_rev}, {os.cpu_count()} CPUs, -j {jobs}, toolkit "
         f"{nvcc_version or 'unknown'}); {int(total_s) // 60} min {int(total_s) % 60} s in all. "
         f"JSON: `{json_path}`.\n")
def first(key):
    return ((machine.get(key) or "?").splitlines() or ["?"])[0]
L.append(f"Machine: {first('os')}, {first('glibc')}, {first('cpus_memory')}; nvcc: "
         f"{nvcc_version or first('nvcc')}; {first('cxx')}; {first('cmake')}; generator "
         f"{os.environ.get('DC_GENERATOR_USED') or 'none'}; dependencies: "
         + (f"`.devdeps` (copied to {os.environ['DC_DEVDEPS']})" if os.environ.get("DC_DEVDEPS")
            else "the system's packages")
         + f"; {build_warnings} compiler warning lines in the build log.\n")
L.append("| stage | status | seconds (timeout) | note |")
L.append("|---|---|---:|---|")
for s in stages:
    note = (s["reason"] or "").replace("|", "/")
    L.append(f'| {s["stage"]} | {s["status"]} | {s["seconds"]} ({s["timeout_s"]}) | {note} |')
L.append("")
L.append(f'GPU tests (`ctest -L cuda`): {ctest["passed"]} passed, {ctest["failed"]} failed, '
         f'{ctest["skipped"]} skipped, {ctest["timeout"]} timed out, {ctest["not_run"]} not run '
         f'(of {ctest["total"]}).')
if ctest["failed"] or ctest["timeout"]:
    L.append("Failed: " + ", ".join(t["name"] for t in ctest["tests"] if t["result"] in ("failed", "timeout")) + ".")
sp = spills
spill_words = ("not checked" if sp["status"] == "skipped" else
               f'{sp["functions_checked"]} kernel/arch entries checked ({sp["source"]}), '
               + ("no spills" if not sp["with_spills"] else
                  f'{len(sp["with_spills"])} with spills: ' + ", ".join(
                      f'{x["function"]} ({x["arch"]}: {x["spill_store_bytes"]} B stores, {x["spill_load_bytes"]} B loads)'
                      for x in sp["with_spills"][:8])))
L.append(f"Spills: {spill_words}.\n")
L.append("| target | threshold | measured | status |")
L.append("|---|---:|---:|---|")
for t in targets:
    v = "—" if t["value"] is None else f'{t["value"]:.3f}'
    L.append(f'| {t["what"]} | {t["threshold"]:.2f} | {v} | {t["status"]}'
             + (f' ({t["detail"]})' if t["detail"] else "") + " |")
L.append("")
if bench:
    ref = bench.get("reference", {})
    L.append(f'cuda_bench (median of {bench["settings"]["reps"]} after {bench["settings"]["warmup"]} '
             f'warm-up; references: bf16 GEMM 8192^3 {ref.get("gemm_8192_flops_per_s", 0) / 1e12:.1f} '
             f'TFLOP/s, D2D copy {ref.get("copy_bytes_per_s", 0) / 1e9:.0f} GB/s read+write):\n')
    L.append("| group | what | shape | ms | rate | of reference | check |")
    L.append("|---|---|---|---:|---:|---:|---|")
    for r in bench.get("rows", []):
        rate = (f'{r["flops_per_s"] / 1e12:.1f} TFLOP/s' if "flops_per_s" in r
                else f'{r["bytes_per_s"] / 1e9:.0f} GB/s')
        L.append(f'| {r["group"]} | {r["name"]} | {r["shape"]} | {r["ms"]:.3f} | {rate} | '
                 f'{100 * r["ratio"]:.1f}% | {r["check"]} |')
    gs = bench.get("gemm_step")
    if gs:
        L.append(f'\nGEMMs of one llama2_7b step (4096 tokens, 32 layers + head): {gs["ms"]:.1f} ms, '
                 f'{gs["flops_per_s"] / 1e12:.1f} TFLOP/s, {100 * gs["ratio"]:.1f}% of the 8192^3 rate.')
    L.append("")
else:
    L.append(f'cuda_bench: {by.get("cuda_bench", {}).get("status", "not run")} '
             f'({by.get("cuda_bench", {}).get("reason") or "no result"}).\n')
if llama:
    L.append(f'llama7b_step ({llama.get("preset")}, {llama.get("layers")} layers, {llama.get("precision")}, '
             f'checkpointing {llama.get("checkpointing")}, B {llama.get("B")}, T {llama.get("T")}): '
             f'step {llama.get("step_s", 0):.3f} s, {llama.get("tokens_per_s", 0):.0f} tokens/s, '
             f'MFU {100 * llama.get("mfu", 0):.1f}%, HFU {100 * llama.get("hfu", 0):.1f}%, '
             f'peak memory {llama.get("peak_bytes", 0) / 2**30:.2f} GiB '
             f'(planned {llama.get("planned_peak_bytes", 0) / 2**30:.2f} GiB).')
else:
    L.append(f'llama7b_step: {by.get("llama7b", {}).get("status", "not run")} '
             f'({by.get("llama7b", {}).get("reason") or "no result"}).')
if llama_none:
    L.append(f'\nllama7b_step without checkpointing: step {llama_none.get("step_s", 0):.3f} s, '
             f'{llama_none.get("tokens_per_s", 0):.0f} tokens/s, MFU {100 * llama_none.get("mfu", 0):.1f}%, '
             f'peak memory {llama_none.get("peak_bytes", 0) / 2**30:.2f} GiB '
             f'(planned {llama_none.get("planned_peak_bytes", 0) / 2**30:.2f} GiB).')
if main_job:
    v = main_job["final_val_loss"]
    L.append(f'\nMain job on the GPU (train_llama --backend cuda --precision bf16_mixed_bf16_grads, 2400 steps): '
             f'final val loss {v if v is not None else "?"} nats/byte over the whole held-out split '
             f'(host fp32: 1.5982; 4-gram: 1.7542) in {main_job["seconds"]} s.')
write(os.path.join(out_dir, "device_check.md"), "\n".join(L) + "\n")
if final:
    print(f"device_check.sh: wrote {os.path.join(out_dir, 'device_check.json')} and "
          f"{os.path.join(out_dir, 'device_check.md')}")
PY
  local rc=$?
  export_out
  return $rc
}

# ---- env: what the machine is (cheap; tells the next session what to expect) ------------------
# probe KEY CMD...: CMD's output (10 s at most) into $work/env/KEY.txt
mkdir -p "$work/env"
probe() { local key=$1; shift; timeout 10 "$@" > "$work/env/$key.txt" 2>&1 || echo "(exit $?)" >> "$work/env/$key.txt"; }
which_v() {  # which_v CMD [VERSION-ARGS]: path and the first line of its version, or "not found"
  local p; p=$(command -v "$1") || { echo "not found"; return 0; }
  echo "$p: $("$p" "${2:---version}" 2>&1 | grep -v '^\s*$' | head -1)"
}
t0=$(date +%s)
(
  probe os sh -c '. /etc/os-release 2>/dev/null && echo "$PRETTY_NAME" || echo "no /etc/os-release"; uname -srm'
  probe cpus_memory sh -c 'echo "$(nproc) CPUs, $(awk "/MemTotal/ { printf \"%.0f GiB\", \$2 / 1048576 }" /proc/meminfo) memory"'
  probe glibc sh -c 'ldd --version 2>&1 | head -1'
  probe nvcc sh -c "${nvcc:-nvcc} --version 2>&1 | tail -2; echo '(path: ${nvcc:-not found})'"
  probe cxx sh -c "${cxx:-g++} --version 2>&1 | head -1; echo '(path: ${cxx:-not found})'"
  probe cmake sh -c 'echo "$(cmake --version | head -1) ($(command -v cmake))"'
  probe generator echo "${generator:-none: neither ninja nor make found}"
  for c in ninja make python3 cuobjdump ccache git; do which_v "$c" > "$work/env/$c.txt"; done
  probe nvidia_smi sh -c 'nvidia-smi 2>&1 || echo "nvidia-smi: not available"'
  probe mpi sh -c 'for c in mpicxx mpirun mpiexec; do printf "%s: %s\n" $c "$(command -v $c || echo not found)"; done'
  probe nccl sh -c 'ls /usr/include/nccl.h /usr/local/cuda/include/nccl.h 2>/dev/null; ldconfig -p 2>/dev/null | grep -m2 libnccl || echo "libnccl not in ldconfig"'
  probe cuda_libs sh -c "ls -d ${nvcc%/bin/nvcc}/lib64/libcublasLt.so* ${nvcc%/bin/nvcc}/lib/libcublasLt.so* ${nvcc%/bin/nvcc}/targets/*/lib/libcublasLt.so* 2>/dev/null || echo 'no libcublasLt beside nvcc'"
  probe system_libs sh -c 'ldconfig -p 2>/dev/null | grep -E "libgomp|libgfortran|libopenblas|libquadmath" || echo "none of libgomp, libgfortran, libopenblas, libquadmath in ldconfig"'
  if [[ -n $devdeps ]]; then
    probe devdeps sh -c "echo '$repo/.devdeps copied to $devdeps'; grep -v '^#' '$repo/.devdeps/MANIFEST.txt' | grep -v '^[0-9]' | tr '\t' ' '"
  else
    probe devdeps echo "no .devdeps/: the system's packages"
  fi
) > /dev/null 2>&1
env_missing=""
[[ -z $nvcc ]] && env_missing+="no nvcc; "
[[ -z $cxx ]] && env_missing+="no g++; "
[[ -z $generator ]] && env_missing+="neither ninja nor make; "
command -v cmake > /dev/null 2>&1 || env_missing+="no cmake; "
command -v python3 > /dev/null 2>&1 || env_missing+="no python3 (no report); "
env_note="$(head -1 "$work/env/os.txt"); nvcc $(grep -o 'release [0-9.]*' "$work/env/nvcc.txt" | head -1 || echo '?'); $(head -1 "$work/env/cxx.txt"); $(head -1 "$work/env/cmake.txt"); ${generator:-no generator}"
if [[ -z $env_missing ]]; then
  record env ok 0 $(( $(date +%s) - t0 )) "$t_env" "$work/env" "$env_note"
else
  record env failed 1 $(( $(date +%s) - t0 )) "$t_env" "$work/env" "${env_missing}$env_note"
fi

# ---- .devdeps: out of the source tree -------------------------------------------------------------
if [[ -n $devdeps ]]; then
  rm -rf "$devdeps.tmp" && mkdir -p "$(dirname "$devdeps")" && cp -a "$repo/.devdeps" "$devdeps.tmp" \
    && rm -rf "$devdeps" && mv "$devdeps.tmp" "$devdeps" \
    || echo "device_check.sh: could not copy .devdeps to $devdeps (configure will say what is missing)" >&2
  export LD_LIBRARY_PATH=$dd_blas_dir:$dd_lib_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi

# ---- configure ----------------------------------------------------------------------------------
run_stage configure "$t_configure" "$work/configure.log" "${cmd_configure[@]}"
configure_ok=0
if [[ $stage_rc == 0 ]]; then
  configure_ok=1
  record configure ok 0 "$stage_s" "$stage_limit_s" "$work/configure.log" \
    "$(grep -m1 -o 'NCCL.*missing' "$work/configure.log" | cut -c1-120)"
elif [[ $stage_rc == 124 || $stage_rc == 137 ]]; then
  record configure timeout "$stage_rc" "$stage_s" "$stage_limit_s" "$work/configure.log" "no result after ${stage_limit_s} s"
else
  record configure failed "$stage_rc" "$stage_s" "$stage_limit_s" "$work/configure.log" \
    "$( (grep -m1 -A3 'CMake Error' "$work/configure.log" || why "$work/configure.log" 2) | tr '\n' ' ' | cut -c1-300)"
fi

# ---- build: what the check needs, going on past a failure -----------------------------------------
if [[ $configure_ok == 1 ]]; then
  targets=()
  [[ ${DC_BUILD_ALL:-0} != 1 ]] && targets=($(device_targets))
  cmd_build=(cmake --build "$build" -j "$jobs")
  [[ ${#targets[@]} -gt 0 ]] && cmd_build+=(--target "${targets[@]}")
  cmd_build+=("${build_args[@]}")
  run_stage build "$t_build" "$work/build.log" "${cmd_build[@]}"
  what="${#targets[@]} targets"
  [[ ${#targets[@]} == 0 ]] && what="all targets"
  if [[ $stage_rc == 0 ]]; then
    build_ok=1
    record build ok 0 "$stage_s" "$stage_limit_s" "$work/build.log" "$what"
  elif [[ $stage_rc == 124 || $stage_rc == 137 ]]; then
    record build timeout "$stage_rc" "$stage_s" "$stage_limit_s" "$work/build.log" "no result after ${stage_limit_s} s ($what)"
  else
    record build failed "$stage_rc" "$stage_s" "$stage_limit_s" "$work/build.log" \
      "$(grep -m1 -E 'error|Error' "$work/build.log" | cut -c1-300)"
  fi
  # Which libraries the 7B step loads (with this LD_LIBRARY_PATH): the bundle's or not.
  if [[ -x $build/examples/llama7b_step ]]; then
    { echo "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"; ldd "$build/examples/llama7b_step"; } > "$work/ldd.txt" 2>&1
  fi
else
  record build skipped "" 0 "$t_build" "" "configure did not succeed"
fi

# ---- spills: ptxas -v of the kernel library ---------------------------------------------------
spill_log=$work/spills.log
kernels_lib=$build/cuda/libtessera_cuda_kernels.a
if [[ -f $kernels_lib ]]; then
  t0=$(date +%s)
  grep -E '^ptxas info|bytes stack frame' "$work/build.log" > "$spill_log"
  spill_source="ptxas -v lines of the build log"
  if ! grep -q 'bytes stack frame' "$spill_log"; then
    # An incremental build did not recompile the kernels: rebuild their
    # objects alone (ccache replays ptxas's output when it has them).
    spill_source="ptxas -v lines of a rebuild of tessera_cuda_kernels"
    rm -f "$build"/cuda/CMakeFiles/tessera_cuda_kernels.dir/*.o
    sl=$(stage_limit "$t_spills"); (( sl < 5 )) && sl=1   # (timeout 0 would mean none)
    timeout --kill-after=15 "$sl" "${cmd_spills[@]}" > "$work/spills_build.log" 2>&1
    grep -E '^ptxas info|bytes stack frame' "$work/spills_build.log" > "$spill_log"
  fi
  if command -v cuobjdump > /dev/null 2>&1; then
    sl=$(stage_limit 60); (( sl < 5 )) && sl=1
    timeout "$sl" cuobjdump --dump-resource-usage "$kernels_lib" > "$work/resource_usage.log" 2>&1 \
      || echo "cuobjdump failed: $?" >> "$work/resource_usage.log"
  else
    echo "cuobjdump not installed" > "$work/resource_usage.log"
  fi
  if grep -q 'bytes stack frame' "$spill_log"; then
    record spills ok 0 "$(( $(date +%s) - t0 ))" "$t_spills" "$spill_log" "$spill_source"
  else
    record spills failed 1 "$(( $(date +%s) - t0 ))" "$t_spills" "$spill_log" "no ptxas -v output found"
  fi
else
  record spills skipped "" 0 "$t_spills" "" "no kernel library (configure or build failed)"
fi

# ---- gpu ------------------------------------------------------------------------------------
gpu_file=$work/gpu.txt
if command -v nvidia-smi > /dev/null 2>&1; then
  if timeout "$t_gpu" nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$gpu_file" 2>&1 \
     && [[ -s $gpu_file ]] && ! grep -qiE 'failed|error|no devices' "$gpu_file"; then
    have_gpu=1
    timeout "$t_gpu" nvidia-smi > "$work/nvidia-smi.txt" 2>&1
    record gpu ok 0 0 "$t_gpu" "$gpu_file" "$(head -1 "$gpu_file")"
  else
    no_gpu_reason="nvidia-smi found no GPU: $(why "$gpu_file")"
    record gpu skipped "" 0 "$t_gpu" "$gpu_file" "$no_gpu_reason"
  fi
else
  no_gpu_reason="nvidia-smi is not installed (no NVIDIA driver on this machine)"
  : > "$gpu_file"
  record gpu skipped "" 0 "$t_gpu" "" "$no_gpu_reason"
fi

# A GPU stage's status from its exit code: ok; skipped (no device: the
# binaries say so themselves, exit 77 or, for llama7b_step, "no CUDA device");
# timeout; failed (anything else, also without a GPU: a binary that should
# have skipped did not).
stage_status() {  # stage rc log
  local rc=$2
  if [[ $rc == 124 || $rc == 137 ]]; then echo timeout
  elif [[ $rc == 0 ]]; then
    if [[ $have_gpu == 1 || $1 != ctest ]]; then echo ok
    # Without a GPU every GPU test must report Skipped, never Passed.
    elif grep -qE 'Test +#[0-9]+: .* Passed' "$3" 2>/dev/null; then echo failed
    else echo skipped; fi
  elif [[ $rc == 77 ]]; then echo skipped
  elif [[ $have_gpu == 0 ]] && grep -q 'no CUDA device' "$3" 2>/dev/null; then echo skipped
  else echo failed
  fi
}

# program_stage NAME TIMEOUT LOG CMD...: one GPU program as a stage (run,
# status, the reason: the log's last lines unless ok; for the main job, its
# final validation loss), or "skipped" when the program was not built.
program_stage() {
  local name=$1 limit=$2 log=$3 st reason=""
  shift 3
  if [[ ! -x $1 ]]; then
    record "$name" skipped "" 0 "$limit" "" "$1 was not built"
    return
  fi
  run_stage "$name" "$limit" "$log" "$@"
  st=$(stage_status "$name" "$stage_rc" "$log")
  if [[ $st != ok ]]; then reason=$(why "$log" 2)
  elif [[ $name == main_job ]]; then reason=$(grep -o 'final val loss [0-9.]* nats/byte' "$log" | tail -1)
  fi
  record "$name" "$st" "$stage_rc" "$stage_s" "$stage_limit_s" "$log" "$reason"
}

# The GPU stages run whatever was built, also after a failed build.
if [[ $configure_ok == 1 ]]; then
  # ---- ctest: the binaries run even without a GPU (they must report skipped) ------------------
  run_stage ctest "$t_ctest" "$work/ctest.log" "${cmd_ctest[@]}"
  st=$(stage_status ctest "$stage_rc" "$work/ctest.log")
  reason=$(grep -E 'tests passed|tests failed' "$work/ctest.log" | tail -1)
  [[ $st == skipped ]] && reason="${no_gpu_reason:-no device}; $reason"
  [[ $st == timeout ]] && reason="no result after ${stage_limit_s} s; $(why "$work/ctest.log")"
  record ctest "$st" "$stage_rc" "$stage_s" "$stage_limit_s" "$work/ctest.log" "$reason"

  # ---- cuda_bench, llama7b_step, the main job on the GPU, llama7b_step without checkpointing --
  rm -f "$bench_json" "$llama_json" "$llama_none_json"
  rm -rf "$work/main-gpu"
  program_stage cuda_bench "$t_bench" "$work/cuda_bench.log" "${cmd_bench[@]}"
  program_stage llama7b "$t_llama" "$work/llama7b_step.log" "${cmd_llama[@]}"
  program_stage main_job "$t_main" "$work/main_job.log" "${cmd_main[@]}"
  program_stage llama7b_none "$t_llama" "$work/llama7b_none.log" "${cmd_llama_none[@]}"
else
  for s in ctest cuda_bench llama7b main_job llama7b_none; do
    record "$s" skipped "" 0 0 "" "no build (configure failed)"
  done
fi

# ---- the final report and the exit status -------------------------------------------------------
final=1
report
py_rc=$?
export_out
status_of() { awk -F'\t' -v s="$1" '$1 == s { print $2 }' "$stages" | tail -1; }
echo "device_check.sh: done in $(( $(date +%s) - start_all )) s"
if [[ $py_rc != 0 ]]; then echo "device_check.sh: the report failed (python3 rc $py_rc)" >&2; exit 1; fi
if [[ $(status_of configure) != ok || $(status_of build) != ok ]]; then exit 2; fi
for s in spills ctest cuda_bench llama7b main_job llama7b_none; do
  case $(status_of "$s") in
    failed|timeout) exit 1 ;;
  esac
done
exit 0
