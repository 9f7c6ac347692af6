#!/usr/bin/env python3
"""Render a training run's loss curve to a PNG.

Reads a JSONL metrics file, one JSON object per line, as the trainer writes:

  {"step": 120, "loss": 2.41, "val_loss": 2.47, "lr": 3e-4, "grad_norm": 0.8, "tokens_per_s": 51000}

(`val_loss` only on evaluation steps; other keys are ignored; blank lines and
lines without "step" are skipped). Plots training loss and validation loss
against step, and, if given, the n-gram baseline
(scripts/ngram_baseline.py) as a dashed horizontal line. Losses are in nats
per token (nats per byte for the byte tokenizer).

Usage (Debian's matplotlib lives with the system Python, which may not be the
`python3` first on PATH):

  /usr/bin/python3 scripts/plot_loss.py runs/x/metrics.jsonl -o runs/x/loss.png --baseline 1.794
  /usr/bin/python3 scripts/plot_loss.py metrics.jsonl -o loss.png \\
      --baseline-json <(python3 scripts/ngram_baseline.py data/fortunes.tok --json)

Exit status 2 with one line on stderr for a missing or malformed input, or a
missing matplotlib.
"""

import argparse
import json
import math
import os
import sys


def fail(msg):
    print(f"plot_loss.py: error: {msg}", file=sys.stderr)
    sys.exit(2)


def read_metrics(path):
    steps, loss, val_steps, val_loss = [], [], [], []
    try:
        f = open(path, "r", encoding="utf-8")
    except OSError as e:
        fail(f"cannot read metrics file '{path}': {e.strerror}")
    with f:
        for lineno, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                fail(f"'{path}' line {lineno} is not JSON ({e.msg}): {line[:80]}")
            if not isinstance(rec, dict) or "step" not in rec:
                continue
            s = rec["step"]
            if isinstance(rec.get("loss"), (int, float)) and math.isfinite(rec["loss"]):
                steps.append(s)
                loss.append(rec["loss"])
            if isinstance(rec.get("baseline_4gram"), (int, float)):
                read_metrics.baseline = rec["baseline_4gram"]
            if isinstance(rec.get("val_loss"), (int, float)) and math.isfinite(rec["val_loss"]):
                val_steps.append(s)
                val_loss.append(rec["val_loss"])
    if not steps and not val_steps:
        fail(f"'{path}' holds no records with \"step\" and \"loss\" or \"val_loss\"")
    return steps, loss, val_steps, val_loss


def main():
    ap = argparse.ArgumentParser(description="Plot train/val loss vs step from a JSONL metrics file.")
    ap.add_argument("metrics", help="JSONL metrics file")
    ap.add_argument("-o", "--output", required=True, help="PNG to write")
    ap.add_argument("--baseline", type=float, help="n-gram baseline loss (drawn dashed)")
    ap.add_argument("--baseline-json", help="file holding ngram_baseline.py --json output")
    ap.add_argument("--baseline-label", default=None, help="legend text for the baseline")
    ap.add_argument("--title", default=None, help="plot title (default: the metrics path)")
    ap.add_argument("--log-y", action="store_true", help="logarithmic loss axis")
    args = ap.parse_args()

    baseline, label = args.baseline, args.baseline_label
    if args.baseline_json:
        try:
            with open(args.baseline_json, "r", encoding="utf-8") as f:
                b = json.loads(f.read().strip().splitlines()[-1])
        except (OSError, ValueError, IndexError) as e:
            fail(f"cannot read a baseline JSON line from '{args.baseline_json}': {e}")
        key = next((k for k in ("val_nats_per_byte", "val_nats_per_token") if k in b), None)
        if key is None:
            fail(f"'{args.baseline_json}' has no val_nats_per_byte / val_nats_per_token")
        baseline = b[key]
        label = label or f"{b.get('order', '?')}-gram Kneser-Ney baseline ({baseline:.3f})"
    if baseline is not None and label is None:
        label = f"n-gram baseline ({baseline:.3f})"

    read_metrics.baseline = None
    steps, loss, val_steps, val_loss = read_metrics(args.metrics)
    if baseline is None and read_metrics.baseline is not None:
        # train_llama records the 4-gram baseline in each metrics line
        baseline = read_metrics.baseline
        label = label or f"4-gram Kneser-Ney baseline ({baseline:.3f})"

    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        fail(f"matplotlib is not installed for {sys.executable}; run this script with "
             "/usr/bin/python3 (Debian's python3-matplotlib) or `pip install matplotlib`")

    out_dir = os.path.dirname(os.path.abspath(args.output))
    if not os.path.isdir(out_dir):
        fail(f"output directory '{out_dir}' does not exist")

    fig, ax = plt.subplots(figsize=(8, 5), dpi=120)
    if steps:
        ax.plot(steps, loss, lw=1.0, color="tab:blue", alpha=0.85, label="train loss")
    if val_steps:
        ax.plot(val_steps, val_loss, lw=1.6, color="tab:orange", marker="o", ms=3,
                label="validation loss")
    if baseline is not None:
        ax.axhline(baseline, color="gray", ls="--", lw=1.2, label=label)
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats per token)")
    if args.log_y:
        ax.set_yscale("log")
    ax.set_title(args.title or os.path.basename(args.metrics))
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    tmp = args.output + ".tmp.%d.png" % os.getpid()
    try:
        fig.savefig(tmp)
        os.replace(tmp, args.output)
    except OSError as e:
        if os.path.exists(tmp):
            os.remove(tmp)
        fail(f"cannot write '{args.output}': {e.strerror}")
    last = f"last train loss {loss[-1]:.4f}" if loss else "no train loss"
    lastv = f", last val loss {val_loss[-1]:.4f}" if val_loss else ""
    print(f"plot_loss.py: {len(steps)} train / {len(val_steps)} val points, {last}{lastv} -> {args.output}")


if __name__ == "__main__":
    main()
