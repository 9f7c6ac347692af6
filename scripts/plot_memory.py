#!/usr/bin/env python3
"""Plots the caching allocator's event log: allocated and reserved device
bytes over time, with their peaks and, optionally, the planner's prediction.

The log is what caching_allocator::write_json writes (core/caching_allocator.hpp):
  {"device", "stats", "dropped", "events": [{"t_ns", "kind", "addr", "bytes",
   "stream", "allocated", "reserved"}, ...]}
`llama7b_step --backend cuda --memory-log FILE` writes one for a training run.

  scripts/plot_memory.py runs/memory.json                       # -> runs/memory.png
  scripts/plot_memory.py runs/memory.json --plan-bytes 123585928028 --out mem.png

Exit status: 0 on success, 2 on a missing, unreadable or foreign file (one line
naming it and what is wrong).
"""
import argparse
import json
import os
import sys


def fail(msg):
    print(f"plot_memory.py: error: {msg}", file=sys.stderr)
    sys.exit(2)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("log", help="the allocator's JSON event log")
    ap.add_argument("--out", help="PNG to write (default: the log's name with .png)")
    ap.add_argument("--plan-bytes", type=int, help="the planner's predicted peak, drawn as a line")
    a = ap.parse_args()
    try:
        with open(a.log) as f:
            log = json.load(f)
    except OSError as e:
        fail(f"cannot read '{a.log}': {e.strerror}")
    except json.JSONDecodeError as e:
        fail(f"'{a.log}' is not JSON ({e.msg} at line {e.lineno})")
    if not isinstance(log, dict) or not isinstance(log.get("events"), list):
        fail(f"'{a.log}' is not an allocator event log (no \"events\" list)")
    ev = log["events"]
    if not ev:
        fail(f"'{a.log}' holds no events (was event logging on?)")
    for i, e in enumerate(ev):
        if not all(k in e for k in ("t_ns", "kind", "allocated", "reserved")):
            fail(f"'{a.log}': event {i} lacks t_ns, kind, allocated or reserved")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    gib = float(1 << 30)
    t0 = ev[0]["t_ns"]
    t = [(e["t_ns"] - t0) / 1e9 for e in ev]
    alloc = [e["allocated"] / gib for e in ev]
    resv = [e["reserved"] / gib for e in ev]
    fig, ax = plt.subplots(figsize=(9, 4.5))
    ax.step(t, resv, where="post", label=f"reserved (peak {max(resv):.2f} GiB)")
    ax.step(t, alloc, where="post", label=f"allocated (peak {max(alloc):.2f} GiB)")
    if a.plan_bytes:
        ax.axhline(a.plan_bytes / gib, color="k", ls="--", lw=1,
                   label=f"planned {a.plan_bytes / gib:.2f} GiB")
    ax.set_xlabel("seconds since the first event")
    ax.set_ylabel("GiB")
    title = f"{log.get('device', '?')}: {len(ev)} allocator events"
    if log.get("dropped"):
        title += f" ({log['dropped']} not logged)"
    ax.set_title(title)
    ax.legend(loc="lower right")
    ax.grid(alpha=0.3)
    out = a.out or os.path.splitext(a.log)[0] + ".png"
    tmp = out + ".tmp.png"
    fig.tight_layout()
    fig.savefig(tmp, dpi=110)
    os.replace(tmp, out)
    print(f"plot_memory.py: {len(ev)} events, peak allocated {max(alloc):.3f} GiB, "
          f"peak reserved {max(resv):.3f} GiB -> {out}")


if __name__ == "__main__":
    main()
