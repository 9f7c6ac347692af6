#!/usr/bin/env python3
"""Render a pipeline step's timeline (Chrome trace JSON) to a PNG.

Reads the file `train_llama --trace FILE` writes (the Trace Event Format's
complete events, "ph": "X": one row per rank, one box per action: forwards
F, backwards B and W (or BW, a whole backward), sends, receives, the
gradient reduction and the optimizer step) and draws one row per rank,
each compute box labelled by its micro-batch, coloured by kind, the
messages as thin ticks under it. The title gives the layout, the schedule
and the bubble measured from the boxes: 1 - (compute time summed over the
ranks) / (ranks x span), as parallel/pipeline_sim.hpp reports it.

Usage (Debian's matplotlib lives with the system Python):

  /usr/bin/python3 scripts/render_trace.py runs/zb1.json -o docs/images/trace_zb1.png
  /usr/bin/python3 scripts/render_trace.py a.json b.json -o both.png   # stacked
"""

import argparse
import json
import sys

COLOURS = {
    "forward": "#4c72b0",
    "backward": "#55a868",
    "backward_input": "#55a868",
    "backward_weight": "#ccb974",
    "reduce_gradients": "#c44e52",
    "clip": "#8172b2",
    "optimizer_step": "#8172b2",
}
MESSAGES = {"send_forward", "recv_forward", "send_backward", "recv_backward"}
COMPUTE = {"forward", "backward", "backward_input", "backward_weight"}


def fail(msg):
    print(f"render_trace: error: {msg}", file=sys.stderr)
    sys.exit(2)


def load(path):
    try:
        with open(path) as f:
            doc = json.load(f)
    except OSError as e:
        fail(f"cannot read '{path}': {e.strerror}")
    except json.JSONDecodeError as e:
        fail(f"'{path}' is not JSON: {e}")
    # The Trace Event Format is an object with "traceEvents" or a bare array.
    raw = doc if isinstance(doc, list) else doc.get("traceEvents", []) if isinstance(doc, dict) else []
    events = [e for e in raw if isinstance(e, dict) and e.get("ph") == "X"
              and all(k in e for k in ("ts", "dur", "tid", "name"))]
    if not events:
        fail(f"'{path}' holds no complete events (ph X with ts, dur, tid, name)")
    for e in events:
        e.setdefault("cat", "")
    return events, doc.get("otherData", {}) if isinstance(doc, dict) else {}


def bubble(events):
    ranks = sorted({e["tid"] for e in events})
    t0 = min(e["ts"] for e in events)
    compute = [e for e in events if e["cat"] in COMPUTE]
    t1 = max(e["ts"] + e["dur"] for e in compute)
    busy = sum(e["dur"] for e in compute)
    span = t1 - t0
    return 1 - busy / (len(ranks) * span) if span > 0 else 0.0, span


def draw(ax, events, meta, path):
    ranks = sorted({e["tid"] for e in events})
    row = {r: i for i, r in enumerate(ranks)}
    t0 = min(e["ts"] for e in events)
    for e in events:
        y = row[e["tid"]]
        x = (e["ts"] - t0) / 1e3
        w = e["dur"] / 1e3
        cat = e["cat"]
        if cat in MESSAGES:
            ax.broken_barh([(x, max(w, 1e-3))], (y + 0.38, 0.08), facecolors="#777777")
            continue
        ax.broken_barh([(x, w)], (y - 0.35, 0.7), facecolors=COLOURS.get(cat, "#999999"),
                       edgecolors="white", linewidth=0.5)
        if cat in COMPUTE:
            label = e["name"]
            ax.text(x + w / 2, y, label, ha="center", va="center", fontsize=6, color="white",
                    clip_on=True)
    frac, span = bubble(events)
    ax.set_yticks(range(len(ranks)))
    ax.set_yticklabels([f"rank {r}" for r in ranks])
    ax.invert_yaxis()
    ax.set_xlabel("ms")
    title = (f"pp {meta.get('pp', '?')} {meta.get('schedule', '')}, V {meta.get('virtual_stages', 1)}, "
             f"M {meta.get('micro_batches', '?')} micro-batches: bubble {100 * frac:.1f}% "
             f"of {span / 1e3:.1f} ms")
    ax.set_title(title, fontsize=9)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("traces", nargs="+", help="Chrome trace JSON files (train_llama --trace)")
    ap.add_argument("-o", "--output", required=True, help="PNG to write")
    args = ap.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    loaded = [load(p) for p in args.traces]
    heights = [1 + 0.45 * len({e["tid"] for e in ev}) for ev, _ in loaded]
    fig, axes = plt.subplots(len(loaded), 1, figsize=(11, sum(heights) + 0.6),
                             gridspec_kw={"height_ratios": heights}, squeeze=False)
    for ax, (events, meta), path in zip(axes[:, 0], loaded, args.traces):
        draw(ax, events, meta, path)
    handles = [Patch(color=COLOURS["forward"], label="forward F"),
               Patch(color=COLOURS["backward"], label="backward (B: input gradient)"),
               Patch(color=COLOURS["backward_weight"], label="W: weight gradient"),
               Patch(color=COLOURS["reduce_gradients"], label="gradient reduction"),
               Patch(color=COLOURS["optimizer_step"], label="clip, optimizer step"),
               Patch(color="#777777", label="send / recv")]
    fig.legend(handles=handles, loc="lower center", ncol=6, fontsize=7, frameon=False)
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    try:
        fig.savefig(args.output, dpi=130)
    except OSError as e:
        fail(f"cannot write '{args.output}': {e.strerror}")
    print(f"render_trace: wrote {args.output}")


if __name__ == "__main__":
    main()
