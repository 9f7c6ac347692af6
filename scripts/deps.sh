#!/usr/bin/env bash
# Checks (and, as root, installs) the Debian 12 packages tessera needs.
#   scripts/deps.sh            # host build, tests and the main job
#   scripts/deps.sh --clang    # clang, its sanitizer/libFuzzer runtimes and LLVM's
#                              # OpenMP only (presets asan, tsan, fuzz)
# Exit status 2 with the exact list of missing packages when not root.
set -euo pipefail
PKGS=(g++ cmake make ccache libopenblas-openmp-dev libdnnl-dev ocl-icd-opencl-dev catch2 nlohmann-json3-dev libssl-dev libcli11-dev
      libopenmpi-dev openmpi-bin python3 python3-matplotlib fortunes)
if [ "${1:-}" = --clang ]; then PKGS=(clang libclang-rt-14-dev libomp-14-dev); fi
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then exit 0; fi
if [ "$(id -u)" -eq 0 ]; then
  echo "tessera: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
  echo "tessera: missing Debian packages: ${missing[*]}" >&2
  echo "tessera: install them with: sudo apt-get install ${missing[*]}" >&2
  exit 2
fi
