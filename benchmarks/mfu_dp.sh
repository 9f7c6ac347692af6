#!/usr/bin/env bash
# MFU of a data-parallel run against one rank at the same per-rank work:
# train_llama on one rank with one OpenMP thread and micro-batch B, and on
# --dp 2 thread ranks (--comm local) with one thread each and the same B per
# rank (G = 2B), interleaved round by round. Each rank reports the step's
# model FLOPs over dp ranks' peaks (one thread's theoretical peak each), so
# the two figures should agree within noise. Writes benchmarks/mfu_dp.json
# and a markdown table (benchmarks/mfu_dp.md) of the median MFU of steps
# 6..N of each run (the first five are warm-up).
#
#   benchmarks/mfu_dp.sh [--rounds N] [--steps N] [--out-dir DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
rounds=3
steps=30
out_dir="$root/benchmarks"
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds=${2:?--rounds needs a value}; shift 2 ;;
    --steps) steps=${2:?--steps needs a value}; shift 2 ;;
    --out-dir) out_dir=${2:?--out-dir needs a value}; shift 2 ;;
    *) echo "mfu_dp: unknown option $1" >&2; exit 2 ;;
  esac
done
[[ "$rounds" =~ ^[1-9][0-9]*$ ]] || { echo "mfu_dp: --rounds $rounds must be a positive integer" >&2; exit 2; }
[[ "$steps" =~ ^[0-9]+$ ]] && [ "$steps" -gt 5 ] || { echo "mfu_dp: --steps $steps must be an integer > 5" >&2; exit 2; }
bin="$root/build/host/examples/train_llama"
[ -x "$bin" ] || { echo "mfu_dp: $bin is missing: build the host preset first" >&2; exit 2; }
mkdir -p "$out_dir"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMP_WAIT_POLICY=passive
common=(--steps "$steps" --micro-batch 8 --seq 128 --eval-every 0 --checkpoint-every 0
        --sample-bytes 0 --no-baseline)
# Median MFU and tokens/s of steps 6.. from a metrics.jsonl.
median_of() {
  python3 - "$1" <<'EOF'
import json, statistics, sys
rows = [r for r in map(json.loads, open(sys.argv[1])) if "step" in r][5:]
print(statistics.median(r["mfu"] for r in rows if r["mfu"] is not None), statistics.median(r["tokens_per_s"] for r in rows))
EOF
}
results=()
for r in $(seq 1 "$rounds"); do
  OMP_NUM_THREADS=1 "$bin" "${common[@]}" --global-batch 8 --out "$work/one" >/dev/null
  read -r m1 t1 < <(median_of "$work/one/metrics.jsonl")
  OMP_NUM_THREADS=2 "$bin" "${common[@]}" --global-batch 16 --dp 2 --comm local --out "$work/dp" >/dev/null
  read -r m2 t2 < <(median_of "$work/dp/metrics.jsonl")
  echo "mfu_dp: round $r/$rounds: one rank (1 thread, B 8) mfu $m1, tokens/s $t1; dp 2 (1 thread each, B 8 per rank) mfu $m2, tokens/s $t2"
  results+=("$m1 $t1 $m2 $t2")
done
# The rounds go through a file: the program itself is python's stdin.
printf '%s\n' "${results[@]}" > "$work/rounds.txt"
python3 - "$out_dir" "$rounds" "$steps" "$work/rounds.txt" <<'EOF'
import datetime, json, os, statistics, sys
out, rounds, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rows = [list(map(float, l.split())) for l in open(sys.argv[4]) if l.strip()]
one_mfu = statistics.median(r[0] for r in rows); dp_mfu = statistics.median(r[2] for r in rows)
one_tps = statistics.median(r[1] for r in rows); dp_tps = statistics.median(r[3] for r in rows)
# Each round runs the two back to back: its ratio compares them under the
# same load, so the median of the rounds' ratios is the figure to read on a
# shared machine (a round whose two halves saw different load is an outlier).
ratios = [r[2] / r[0] for r in rows]
j = {"date": datetime.date.today().isoformat(), "rounds": rounds, "steps": steps,
     "one_rank": {"threads": 1, "micro_batch": 8, "mfu": one_mfu, "tokens_per_s": one_tps},
     "dp2_local": {"threads_per_rank": 1, "micro_batch": 8, "mfu": dp_mfu, "tokens_per_s": dp_tps},
     "mfu_ratio": dp_mfu / one_mfu,
     "mfu_ratio_per_round": ratios, "mfu_ratio_median_of_rounds": statistics.median(ratios),
     "per_rank_throughput_ratio": dp_tps / 2 / one_tps, "rounds_raw": rows}
with open(os.path.join(out, "mfu_dp.json.tmp"), "w") as f: json.dump(j, f, indent=1)
os.replace(os.path.join(out, "mfu_dp.json.tmp"), os.path.join(out, "mfu_dp.json"))
md = (f"MFU at equal per-rank work (small preset, B 8 per rank, T 128, 1 thread per rank, "
      f"{rounds} interleaved rounds, median of steps 6..{steps}), {j['date']}:\n\n"
      "| run | MFU | tokens/s (all ranks) |\n|---|---|---|\n"
      f"| one rank | {100*one_mfu:.1f}% | {one_tps:.0f} |\n"
      f"| dp 2 on threads (--comm local) | {100*dp_mfu:.1f}% | {dp_tps:.0f} |\n"
      f"\ndp 2 / one rank MFU, median of the rounds' ratios: {statistics.median(ratios):.3f} "
      f"(rounds: {', '.join(f'{x:.2f}' for x in ratios)}); of the medians: "
      f"{dp_mfu/one_mfu:.3f}; per-rank tokens/s of dp 2 / one rank's: "
      f"{dp_tps/2/one_tps:.3f} (the MFU is the per-rank figure: the two ratios agree, and "
      f"what separates them from 1 is the scaling loss of the run)\n")
with open(os.path.join(out, "mfu_dp.md.tmp"), "w") as f: f.write(md)
os.replace(os.path.join(out, "mfu_dp.md.tmp"), os.path.join(out, "mfu_dp.md"))
print(md)
EOF
