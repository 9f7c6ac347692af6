#!/usr/bin/env bash
# Builds tessera (host preset: library tests, examples, benchmarks) and runs
# the test suite with CTest. Extra arguments go to ctest (e.g. -L kernels).
#   scripts/test.sh
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
cmake --preset host >/dev/null
cmake --build --preset host -j "$(nproc)"
ctest --preset host "$@"
