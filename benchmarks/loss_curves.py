#!/usr/bin/env python3
"""The JSON and markdown table of benchmarks/loss_curves.sh: reads each
variant's metrics.jsonl from the work folder (and runs.txt: name, seconds,
flags), merges earlier runs when asked, and writes SET_curves.json and
SET_curves.md. Losses in nats per byte; gaps are means over windows of 20
steps minus the reference variant's.

  loss_curves.py SET OUT_DIR WORK STEPS REFERENCE MERGE(0|1)
"""
import datetime
import json
import os
import sys


def windows(xs, w=20):
    return [sum(xs[i:i + w]) / w for i in range(0, len(xs) - w + 1, w)]


def main(set_name, out, work, steps, reference, merge):
    runs_txt = [l.split(maxsplit=2) for l in open(os.path.join(work, "runs.txt"))]
    now = {r[0]: (int(r[1]), r[2].strip() if len(r) > 2 else "") for r in runs_txt}
    path = os.path.join(out, f"{set_name}_curves.json")
    runs = {}
    if merge and os.path.exists(path):
        prev = json.load(open(path))
        if prev["steps"] != steps:
            sys.exit(f"loss_curves: --merge: the saved runs have {prev['steps']} steps, not {steps}")
        for v, r in prev["runs"].items():
            if v not in now:
                r["val"] = {int(k): x for k, x in r["val"].items()}  # JSON keys are strings
                runs[v] = r
    for v, (seconds, flags) in now.items():
        rows = [r for r in map(json.loads, open(os.path.join(work, v, "metrics.jsonl")))
                if "step" in r]
        runs[v] = {"flags": flags,
                   "loss": [r["loss"] for r in rows],
                   "val": {r["step"]: r["val_loss"] for r in rows if "val_loss" in r},
                   "skipped_steps": sum(1 for r in rows if r.get("skipped")),
                   "last_loss_scale": rows[-1].get("loss_scale"),
                   "seconds": seconds, "date": datetime.date.today().isoformat()}
    ref = reference if reference in runs else next(iter(runs))
    for v, r in runs.items():
        a, b = windows(r["loss"]), windows(runs[ref]["loss"])
        r["max_gap_to_" + ref] = max(abs(x - y) for x, y in zip(a, b))
        r["final_gap_to_" + ref] = a[-1] - b[-1]
        r["final_window_loss"] = a[-1]
        r["final_val_loss"] = r["val"][max(r["val"])]
    j = {"date": datetime.date.today().isoformat(), "set": set_name, "steps": steps,
         "reference": ref, "command": f"benchmarks/loss_curves.sh {set_name} --steps {steps}",
         "settings": "small preset, data/fortunes.txt, train_llama defaults (seed 1337)",
         "runs": runs}
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(j, f, indent=1)
    os.replace(tmp, path)

    scaled = any(r.get("last_loss_scale") is not None for r in runs.values())
    md = (f"Loss curves by {set_name} (train_llama, small preset, bundled corpus, {steps} "
          f"steps, {j['date']}; losses in nats per byte, training loss as the mean of the last 20 "
          f"steps; gap = this variant's mean over a window of 20 steps minus {ref}'s):\n\n"
          f"| {set_name} | flags | train loss (last 20) | val loss (end) | largest gap to {ref} | "
          + ("skipped steps | last loss scale | " if scaled else "") + "seconds |\n"
          + "|---" * (7 if scaled else 5) + "|---|\n")
    for v, r in runs.items():
        md += (f"| {v} | `{r.get('flags', '')}` | {r['final_window_loss']:.4f} | "
               f"{r['final_val_loss']:.4f} | {r['max_gap_to_' + ref]:.4f} | ")
        if scaled:
            scale = r["last_loss_scale"]
            md += f"{r['skipped_steps']} | {scale if scale is not None else '-'} | "
        md += f"{r['seconds']} |\n"
    with open(os.path.join(out, f"{set_name}_curves.md"), "w") as f:
        f.write(md)
    print(md)


if __name__ == "__main__":
    if len(sys.argv) != 7:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5], sys.argv[6] == "1")
