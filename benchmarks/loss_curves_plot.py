#!/usr/bin/env python3
"""Draws benchmarks/SET_curves.json (benchmarks/loss_curves.sh): the
training loss of each variant (a running mean of 10 steps) with its
validation losses, and below it each variant's gap to the reference
variant's curve (means over windows of 20 steps).

  /usr/bin/python3 benchmarks/loss_curves_plot.py benchmarks/precision_curves.json out.png
"""
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def running_mean(xs, w):
    return [sum(xs[max(0, i - w + 1):i + 1]) / (i - max(0, i - w + 1) + 1) for i in range(len(xs))]


def main(src, dst):
    j = json.load(open(src))
    ref = j["reference"]
    fig, (top, gap) = plt.subplots(2, 1, figsize=(7, 6), sharex=True,
                                   gridspec_kw={"height_ratios": [2, 1]})
    w = 20
    for p, r in j["runs"].items():
        xs = list(range(1, len(r["loss"]) + 1))
        line, = top.plot(xs, running_mean(r["loss"], 10), label=f"{p} (train, mean of 10)")
        vs = sorted((int(k), v) for k, v in r["val"].items())
        top.plot([k for k, _ in vs], [v for _, v in vs], "o--", color=line.get_color(),
                 label=f"{p} (val)")
        a, b = r["loss"], j["runs"][ref]["loss"]
        centres = [i + w / 2 for i in range(0, len(a) - w + 1, w)]
        diffs = [sum(a[i:i + w]) / w - sum(b[i:i + w]) / w for i in range(0, len(a) - w + 1, w)]
        gap.plot(centres, diffs, "o-", color=line.get_color(), label=p)
    top.set_ylabel("loss (nats per byte)")
    top.set_title(f"train_llama, small preset: loss by {j.get('set', 'precision')} ({j['date']})")
    top.legend(fontsize=8)
    gap.axhline(0, color="grey", lw=0.5)
    gap.set_xlabel("step")
    gap.set_ylabel(f"minus {ref} (mean of {w})")
    gap.legend(fontsize=8)
    fig.tight_layout()
    tmp = dst + ".tmp.png"
    fig.savefig(tmp, dpi=110)
    os.replace(tmp, dst)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: loss_curves_plot.py CURVES.json OUT.png")
    main(sys.argv[1], sys.argv[2])
