#!/usr/bin/env bash
# Bad input to train_llama and tokenize ends with a one-line error naming the
# value and the limit, exit status 2, and no output left behind.
#   tests/train/cli_errors.sh build/host/examples/train_llama build/host/examples/tokenize
set -uo pipefail
train=${1:?}; tok=${2:?}
root=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
printf 'far too short' > "$work/short.txt"
fail=0
# expect <name> <pattern> <command...>: exit 2, one stderr line matching, no $work/out
expect() {
  local name=$1 pat=$2; shift 2
  "$@" > "$work/stdout" 2> "$work/stderr"
  local rc=$?
  # The notice of a BLAS core re-run (kernels::check_blas_core) is not the
  # error, nor the OpenMP runtime's own warning about a value it ignores
  # (a blank line and one line, printed as the library loads, before main).
  grep -v -e "^tessera: OpenBLAS chose core" -e "^libgomp: Invalid value" -e "^$" "$work/stderr" > "$work/stderr.err" || true
  mv "$work/stderr.err" "$work/stderr"
  local nl; nl=$(wc -l < "$work/stderr")
  if [ $rc -ne 2 ] || [ "$nl" -ne 1 ] || ! grep -q -- "$pat" "$work/stderr" || [ -e "$work/out" ] || [ -e "$work/out.tok" ]; then
    echo "FAIL $name: rc=$rc lines=$nl stderr: $(cat "$work/stderr")"; fail=1
    [ -e "$work/out" ] && echo "     left behind: $(find "$work/out" "$work/out.tok" 2>/dev/null | tr '\n' ' ')"
  else
    echo "ok   $name: $(cat "$work/stderr")"
  fi
  rm -rf "$work/out" "$work/out.tok"
}
common=(--out "$work/out" --no-baseline --sample-bytes 0 --steps 2)
expect "missing data" "does not exist" "$train" --data "$work/nope.txt" "${common[@]}"
expect "directory as data" "is a directory" "$train" --data "$work" "${common[@]}"
expect "corpus smaller than a window" "than one window of T+1" "$train" --data "$work/short.txt" "${common[@]}"
expect "heads do not divide dim" "n_heads=3 does not divide dim=128" "$train" --heads 3 "${common[@]}"
expect "nkv does not divide nh" "n_kv_heads=3 does not divide n_heads=4" "$train" --kv-heads 3 "${common[@]}"
expect "micro-batch of zero" "--micro-batch: Value 0 not in range 1 to 1000000000" "$train" --micro-batch 0 "${common[@]}"
expect "global batch of zero" "--global-batch: Value 0 not in range 1 to" "$train" --global-batch 0 "${common[@]}"
expect "G not divisible by B" "not divisible" "$train" --global-batch 12 --micro-batch 8 "${common[@]}"
expect "seq beyond max_seq" "max_seq" "$train" --seq 4096 "${common[@]}"
expect "unknown preset" "unknown preset" "$train" --preset huge "${common[@]}"
expect "unknown precision" "unknown precision" "$train" --precision fp4 "${common[@]}"
expect "bad flag" "error" "$train" --no-such-flag "${common[@]}"
expect "loss scale without fp16" "--loss-scale sets fp16's loss scale: it needs --precision fp16 (--precision bf16 trains without one)" "$train" --precision bf16 --loss-scale 128 "${common[@]}"
expect "hysteresis without fp16" "--hysteresis sets fp16's loss scale" "$train" --hysteresis 3 "${common[@]}"
expect "static and dynamic loss scale" "--loss-scale 128 is a static scale, which --initial-loss-scale does not move: give one" "$train" --precision fp16 --loss-scale 128 --initial-loss-scale 256 "${common[@]}"
expect "static loss scale with a window" "--loss-scale 128 is a static scale, which --loss-scale-window does not move: give one" "$train" --precision fp16 --loss-scale 128 --loss-scale-window 10 "${common[@]}"
expect "minimum above the initial loss scale" "minimum loss scale 1024 must be > 0 and at most the initial scale 256" "$train" --precision fp16 --initial-loss-scale 256 --min-loss-scale 1024 "${common[@]}"
expect "loss scale window of zero" "--loss-scale-window: Value 0 not in range" "$train" --precision fp16 --loss-scale-window 0 "${common[@]}"
expect "fp8 scaling without fp8" "--fp8-scaling sets the FP8 recipe: it needs --precision fp8 (--precision bf16 has no FP8 GEMMs)" "$train" --precision bf16 --fp8-scaling current "${common[@]}"
expect "fp8 margin without fp8" "--fp8-margin sets the FP8 recipe: it needs --precision fp8" "$train" --fp8-margin 1 "${common[@]}"
expect "unknown fp8 format" "unknown FP8 format 'e5m2' (valid: hybrid, e4m3)" "$train" --precision fp8 --fp8-format e5m2 "${common[@]}"
expect "unknown fp8 scaling" "unknown FP8 scaling 'static' (valid: delayed, current)" "$train" --precision fp8_mixed --fp8-scaling static "${common[@]}"
expect "tp does not split the query heads" "tp=3 must divide the query heads nh=4" "$train" --tp 3 "${common[@]}"
expect "tp neither divides nor is a multiple of nkv" "either divide the key/value heads nkv=4 or be a multiple of them" "$train" --dim 96 --heads 12 --kv-heads 4 --tp 6 "${common[@]}"
expect "sequence parallel without tp" "needs tp > 1 (tp=1)" "$train" --sequence-parallel "${common[@]}"
expect "sequence parallel, T not divisible by tp" "sequence length T=127 is not divisible by tp=2" "$train" --tp 2 --seq 127 --sequence-parallel "${common[@]}"
expect "tp does not split F" "F=385" "$train" --tp 2 --ffn 385 "${common[@]}"
expect "tp of zero" "tp=0" "$train" --tp 0 "${common[@]}"
expect "dp x tp over the rank limit" "= 4096 ranks exceeds the limit of 1024" "$train" --dp 64 --tp 64 "${common[@]}"
# Refused on the launching thread, before 512 rank threads start.
expect "pp of zero" "pp=0 must be in" "$train" --pp 0 "${common[@]}"
expect "unknown pipeline schedule" "unknown pipeline schedule 'pipedream'" "$train" --pp 2 --schedule pipedream "${common[@]}"
expect "more stages than layers" "more virtual stages (K V = 8 x 1 = 8) than layers (4)" "$train" --pp 8 --micro-batch 2 "${common[@]}"
expect "virtual stages without interleaving" "virtual stages V=2 need the interleaved schedule" "$train" --pp 2 --virtual-stages 2 --micro-batch 2 "${common[@]}"
expect "interleaved micro-batch count" "interleaved needs the micro-batch count M=3 to be a multiple of pp=2" "$train" --pp 2 --schedule interleaved --virtual-stages 2 --global-batch 12 --micro-batch 4 "${common[@]}"
expect "stage list of the wrong sum" "the listed stage sizes sum to 3 blocks, the model has 4" "$train" --pp 2 --stage-blocks 1,2 --micro-batch 2 "${common[@]}"
expect "dp x tp x pp over the rank limit" "= 2048 ranks exceeds the limit of 1024" "$train" --dp 32 --tp 2 --pp 32 "${common[@]}"
expect "cp of zero" "--cp 0 must be in \[1, 64\]" "$train" --cp 0 "${common[@]}"
expect "seq not divisible by 2 cp" "is not divisible by 2 x --cp = 6" "$train" --cp 3 "${common[@]}"
expect "cp kind without cp" "--cp-kind ulysses chooses how attention runs over the cp group: it needs --cp > 1" "$train" --cp-kind ulysses "${common[@]}"
expect "unknown cp kind" "unknown context-parallel kind 'zigzag': choose ring or ulysses" "$train" --cp 2 --cp-kind zigzag "${common[@]}"
expect "ulysses heads of a tp rank" "--cp-kind ulysses: cp=4 does not divide the query heads of a tp rank, nh/tp = 4/2 = 2" "$train" --cp 4 --tp 2 --cp-kind ulysses "${common[@]}"
expect "dp x cp x tp x pp over the rank limit" "dp=32 x cp=2 x tp=2 x pp=16 = 2048 ranks exceeds the limit of 1024" "$train" --dp 32 --cp 2 --tp 2 --pp 16 "${common[@]}"
expect "trace into a missing folder" "does not exist or is not writable" "$train" --trace "$work/nodir/t.json" "${common[@]}"
expect "trace step without a trace" "--trace-step 1 needs --trace FILE" "$train" --trace-step 1 "${common[@]}"
expect "a large mesh refused before its ranks start" "tp=64 must divide the query heads nh=4" timeout 20 "$train" --dp 8 --tp 64 "${common[@]}"
expect "bad batch for a large mesh" "is not divisible by micro-batch B=16 x dp=8" timeout 20 "$train" --dp 8 --tp 2 "${common[@]}"
expect "foreign checkpoint" "not a tessera checkpoint" bash -c "mkdir -p '$work/ck' && echo junk > '$work/ck/checkpoint.bin' && '$train' --resume '$work/ck' --out '$work/out' --no-baseline --sample-bytes 0 --steps 2"
# Numbers that do not fit: no silent wrap or rounding of a seed, no NaN or infinite rate.
expect "negative seed" "'-1' is not an integer in \[0, 18446744073709551615\]" "$train" --seed -1 "${common[@]}"
expect "seed of 2^64" "'18446744073709551616' is not an integer" "$train" --seed 18446744073709551616 "${common[@]}"
expect "seed in floating notation" "'1e23' is not an integer" "$train" --seed 1e23 "${common[@]}"
expect "weight decay nan" "'nan' is not a finite number" "$train" --weight-decay nan "${common[@]}"
expect "lr inf" "'inf' is not a finite number" "$train" --lr inf "${common[@]}"
mkdir -p "$work/gone"
expect "resume of a missing folder" "--resume '$work/nowhere': no such run folder" "$train" --resume "$work/nowhere" --dp 2 "${common[@]}"
expect "overwrite the folder resumed" "--overwrite replaces the checkpoints of --out '$work/gone', which --resume continues: give one" "$train" --resume "$work/gone" --overwrite --no-baseline --sample-bytes 0 --steps 2
expect "auto-resume with resume" "--auto-resume resumes --out when it holds a checkpoint: give it or --resume DIR, not both" "$train" --resume "$work/gone" --auto-resume "${common[@]}"
expect "sample-only without resume" "--sample-only samples from a checkpoint: it needs --resume DIR" "$train" --sample-only "${common[@]}"
expect "high-vocabulary data without a tokenizer" "has a vocabulary of 300 ids but no tokenizer.json beside it" bash -c "python3 -c \"import struct,sys; ids=list(range(300))*20; open(sys.argv[1],'wb').write(b'TSRATOK1'+struct.pack('<IIQQQ',1,1,len(ids),300,64)+bytes(24)+struct.pack('<%dH'%len(ids),*ids))\" '$work/v300.tok' && '$train' --data '$work/v300.tok' --out '$work/out' --no-baseline --steps 2 --seq 16 --micro-batch 2 --global-batch 2"
expect "missing --config file" "$work/none.toml" "$train" --config "$work/none.toml" "${common[@]}"
printf 'steps = "many"\n' > "$work/bad.toml"
expect "bad value in a --config file" "many" "$train" --config "$work/bad.toml" --out "$work/out" --no-baseline
# A temporary a killed save left behind is removed at the next start.
mkdir -p "$work/stale" && printf 'x' > "$work/stale/checkpoint.bin.tmp.99999999.1"
"$train" "${common[@]}" --out "$work/stale" --dim 32 --layers 1 --heads 4 --kv-heads 2 --ffn 64 --seq 16 --micro-batch 2 --global-batch 2 > /dev/null 2>&1
if [ -e "$work/stale/checkpoint.bin.tmp.99999999.1" ]; then echo "FAIL stale temporary kept"; fail=1; else echo "ok   stale temporary removed"; fi
if ! "$train" --version | grep -q "^train_llama (tessera) [0-9]*\.[0-9]*\.[0-9]*$"; then
  echo "FAIL --version: $("$train" --version)"; fail=1
fi
# Inputs that are not regular files, and token files with a damaged header.
expect "a device as data" "is not a regular file" "$train" --data /dev/zero "${common[@]}"
mkfifo "$work/fifo"
expect "a FIFO as data" "is not a regular file" timeout 20 "$train" --data "$work/fifo" "${common[@]}"
{ printf 'TSRBTOK1'; head -c 3000 "$root/data/fortunes.txt"; } > "$work/damaged.tok"
expect "a token file with a damaged magic (UTF-8 after it)" "is not a tessera token file" "$train" --data "$work/damaged.tok" "${common[@]}"
expect "unknown data format" "--data-format 'csv' is not one of auto, text, tokens" "$train" --data-format csv "${common[@]}"
python3 -c "import struct,sys; ids=[i % 100 for i in range(6000)]; open(sys.argv[1],'wb').write(b'TSRATOK1'+struct.pack('<IIQQQ',1,1,len(ids),100,64)+bytes(24)+struct.pack('<%dH'%len(ids),*ids))" "$work/v100.tok"
expect "a prompt byte outside the vocabulary" "--prompt byte 104 is outside the model's vocabulary of 100" "$train" --data "$work/v100.tok" --prompt "The " --sample-bytes 10 --out "$work/out" --no-baseline --steps 2 --seq 16 --micro-batch 2 --global-batch 2
expect "steps beyond the bound" "--steps: Value 99999999999999 not in range 1 to 1000000000000" "$train" --steps 99999999999999 --out "$work/out" --no-baseline
printf 'stepz = 5\n' > "$work/extra.toml"
expect "unknown key in a --config file" "stepz" "$train" --config "$work/extra.toml" "${common[@]}"
printf 'x' > "$work/hffile"
expect "--export-hf under a file" "is not a folder" "$train" --export-hf "$work/hffile/sub" "${common[@]}"
# Hugging Face folders: a fixture saved by transformers, damaged copies.
hf="$root/tests/python/fixtures/fp32"
expect "hf folder missing" "cannot read '$work/nohf/config.json'" "$train" --init-from-hf "$work/nohf" "${common[@]}"
expect "hf sizes overridden" "--dim cannot be given with --init-from-hf" "$train" --init-from-hf "$hf" --dim 64 "${common[@]}"
expect "hf tying overridden" "--tie-embeddings cannot be given with --init-from-hf" "$train" --init-from-hf "$hf" --tie-embeddings "${common[@]}"
mkdir -p "$work/hftied" && cp "$hf"/* "$work/hftied/" && sed -i 's/"tie_word_embeddings": false/"tie_word_embeddings": true/' "$work/hftied/config.json"
expect "hf tied with another lm_head" "the tensor 'lm_head.weight' differs from 'model.embed_tokens.weight'" "$train" --init-from-hf "$work/hftied" "${common[@]}"
mkdir -p "$work/hfbias" && cp "$hf"/* "$work/hfbias/" && sed -i 's/"attention_bias": false/"attention_bias": true/' "$work/hfbias/config.json"
expect "hf attention biases" "attention_bias=true: tessera's Llama has no attention biases" "$train" --init-from-hf "$work/hfbias" "${common[@]}"
mkdir -p "$work/hfnot" && cp "$hf/config.json" "$work/hfnot/" && printf 'x' > "$work/hfnot/pytorch_model.bin"
expect "hf pickle only" "safe_serialization=True" "$train" --init-from-hf "$work/hfnot" "${common[@]}"
expect "hf dtype unknown" "'int8' is not one of float32, bfloat16, float16, float64" "$train" --export-hf "$work/hfout" --hf-dtype int8 "${common[@]}"
expect "hf dtype without export" "--hf-dtype bfloat16 needs --export-hf DIR" "$train" --hf-dtype bfloat16 "${common[@]}"
printf 'x' > "$work/hffile"
expect "hf export onto a file" "--export-hf '$work/hffile' exists and is not a folder" "$train" --export-hf "$work/hffile" "${common[@]}"
expect "G not divisible by dp x B" "G=16 is not divisible by micro-batch B=2 x dp=3" "$train" --dp 3 --global-batch 16 --micro-batch 2 "${common[@]}"
expect "not a ZeRO stage" "zero 5 is not a ZeRO stage" "$train" --zero 5 "${common[@]}"
expect "dp of zero" "dp=0" "$train" --dp 0 "${common[@]}"
expect "sharded resume of a single-file checkpoint" "which the single-file checkpoint (.bin) of earlier versions cannot hold" "$train" --dp 2 --zero 1 --micro-batch 8 --resume "$work/ck" "${common[@]}"
expect "dim override of zero" "--dim: Value 0 not in range 1 to 1048576" "$train" --dim 0 "${common[@]}"
expect "lr not finite" "--lr: .inf. is not a finite number" "$train" --lr inf "${common[@]}"
expect "empty prompt" "prompt is empty" "$train" --prompt "" --sample-bytes 10 --out "$work/out" --no-baseline --steps 2
head -c 4096 /dev/urandom > "$work/random.bin"
expect "binary data that is no token file" "is not a tessera token file" "$train" --data "$work/random.bin" "${common[@]}"
cp "$work/random.bin" "$work/random.txt"
expect "binary data named as text" "is not UTF-8 text (invalid UTF-8 at byte" "$train" --data "$work/random.txt" "${common[@]}"
expect "tokenize: binary input" "not UTF-8" "$tok" "$work/random.bin" -o "$work/out.tok"
cp "$work/short.txt" "$work/same.txt"
expect "tokenize: output is the input" "is the input" "$tok" "$work/same.txt" -o "$work/same.txt"
# Sizes whose products pass 64 bits, and models that cannot be allocated:
# refused by name before any allocation (once: SIGFPE, SIGSEGV, a hang).
expect "batch sizes of 2^62 with dp 4" "--global-batch: Value 4611686018427387904 not in range" "$train" --data "$root/data/fortunes.txt" "${common[@]}" --global-batch 4611686018427387904 --micro-batch 4611686018427387904 --dp 4
expect "dim of 2^62" "--dim: Value 4611686018427387904 not in range 1 to 1048576" "$train" --data "$root/data/fortunes.txt" "${common[@]}" --dim 4611686018427387904
expect "ffn of 2^62" "--ffn: Value 4611686018427387904 not in range 1 to 16777216" "$train" --data "$root/data/fortunes.txt" "${common[@]}" --ffn 4611686018427387904
expect "a billion layers" "--layers: Value 1000000000 not in range 1 to 65536" timeout 20 "$train" --data "$root/data/fortunes.txt" "${common[@]}" --layers 1000000000
expect "bounded sizes whose state overflows 64 bits" "the model's training state (16 bytes per parameter) overflows 64 bits" timeout 20 "$train" --data "$root/data/fortunes.txt" "${common[@]}" --dim 1048576 --layers 65536 --ffn 16777216
expect "a model state larger than the machine" "the model state of this run needs [0-9]* GiB (.* parameters of --dim 65536 --layers 64 .* but the machine has [0-9]* GiB available" timeout 20 "$train" --data "$root/data/fortunes.txt" "${common[@]}" --dim 65536 --layers 64
# One step larger than the machine (a micro-batch of a billion sequences):
# refused by the planner before any allocation, not after minutes of it.
expect "a step larger than the machine" "one step of this run needs [0-9]* GiB (--micro-batch 1000000000 x --seq 128" timeout 20 "$train" --data "$root/data/fortunes.txt" "${common[@]}" --global-batch 1000000000 --micro-batch 1000000000
expect "a billion sequences per step" "= 62500000 micro-batches per step and rank exceed the limit of 1048576" timeout 20 "$train" "${common[@]}" --global-batch 1000000000
# An allocation that fails anyway (a process limit the planner does not
# see) names the settings.
expect "an allocation that fails names the settings" "out of memory.*--dim 1024 --layers 6 --ffn 4096" bash -c "ulimit -v 1200000; exec '$train' --data '$root/data/fortunes.txt' --out '$work/out' --no-baseline --sample-bytes 0 --steps 2 --preset small --dim 1024 --layers 6 --ffn 4096 --micro-batch 2 --global-batch 2 --seq 64"
# The OpenMP environment: refused before any parallel region (it hung,
# crashed libgomp, or ran many times slower without a word).
cpus=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)  # nproc honours both
expect "OMP_NUM_THREADS of 99999" "OMP_NUM_THREADS=99999 exceeds the $cpus CPUs this process may use" env OMP_NUM_THREADS=99999 "$train" "${common[@]}"
expect "more OpenMP threads than CPUs" "OMP_NUM_THREADS=$((cpus + 1)) exceeds the $cpus CPUs" env OMP_NUM_THREADS=$((cpus + 1)) "$train" "${common[@]}"
expect "OMP_DYNAMIC=true" "OMP_DYNAMIC is true" env OMP_DYNAMIC=true "$train" "${common[@]}"
expect "OMP_THREAD_LIMIT below OMP_NUM_THREADS" "OMP_NUM_THREADS=2 exceeds OMP_THREAD_LIMIT=1" env OMP_THREAD_LIMIT=1 OMP_NUM_THREADS=2 "$train" "${common[@]}"
expect "OMP_NUM_THREADS not a number" "OMP_NUM_THREADS='abc' is not a positive integer" env OMP_NUM_THREADS=abc "$train" "${common[@]}"
expect "OMP_NUM_THREADS of 0" "OMP_NUM_THREADS='0' is not a positive integer" env OMP_NUM_THREADS=0 "$train" "${common[@]}"
# Thread binding pins the first thread before main: the CPUs are the places'.
if ! env OMP_PROC_BIND=close OMP_NUM_THREADS=1 "$train" --preset tiny --steps 1 --seq 16 --global-batch 2 --micro-batch 2 --eval-every 0 --eval-windows 1 --out "$work/bind" --no-baseline --sample-bytes 0 > "$work/stdout" 2> "$work/stderr"; then
  echo "FAIL OMP_PROC_BIND=close refused: $(cat "$work/stderr")"; fail=1
else
  echo "ok   OMP_PROC_BIND=close runs"
fi
rm -rf "$work/bind"
# --trace may not overwrite what the run reads or writes.
expect "trace over the data" "which this run reads or writes" "$train" --data "$work/short.txt" --trace "$work/short.txt" "${common[@]}"
# Empty paths, control characters, options that do not apply.
for f in --out --data --resume --export-hf --trace --tokenizer; do
  expect "an empty $f" "$f is empty" "$train" "${common[@]}" "$f" ""
done
expect "a folder as --tokenizer" "--tokenizer '$work' is not a file" "$train" "${common[@]}" --tokenizer "$work"
expect "a newline in --prompt" "--prompt holds a control character (byte 1)" "$train" "${common[@]}" --prompt $'a\nb'
expect "a newline in --out" "--out holds a control character" "$train" "${common[@]}" --out "$work/a"$'\n'"b"
printf 'steps = 3\nseq = 16\nsteps = 5\n' > "$work/dup.toml"
expect "a key given twice in a --config file" "'steps' is given twice (lines 1 and 3)" "$train" --config "$work/dup.toml" "${common[@]}"
expect "--nesterov with adamw" "--nesterov sets SGD's momentum: it needs --optimizer sgd" "$train" "${common[@]}" --nesterov
# The optimizers: their names, and each one's hyper-parameters only with it.
expect "unknown optimizer" "unknown optimizer 'adagrad' (valid: adamw, sgd, lion, adafactor, muon)" "$train" "${common[@]}" --optimizer adagrad
expect "--lion-beta1 with adamw" "--lion-beta1 sets Lion's betas: it needs --optimizer lion" "$train" "${common[@]}" --lion-beta1 0.95
expect "--lion-beta2 with sgd" "--lion-beta2 sets Lion's betas: it needs --optimizer lion" "$train" "${common[@]}" --optimizer sgd --lion-beta2 0.98
expect "--momentum with lion" "--momentum sets SGD's momentum: it needs --optimizer sgd" "$train" "${common[@]}" --optimizer lion --momentum 0.5
expect "lion beta2 of 1" "beta2=1 must be in \[0, 1)" "$train" "${common[@]}" --optimizer lion --lion-beta2 1
expect "--adafactor-beta1 with adamw" "--adafactor-beta1 sets Adafactor's update: it needs --optimizer adafactor" "$train" "${common[@]}" --adafactor-beta1 0.9
expect "--adafactor-relative-step with lion" "--adafactor-relative-step sets Adafactor's update: it needs --optimizer adafactor" "$train" "${common[@]}" --optimizer lion --adafactor-relative-step
expect "--lion-beta1 with adafactor" "--lion-beta1 sets Lion's betas: it needs --optimizer lion" "$train" "${common[@]}" --optimizer adafactor --lion-beta1 0.9
expect "adafactor decay rate of 0" "decay_rate=0 must be in \[-1, 0)" "$train" "${common[@]}" --optimizer adafactor --adafactor-decay-rate 0
expect "adafactor warmup init without the relative step" "warmup_init shapes the relative step: it needs relative_step" "$train" "${common[@]}" --optimizer adafactor --adafactor-warmup-init
expect "--muon-momentum with adamw" "--muon-momentum sets Muon's update: it needs --optimizer muon" "$train" "${common[@]}" --muon-momentum 0.9
expect "--muon-adjust-lr with lion" "--muon-adjust-lr sets Muon's update: it needs --optimizer muon" "$train" "${common[@]}" --optimizer lion --muon-adjust-lr match_rms_adamw
expect "--muon-adamw-lr with adafactor" "--muon-adamw-lr sets Muon's update: it needs --optimizer muon" "$train" "${common[@]}" --optimizer adafactor --muon-adamw-lr 1e-3
expect "--muon-nesterov with sgd" "--muon-nesterov sets Muon's update: it needs --optimizer muon" "$train" "${common[@]}" --optimizer sgd --muon-nesterov false
expect "--muon-ns-steps with adamw" "--muon-ns-steps sets Muon's update: it needs --optimizer muon" "$train" "${common[@]}" --muon-ns-steps 3
expect "an unknown muon update scale" "unknown Muon update scale 'spectral' (valid: original, match_rms_adamw)" "$train" "${common[@]}" --optimizer muon --muon-adjust-lr spectral
expect "muon momentum of 1" "muon momentum=1 must be in \[0, 1)" "$train" "${common[@]}" --optimizer muon --muon-momentum 1
expect "--schedule without --pp" "--schedule gpipe orders a pipeline's stages: it needs --pp > 1" "$train" "${common[@]}" --schedule gpipe
expect "a negative --baseline" "--baseline -1 must be > 0" "$train" "${common[@]}" --baseline -1
# The learning-rate schedule: its names, wsd's flags only with wsd, the
# limits of each schedule, and a resume under another schedule.
expect "unknown lr schedule" "unknown lr schedule 'step' (valid: cosine, wsd, linear, constant, inverse_sqrt)" "$train" "${common[@]}" --lr-schedule step
expect "--wsd-decay-fraction without wsd" "--wsd-decay-fraction shapes wsd's decay: it needs --lr-schedule wsd (--lr-schedule cosine has none)" "$train" "${common[@]}" --wsd-decay-fraction 0.2
expect "--wsd-cooldown without wsd" "--wsd-cooldown shapes wsd's decay: it needs --lr-schedule wsd (--lr-schedule linear has none)" "$train" "${common[@]}" --lr-schedule linear --wsd-cooldown sqrt
expect "unknown wsd cooldown" "unknown WSD cooldown 'cosine' (valid: linear, sqrt)" "$train" "${common[@]}" --lr-schedule wsd --wsd-cooldown cosine
expect "wsd decay fraction above 1" "--wsd-decay-fraction 1.5 must be in (0, 1]" "$train" "${common[@]}" --lr-schedule wsd --wsd-decay-fraction 1.5
expect "--min-lr-ratio with constant" "--min-lr-ratio sets the lr that cosine, linear and wsd decay to: --lr-schedule constant never reaches it" "$train" "${common[@]}" --lr-schedule constant --min-lr-ratio 0.2
expect "wsd decay inside the warmup" "wsd's decay of 5 steps (decay_fraction=0.5 of total=10) would start at step 5, inside the warmup of 9 steps" "$train" --out "$work/out" --no-baseline --sample-bytes 0 --steps 10 --warmup 9 --lr-schedule wsd --wsd-decay-fraction 0.5
expect "inverse_sqrt without warmup" "inverse_sqrt decays as max_lr sqrt(warmup / (step + 1)): it needs warmup >= 1 (warmup=0)" "$train" "${common[@]}" --lr-schedule inverse_sqrt --warmup 0
"$train" --out "$work/wsd" --no-baseline --sample-bytes 0 --steps 2 --preset tiny --seq 16 --micro-batch 2 --global-batch 2 --eval-windows 1 --lr-schedule wsd > /dev/null 2>&1
expect "a resume under another schedule" 'schedule={"cooldown":"linear","decay_fraction":0.1,"min_lr_ratio":0.1,"name":"wsd"} in the checkpoint, {"min_lr_ratio":0.1,"name":"cosine"} in this run' "$train" --resume "$work/wsd" --lr-schedule cosine --steps 3
expect "--document-separator without the mask" "--document-separator names the separator of packed documents: it needs --document-mask" "$train" "${common[@]}" --document-separator 10
expect "a separator the data never holds" "document separator id 3 does not occur in the first" "$train" "${common[@]}" --document-mask
expect "document separator outside the vocabulary" "document separator id 300 is outside the vocabulary \[0, 256)" "$train" "${common[@]}" --document-mask --document-separator 300
"$train" --out "$work/docs" --no-baseline --sample-bytes 0 --steps 2 --preset tiny --seq 16 --micro-batch 2 --global-batch 2 --eval-windows 1 --document-mask --document-separator 37 > /dev/null 2>&1
expect "a resume under another document separator" 'document_separator=37 in the checkpoint, 10 in this run' "$train" --resume "$work/docs" --document-separator 10 --steps 3
expect "a negative --trace-step" "--trace-step: Value -1 not in range" "$train" "${common[@]}" --trace-step -1
# Subword token files (Hugging Face tokenizers): each decodes through its
# own <name>.tokenizer.json, also beside another tokenizer's files in one
# folder; a prompt that starts with '-' is a prompt; one that is not UTF-8
# is refused naming it.
if python3 -c "import tokenizers" 2> /dev/null; then
  mkdir -p "$work/tk"
  head -c 200000 "$root/data/fortunes.txt" > "$work/tk/a.txt"
  tail -c 200000 "$root/data/fortunes.txt" > "$work/tk/b.txt"
  python3 "$root/scripts/tokenizer.py" train "$work/tk/a.txt" --vocab 300 --out "$work/tk/A" > /dev/null
  python3 "$root/scripts/tokenizer.py" train "$work/tk/b.txt" --vocab 280 --out "$work/tk/B" > /dev/null
  python3 "$root/scripts/tokenizer.py" encode "$work/tk/b.txt" --tokenizer "$work/tk/B/tokenizer.json" --out "$work/tk/A/b.tok" > /dev/null
  small=(--out "$work/tkrun" --no-baseline --steps 2 --seq 16 --micro-batch 2 --global-batch 2 --sample-bytes 8)
  if "$train" --data "$work/tk/A/b.tok" "${small[@]}" --prompt "-x" > "$work/tk.out" 2>&1 &&
     grep -q "tokenizer $work/tk/A/b.tokenizer.json" "$work/tk.out" && grep -q -- "---- sample" "$work/tk.out"; then
    echo "ok   a token file's own tokenizer in a shared folder, a prompt starting with '-'"
  else
    echo "FAIL a token file's own tokenizer, a prompt starting with '-': $(cat "$work/tk.out")"; fail=1
  fi
  expect "a prompt that is not UTF-8, through a tokenizer" "--prompt: the text to encode is not UTF-8" "$train" --data "$work/tk/A/b.tok" "${common[@]}" --seq 16 --micro-batch 2 --global-batch 2 --sample-bytes 8 --prompt $'\xff'
else
  echo "skip subword token files: Hugging Face tokenizers is not installed"
fi
# --sample-only reads a checkpoint and writes nothing: a folder others may
# only read works (as root, run as nobody), and is left as it was.
"$train" --out "$work/ro" --no-baseline --sample-bytes 0 --steps 2 --preset tiny --seq 16 --micro-batch 2 --global-batch 2 > /dev/null 2>&1
before=$(ls -l --time-style=full-iso "$work/ro")
chmod -R a+rX "$work" && chmod 555 "$work/ro"
as=()
# (nobody must reach the binary: a clone under a private folder, as a
# mktemp -d one, is run as root instead, which still checks nothing is written)
if [ "$(id -u)" = 0 ] && command -v runuser > /dev/null && runuser -u nobody -- test -x "$train"; then
  as=(runuser -u nobody --)
fi
if "${as[@]}" env HOME=/tmp "$train" --resume "$work/ro" --sample-only --sample-bytes 8 > "$work/so.out" 2>&1 &&
   grep -q -- "---- sample" "$work/so.out" && [ "$before" = "$(ls -l --time-style=full-iso "$work/ro")" ]; then
  echo "ok   --sample-only from a read-only folder"
else
  echo "FAIL --sample-only from a read-only folder: $(cat "$work/so.out")"; fail=1
fi
chmod 755 "$work/ro"
# A damaged metrics.jsonl in a resume folder: the file and the line named.
"$train" --data "$root/data/fortunes.txt" --out "$work/mres" --no-baseline --sample-bytes 0 --steps 2 --preset small --dim 32 --layers 1 --heads 4 --kv-heads 2 --ffn 64 --seq 32 > /dev/null 2>&1
printf '{"step": "two"}\n{"step": 3}\n' >> "$work/mres/metrics.jsonl"
expect "a damaged metrics.jsonl in the resume folder" "metrics file '$work/mres/metrics.jsonl' line [0-9]*" "$train" --resume "$work/mres" --steps 4
expect "tokenize: missing input" "" "$tok" "$work/nope.txt" -o "$work/out.tok"
expect "tokenize: empty input" "empty" bash -c ": > '$work/empty.txt'; '$tok' '$work/empty.txt' -o '$work/out.tok'"
exit $fail
