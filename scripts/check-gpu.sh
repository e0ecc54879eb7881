#!/usr/bin/env bash
# The GPU check, for a machine with an NVIDIA GPU and PyTorch 2.x (with CUDA) in its
# python3; CI machines have no GPU, so this is run by hand where one is lent. It builds
# tinylm against PyTorch's own LibTorch (torch.utils.cmake_prefix_path) and prints one
# JSON line per check on standard output:
#   build       tinylm, its CUDA tests and its tool, against that LibTorch
#   cuda_tests  tests/cuda: device moves, CPU/CUDA agreement, training, generation, SDPA
#   sdpa        SDPA against the step-by-step path on the GPU (float32 and bfloat16)
#   reference   the reference run with --device cuda: epoch means and 100% accuracy
#   bf16        a transformer run with --bf16 (autocast) on the copy task, to 99% accuracy
#   p2          P2 (4 blocks, d 256, 8 heads, T 128, batch 16, AdamW) in tokens/s: tinylm
#               against PyTorch eager, same GPU, same model, both in float32
#   bf16_generate  sample --bf16 against float32 on the GPU (scripts/bench_bf16_generate.py)
#               for the reference and P2 checkpoints: tokens/s, and the reference's greedy
#               text the same as float32's
# and exits non-zero when a check fails. Where no GPU is visible it stops at once, with
# one line saying so.
#
# The machine has no internet and need not have Debian's packages: the header-only
# dependencies (spdlog and fmt, nlohmann/json, toml++, CLI11, Catch2 v2, Gloo's headers;
# spdlog is Debian 13's, fetched from Debian's archive) travel with the tree in .deps/
# (ignored by git), made on a Debian 12 machine with
#   scripts/check-gpu.sh --stage
# SentencePiece is left out there (byte-level tokenizers only), and libxsmm where absent.
#   scripts/check-gpu.sh [--jobs N]     run the checks (build in build/gpu); with
#                                       CHECK_GPU_JSONL=FILE, the lines go to FILE too
set -uo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
deps=$repo/.deps

if [ "${1:-}" = --stage ]; then
  # Copies of Debian's headers (apt-get install libspdlog-dev libfmt-dev nlohmann-json3-dev
  # libtomlplusplus-dev libcli11-dev catch2 libgloo-dev on Debian 12).
  rm -rf "$deps"
  mkdir -p "$deps/include"
  for d in spdlog fmt nlohmann toml++ CLI catch2 gloo; do
    [ -d "/usr/include/$d" ] || { echo "check-gpu --stage: /usr/include/$d is missing (Debian 12's packages: see this script)" >&2; exit 1; }
    cp -r "/usr/include/$d" "$deps/include/"
  done
  [ -f "$deps/include/catch2/catch.hpp" ] || { echo "check-gpu --stage: Catch2 v2's catch2/catch.hpp is missing (stage on Debian 12)" >&2; exit 1; }
  # spdlog from Debian 13 (1.15): Debian 12's 1.10 compiles only with fmt 9, and PyTorch's
  # wheels bring their own fmt (12 in 2.11), which then wins (see the build below). The
  # package comes from Debian's archive, the one place this machine reaches.
  apt_dir=$(mktemp -d)
  mkdir -p "$apt_dir/lists/partial" "$apt_dir/cache/archives/partial" "$apt_dir/deb"
  echo "deb http://deb.debian.org/debian trixie main" > "$apt_dir/sources.list"
  apt_opts=(-o "Dir::Etc::SourceList=$apt_dir/sources.list" -o Dir::Etc::SourceParts=/dev/null
            -o "Dir::State::Lists=$apt_dir/lists" -o "Dir::Cache=$apt_dir/cache" -o Debug::NoLocking=1)
  if ! apt-get "${apt_opts[@]}" -qq update > "$apt_dir/log" 2>&1 ||
     ! (cd "$apt_dir/deb" && apt-get "${apt_opts[@]}" -qq download libspdlog-dev >> "$apt_dir/log" 2>&1) ||
     ! dpkg-deb -x "$apt_dir"/deb/libspdlog-dev_*.deb "$apt_dir/x" ||
     [ ! -f "$apt_dir/x/usr/include/spdlog/spdlog.h" ]; then
    echo "check-gpu --stage: could not fetch Debian 13's libspdlog-dev: $(tail -n 1 "$apt_dir/log")" >&2
    rm -rf "$apt_dir"; exit 1
  fi
  rm -rf "$deps/include/spdlog"
  cp -r "$apt_dir/x/usr/include/spdlog" "$deps/include/"
  rm -rf "$apt_dir"
  echo "check-gpu: staged $(du -sh "$deps" | cut -f1) of headers in $deps"
  exit 0
fi
jobs=$(nproc)
[ "${1:-}" = --jobs ] && jobs=${2:?--jobs needs a number}

# ---- a GPU, or one line and stop ---------------------------------------------------------
if ! command -v nvidia-smi > /dev/null 2>&1; then
  echo "check-gpu: no NVIDIA GPU is visible here (no nvidia-smi): run it on a machine with one" >&2
  exit 1
fi
if ! gpus=$(nvidia-smi -L 2> /dev/null) || ! grep -q "^GPU " <<< "$gpus"; then
  echo "check-gpu: no NVIDIA GPU is visible here (nvidia-smi lists none): run it on a machine with one" >&2
  exit 1
fi

failures=0
json() { echo "$1"; }  # one JSON line per check
fail_json() {          # fail_json CHECK MESSAGE
  failures=$((failures + 1))
  python3 -c 'import json, sys; print(json.dumps({"check": sys.argv[1], "ok": False, "error": sys.argv[2]}))' "$1" "$2"
}
work=$repo/build/gpu-work
rm -rf "$work"
mkdir -p "$work"
# CHECK_GPU_JSONL=FILE: each JSON line also goes to FILE as it is printed (a device run's
# output folder keeps what a cut-off run had done).
[ -n "${CHECK_GPU_JSONL:-}" ] && exec > >(tee "$CHECK_GPU_JSONL")

# ---- PyTorch and its LibTorch ------------------------------------------------------------
if ! info=$(python3 - <<'PY' 2> "$work/torch.err"
import json, torch, torch.utils
assert int(torch.__version__.split(".")[0]) >= 2, f"PyTorch {torch.__version__} is older than 2"
assert torch.cuda.is_available(), "torch.cuda.is_available() is False"
print(json.dumps({"torch": torch.__version__, "cuda": torch.version.cuda, "prefix": torch.utils.cmake_prefix_path,
                  "gpu": torch.cuda.get_device_name(0), "cxx11_abi": int(torch._C._GLIBCXX_USE_CXX11_ABI)}))
PY
); then
  echo "check-gpu: python3 has no usable PyTorch 2.x with CUDA: $(tail -n 1 "$work/torch.err")" >&2
  exit 1
fi
prefix=$(python3 -c 'import json, sys; print(json.loads(sys.argv[1])["prefix"])' "$info")
json "{\"check\": \"machine\", \"ok\": true, \"info\": $info, \"gpus\": $(nvidia-smi -L | grep -c '^GPU ')}"

# ---- build -------------------------------------------------------------------------------
[ -d "$deps/include" ] || { fail_json build "no .deps/include: stage the header-only dependencies with scripts/check-gpu.sh --stage on a Debian 12 machine, and bring .deps/ along"; exit 1; }
# PyTorch's own fmt, where its include folder has one, wins over the staged copy.
torch_include=$(python3 -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "include"))')
overlay=$work/deps
mkdir -p "$overlay/include"
for d in "$deps"/include/*; do
  [ "$(basename "$d")" = fmt ] && [ -d "$torch_include/fmt" ] && continue
  ln -s "$d" "$overlay/include/$(basename "$d")"
done
generator=()
command -v ninja > /dev/null && generator=(-G Ninja)
start=$(date +%s)
if cmake -S . -B build/gpu "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$prefix" \
     -DTINYLM_DEPS_DIR="$overlay" -DTINYLM_SENTENCEPIECE=AUTO -DTINYLM_LIBXSMM=AUTO > "$work/configure.log" 2>&1 &&
   cmake --build build/gpu -j "$jobs" --target tinylm_cli tinylm_cuda_tests > "$work/build.log" 2>&1; then
  summary=$(sed -n 's/^-- tinylm: //p' "$work/configure.log")
  python3 -c 'import json, sys; print(json.dumps({"check": "build", "ok": True, "seconds": int(sys.argv[1]), "summary": sys.argv[2]}))' \
    "$(( $(date +%s) - start ))" "$summary"
else
  fail_json build "$(grep -m1 -E 'error|Error' "$work/configure.log" "$work/build.log" | cut -c1-400)"
  exit 1
fi
tinylm=$repo/build/gpu/tinylm

# ---- tests/cuda, and SDPA on the GPU -------------------------------------------------------
for spec in cuda_tests:"" sdpa:"[sdpa]"; do
  name=${spec%%:*} filter=${spec#*:}
  if out=$(build/gpu/tests/tinylm_cuda_tests $filter 2>&1) && grep -q "All tests passed" <<< "$out"; then
    python3 -c 'import json, sys; print(json.dumps({"check": sys.argv[1], "ok": True, "result": sys.argv[2]}))' \
      "$name" "$(grep "All tests passed" <<< "$out")"
  else
    fail_json "$name" "$(tail -n 20 <<< "$out" | tr '\n' ' ' | cut -c1-600)"
  fi
done

# ---- the reference run on the GPU ----------------------------------------------------------
if "$tinylm" train --device cuda --out-dir "$work/reference" > "$work/reference.log" 2>&1 &&
   grep -q "accuracy 100.00%" "$work/reference.log"; then
  python3 - "$work/reference.log" <<'PY'
import json, re, sys
text = open(sys.argv[1]).read()
means = [float(m) for m in re.findall(r"epoch \d+/\d+: mean loss ([0-9.]+)", text)]
final = re.search(r"final: .*", text).group(0)
print(json.dumps({"check": "reference", "ok": True, "epoch_means": means, "final": final}))
PY
else
  fail_json reference "$(tail -n 3 "$work/reference.log" | tr '\n' ' ')"
fi

# ---- generation with bfloat16 products (sample --bf16) against float32, on the GPU ------
# The reference checkpoint's greedy text must be float32's; P2's (below) is reported.
gen_check() {  # gen_check CHECKPOINT...
  if out=$(python3 scripts/bench_bf16_generate.py --tinylm "$tinylm" --device cuda --rounds 2 "$@" 2> "$work/generate.err"); then
    python3 - "$out" <<'PY'
import json, sys
records = [json.loads(l) for l in sys.argv[1].splitlines() if l.startswith("{")]
ratios = [r for r in records if r.get("metric") == "over_float32"]
ok = bool(ratios) and ratios[0].get("same_greedy_text") is True
print(json.dumps({"check": "bf16_generate", "ok": ok, "records": records}))
sys.exit(0 if ok else 1)
PY
    [ $? -eq 0 ] || failures=$((failures + 1))
  else
    fail_json bf16_generate "$(tail -n 3 "$work/generate.err" | tr '\n' ' ')"
  fi
}

# ---- a bf16 transformer run ----------------------------------------------------------------
if "$tinylm" train --config configs/copy.toml --device cuda --bf16 --out-dir "$work/bf16" > "$work/bf16.log" 2>&1; then
  python3 - "$work/bf16/metrics.jsonl" <<'PY'
import json, sys
evals = [r for r in map(json.loads, open(sys.argv[1])) if r.get("type") == "eval"]
last = evals[-1] if evals else {}
ok = last.get("accuracy", 0) >= 0.99
print(json.dumps({"check": "bf16", "ok": ok, "validation": last}))
sys.exit(0 if ok else 1)
PY
  [ $? -eq 0 ] || failures=$((failures + 1))
else
  fail_json bf16 "$(tail -n 3 "$work/bf16.log" | tr '\n' ' ')"
fi

# ---- P2 tokens/s: tinylm against PyTorch eager on the same GPU -----------------------------
p2=(--model transformer --n-layers 4 --d-model 256 --n-heads 8 --seq-len 128 --vocab-size 256
    --batch-size 16 --task copy --optimizer adamw --weight-decay 0.1 --device cuda
    --epochs 1 --steps-per-epoch 400 --log-every 10 --eval-every 400 --eval-batches 1)
if "$tinylm" train "${p2[@]}" --out-dir "$work/p2" > "$work/p2.log" 2>&1; then
  python3 - "$work/p2/metrics.jsonl" "$repo/scripts" <<'PY' || failures=$((failures + 1))
import json, statistics, sys, time
import torch
import torch.nn.functional as F
sys.path.insert(0, sys.argv[2])
import bench_pytorch as bp  # the same P2 model bench_pytorch.py times on the CPU
rates = [r["tokens_per_s"] for r in map(json.loads, open(sys.argv[1])) if r.get("type") == "train"]
tinylm = statistics.median(rates[len(rates) // 2:])
torch.manual_seed(42)
dev = torch.device("cuda")
model = bp.TransformerLM(layers=4, ctx=128).to(dev)
decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and not n.startswith(("emb", "pos"))]
other = [p for n, p in model.named_parameters() if not (p.dim() >= 2 and not n.startswith(("emb", "pos")))]
opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": other, "weight_decay": 0.0}], lr=1e-3)
def step():
    ids = torch.randint(256, (16, 129), device=dev)
    loss = F.cross_entropy(model(ids[:, :-1]).reshape(-1, 256), ids[:, 1:].reshape(-1))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    loss.item()  # one synchronisation per step, as tinylm's loss logging does
for _ in range(20):
    step()
times = []
for _ in range(5):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(40):
        step()
    times.append((time.perf_counter() - t0) / 40)
pytorch = 16 * 128 / statistics.median(times)
print(json.dumps({"check": "p2", "ok": True, "device": torch.cuda.get_device_name(0),
                  "tinylm_tokens_per_s": round(tinylm), "pytorch_eager_tokens_per_s": round(pytorch),
                  "tinylm_over_pytorch": round(tinylm / pytorch, 3)}))
PY
else
  fail_json p2 "$(tail -n 3 "$work/p2.log" | tr '\n' ' ')"
fi

p2_checkpoint=$(ls "$work"/p2/best.ckpt "$work"/p2/step-*.ckpt 2> /dev/null | head -n 1)
if [ -f "$work/reference/best.ckpt" ] && [ -n "$p2_checkpoint" ]; then
  gen_check "$work/reference/best.ckpt" "$p2_checkpoint"
else
  fail_json bf16_generate "no reference or P2 checkpoint to sample (see the checks above)"
fi

[ "$failures" -eq 0 ] || { echo "check-gpu: $failures check(s) failed (logs in $work)" >&2; exit 1; }
echo "check-gpu: every check passed (logs in $work)" >&2
