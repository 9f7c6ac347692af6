#!/usr/bin/env bash
# Checks (and, as root, installs) clang with its sanitizer and libFuzzer
# runtimes and LLVM's OpenMP: what the asan, tsan and fuzz presets build with.
#   scripts/clang_deps.sh
exec "$(dirname "$0")/deps.sh" --clang
