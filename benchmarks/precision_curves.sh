#!/usr/bin/env bash
# Loss curves of the precision policies on the main job: train_llama on the
# bundled corpus (small preset) for N steps (default 300) under each
# --precision, the same seed and data order, one after another. Writes
# benchmarks/precision_curves.json (per policy: every step's training loss,
# the validation losses, the steps skipped, the last loss scale; and the
# largest gap to bf16's curve, as the mean over windows of 20 steps, and at
# the end), a markdown table (benchmarks/precision_curves.md) and the plot
# docs/images/precision_curves.png (Debian's /usr/bin/python3 with
# matplotlib; skipped with a note when it is missing).
#
#   benchmarks/precision_curves.sh [--steps N] [--policies "fp32 bf16 fp16"] [--out-dir DIR]
#
# A policy is a --precision name, or fp8:delayed / fp8:current for
# --precision fp8 with that --fp8-scaling. --merge keeps the runs already in
# the JSON that this invocation does not repeat (to add policies later).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
steps=300
policies="fp32 bf16 fp16"
out_dir="$root/benchmarks"
merge=0
while [ $# -gt 0 ]; do
  case "$1" in
    --steps) steps=${2:?--steps needs a value}; shift 2 ;;
    --policies) policies=${2:?--policies needs a value}; shift 2 ;;
    --out-dir) out_dir=${2:?--out-dir needs a value}; shift 2 ;;
    --merge) merge=1; shift ;;
    *) echo "precision_curves: unknown option $1" >&2; exit 2 ;;
  esac
done
[[ "$steps" =~ ^[0-9]+$ ]] && [ "$steps" -ge 40 ] ||
  { echo "precision_curves: --steps $steps must be an integer >= 40" >&2; exit 2; }
bin="$root/build/host/examples/train_llama"
[ -x "$bin" ] || { echo "precision_curves: $bin is missing: build the host preset first" >&2; exit 2; }
mkdir -p "$out_dir"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMP_WAIT_POLICY=passive
common=(--steps "$steps" --eval-every 50 --checkpoint-every 0 --sample-bytes 0 --no-baseline)
for p in $policies; do
  echo "precision_curves: $p, $steps steps" >&2
  flags=(--precision "${p%%:*}")
  [[ "$p" == *:* ]] && flags+=(--fp8-scaling "${p#*:}")
  start=$(date +%s)
  "$bin" "${common[@]}" "${flags[@]}" --out "$work/$p" >/dev/null
  echo "$p $(( $(date +%s) - start ))" >> "$work/seconds.txt"
done
python3 - "$out_dir" "$work" "$steps" "$policies" "$merge" <<'EOF'
import datetime, json, os, sys
out, work, steps, policies = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4].split()
seconds = dict(l.split() for l in open(os.path.join(work, "seconds.txt")))
runs, dates = {}, {}
old = os.path.join(out, "precision_curves.json")
if sys.argv[5] == "1" and os.path.exists(old):
    prev = json.load(open(old))
    if prev["steps"] != steps:
        sys.exit(f"precision_curves: --merge: the saved runs have {prev['steps']} steps, not {steps}")
    for p, r in prev["runs"].items():
        if p not in policies:
            r["val"] = {int(k): v for k, v in r["val"].items()}  # JSON keys are strings
            runs[p] = r
            dates[p] = r.get("date", prev["date"])
for p in policies:
    rows = [r for r in map(json.loads, open(os.path.join(work, p, "metrics.jsonl"))) if "step" in r]
    runs[p] = {"loss": [r["loss"] for r in rows],
               "val": {r["step"]: r["val_loss"] for r in rows if "val_loss" in r},
               "skipped_steps": sum(1 for r in rows if r.get("skipped")),
               "last_loss_scale": rows[-1].get("loss_scale"),
               "seconds": int(seconds[p]), "date": datetime.date.today().isoformat()}
def windows(xs, w=20):
    return [sum(xs[i:i + w]) / w for i in range(0, len(xs) - w + 1, w)]
ref = "bf16" if "bf16" in runs else next(iter(runs))
for p, r in runs.items():
    a, b = windows(r["loss"]), windows(runs[ref]["loss"])
    r["max_gap_to_" + ref] = max(abs(x - y) for x, y in zip(a, b))
    r["final_gap_to_" + ref] = a[-1] - b[-1]
    r["final_window_loss"] = a[-1]
    last = max(r["val"])
    r["final_val_loss"] = r["val"][last]
j = {"date": datetime.date.today().isoformat(), "steps": steps, "reference": ref,
     "command": "benchmarks/precision_curves.sh --steps %d" % steps,
     "settings": "small preset, data/fortunes.txt, train_llama defaults (seed 1337)", "runs": runs}
tmp = os.path.join(out, "precision_curves.json.tmp")
with open(tmp, "w") as f: json.dump(j, f, indent=1)
os.replace(tmp, os.path.join(out, "precision_curves.json"))
md = (f"Loss curves by precision policy (train_llama, small preset, bundled corpus, {steps} "
      f"steps, {j['date']}; losses in nats per byte, training loss as the mean of the last 20 "
      f"steps; gap = this policy's mean over a window of 20 steps minus {ref}'s):\n\n"
      f"| precision | train loss (last 20) | val loss (end) | largest gap to {ref} | skipped steps | "
      "last loss scale | seconds |\n|---|---|---|---|---|---|---|\n")
for p, r in runs.items():
    md += (f"| {p} | {r['final_window_loss']:.4f} | {r['final_val_loss']:.4f} | "
           f"{r['max_gap_to_' + ref]:.4f} | {r['skipped_steps']} | "
           f"{r['last_loss_scale'] if r['last_loss_scale'] is not None else '-'} | {r['seconds']} |\n")
with open(os.path.join(out, "precision_curves.md"), "w") as f: f.write(md)
print(md)
EOF
# The plot, with the system Python's matplotlib (benchmarks/precision_curves_plot.py).
if /usr/bin/python3 -c "import matplotlib" 2>/dev/null; then
  /usr/bin/python3 benchmarks/precision_curves_plot.py "$out_dir/precision_curves.json" \
    "$root/docs/images/precision_curves.png"
  echo "precision_curves: wrote docs/images/precision_curves.png" >&2
else
  echo "precision_curves: no matplotlib for /usr/bin/python3: the plot was not drawn" >&2
fi
