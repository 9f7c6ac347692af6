#!/usr/bin/env bash
# device_check.sh: the GPU session in one command. Configures and builds the
# `cuda` preset (Release), runs the GPU tests, checks the kernel library for
# register spills, runs the kernel benchmark and the full llama2_7b step, and
# writes one JSON and one markdown table (ready to paste into
# benchmarks/RESULTS.md) with the issue's targets marked pass or fail.
#
#   benchmarks/device_check.sh                      # from the repository root
#   benchmarks/device_check.sh --jobs 16 --build-dir build/cuda
#   benchmarks/device_check.sh --dry-run            # print the stages, run nothing
#
# Budget on one H200 with 16 cores (each stage has its own timeout, so one
# hang cannot eat the rest; a failed or timed-out stage is recorded and the
# script goes on):
#
#   stage        what                                                    timeout
#   configure    cmake --preset cuda -B <build> (Release)                  120 s
#   build        cmake --build <build> -j <jobs> (~3 min at -j16)          480 s
#   spills       ptxas -v lines of the kernel library (its objects are     180 s
#                rebuilt if the build log has none), and cuobjdump
#                --dump-resource-usage when installed
#   gpu          nvidia-smi: name, driver, CUDA version                     30 s
#   ctest        ctest -L cuda --output-on-failure, 120 s a test (~2 min)  300 s
#   cuda_bench   <build>/benchmarks/cuda_bench --json (~1-2 min)           180 s
#   llama7b      <build>/examples/llama7b_step --backend cuda --preset      300 s
#                llama2_7b --precision bf16 --seq 4096 --micro-batch 1
#                --warmup-steps 1 --steps 3 --json (~2 min)
#
# About 9 minutes when all goes well; a hang costs at most its stage's
# timeout (one GPU test at most 120 s).
# Timeouts: DC_TIMEOUT_{CONFIGURE,BUILD,SPILLS,GPU,CTEST,BENCH,LLAMA} (seconds),
# e.g. DC_TIMEOUT_BUILD=1200 on a machine with few cores.
#
# Outputs: benchmarks/device_check.json and benchmarks/device_check.md (or
# --out DIR), benchmarks/cuda_bench.json when the benchmark ran, and every
# stage's log under <build>/device_check/.
#
# Without a GPU the GPU stages are recorded as skipped with the reason (the
# test and benchmark binaries still run: they must report "skipped"), the
# JSON and the table are still written, and the exit status is 0.
#
# Exit status: 0 when every stage that ran succeeded (or was skipped for want
# of a device); 1 when a GPU stage failed or timed out (tests failed, a
# benchmark check failed, a crash); 2 when configure or build failed (the
# GPU stages are then skipped). Missed performance targets do not change the
# exit status: they are marked in the JSON and the table.

set -u -o pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build_dir=build/cuda
out_dir=benchmarks
jobs=$(nproc 2>/dev/null || echo 4)
dry_run=0
command_line="$0 $*"

usage() {
  sed -n '2,46p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
  echo "options: --build-dir DIR (default build/cuda)  --jobs N (default nproc)"
  echo "         --out DIR (default benchmarks)  --dry-run  --help"
}
while [[ $# -gt 0 ]]; do
  case "$1" in
    --build-dir) build_dir=$2; shift 2 ;;
    --jobs|-j) jobs=$2; shift 2 ;;
    --out) out_dir=$2; shift 2 ;;
    --dry-run) dry_run=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "device_check.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done

cd "$repo" || exit 2
build=$build_dir
work=$build/device_check
bench_json=$out_dir/cuda_bench.json
llama_json=$work/llama7b_step.json

t_configure=${DC_TIMEOUT_CONFIGURE:-120}
t_build=${DC_TIMEOUT_BUILD:-480}
t_spills=${DC_TIMEOUT_SPILLS:-180}
t_gpu=${DC_TIMEOUT_GPU:-30}
t_ctest=${DC_TIMEOUT_CTEST:-300}
t_bench=${DC_TIMEOUT_BENCH:-180}
t_llama=${DC_TIMEOUT_LLAMA:-300}

cmd_configure=(cmake --preset cuda -B "$build" -DCMAKE_BUILD_TYPE=Release)
# GNU make >= 4 keeps each target's output together (-Otarget), so the
# ptxas -v lines of parallel kernel TUs do not interleave in the log.
make_args=()
if make --version 2>/dev/null | head -1 | grep -Eq 'GNU Make ([4-9]|[1-9][0-9])'; then
  make_args=(-- -Otarget)
fi
cmd_build=(cmake --build "$build" -j "$jobs" "${make_args[@]}")
cmd_spills=(cmake --build "$build" -j "$jobs" --target tessera_cuda_kernels "${make_args[@]}")
cmd_ctest=(ctest --test-dir "$build" -L cuda --output-on-failure --timeout 120)
cmd_bench=("$build/benchmarks/cuda_bench" --json "$bench_json")
cmd_llama=("$build/examples/llama7b_step" --backend cuda --preset llama2_7b --precision bf16
           --seq 4096 --micro-batch 1 --warmup-steps 1 --steps 3 --json "$llama_json")

if [[ $dry_run == 1 ]]; then
  echo "device_check.sh --dry-run: would run, from $repo:"
  printf '  configure  (%4s s)  %s\n' "$t_configure" "${cmd_configure[*]}"
  printf '  build      (%4s s)  %s\n' "$t_build" "${cmd_build[*]}"
  printf '  spills     (%4s s)  ptxas -v lines of %s (kernel objects rebuilt if none), cuobjdump --dump-resource-usage\n' \
    "$t_spills" "$build/cuda/libtessera_cuda_kernels.a"
  printf '  gpu        (%4s s)  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader\n' "$t_gpu"
  printf '  ctest      (%4s s)  %s\n' "$t_ctest" "${cmd_ctest[*]}"
  printf '  cuda_bench (%4s s)  %s\n' "$t_bench" "${cmd_bench[*]}"
  printf '  llama7b    (%4s s)  %s\n' "$t_llama" "${cmd_llama[*]}"
  echo "  report               $out_dir/device_check.json, $out_dir/device_check.md; logs in $work/"
  exit 0
fi

mkdir -p "$work" "$out_dir" || exit 2
stages=$work/stages.tsv
: > "$stages"
start_all=$(date +%s)
echo "device_check.sh: logs in $work/"

# record NAME STATUS RC SECONDS TIMEOUT LOG REASON
record() {
  local reason=${7//$'\t'/ }
  reason=${reason//$'\n'/ }
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" "$5" "$6" "$reason" >> "$stages"
  printf 'device_check.sh: %-10s %-8s (%s s)%s\n' "$1" "$2" "$4" "${7:+  $7}"
}

# run_stage NAME TIMEOUT LOG CMD...: runs CMD under timeout, output to LOG;
# sets stage_rc and stage_s.
run_stage() {
  local name=$1 limit=$2 log=$3
  shift 3
  echo "device_check.sh: $name: $* (timeout ${limit} s)"
  local t0
  t0=$(date +%s)
  timeout --kill-after=15 "$limit" "$@" > "$log" 2>&1
  stage_rc=$?
  stage_s=$(( $(date +%s) - t0 ))
}

# Last line of a log that says why (for the reason column).
why() { grep -v '^\s*$' "$1" 2>/dev/null | tail -n "${2:-1}" | tr '\t\n' '  ' | sed 's/ *$//' | cut -c1-300; }

build_ok=0
# ---- configure -----------------------------------------------------------------------------
run_stage configure "$t_configure" "$work/configure.log" "${cmd_configure[@]}"
if [[ $stage_rc == 0 ]]; then
  record configure ok 0 "$stage_s" "$t_configure" "$work/configure.log" ""
  # ---- build -------------------------------------------------------------------------------
  run_stage build "$t_build" "$work/build.log" "${cmd_build[@]}"
  if [[ $stage_rc == 0 ]]; then
    build_ok=1
    record build ok 0 "$stage_s" "$t_build" "$work/build.log" ""
  elif [[ $stage_rc == 124 || $stage_rc == 137 ]]; then
    record build timeout "$stage_rc" "$stage_s" "$t_build" "$work/build.log" "no result after ${t_build} s"
  else
    record build failed "$stage_rc" "$stage_s" "$t_build" "$work/build.log" \
      "$(grep -m1 -E 'error|Error' "$work/build.log" | cut -c1-300)"
  fi
else
  record configure failed "$stage_rc" "$stage_s" "$t_configure" "$work/configure.log" "$(why "$work/configure.log" 2)"
  record build skipped "" 0 "$t_build" "" "configure failed"
fi

# ---- spills: ptxas -v of the kernel library ---------------------------------------------------
spill_log=$work/spills.log
kernels_lib=$build/cuda/libtessera_cuda_kernels.a
if [[ $build_ok == 1 ]]; then
  t0=$(date +%s)
  grep -E '^ptxas info|bytes stack frame' "$work/build.log" > "$spill_log"
  spill_source="ptxas -v lines of the build log"
  if ! grep -q 'bytes stack frame' "$spill_log"; then
    # An incremental build did not recompile the kernels: rebuild their
    # objects alone (ccache replays ptxas's output when it has them).
    spill_source="ptxas -v lines of a rebuild of tessera_cuda_kernels"
    rm -f "$build"/cuda/CMakeFiles/tessera_cuda_kernels.dir/*.o
    timeout --kill-after=15 "$t_spills" "${cmd_spills[@]}" > "$work/spills_build.log" 2>&1
    grep -E '^ptxas info|bytes stack frame' "$work/spills_build.log" > "$spill_log"
  fi
  if command -v cuobjdump > /dev/null 2>&1 || [[ -x /usr/local/cuda/bin/cuobjdump ]]; then
    objdump_bin=$(command -v cuobjdump || echo /usr/local/cuda/bin/cuobjdump)
    timeout 120 "$objdump_bin" --dump-resource-usage "$kernels_lib" > "$work/resource_usage.log" 2>&1 \
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
  record spills skipped "" 0 "$t_spills" "" "no build"
fi

# ---- gpu ------------------------------------------------------------------------------------
gpu_file=$work/gpu.txt
have_gpu=0
no_gpu_reason=""
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
    if [[ $have_gpu == 1 || $1 != ctest ]]; then echo ok; else echo skipped; fi
  elif [[ $rc == 77 ]]; then echo skipped
  elif [[ $have_gpu == 0 ]] && grep -q 'no CUDA device' "$3" 2>/dev/null; then echo skipped
  else echo failed
  fi
}

if [[ $build_ok == 1 ]]; then
  # ---- ctest: the binaries run even without a GPU (they must report skipped) ------------------
  run_stage ctest "$t_ctest" "$work/ctest.log" "${cmd_ctest[@]}"
  st=$(stage_status ctest "$stage_rc" "$work/ctest.log")
  reason=$(grep -E 'tests passed|tests failed' "$work/ctest.log" | tail -1)
  [[ $st == skipped ]] && reason="${no_gpu_reason:-no device}; $reason"
  record ctest "$st" "$stage_rc" "$stage_s" "$t_ctest" "$work/ctest.log" "$reason"

  # ---- cuda_bench ----------------------------------------------------------------------------
  rm -f "$bench_json"
  run_stage cuda_bench "$t_bench" "$work/cuda_bench.log" "${cmd_bench[@]}"
  st=$(stage_status cuda_bench "$stage_rc" "$work/cuda_bench.log")
  reason=""
  [[ $st != ok ]] && reason=$(why "$work/cuda_bench.log" 2)
  record cuda_bench "$st" "$stage_rc" "$stage_s" "$t_bench" "$work/cuda_bench.log" "$reason"

  # ---- llama7b_step --------------------------------------------------------------------------
  rm -f "$llama_json"
  run_stage llama7b "$t_llama" "$work/llama7b_step.log" "${cmd_llama[@]}"
  st=$(stage_status llama7b "$stage_rc" "$work/llama7b_step.log")
  reason=""
  [[ $st != ok ]] && reason=$(why "$work/llama7b_step.log" 2)
  record llama7b "$st" "$stage_rc" "$stage_s" "$t_llama" "$work/llama7b_step.log" "$reason"
else
  for s in ctest cuda_bench llama7b; do record "$s" skipped "" 0 0 "" "no build (configure or build failed)"; done
fi

# ---- report ---------------------------------------------------------------------------------
total_s=$(( $(date +%s) - start_all ))
nvcc_version=$( (nvcc --version 2>/dev/null || /usr/local/cuda/bin/nvcc --version 2>/dev/null) | grep -o 'release [0-9.]*, V[0-9.]*' | head -1)
git_rev=$(git rev-parse --short HEAD 2>/dev/null)$(git diff --quiet HEAD 2>/dev/null || echo "+dirty")

python3 - "$stages" "$work" "$bench_json" "$llama_json" "$out_dir" "$command_line" "$total_s" \
  "$nvcc_version" "$git_rev" "$have_gpu" "$no_gpu_reason" "$build" "$jobs" <<'PY'
import json, os, re, sys, datetime

(stages_path, work, bench_json, llama_json, out_dir, command, total_s, nvcc_version, git_rev,
 have_gpu, no_gpu_reason, build, jobs) = sys.argv[1:]
have_gpu = have_gpu == "1"

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

# Targets (the CUDA issue): GEMMs >= 0.85 of the 8192^3 rate, attention
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
else:
    targets += [target("gemm", None, 0.85, "every llama2_7b GEMM / cuBLASLt bf16 8192^3"),
                target("attention_forward", None, 0.50, "flash attention forward / cuBLASLt bf16 8192^3"),
                target("adamw", None, 0.85, "AdamW bytes/s / D2D copy bytes/s")]
targets.append(target("llama7b_mfu", llama.get("mfu") if llama else None, 0.45,
                      "llama2_7b full step, bf16, seq 4096, micro-batch 1: MFU"))
# Spills: the share of kernel/arch entries without any (1.00 = none spill).
checked = spills["functions_checked"]
targets.append(target("no_spills", 1 - len(spills["with_spills"]) / checked if checked else None, 1.0,
                      "kernel library: share of kernels (per arch) without register spills",
                      ("spilling: " + ", ".join(x["function"] for x in spills["with_spills"][:8]))
                      if spills["with_spills"] else None))

result = {
    "schema": "tessera.device_check/1",
    "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    "host": os.uname().nodename, "cpus": os.cpu_count(), "jobs": int(jobs),
    "command": command, "git": git_rev, "build_dir": build,
    "cuda_toolkit": nvcc_version or None, "gpu": gpu, "total_seconds": int(total_s),
    "stages": stages, "ctest": ctest, "spills": spills,
    "cuda_bench": bench, "llama7b_step": llama, "targets": targets,
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
L.append(f"Command: `{command}` (commit {git_rev}, {os.cpu_count()} CPUs, -j {jobs}, toolkit "
         f"{nvcc_version or 'unknown'}); {int(total_s) // 60} min {int(total_s) % 60} s in all. "
         f"JSON: `{json_path}`.\n")
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
write(os.path.join(out_dir, "device_check.md"), "\n".join(L) + "\n")
print(f"device_check.sh: wrote {os.path.join(out_dir, 'device_check.json')} and "
      f"{os.path.join(out_dir, 'device_check.md')}")
PY
py_rc=$?

# ---- exit status ----------------------------------------------------------------------------
status_of() { awk -F'\t' -v s="$1" '$1 == s { print $2 }' "$stages" | tail -1; }
echo "device_check.sh: done in ${total_s} s"
if [[ $py_rc != 0 ]]; then echo "device_check.sh: the report failed (python3 rc $py_rc)" >&2; exit 1; fi
if [[ $(status_of configure) != ok || $(status_of build) != ok ]]; then exit 2; fi
for s in spills ctest cuda_bench llama7b; do
  case $(status_of "$s") in
    failed|timeout) exit 1 ;;
  esac
done
exit 0
