#!/usr/bin/env bash
# Checks (and, as root, installs) clang with its sanitizer and libFuzzer
# runtimes and LLVM's OpenMP: what the asan and fuzz presets build with
# (Debian 12: clang, libclang-rt-14-dev, libomp-14-dev).
#   scripts/clang_deps.sh
# Exit status 2 with the exact list of missing packages when not root.
set -euo pipefail
pkgs=(clang libclang-rt-14-dev libomp-14-dev)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -eq 0 ]; then
  echo "tessera: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
  echo "tessera: clang is needed here: sudo apt-get install ${missing[*]}" >&2
  exit 2
fi
