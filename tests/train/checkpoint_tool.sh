#!/usr/bin/env bash
# The checkpoint tool (examples/checkpoint.cpp) on the folders train_llama
# writes: a dp 2 ZeRO-3 run saves checkpoint folders; `list` names its
# layout and tensors (and the run folder's checkpoints, the newest marked,
# also as JSON); `verify` passes, then fails naming a rank file with one
# byte changed; `consolidate` writes one file, and `train_llama --resume`
# from a run folder holding it continues with the same losses, bit for bit,
# as the resume of the original (and runs at another layout); `export-hf`
# writes config.json and model.safetensors. Bad input is one line, exit 2,
# nothing written.
#   tests/train/checkpoint_tool.sh build/host/examples/checkpoint build/host/examples/train_llama
set -euo pipefail
tool=${1:?usage: checkpoint_tool.sh path/to/checkpoint path/to/train_llama}
train=${2:?usage: checkpoint_tool.sh path/to/checkpoint path/to/train_llama}
root=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
fail() { echo "checkpoint_tool: $*" >&2; exit 1; }
args=(--preset small --dim 32 --layers 2 --heads 4 --kv-heads 2 --ffn 64 --data "$root/data/fortunes.txt"
      --steps 4 --global-batch 8 --micro-batch 4 --seq 32 --lr 3e-3 --warmup 3 --eval-every 0
      --eval-windows 8 --checkpoint-every 2 --sample-bytes 0 --no-baseline)
"$train" "${args[@]}" --dp 2 --zero 3 --out "$work/run" > "$work/train.log"
ck="$work/run/step-000004"

# list: the run folder, one checkpoint, and JSON.
"$tool" list "$work/run" > "$work/list_run"
grep -q "step-000002 .*complete" "$work/list_run" || fail "list of the run folder: $(cat "$work/list_run")"
grep -q "step-000004 .*newest complete" "$work/list_run" || fail "no newest mark: $(cat "$work/list_run")"
"$tool" list "$ck" > "$work/list_ck"
grep -q "step 4 of 4" "$work/list_ck" || fail "list: no step: $(head -3 "$work/list_ck")"
grep -q "layout: dp 2, tp 1, pp 1 (world 2), ZeRO-3" "$work/list_ck" || fail "list: no layout: $(head -3 "$work/list_ck")"
grep -q "embedding  *\[256, 32\]  *exp_avg float32 x2, exp_avg_sq float32 x2, param float32 x2" "$work/list_ck" ||
  fail "list: no embedding row: $(grep embedding "$work/list_ck")"
grep -q "rank-00001.bin" "$work/list_ck" || fail "list: no rank file"
"$tool" list --json "$ck" > "$work/list.json"
python3 - "$work/list.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
assert d["kind"] == "checkpoint" and d["step"] == 4, d["step"]
assert d["layout"]["dp"] == 2 and d["layout"]["zero"] == "zero3", d["layout"]
assert d["model"]["dim"] == 32 and len(d["tensors"]) == 21, len(d["tensors"])
assert [f["name"] for f in d["files"]] == ["rank-00000.bin", "rank-00001.bin"], d["files"]
assert d["bytes"] == sum(f["bytes"] for f in d["files"])
PY
echo "checkpoint_tool: list ok"

# verify: passes; one byte changed in a rank file fails naming it.
"$tool" verify "$ck" | grep -q ": ok (2 files" || fail "verify of a good checkpoint failed"
cp -r "$ck" "$work/damaged"
python3 - "$work/damaged/rank-00001.bin" <<'PY'
import sys
with open(sys.argv[1], "r+b") as f:
    f.seek(1000); b = f.read(1); f.seek(1000); f.write(bytes([b[0] ^ 0x5a]))
PY
set +e
"$tool" verify "$work/damaged" > /dev/null 2> "$work/verify.err"
rc=$?
set -e
[ $rc -eq 2 ] && [ "$(grep -c . "$work/verify.err")" -eq 1 ] && grep -q "rank-00001.bin' does not match its SHA-256" "$work/verify.err" ||
  fail "verify of a damaged file: rc $rc, $(cat "$work/verify.err")"
echo "checkpoint_tool: verify ok; damaged: $(cat "$work/verify.err")"

# consolidate: one file; a run folder holding it resumes as the original does.
mkdir "$work/one"
for f in "$work/run"/*; do case $(basename "$f") in step-*) ;; *) cp -r "$f" "$work/one/";; esac; done
cp -r "$work/one" "$work/other"
"$tool" consolidate "$ck" "$work/one/step-000004" > /dev/null
"$tool" verify "$work/one/step-000004" | grep -q ": ok (1 files" || fail "the consolidated folder does not verify"
"$tool" list "$work/one/step-000004" | grep -q "consolidated from: dp 2, tp 1, pp 1" || fail "list of the consolidated folder"
cp -r "$work/one/step-000004" "$work/other/"
cp -r "$work/run" "$work/orig"
"$train" --resume "$work/orig" --steps 6 > /dev/null
"$train" --resume "$work/one" --steps 6 > /dev/null
python3 - "$work/orig/metrics.jsonl" "$work/one/metrics.jsonl" <<'PY'
import json, sys
def load(p):
    return {r["step"]: (r["loss"], r["grad_norm"], r["lr"]) for r in map(json.loads, open(p)) if "step" in r}
a, b = load(sys.argv[1]), load(sys.argv[2])
assert sorted(a) == sorted(b) == list(range(1, 7)), (sorted(a), sorted(b))
assert a[5] == b[5] and a[6] == b[6], (a[5], b[5], a[6], b[6])  # bit for bit
PY
"$train" --resume "$work/other" --dp 1 --zero 0 --steps 6 > /dev/null
[ -f "$work/other/step-000006/metadata.json" ] || fail "a resume at dp 1 of the consolidated folder wrote no checkpoint"
echo "checkpoint_tool: consolidate ok; resumed steps 5 and 6 equal the original's"

# export-hf: config.json and model.safetensors.
"$tool" export-hf "$ck" "$work/hf" --dtype bf16 > /dev/null
[ -f "$work/hf/config.json" ] && [ -f "$work/hf/model.safetensors" ] || fail "export-hf: $(ls "$work/hf")"
python3 - "$work/hf" <<'PY'
import json, struct, sys
c = json.load(open(sys.argv[1] + "/config.json"))
assert c["architectures"] == ["LlamaForCausalLM"] and c["hidden_size"] == 32, c
with open(sys.argv[1] + "/model.safetensors", "rb") as f:
    n = struct.unpack("<Q", f.read(8))[0]; h = json.loads(f.read(n))
assert h["model.embed_tokens.weight"] == {**h["model.embed_tokens.weight"], "dtype": "BF16", "shape": [256, 32]}, h["model.embed_tokens.weight"]
assert len([k for k in h if k != "__metadata__"]) == 21
PY
echo "checkpoint_tool: export-hf ok"

# Bad input: one line, exit 2, nothing written.
expect() {
  local name=$1 pat=$2; shift 2
  set +e
  "$@" > /dev/null 2> "$work/err"
  local rc=$?
  set -e
  # Not the error: the OpenMP runtime's warning about a value it ignores
  # (a blank line and one line, printed as the library loads).
  grep -v -e "^libgomp: Invalid value" -e "^$" "$work/err" > "$work/err.only" || true
  mv "$work/err.only" "$work/err"
  [ $rc -eq 2 ] && [ "$(grep -c . "$work/err")" -eq 1 ] && grep -q -- "$pat" "$work/err" && [ ! -e "$work/out" ] ||
    fail "$name: rc $rc, $(cat "$work/err")"
  echo "ok   $name: $(cat "$work/err")"
}
mkdir "$work/empty"
expect "missing folder" "is not a checkpoint folder" "$tool" verify "$work/nope"
expect "no metadata.json" "has no metadata.json" "$tool" verify "$work/empty"
expect "neither checkpoint nor run" "not a run folder" "$tool" list "$work/empty"
expect "damaged source" "does not match its SHA-256" "$tool" consolidate "$work/damaged" "$work/out"
expect "output exists" "exists: give a new folder" "$tool" consolidate "$ck" "$work/empty"
expect "unknown dtype" "is not one of" "$tool" export-hf "$ck" "$work/out" --dtype int8
expect "export of a damaged file" "rank-00001.bin' does not match its SHA-256" "$tool" export-hf "$work/damaged" "$work/out"
expect "trailing slash on an existing output" "exists: give a new folder" "$tool" consolidate "$ck" "$work/empty/"
expect "not a checkpoint.bin" "bad magic" "$tool" convert "$ck/rank-00000.bin" "$work/out"
truncate -s 1000 "$work/damaged/rank-00000.bin"
expect "truncated file" "holds 1000 bytes; the metadata records" "$tool" list "$work/damaged"
ls -a "$work" | grep -q "tmp-" && fail "a temporary folder was left: $(ls -a "$work")"
echo "checkpoint_tool: all checks passed"
