#!/usr/bin/env bash
# The Python helpers, where their Debian packages are installed (exit 77 = skipped):
#   plot     scripts/plot.py (python3-matplotlib): loss curve and attention heatmap PNGs
#   pytorch  scripts/bench_pytorch.py --quick (python3-torch): the comparison script runs,
#            and the nanoGPT recipe's loss curves agree over 20 steps
# usage: test_optional_python.sh plot|pytorch path/to/tinylm source-dir scratch-dir
set -u
what=$1 tinylm=$2 src=$3 work=$4
rm -rf "$work" && mkdir -p "$work" && cd "$work" || exit 1
if [ "$what" = plot ]; then
  /usr/bin/python3 -c "import matplotlib" 2>/dev/null || { echo "SKIPPED: python3-matplotlib is not installed"; exit 77; }
  "$tinylm" train --steps-per-epoch 20 --log-every 5 --out-dir run > train.log 2>&1 || { cat train.log; exit 1; }
  "$src/scripts/plot.py" loss run/metrics.jsonl -o loss.png || exit 1
  "$src/scripts/plot.py" attention run --prompt "4 4 4 4" --tinylm "$tinylm" -o attention.png || exit 1
  for f in loss.png attention.png; do
    head -c 8 "$f" | od -An -tx1 | grep -q "89 50 4e 47" || { echo "FAIL: $f is not a PNG"; exit 1; }
  done
  "$src/scripts/plot.py" loss nowhere.jsonl -o x.png 2> err.txt && { echo "FAIL: a missing file was accepted"; exit 1; }
  grep -q "cannot read nowhere.jsonl" err.txt || { echo "FAIL: unclear error: $(cat err.txt)"; exit 1; }
  echo "ok: loss.png and attention.png written; a missing metrics file is refused"
else
  /usr/bin/python3 -c "import importlib.util as u, sys; sys.exit(u.find_spec('torch') is None)" 2>/dev/null ||
    { echo "SKIPPED: python3-torch is not installed"; exit 77; }
  # --curve: nanoGPT's recipe from the same weights on the same batches in both; 20 steps
  # agree step by step to 1e-4 nats (the arithmetic's rounding; measured: about 1e-6).
  out=$("$src/scripts/bench_pytorch.py" --quick --rounds 1 --tinylm-threads 1 --tinylm "$tinylm" \
        --curve 20 --curve-tolerance 1e-4) || { echo "$out"; exit 1; }
  echo "$out"
  for case in p1 p2 nanogpt; do
    grep -q "\"${case}_ratio\", \"metric\": \"median_tinylm_over_pytorch\"" <<<"$out" ||
      { echo "FAIL: no $case ratio printed"; exit 1; }
  done
  [ "$(grep -c '"nanogpt_curve", "metric": "loss"' <<<"$out")" = 20 ] || { echo "FAIL: not 20 curve steps"; exit 1; }
  # bfloat16 (where the build and the CPU have bfloat16 products): the three ratios of each
  # case, and the curve in bfloat16 within the 20-step tolerance (no step-by-step one).
  if "$tinylm" --version | grep -q 'bfloat16: oneDNN' && grep -qwE 'avx512_bf16|amx_bf16' /proc/cpuinfo; then
    out=$("$src/scripts/bench_pytorch.py" --quick --rounds 1 --tinylm-threads 1 --tinylm "$tinylm" --bf16 \
          --cases p2,gpt2 --curve 20) || { echo "$out"; exit 1; }
    for case in p2 gpt2; do
      for ratio in "${case}_ratio\", \"metric\": \"median_tinylm_over_pytorch" \
                   "${case}_bf16_ratio\", \"metric\": \"median_tinylm_bf16_over_pytorch_best" \
                   "${case}_bf16_over_float32\", \"metric\": \"median_tinylm_bf16_over_tinylm_float32" \
                   "${case}_bf16_ceiling\", \"metric\": \"median_pytorch_best_mfu" \
                   "${case}_bf16_ceiling\", \"metric\": \"median_most_possible_lead" \
                   "${case}_bf16_ceiling\", \"metric\": \"median_most_lead_on_tinylm_products"; do
        grep -qF "\"$ratio\"" <<<"$out" || { echo "$out"; echo "FAIL: no $ratio printed"; exit 1; }
      done
    done
    # The ceiling: PyTorch's model FLOP/s over the bfloat16 peak, and the lead its inverse.
    /usr/bin/python3 - "$out" <<'PY' || exit 1
import json, sys
rec = {(r["case"], r["metric"]): r for r in map(json.loads, sys.argv[1].splitlines()) if "metric" in r}
for case in ("p2", "gpt2"):
    used = rec[case + "_bf16_ceiling", "pytorch_best_mfu"]
    lead = rec[case + "_bf16_ceiling", "most_possible_lead"]["value"]
    # The model's FLOPs per token and the peak as the bfloat16 bench printed them (one round,
    # one thread count: the last of each line is that run's).
    per_token = rec[case + "_bf16", "model_gflops"]["value"] / rec[case + "_bf16", "train_tokens_per_s"]["value"]
    peak = rec["peak_bf16_onednn", "matmul_gflops"]["value"]
    want = used["pytorch"] * per_token / peak
    if not (used["value"] > 0 and abs(used["value"] - want) < 1e-3 * want and abs(lead * used["value"] - 1) < 1e-5):
        sys.exit(f"FAIL: {case}'s ceiling: {used}, lead {lead}")
    # The lead on tinylm's own products: PyTorch's time per token over the products' time
    # per token, from the bench's products_ms (per step of batch x seq tokens).
    alone = rec[case + "_bf16", "products_ms"]
    per_token = alone["value"] / 1e3 / (alone["config"]["batch"] * alone["config"]["seq"])
    bound = rec[case + "_bf16_ceiling", "most_lead_on_tinylm_products"]
    want = 1 / (bound["pytorch"] * per_token)
    if not (alone["value"] > 0 and abs(bound["value"] - want) < 1e-3 * want):
        sys.exit(f"FAIL: {case}'s lead on tinylm's products: {bound}, products {alone}")
    # The same products' time inside the timed steps: some, and less than a step (the mean
    # over the steps against the step's median, which with --quick's two steps is the slower).
    inside = rec[case + "_bf16", "products_in_step_ms"]["value"]
    step_ms = 1e3 * alone["config"]["batch"] * alone["config"]["seq"] / rec[case + "_bf16", "train_tokens_per_s"]["value"]
    if not 0 < inside < step_ms:
        sys.exit(f"FAIL: {case}'s products took {inside} ms inside a step of {step_ms} ms")
PY
    grep -q '"largest_window_mean_difference".*"tinylm": "bfloat16 products"' <<<"$out" ||
      { echo "FAIL: the bfloat16 curve was not compared"; exit 1; }
  fi
  "$src/scripts/bench_pytorch.py" --cases p9 --tinylm "$tinylm" 2> err.txt && { echo "FAIL: an unknown case ran"; exit 1; }
  grep -q "unknown case" err.txt || { echo "FAIL: unclear error: $(cat err.txt)"; exit 1; }
fi
