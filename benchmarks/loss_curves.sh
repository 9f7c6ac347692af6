#!/usr/bin/env bash
# Loss curves of the main job under a set of variants: train_llama on the
# bundled corpus (small preset) for N steps (default 300) under each
# variant's flags, the same seed and data order, one after another. Two sets:
#
#   precision  --precision fp32 | bf16 | fp16 | fp8:delayed | fp8:current
#   optimizer  --optimizer adamw | lion | adafactor | muon, each at the
#              learning rate and weight decay its authors recommend relative
#              to AdamW's (the table in flags_for below)
#
# Writes benchmarks/SET_curves.json (per variant: its flags, every step's
# training loss, the validation losses, the steps skipped, the last loss
# scale; the largest gap to the reference variant's curve, as the mean over
# windows of 20 steps, and at the end), a markdown table
# (benchmarks/SET_curves.md) and the plot docs/images/SET_curves.png
# (Debian's /usr/bin/python3 with matplotlib; skipped with a note when it is
# missing).
#
#   benchmarks/loss_curves.sh SET [--steps N] [--variants "a b c"] [--merge] [--out-dir DIR]
#
# --merge keeps the runs already in the JSON that this invocation does not
# repeat (to add variants later).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
set_name=${1:-}
case "$set_name" in
  precision) variants="fp32 bf16 fp16"; reference=bf16 ;;
  optimizer) variants="adamw lion adafactor muon"; reference=adamw ;;
  *) echo "loss_curves: the first argument $set_name must be precision or optimizer" >&2; exit 2 ;;
esac
shift
steps=300
out_dir="$root/benchmarks"
merge=0
while [ $# -gt 0 ]; do
  case "$1" in
    --steps) steps=${2:?--steps needs a value}; shift 2 ;;
    --variants) variants=${2:?--variants needs a value}; shift 2 ;;
    --out-dir) out_dir=${2:?--out-dir needs a value}; shift 2 ;;
    --merge) merge=1; shift ;;
    *) echo "loss_curves: unknown option $1" >&2; exit 2 ;;
  esac
done
[[ "$steps" =~ ^[0-9]+$ ]] && [ "$steps" -ge 40 ] ||
  { echo "loss_curves: --steps $steps must be an integer >= 40" >&2; exit 2; }

# The train_llama flags of variant $2 of set $1.
flags_for() {
  case "$1:$2" in
    precision:fp8:*) echo "--precision fp8 --fp8-scaling ${2#fp8:}" ;;
    precision:*) echo "--precision $2" ;;
    # AdamW at train_llama's defaults (lr 2e-3, weight decay 0.1).
    optimizer:adamw) echo "--optimizer adamw" ;;
    # Lion: lr 3-10x smaller and decay 3-10x larger than AdamW's (Chen et
    # al. 2023, section 5), so that lr x decay stays about the same.
    optimizer:lion) echo "--optimizer lion --lr 1e-3 --weight-decay 0.2" ;;
    # Adafactor with a first moment (beta1 0.9, as the T5 recipes that use
    # one) at the schedule's lr, relative step off.
    optimizer:adafactor) echo "--optimizer adafactor --adafactor-beta1 0.9 --lr 5e-3 --weight-decay 0.1" ;;
    # Muon: the matrices at torch.optim.Muon's documented lr (0.02, with the
    # `original` shape scale), the embedding, head and norms at AdamW's lr.
    optimizer:muon) echo "--optimizer muon --lr 0.02 --muon-adamw-lr 2e-3" ;;
    *) echo "loss_curves: unknown $1 variant $2" >&2; return 2 ;;
  esac
}
for v in $variants; do flags_for "$set_name" "$v" >/dev/null; done

bin="$root/build/host/examples/train_llama"
[ -x "$bin" ] || { echo "loss_curves: $bin is missing: build the host preset first" >&2; exit 2; }
mkdir -p "$out_dir"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMP_WAIT_POLICY=passive
common=(--steps "$steps" --eval-every 50 --checkpoint-every 0 --sample-bytes 0 --no-baseline)
for v in $variants; do
  echo "loss_curves: $set_name $v, $steps steps" >&2
  read -r -a flags <<< "$(flags_for "$set_name" "$v")"
  start=$(date +%s)
  "$bin" "${common[@]}" "${flags[@]}" --out "$work/$v" >/dev/null
  echo "$v $(( $(date +%s) - start )) ${flags[*]}" >> "$work/runs.txt"
done
python3 benchmarks/loss_curves.py "$set_name" "$out_dir" "$work" "$steps" "$reference" "$merge"
# The plot, with the system Python's matplotlib (benchmarks/loss_curves_plot.py).
if /usr/bin/python3 -c "import matplotlib" 2>/dev/null; then
  /usr/bin/python3 benchmarks/loss_curves_plot.py "$out_dir/${set_name}_curves.json" \
    "$root/docs/images/${set_name}_curves.png"
  echo "loss_curves: wrote docs/images/${set_name}_curves.png" >&2
else
  echo "loss_curves: no matplotlib for /usr/bin/python3: the plot was not drawn" >&2
fi
