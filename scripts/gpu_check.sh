#!/usr/bin/env bash
# Everything in nanomt that needs a GPU, in one command: under 10 minutes on one H100.
#
#   scripts/gpu_check.sh RESULTS_DIR [--data DIR] [--minutes N]
#   scripts/gpu_check.sh --smoke RESULTS_DIR --data DIR    # the same steps on a CPU, tiny and short (a test)
#
# 1. the CUDA tests (pytest -m cuda: bf16 and fp16 training, the fp16 resume, decoding against the CPU, compile,
#    packed batches equal to padded ones through the varlen kernel);
# 2. benchmarks.gpu_step: the base model's training step at ~25k target tokens (WMT news lengths, token-budget
#    batches): padded, packed, chunked loss, compiled, pageable copies, fp32, and Hugging Face Marian; tokens/s,
#    MFU, peak memory;
# 3. the Multi30k recipe's config trained for --minutes (default 3) on the GPU, then test2016 at beam 5;
# 4. benchmarks.gpu_decode: greedy and beam 4 beside Hugging Face `generate`, fp32 and bf16;
# 5. scripts.gpu_check_summary: RESULTS_DIR/gpu_check.json, the figures of all four with the commit.
# RESULTS_DIR holds 6 files; the run directory goes to a temporary one. --data holds Multi30k's files
# (train, val, test2016 .de/.en; default ../shared/data/multi30k). Needs only a CUDA PyTorch with transformers,
# sentencepiece, safetensors, sacrebleu, pyyaml and pytest: nanomt runs from this checkout (PYTHONPATH), nothing is
# installed. A failed step does not stop the others; the exit status says whether every step passed.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1

die() { echo "gpu_check: $*" >&2; exit 2; }

smoke=0 results="" data="$ROOT/../shared/data/multi30k" minutes=3
while [ $# -gt 0 ]; do
  case "$1" in
    --smoke) smoke=1 ;;
    --data) [ $# -ge 2 ] || die "--data needs a directory"; data="$2"; shift ;;
    --minutes) [ $# -ge 2 ] || die "--minutes needs a number"; minutes="$2"; shift ;;
    -h|--help) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) die "unknown option $1 (see --help)" ;;
    *) [ -z "$results" ] || die "one RESULTS_DIR, got '$results' and '$1'"; results="$1" ;;
  esac
  shift
done
[ -n "$results" ] || die "usage: scripts/gpu_check.sh RESULTS_DIR [--data DIR] [--minutes N] [--smoke]"
for f in train val test2016; do
  for lang in de en; do
    [ -f "$data/$f.$lang" ] || die "--data $data: no $f.$lang (Multi30k's train, val, test2016 .de/.en)"
  done
done
case "$minutes" in ''|*[!0-9.]*) die "--minutes $minutes: want a number of minutes" ;; esac

if [ "$smoke" = 1 ]; then
  device=cpu
  tiny=(--tiny)
  bench=(--steps 2 --warmup 1 --rounds 1 --batches 2)
  decode=(--reps 1 --warmup 0)
  # The recipe's config at a toy size: the same commands, seconds instead of minutes.
  train_sets=(data.vocab_size=150 model.d_model=32 model.n_heads=2 model.n_encoder_layers=1
    model.n_decoder_layers=1 model.d_ff=64 train.max_steps=12 train.eval_every=6 train.save_every=6
    train.log_every=3 train.max_tokens=400 train.valid_bleu_sentences=20 train.precision=fp32)
else
  "$PYTHON" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" \
    || die "PyTorch ($PYTHON) sees no CUDA GPU; --smoke runs the same steps on a CPU"
  device=cuda
  tiny=() bench=() decode=() train_sets=()
fi

mkdir -p "$results" || die "cannot create $results"
results="$(cd "$results" && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
failed=() timings=()
step() {  # step NAME COMMAND...: run it, time it, remember a failure
  local name="$1" start=$SECONDS
  shift
  echo "== $name: $*"
  "$@" || { failed+=("$name"); echo "== $name FAILED"; }
  timings+=("$name=$((SECONDS - start))")
}

cd "$ROOT" || die "cannot enter $ROOT"
step cuda_tests "$PYTHON" -m pytest -m cuda -p no:cacheprovider -q -rs \
  --junitxml="$results/cuda_tests.xml" tests/test_cuda.py

step gpu_step "$PYTHON" -m benchmarks.gpu_step --device "$device" "${tiny[@]}" "${bench[@]}" \
  --out "$results/gpu_step.json"

sets=()
for pair in train:train valid:val test:test2016; do
  split="${pair%%:*}" name="${pair##*:}"
  sets+=(--set "data.$split.src=$data/$name.de" --set "data.$split.tgt=$data/$name.en")
done
for s in "${train_sets[@]}"; do sets+=(--set "$s"); done
run="$work/multi30k"
train_and_log() {
  "$PYTHON" -m nanomt.cli train configs/multi30k_de_en.yaml --run-dir "$run" "${sets[@]}" \
    --set train.device="$device" --set train.max_minutes="$minutes" --set train.progress=false \
    2>&1 | tee "$results/multi30k_train.log"
}
step multi30k_train train_and_log
sed -i "s#$work/##g; s#$ROOT/##g" "$results/multi30k_train.log"  # results name no path of this machine
cp "$run/metrics.jsonl" "$results/multi30k_metrics.jsonl" 2>/dev/null
evaluate() {
  "$PYTHON" -m nanomt.cli evaluate "$run" --src "$data/test2016.de" --ref "$data/test2016.en" --beam 5 \
    --device "$device" --json > "$work/test2016.json"
}
step multi30k_test2016 evaluate

step gpu_decode "$PYTHON" -m benchmarks.gpu_decode --device "$device" "${tiny[@]}" "${decode[@]}" \
  --out "$results/gpu_decode.json"

"$PYTHON" -m scripts.gpu_check_summary "$results" --test2016 "$work/test2016.json" --minutes "$minutes" \
  --failed "${failed[@]}" --seconds "${timings[@]}" || failed+=(summary)
if [ ${#failed[@]} -gt 0 ]; then
  echo "gpu_check: failed: ${failed[*]} (results in $results)" >&2
  exit 1
fi
echo "gpu_check: every step passed; results in $results"
