#!/usr/bin/env python3
"""Plot the validation loss of several runs in nats per byte, whatever their
tokenizers, against the optimizer step.

Reads train_llama's metrics.jsonl files: the lines with a "step" and a
"val_nats_per_byte" (train_llama writes it on each evaluation: the loss in
nats per token divided by the validation split's bytes per token).

  /usr/bin/python3 scripts/plot_compare.py runs/bytes/metrics.jsonl="bytes (V 256)" \\
      runs/bpe/metrics.jsonl="BPE 4096" -o docs/images/bpe_vs_bytes.png

Exit status 2 with one line on stderr for a missing or malformed input, or a
missing matplotlib.
"""
import argparse
import json
import os
import sys


def fail(msg):
    print(f"plot_compare.py: error: {msg}", file=sys.stderr)
    sys.exit(2)


def read(path):
    steps, vals = [], []
    try:
        with open(path, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    r = json.loads(line)
                except json.JSONDecodeError as e:
                    fail(f"'{path}' line {n} is not JSON ({e.msg})")
                if "step" in r and isinstance(r.get("val_nats_per_byte"), (int, float)):
                    steps.append(r["step"])
                    vals.append(r["val_nats_per_byte"])
    except OSError as e:
        fail(f"cannot read '{path}': {e.strerror}")
    if not steps:
        fail(f"'{path}' has no evaluation lines with val_nats_per_byte")
    return steps, vals


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", help="METRICS.jsonl=LABEL")
    ap.add_argument("-o", "--output", required=True)
    ap.add_argument("--title", default="validation loss, nats per byte")
    a = ap.parse_args()
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        fail(f"matplotlib is not installed for {sys.executable}; use /usr/bin/python3")
    fig, ax = plt.subplots(figsize=(8, 5), dpi=120)
    for run in a.runs:
        path, _, label = run.partition("=")
        steps, vals = read(path)
        ax.plot(steps, vals, marker="o", ms=3, lw=1.5,
                label=f"{label or path} (final {vals[-1]:.3f})")
    ax.set_xlabel("step")
    ax.set_ylabel("validation loss (nats per byte)")
    ax.set_title(a.title)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    tmp = a.output + f".tmp.{os.getpid()}.png"
    fig.savefig(tmp)
    os.replace(tmp, a.output)
    print(f"plot_compare.py: wrote {a.output}")


if __name__ == "__main__":
    main()
