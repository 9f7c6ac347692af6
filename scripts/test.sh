#!/usr/bin/env bash
# Builds tessera (host preset: library tests, examples, benchmarks) and runs
# the test suite with CTest. Extra arguments go to ctest (e.g. -L kernels).
#   scripts/test.sh
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
# numpy and safetensors for the Hugging Face interop test (skipped without them)
scripts/python_deps.sh || echo "tessera: without numpy and safetensors the hf_interop test is skipped"
cmake --preset host >/dev/null
cmake --build --preset host -j "$(nproc)"
ctest --preset host "$@"
