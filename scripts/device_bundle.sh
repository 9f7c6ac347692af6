#!/usr/bin/env bash
# device_bundle.sh: the build dependencies of the `cuda` preset, unpacked into
# .devdeps/ at the repository root, for the GPU machine lent through the
# device tool (a bare CUDA image: nvcc, g++, CMake, ninja, python3; no apt,
# no network, none of the Debian -dev packages below). Run it HERE (Debian 12,
# apt and network), then name `.devdeps` in the device call's `carry`;
# benchmarks/device_check.sh finds everything in it first (CMAKE_PREFIX_PATH,
# TESSERA_OPENBLAS_LIBRARY / TESSERA_CBLAS_INCLUDE_DIR, LD_LIBRARY_PATH).
#
#   scripts/device_bundle.sh           # download (cached in build/dc-debs/) and unpack
#   scripts/device_bundle.sh --check   # only say whether .devdeps/ is complete (exit 0/1)
#
# What goes in (Debian 12 packages, docs, man pages, pkg-config/lintian files,
# the static libopenblas.a and the BLAS/LAPACK .so.3 alternatives stripped):
#   catch2                  Catch2 v2: headers, CMake config (+ the static
#                           libCatch2WithMain.a its config insists exists)
#   nlohmann-json3-dev      headers, CMake config
#   libcli11-dev            headers, CMake config
#   libopenblas-openmp-dev  cblas.h & co., the libopenblas.so link
#   libopenblas0-openmp     libopenblasp-r0.3.21.so (DYNAMIC_ARCH: ~35 MiB of the total)
#   libgfortran5            libopenblas needs it; a gcc without gfortran lacks it
#   libquadmath0            libgfortran5 needs it
# Not bundled: libc, libstdc++, libgcc-s, libgomp (any g++ install has them;
# libopenblas needs at most GLIBC_2.34 and OMP_4.5), MPI and NCCL (the device
# check configures without MPI, so the NCCL block is skipped).
#
# Idempotent: .debs already in build/dc-debs/ are not downloaded again, and
# .devdeps/ is rebuilt from them in a temporary folder and swapped in whole.
# Also writes .devdeps/MANIFEST.txt (packages, versions, sizes) and
# .devdeps/source_rev (this checkout's commit, for a device copy without .git).
# Exit status: 0 done; 1 a download, an unpack or a check failed (with why).

set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
dest=$repo/.devdeps
cache=$repo/build/dc-debs
pkgs=(catch2 nlohmann-json3-dev libcli11-dev libopenblas-openmp-dev libopenblas0-openmp
      libgfortran5 libquadmath0)
# Files the device check needs; --check and the end of a run test for them.
needed=(
  usr/lib/cmake/Catch2/Catch2Config.cmake
  usr/include/catch2/catch.hpp
  usr/share/cmake/nlohmann_json/nlohmann_jsonConfig.cmake
  usr/include/nlohmann/json.hpp
  usr/share/cmake/CLI11/CLI11Config.cmake
  usr/include/CLI/CLI.hpp
  usr/lib/x86_64-linux-gnu/openblas-openmp/libopenblas.so
  usr/lib/x86_64-linux-gnu/openblas-openmp/libopenblas.so.0
  usr/include/x86_64-linux-gnu/openblas-openmp/cblas.h
  usr/lib/x86_64-linux-gnu/libgfortran.so.5
  usr/lib/x86_64-linux-gnu/libquadmath.so.0
)
# The travelling limit of the device tool (working tree + carried paths).
limit_mib=64

die() { echo "device_bundle.sh: $*" >&2; exit 1; }

check() {  # check DIR: every needed file there (links resolved)
  local missing=()
  for f in "${needed[@]}"; do [[ -e $1/$f ]] || missing+=("$f"); done
  if [[ ${#missing[@]} -gt 0 ]]; then
    echo "device_bundle.sh: $1 lacks: ${missing[*]}" >&2
    return 1
  fi
}

if [[ ${1:-} == --check ]]; then
  check "$dest" && echo "device_bundle.sh: $dest is complete" && exit 0
  exit 1
elif [[ $# -gt 0 ]]; then
  sed -n '2,12p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
  [[ $1 == -h || $1 == --help ]] && exit 0
  exit 1
fi

command -v apt-get > /dev/null && command -v dpkg > /dev/null \
  || die "needs apt-get and dpkg (run it on the Debian 12 development machine, not on the GPU machine)"
[[ $(dpkg --print-architecture) == amd64 ]] \
  || die "this machine is $(dpkg --print-architecture); the GPU machine is x86-64 (amd64): bundle on an amd64 machine"

# ---- download (only what the cache lacks, at the candidate version) ----------------------------
mkdir -p "$cache"
declare -A ver=()
want=()
for p in "${pkgs[@]}"; do
  v=$(apt-cache policy "$p" 2>/dev/null | awk '/Candidate:/ { print $2 }')
  [[ -n $v && $v != "(none)" ]] || die "apt knows no candidate for '$p' (apt-get update? not Debian 12?)"
  ver[$p]=$v
  # .deb names carry the version with ':' as '%3a'.
  if ! compgen -G "$cache/${p}_${v//:/%3a}_*.deb" > /dev/null; then want+=("$p=$v"); fi
done
if [[ ${#want[@]} -gt 0 ]]; then
  echo "device_bundle.sh: downloading ${want[*]}"
  # apt's sandbox user cannot write a root-owned folder: download as this user.
  (cd "$cache" && apt-get download -o APT::Sandbox::User=root "${want[@]}") \
    || die "apt-get download failed for ${want[*]} (network? apt-get update?)"
fi
debs=()
for p in "${pkgs[@]}"; do
  f=$(compgen -G "$cache/${p}_${ver[$p]//:/%3a}_*.deb" | head -1) || true
  [[ -n $f ]] || die "no .deb of $p ${ver[$p]} in $cache after the download"
  debs+=("$f")
done

# ---- unpack into a fresh folder, strip, check, swap in ------------------------------------------
tmp=$(mktemp -d "$cache/unpack.XXXXXX")   # same file system as .devdeps: mv is a rename
trap 'rm -rf "$tmp"' EXIT
for f in "${debs[@]}"; do dpkg -x "$f" "$tmp" || die "dpkg -x $f failed"; done
ob=$tmp/usr/lib/x86_64-linux-gnu/openblas-openmp
rm -rf "$tmp"/usr/share/doc "$tmp"/usr/share/man "$tmp"/usr/share/lintian "$tmp"/usr/share/Catch2 \
       "$tmp"/usr/share/pkgconfig "$ob"/pkgconfig "$ob"/cmake \
       "$ob"/libopenblas*.a "$ob"/libblas.so* "$ob"/liblapack.so*
find "$tmp" -xtype l -delete        # links left dangling by the above
find "$tmp" -depth -type d -empty -delete
check "$tmp" || die "the unpacked packages lack files the device check needs (see above)"

{
  echo "# .devdeps: made by scripts/device_bundle.sh on $(date -u +%Y-%m-%dT%H:%M:%SZ) ($(. /etc/os-release && echo "$PRETTY_NAME"))"
  for f in "${debs[@]}"; do
    printf '%s\t%s\n' "$(dpkg-deb -f "$f" Package)" "$(dpkg-deb -f "$f" Version)"
  done
  echo "# files (bytes):"
  (cd "$tmp" && find . -type f -printf '%s\t%P\n' | sort -k2)
} > "$cache/MANIFEST.txt"
mv "$cache/MANIFEST.txt" "$tmp/MANIFEST.txt"
# The commit this bundle was made at (the device copy of the tree most likely has no .git).
rev=$(git -C "$repo" rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
git -C "$repo" diff --quiet HEAD 2>/dev/null || rev="$rev+dirty"
echo "$rev" > "$tmp/source_rev"

rm -rf "$dest"
mv "$tmp" "$dest"
trap - EXIT

# ---- sizes ------------------------------------------------------------------------------------------
mib() { awk -v b="$1" 'BEGIN { printf "%.1f", b / 1048576 }'; }
bundle_b=$(du -sb "$dest" | cut -f1)
blas_b=$(stat -L -c %s "$dest"/usr/lib/x86_64-linux-gnu/openblas-openmp/libopenblas.so.0)
# What travels without carry: tracked and untracked-not-ignored files.
tree_b=$(cd "$repo" && git ls-files -z --cached --others --exclude-standard 2>/dev/null \
         | xargs -0 stat -c %s 2>/dev/null | awk '{ s += $1 } END { print s + 0 }')
echo "device_bundle.sh: $dest: $(mib "$bundle_b") MiB ($(mib "$blas_b") MiB of it libopenblas, OpenMP, DYNAMIC_ARCH)"
echo "device_bundle.sh: with the working tree ($(mib "$tree_b") MiB) a call carrying .devdeps sends $(mib $((bundle_b + tree_b))) MiB of the tool's $limit_mib MiB"
if (( bundle_b + tree_b > (limit_mib - 4) * 1048576 )); then
  die "that is too close to the device tool's $limit_mib MiB limit"
fi
