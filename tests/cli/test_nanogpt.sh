#!/usr/bin/env bash
# tinylm <-> nanoGPT (tests/python/nanogpt_parity.py: a GPT in nanoGPT's structure):
#  - export: a model trained by tinylm (exact GELU), exported, loads into GPT with
#    strict=True and gives the same logits within 1e-5;
#  - import: a GPT saved by Python as nanoGPT saves it (torch.compile's prefix, optimizer
#    state, model_args) and as a bare state dict, imported, gives GPT's logits in tinylm
#    within 1e-5; tinylm eval and train --resume accept the import;
#  - bad files end with one line and write nothing.
# Needs Debian's python3-torch (exit 77 = skipped where absent).
# usage: test_nanogpt.sh TINYLM TINYLM_TESTS SOURCE_DIR WORK_DIR
set -u
tinylm=$1 tests=$2 src=$3 work=$4
/usr/bin/python3 -c "import torch" 2>/dev/null || { echo "SKIPPED: python3-torch is not installed"; exit 77; }
rm -rf "$work" && mkdir -p "$work" && cd "$work" || exit 1
"$tinylm" train --model transformer --activation gelu --n-layers 2 --d-model 32 --n-heads 4 \
  --task copy --epochs 1 --steps-per-epoch 40 --out-dir run > train.log 2>&1 || { tail -3 train.log; exit 1; }
"$tinylm" export run --out model.pt > export.log 2>&1 || { cat export.log; exit 1; }
TINYLM_EXPORT_CKPT=run TINYLM_LOGITS_OUT=logits.pt "$tests" "[nanogpt-logits]" > logits.log 2>&1 ||
  { cat logits.log; exit 1; }
py="$src/tests/python/nanogpt_parity.py"
/usr/bin/python3 "$py" compare model.pt logits.pt || exit 1
# The default MLP (tanh GELU) exports with a note.
"$tinylm" train --model transformer --task copy --epochs 1 --steps-per-epoch 5 --out-dir tanh > /dev/null 2>&1 || exit 1
"$tinylm" export tanh --out tanh.pt > tanh.log 2>&1 || { cat tanh.log; exit 1; }
grep -q "note: its MLP uses tanh-approximated GELU" tanh.log || { echo "FAIL: no note for tanh GELU"; cat tanh.log; exit 1; }
echo "ok   the default (tanh GELU) model exports with a note"

# ---- import ---------------------------------------------------------------------------
/usr/bin/python3 "$py" make gpt.pt || exit 1
/usr/bin/python3 "$py" make bare.pt --bare || exit 1
# LibTorch 2.1+ reads nanoGPT's whole ckpt.pt; an older one refuses it (its unpickler has
# no APPEND, which the optimizer state needs), saying how to save the model alone.
if "$tinylm" import gpt.pt --out imported.ckpt > import.log 2>&1; then
  echo "ok   nanoGPT's whole ckpt.pt (with optimizer state) imports"
else
  grep -q "^error: 'gpt.pt' holds a pickle this LibTorch cannot read .*save plain dicts of tensors" import.log ||
    { echo "FAIL: import of the whole ckpt.pt"; cat import.log; exit 1; }
  echo "ok   this LibTorch cannot read the optimizer state, and says how to save the model alone"
  "$tinylm" import gpt-model.pt --out imported.ckpt > import.log 2>&1 || { cat import.log; exit 1; }
fi
if "$tinylm" import bare-ordered.pt --n-heads 4 --out ordered.ckpt > ordered.log 2>&1; then
  echo "ok   a bare OrderedDict state dict imports"
else
  grep -q "holds a pickle this LibTorch cannot read .*save plain dicts of tensors" ordered.log ||
    { echo "FAIL: import of an OrderedDict state dict"; cat ordered.log; exit 1; }
  echo "ok   this LibTorch cannot read an OrderedDict, and says how to save a plain dict"
fi
grep -q "stripped torch.compile's '_orig_mod.' prefix" import.log || { echo "FAIL: no note on the prefix"; cat import.log; exit 1; }
TINYLM_EXPORT_CKPT=imported.ckpt TINYLM_LOGITS_OUT=imported-logits.pt "$tests" "[nanogpt-logits]" > il.log 2>&1 ||
  { cat il.log; exit 1; }
/usr/bin/python3 "$py" compare gpt-model.pt imported-logits.pt || exit 1
"$tinylm" import bare.pt --out bare.ckpt --n-heads 4 > bare.log 2>&1 || { cat bare.log; exit 1; }
TINYLM_EXPORT_CKPT=bare.ckpt TINYLM_LOGITS_OUT=bare-logits.pt "$tests" "[nanogpt-logits]" > bl.log 2>&1 || { cat bl.log; exit 1; }
/usr/bin/python3 - <<'PY' || exit 1
import torch
a, b = torch.load("imported-logits.pt")["logits"], torch.load("bare-logits.pt")["logits"]
assert torch.equal(a, b), "the bare state dict imports differently"
print("ok   the bare state dict imports to the same logits")
PY
"$tinylm" eval imported.ckpt --batches 2 > eval.log 2>&1 || { cat eval.log; exit 1; }
grep -q "^loss " eval.log || { echo "FAIL: eval of the import printed no loss"; exit 1; }
"$tinylm" train --resume imported.ckpt --epochs 1 --steps-per-epoch 260 --out-dir resumed > resume.log 2>&1 ||
  { tail -3 resume.log; exit 1; }
grep -q "no optimizer state (an import): the optimizer starts fresh" resume.log || { echo "FAIL: no fresh-optimizer warning"; exit 1; }
echo "ok   tinylm eval and train --resume (step 250 -> 260) accept the import"

# ---- bad files: one line, non-zero, nothing written -----------------------------------
failures=0
refused() {  # refused NAME EXPECTED args...
  local name="$1" expected="$2"; shift 2
  local out status
  out="$("$tinylm" "$@" 2>&1)"; status=$?
  if [ "$status" -eq 0 ] || ! grep -qF -- "$expected" <<<"$out" || [ "$(grep -c . <<<"$out")" -ne 1 ]; then
    echo "FAIL $name (status $status): $out"; failures=$((failures + 1)); return
  fi
  echo "ok   $name: $out"
}
/usr/bin/python3 - <<'PY'
import torch
ck = torch.load("gpt-model.pt")
sd = ck["model"]
missing = dict(sd); del missing["_orig_mod.transformer.h.1.mlp.c_fc.weight"]
torch.save({"model": missing, "model_args": ck["model_args"]}, "missing.pt")
extra = dict(sd); extra["_orig_mod.transformer.h.9.ln_1.scale"] = torch.ones(3)
torch.save({"model": extra, "model_args": ck["model_args"]}, "extra.pt")
shape = dict(sd); shape["_orig_mod.transformer.h.0.attn.c_proj.weight"] = torch.ones(32, 31)
torch.save({"model": shape, "model_args": ck["model_args"]}, "shape.pt")
args = dict(ck["model_args"]); args["n_layer"] = 3
torch.save({"model": sd, "model_args": args}, "args.pt")
torch.save([1, 2, 3], "list.pt")
PY
echo "not a pickle" > text.pt
refused "missing key" "has no 'transformer.h.1.mlp.c_fc.weight'" import missing.pt --out m.ckpt
refused "extra key" "has 'transformer.h.9.ln_1.scale', which nanoGPT's GPT with these model args does not have" import extra.pt --out e.ckpt
refused "shape mismatch" "'transformer.h.0.attn.c_proj.weight' has shape [32, 31]" import shape.pt --out s.ckpt
refused "model_args disagree" "model_args says n_layer=3 but the weights imply 2" import args.pt --out a.ckpt
refused "bare without heads" "does not say its number of heads" import bare.pt --out b.ckpt
refused "not a dict" "not a dict" import list.pt --out l.ckpt
refused "not a torch file" "is not a file Python's torch.save wrote (not its zip format" import text.pt --out t.ckpt
refused "not a regular file" "not a regular file" import /dev/null --out d.ckpt
refused "existing output" "already exists" import gpt-model.pt --out imported.ckpt
refused "export of the tiny model" "cannot export" export "$src/tests/fixtures/v3-tiny-adam-step12.ckpt" --out tiny.pt
for f in m e s a b l t d tiny; do [ -e "$f.ckpt" ] || [ -e "$f.pt" ] && { echo "FAIL: $f was written"; failures=$((failures + 1)); }; done
[ "$failures" -eq 0 ] || { echo "$failures failure(s)"; exit 1; }
echo "all nanoGPT interop checks passed"
