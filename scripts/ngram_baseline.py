#!/usr/bin/env python3
"""Count-based n-gram baseline for a token file: the loss a transformer must beat.

Fits an interpolated modified Kneser-Ney n-gram model (default order 4) on the
TRAINING split of a token file and reports its cross-entropy on the VALIDATION
split in nats per token (nats per byte for the byte tokenizer). The split is
the one in include/tessera/data/token_file.hpp: the last floor(n * f) tokens
are validation (f = --val-fraction, default 0.1), the rest training.

Model (Chen and Goodman, "An Empirical Study of Smoothing Techniques for
Language Modeling", 1998, section 3, "modified Kneser-Ney"; the form KenLM
uses):

  p_k(w | h) = max(c_k(h w) - D_k(c_k(h w)), 0) / c_k(h .)  +  gamma_k(h) p_{k-1}(w | h')
  gamma_k(h) = (D_k1 N1(h .) + D_k2 N2(h .) + D_k3+ N3+(h .)) / c_k(h .)
  p_0(w)     = 1 / V

where h' drops the oldest token of h, c_k is the raw count at the top order
and the continuation count N1+(. h w) (number of distinct left neighbours) at
lower orders, N1/N2/N3+(h .) count the words after h seen once, twice, three
or more times, and the three discounts per order come from the count-of-counts
n1..n4 of that order: Y = n1 / (n1 + 2 n2), D1 = 1 - 2Y n2/n1,
D2 = 2 - 3Y n3/n2, D3+ = 3 - 4Y n4/n3. A context never seen in training
falls through to the next lower order; every byte keeps a probability of at
least gamma_1 / V, so no validation token costs infinity.

What is scored: every validation token except the first, each given the up to
(order - 1) tokens before it inside the validation range, which is what the
transformer's fixed validation windows score too (sampler.hpp, val_windows).

Usage:
  python3 scripts/ngram_baseline.py data/fortunes.tok            # a token file
  python3 scripts/ngram_baseline.py data/fortunes.txt            # raw text: bytes are tokens
  python3 scripts/ngram_baseline.py data/fortunes.tok --json     # one JSON line

A file that does not start with the token-file magic "TSRATOK1" is read as raw
bytes (vocabulary 256), which is exactly what `examples/tokenize FILE` without
--append-eot produces, so both give the same number. Standard library only.
"""

import argparse
import json
import math
import struct
import sys
import time
from collections import Counter, defaultdict

MAGIC = b"TSRATOK1"
HEADER_BYTES = 64
DEFAULT_VAL_FRACTION = 0.1  # token_file.hpp: default_val_fraction


def fail(msg):
    print(f"ngram_baseline.py: error: {msg}", file=sys.stderr)
    sys.exit(2)


def load_tokens(path):
    """Returns (tokens, vocab, kind). tokens is `bytes` when vocab <= 256 (fast
    slicing and hashing), else a tuple of ints. Checks the header as the C++
    reader does."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        fail(f"cannot read '{path}': {e.strerror}")
    if not data:
        fail(f"'{path}' is empty")
    if not data.startswith(MAGIC):
        return data, 256, "raw bytes"
    if len(data) < HEADER_BYTES:
        fail(f"token file '{path}' is truncated: {len(data)} bytes, header needs {HEADER_BYTES}")
    version, code, count, vocab, header_bytes = struct.unpack_from("<IIQQQ", data, 8)
    if version != 1:
        fail(f"token file '{path}' has unsupported version {version}; this reader supports version 1")
    if code not in (1, 2):
        fail(f"token file '{path}' has unsupported token dtype code {code}; expected 1 (uint16) or 2 (uint32)")
    if header_bytes != HEADER_BYTES:
        fail(f"token file '{path}' has unsupported header size {header_bytes}")
    width = 2 if code == 1 else 4
    expect = HEADER_BYTES + count * width
    if len(data) != expect:
        fail(f"token file '{path}' is truncated: header says {count} tokens ({expect} bytes) "
             f"but file holds {len(data)}")
    fmt = "<%d%s" % (count, "H" if code == 1 else "I")
    ids = struct.unpack_from(fmt, data, HEADER_BYTES)
    top = max(ids) if ids else 0
    if ids and top >= vocab:
        i = ids.index(top)
        fail(f"token file '{path}' holds token id {top} at index {i}, not below the vocabulary size {vocab}")
    kind = "token file (%s, vocab %d)" % ("uint16" if code == 1 else "uint32", vocab)
    if vocab <= 256:
        return bytes(ids), vocab, kind
    return ids, vocab, kind


def split(n, val_fraction):
    """token_file.hpp split_tokens: n_val = floor(n * f) in IEEE double."""
    if not (0.0 <= val_fraction < 1.0):
        fail(f"val_fraction={val_fraction} must lie in [0, 1)")
    n_val = math.floor(n * val_fraction)
    return (0, n - n_val), (n - n_val, n)


def discounts(counts):
    """Modified-KN discounts (D1, D2, D3+) from the count-of-counts of `counts`."""
    coc = Counter(c for c in counts.values() if c <= 4)
    n1, n2, n3, n4 = (coc.get(i, 0) for i in (1, 2, 3, 4))
    if n1 == 0 or n2 == 0 or n3 == 0 or n4 == 0:
        return (0.5, 1.0, 1.5)  # degenerate (tiny data): plain KN-like fallbacks
    y = n1 / (n1 + 2 * n2)
    d = (1 - 2 * y * n2 / n1, 2 - 3 * y * n3 / n2, 3 - 4 * y * n4 / n3)
    return tuple(min(max(x, 0.0), float(i + 1)) for i, x in enumerate(d))


class KneserNey:
    """Interpolated modified Kneser-Ney of a given order over `train`."""

    def __init__(self, train, order, vocab):
        self.order, self.vocab = order, vocab
        n = len(train)
        raw = {k: Counter(train[i:i + k] for i in range(n - k + 1)) for k in range(1, order + 1)}
        # level k: the counts of k-grams the model uses at order k
        self.levels = {}
        for k in range(1, order + 1):
            if k == order:
                counts = raw[k]
            else:  # continuation counts: distinct left neighbours of each k-gram
                counts = Counter(g[1:] for g in raw[k + 1])
            d1, d2, d3 = discounts(counts)
            ctx = defaultdict(lambda: [0, 0, 0, 0])  # total, N1, N2, N3+
            for g, c in counts.items():
                s = ctx[g[:-1]]
                s[0] += c
                s[1 if c == 1 else 2 if c == 2 else 3] += 1
            # context -> (1 / total, gamma)
            stats = {h: (1.0 / s[0], (d1 * s[1] + d2 * s[2] + d3 * s[3]) / s[0]) for h, s in ctx.items()}
            self.levels[k] = (counts, stats, (0.0, d1, d2, d3))

    def prob(self, context, w):
        """p(w | context), context the up to order-1 preceding tokens (a slice)."""
        p = 1.0 / self.vocab
        start = max(0, len(context) - (self.order - 1))
        ctx_full = context[start:]
        for k in range(1, len(ctx_full) + 2):
            h = ctx_full[len(ctx_full) - (k - 1):] if k > 1 else ctx_full[:0]
            counts, stats, d = self.levels[k]
            s = stats.get(h)
            if s is None:
                continue  # unseen context: this order adds nothing, keep the lower estimate
            inv_total, gamma = s
            c = counts.get(h + w, 0)
            p = max(c - d[min(c, 3)], 0.0) * inv_total + gamma * p
        return p


def cross_entropy(model, val):
    """Mean -ln p over val[1:], each token given the preceding tokens within val."""
    order = model.order
    total = 0.0
    for i in range(1, len(val)):
        ctx = val[max(0, i - (order - 1)):i]
        total -= math.log(model.prob(ctx, val[i:i + 1]))
    return total / (len(val) - 1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("path", help="token file (.tok) or raw UTF-8 text file")
    ap.add_argument("--order", type=int, default=4, help="n-gram order (default 4)")
    ap.add_argument("--val-fraction", type=float, default=DEFAULT_VAL_FRACTION,
                    help="fraction held out from the END of the file (default 0.1, as token_file.hpp)")
    ap.add_argument("--json", action="store_true", help="print one JSON line instead of text")
    args = ap.parse_args()
    if args.order < 1:
        fail(f"--order {args.order} must be >= 1")

    t0 = time.time()
    tokens, vocab, kind = load_tokens(args.path)
    (tb, te), (vb, ve) = split(len(tokens), args.val_fraction)
    train, val = tokens[tb:te], tokens[vb:ve]
    if len(val) < 2:
        fail(f"validation split of {len(val)} tokens is too small to score (n={len(tokens)}, "
             f"val_fraction={args.val_fraction})")

    results = {}
    for k in sorted({1, 2, 3, args.order}):
        if k > args.order:
            continue
        results[k] = cross_entropy(KneserNey(train, k, vocab), val)
    seconds = time.time() - t0
    unit = "nats_per_byte" if vocab == 256 else "nats_per_token"
    if args.json:
        out = {"order": args.order, f"val_{unit}": results[args.order],
               "train_tokens": len(train), "val_tokens": len(val),
               f"unigram_val_{unit}": results[1]}
        if 2 in results:
            out[f"bigram_val_{unit}"] = results[2]
        if 3 in results:
            out[f"trigram_val_{unit}"] = results[3]
        out.update({"val_fraction": args.val_fraction, "vocab": vocab,
                    "smoothing": "interpolated modified Kneser-Ney", "source": kind,
                    "seconds": round(seconds, 1)})
        print(json.dumps(out))
    else:
        u = unit.replace("_", " ")
        print(f"{args.path}: {kind}, {len(train)} train / {len(val)} validation tokens "
              f"(val_fraction {args.val_fraction})")
        for k, ce in results.items():
            print(f"  order {k} interpolated modified Kneser-Ney: validation {ce:.4f} {u} "
                  f"({ce / math.log(2):.4f} bits)")
        print(f"  ({seconds:.1f} s)")


if __name__ == "__main__":
    main()
