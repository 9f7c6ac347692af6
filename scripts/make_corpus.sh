#!/usr/bin/env bash
# Regenerates data/fortunes.txt, the bundled training corpus, from the
# fortune cookie files of Debian's `fortunes` package (and `fortunes-min`,
# which it depends on, for the file named `fortunes`); BSD licence, see
# data/LICENSE.fortunes and data/README.md.
#
#   scripts/make_corpus.sh [OUT]        # default OUT: data/fortunes.txt
#
# Deterministic: a fixed list of files in a fixed order, and two fixed
# rewrites, so the same package version gives the same bytes (the SHA-256 is
# recorded in data/README.md):
#   * nroff overstriking is removed ("_\bX" underlining and "X\bX" bold become
#     "X"; an accent typed as "e\b'" keeps the second character), innermost
#     pair first, so no backspace byte reaches the corpus;
#   * each file ends with the cookie separator line "%", so the last cookie of
#     one file does not run into the first of the next.
# Skipped: ascii-art (pictures, not prose), translate-me (material staged for
# translation), the .dat index files and the .u8 links (same text).
set -euo pipefail

src=/usr/share/games/fortunes
out=${1:-"$(dirname "$0")/../data/fortunes.txt"}

files=(
  art computers cookie debian definitions disclaimer drugs education ethnic
  food fortunes goedel humorists kids knghtbrd law linux linuxcookie
  literature love magic medicine men-women miscellaneous news paradoxum
  people perl pets platitudes politics pratchett riddles science songs-poems
  sports startrek tao wisdom work zippy
)

for f in "${files[@]}"; do
  if [[ ! -r "$src/$f" ]]; then
    echo "make_corpus.sh: error: $src/$f is missing; install the Debian packages 'fortunes' and 'fortunes-min'" >&2
    exit 2
  fi
done

tmp="$out.tmp.$$"
trap 'rm -f "$tmp"' EXIT
{
  for f in "${files[@]}"; do
    LC_ALL=C perl -pe '1 while s/[^\x08]\x08//; s/\x08//g' "$src/$f"
    if [[ "$(tail -n 1 "$src/$f")" != "%" ]]; then printf '%%\n'; fi
  done
} > "$tmp"

# Shuffle the cookies (each ends with its "%" line) in a fixed pseudo-random
# order, so the held-out tail of the corpus (the last 10%, the validation
# split) is a sample of the same material as the training split. In file
# order the tail would be a change of topic (startrek, tao, wisdom, work,
# zippy) that measures domain shift rather than learning.
python3 - "$tmp" <<'PY'
import random, sys
path = sys.argv[1]
data = open(path, 'rb').read()
cookies = [c + b'%\n' for c in data.split(b'%\n') if c]
random.Random(20261129).shuffle(cookies)
open(path, 'wb').write(b''.join(cookies))
PY

if LC_ALL=C grep -q $'\x08' "$tmp"; then
  echo "make_corpus.sh: error: a backspace byte survived in $tmp" >&2
  exit 1
fi
if ! iconv -f UTF-8 -t UTF-8 "$tmp" > /dev/null 2>&1; then
  echo "make_corpus.sh: error: $tmp is not valid UTF-8" >&2
  exit 1
fi
mv "$tmp" "$out"
trap - EXIT
echo "make_corpus.sh: $(wc -c < "$out") bytes from ${#files[@]} files -> $out"
sha256sum "$out"
