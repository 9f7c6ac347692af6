#!/usr/bin/env bash
# Host step time of this checkout against another commit, measured in one
# run on this machine, interleaved round by round so that both see the same
# load: the main job (train_llama's defaults: small preset, G = B = 16,
# T 128, fp32, 2 threads) and llama7b_step --layers 1 --seq 256 (llama2_7b
# shapes, fp32). Writes benchmarks/speed_vs_commit.json and a markdown table
# (benchmarks/speed_vs_commit.md) of median step times and their ratio.
#
#   benchmarks/speed_vs_commit.sh REF [--rounds N] [--out-dir DIR]
#
# REF is built in a temporary git worktree (build/host preset, its own
# ccache); this checkout must already be built (scripts/test.sh or
# cmake --build --preset host). The step times are medians over the rounds
# of per-run medians: train_llama's steps 11..60 (the first ten are warm-up),
# llama7b_step's best of 2 timed steps after 1 warm-up step. The ratio is
# the median over the rounds of each round's this / reference (the two runs
# of a round see the same load), beside the ratio of the medians.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
ref=${1:?usage: benchmarks/speed_vs_commit.sh REF [--rounds N] [--out-dir DIR]}
shift
rounds=5
out_dir="$root/benchmarks"
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds=${2:?--rounds needs a value}; shift 2 ;;
    --out-dir) out_dir=${2:?--out-dir needs a value}; shift 2 ;;
    *) echo "speed_vs_commit: unknown option $1" >&2; exit 2 ;;
  esac
done
[[ "$rounds" =~ ^[1-9][0-9]*$ ]] || { echo "speed_vs_commit: --rounds $rounds must be a positive integer" >&2; exit 2; }
git rev-parse --verify -q "$ref^{commit}" >/dev/null || { echo "speed_vs_commit: $ref is not a commit" >&2; exit 2; }
new_bin="$root/build/host/examples"
for b in train_llama llama7b_step; do
  [ -x "$new_bin/$b" ] || { echo "speed_vs_commit: $new_bin/$b is missing: build this checkout first" >&2; exit 2; }
done
mkdir -p "$out_dir"

work=$(mktemp -d)
trap 'git -C "$root" worktree remove --force "$work/ref" >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
git -C "$root" worktree add --detach "$work/ref" "$ref" >/dev/null 2>&1
echo "speed_vs_commit: building $ref in $work/ref"
(cd "$work/ref" && cmake --preset host >/dev/null && cmake --build --preset host --target train_llama llama7b_step >/dev/null)
old_bin="$work/ref/build/host/examples"

export OMP_NUM_THREADS=2 OMP_WAIT_POLICY=passive
# train_llama's median step seconds of steps 11..60 (metrics.jsonl).
main_job() {
  local bin=$1 out=$2
  rm -rf "$out"
  "$bin/train_llama" --steps 60 --eval-every 0 --eval-windows 8 --checkpoint-every 0 \
    --sample-bytes 0 --no-baseline --out "$out" >/dev/null
  python3 - "$out/metrics.jsonl" <<'PY'
import json, statistics, sys
s = [j["seconds"] for j in map(json.loads, open(sys.argv[1])) if "seconds" in j][10:]
print(statistics.median(s))
PY
}
# llama7b_step's best timed step (its --json).
step7b() {
  local bin=$1 out=$2
  "$bin/llama7b_step" --layers 1 --seq 256 --steps 2 --warmup-steps 1 --json "$out" >/dev/null
  python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["step_best_s"])' "$out"
}

declare -a m_old m_new s_old s_new
for r in $(seq 1 "$rounds"); do
  m_old+=("$(main_job "$old_bin" "$work/m_old")")
  m_new+=("$(main_job "$new_bin" "$work/m_new")")
  s_old+=("$(step7b "$old_bin" "$work/s_old.json")")
  s_new+=("$(step7b "$new_bin" "$work/s_new.json")")
  echo "speed_vs_commit: round $r/$rounds: main job ${m_old[-1]} s vs ${m_new[-1]} s, llama7b_step ${s_old[-1]} s vs ${s_new[-1]} s"
done

python3 - "$out_dir" "$ref" "$(git -C "$root" rev-parse --short HEAD)" "$(git -C "$root" rev-parse --short "$ref")" \
  "${m_old[*]}" "${m_new[*]}" "${s_old[*]}" "${s_new[*]}" <<'PY'
import json, os, statistics, sys, datetime
out, ref, head, refc, mo, mn, so, sn = sys.argv[1:]
f = lambda s: [float(x) for x in s.split()]
rows = []
for name, a, b in (("main job (small, fp32, G=B=16, T=128), median step", f(mo), f(mn)),
                   ("llama7b_step --layers 1 --seq 256 (fp32), best step", f(so), f(sn))):
    ma, mb = statistics.median(a), statistics.median(b)
    paired = statistics.median([y / x for x, y in zip(a, b)])
    rows.append({"benchmark": name, "reference_s": ma, "this_s": mb, "ratio": paired,
                 "ratio_of_medians": mb / ma, "reference_runs": a, "this_runs": b})
j = {"date": datetime.date.today().isoformat(), "reference": f"{ref} ({refc})", "this": head,
     "omp_threads": int(os.environ.get("OMP_NUM_THREADS", "0")), "rows": rows}
tmp = os.path.join(out, "speed_vs_commit.json.tmp")
with open(tmp, "w") as fh: json.dump(j, fh, indent=2)
os.replace(tmp, os.path.join(out, "speed_vs_commit.json"))
md = [f"Step time of {head} against {ref} ({refc}), {len(rows[0]['this_runs'])} interleaved rounds, {j['date']}:",
      "", "| benchmark | reference, median (s) | this, median (s) | this / reference, median of rounds | ratio of medians |",
      "|---|---|---|---|---|"]
md += [f"| {r['benchmark']} | {r['reference_s']:.4f} | {r['this_s']:.4f} | {r['ratio']:.3f} | {r['ratio_of_medians']:.3f} |" for r in rows]
tmp = os.path.join(out, "speed_vs_commit.md.tmp")
with open(tmp, "w") as fh: fh.write("\n".join(md) + "\n")
os.replace(tmp, os.path.join(out, "speed_vs_commit.md"))
print("\n".join(md))
PY
