#!/usr/bin/env bash
# tinylm <-> nanoGPT (tests/python/nanogpt_parity.py: a GPT in nanoGPT's structure):
#  - export: a model trained by tinylm (exact GELU), exported, loads into GPT with
#    strict=True and gives the same logits within 1e-5;
#  - import: a GPT saved by Python as nanoGPT's train.py saves it (an OrderedDict state
#    dict with or without torch.compile's prefix, optimizer state, model_args, config;
#    bias True and False) and as a bare state dict, imported, gives GPT's logits in
#    tinylm within 1e-5; tinylm eval and train --resume accept the import;
#  - bad and hostile files (pickle code, stride-0 views, short storages, broken pickles
#    and zips) end with one line and write nothing; the pickle's code never runs.
# Needs Debian's python3-torch (exit 77 = skipped where absent).
# usage: test_nanogpt.sh TINYLM TINYLM_TESTS SOURCE_DIR WORK_DIR
set -u
tinylm=$1 tests=$2 src=$3 work=$4
# (Found without importing it: each start of PyTorch costs a second or two.)
/usr/bin/python3 -c "import importlib.util as u, sys; sys.exit(u.find_spec('torch') is None)" 2>/dev/null ||
  { echo "SKIPPED: python3-torch is not installed"; exit 77; }
rm -rf "$work" && mkdir -p "$work" && cd "$work" || exit 1
"$tinylm" train --model transformer --activation gelu --n-layers 2 --d-model 32 --n-heads 4 \
  --task copy --epochs 1 --steps-per-epoch 40 --out-dir run > train.log 2>&1 || { tail -3 train.log; exit 1; }
"$tinylm" export run --out model.pt > export.log 2>&1 || { cat export.log; exit 1; }
TINYLM_EXPORT_CKPT=run TINYLM_LOGITS_OUT=logits.pt "$tests" "[nanogpt-logits]" > logits.log 2>&1 ||
  { cat logits.log; exit 1; }
py="$src/tests/python/nanogpt_parity.py"
compare=(model.pt logits.pt)  # pairs GPT compares in one Python run, once all are written
# The default MLP (tanh GELU) exports with a note.
"$tinylm" train --model transformer --task copy --epochs 1 --steps-per-epoch 5 --out-dir tanh > /dev/null 2>&1 || exit 1
"$tinylm" export tanh --out tanh.pt > tanh.log 2>&1 || { cat tanh.log; exit 1; }
grep -q "note: its MLP uses tanh-approximated GELU" tanh.log || { echo "FAIL: no note for tanh GELU"; cat tanh.log; exit 1; }
echo "ok   the default (tanh GELU) model exports with a note"

# ---- import ---------------------------------------------------------------------------
/usr/bin/python3 "$py" make gpt.pt plain.pt:no-prefix nobias.pt:no-bias bare.pt:bare || exit 1
# nanoGPT's train.py file as it is: an OrderedDict state dict (with torch.compile's
# prefix, or without), optimizer state, model_args, config, best_val_loss as a tensor.
"$tinylm" import gpt.pt --out imported.ckpt > import.log 2>&1 || { cat import.log; exit 1; }
grep -q "stripped torch.compile's '_orig_mod.' prefix" import.log || { echo "FAIL: no note on the prefix"; cat import.log; exit 1; }
grep -q "its optimizer state is not imported" import.log || { echo "FAIL: no note on the optimizer state"; cat import.log; exit 1; }
echo "ok   nanoGPT's train.py ckpt.pt (OrderedDict, _orig_mod., optimizer state, config) imports"
for name in plain nobias; do
  "$tinylm" import $name.pt --out $name.ckpt > $name.log 2>&1 || { cat $name.log; exit 1; }
  TINYLM_EXPORT_CKPT=$name.ckpt TINYLM_LOGITS_OUT=$name-logits.pt "$tests" "[nanogpt-logits]" > $name-l.log 2>&1 ||
    { cat $name-l.log; exit 1; }
  compare+=($name-model.pt $name-logits.pt)
done
# A bias=False import goes back to nanoGPT's layout unchanged (no LayerNorm biases).
"$tinylm" export nobias.ckpt --out nobias-export.pt > nobias-export.log 2>&1 || { cat nobias-export.log; exit 1; }
compare+=(nobias-export.pt nobias-logits.pt)
"$tinylm" import bare-ordered.pt --n-heads 4 --out ordered.ckpt > ordered.log 2>&1 || { cat ordered.log; exit 1; }
echo "ok   a bare OrderedDict state dict imports"
TINYLM_EXPORT_CKPT=imported.ckpt TINYLM_LOGITS_OUT=imported-logits.pt "$tests" "[nanogpt-logits]" > il.log 2>&1 ||
  { cat il.log; exit 1; }
compare+=(gpt-model.pt imported-logits.pt)
/usr/bin/python3 "$py" compare "${compare[@]}" || exit 1
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
# Fine-tuning an import: its whole context is the sequence length, any optimizer may be
# chosen (it stored none), and the epoch's mean covers the steps trained here only.
"$tinylm" inspect imported.ckpt > inspect.log 2>&1 || { cat inspect.log; exit 1; }
grep -q "seq-len = 16" inspect.log || { echo "FAIL: the import's sequence length is not its context (16)"; grep seq-len inspect.log; exit 1; }
grep -q 'optimizer = "adamw"' inspect.log || { echo "FAIL: the import's optimizer is not nanoGPT's AdamW"; exit 1; }
grep -q "none stored (an import without --tokenizer" inspect.log || { echo "FAIL: inspect's tokenizer line"; grep tokenizer inspect.log; exit 1; }
"$tinylm" train --resume imported.ckpt --optimizer adam --epochs 1 --steps-per-epoch 260 --log-every 1 \
  --out-dir resumed > resume.log 2>&1 || { tail -3 resume.log; exit 1; }
grep -q "no optimizer state (an import): the optimizer starts fresh" resume.log || { echo "FAIL: no fresh-optimizer warning"; exit 1; }
/usr/bin/python3 - resumed/metrics.jsonl <<'PY' || exit 1
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
steps = [r["loss"] for r in rows if r["type"] == "train"]
epoch = [r for r in rows if r["type"] == "epoch"][0]
mean = sum(steps) / len(steps)
assert len(steps) == 10 and epoch["steps"] == 10, (len(steps), epoch)
assert abs(epoch["loss"] - mean) < 1e-6 * max(1, mean), (epoch["loss"], mean)
print(f"ok   the epoch's mean after an import covers its 10 steps: {epoch['loss']:.6f}")
PY
echo "ok   tinylm eval and train --resume --optimizer adam (step 250 -> 260) accept the import"

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

import io, os, zipfile
# Files built to attack the reader, each from a real torch.save file.
class Evil:
    def __reduce__(self):
        return (os.system, ("touch pwned",))
torch.save({"model": {"x": Evil()}}, "evil.pt")
# A view with stride 0: one stored float claiming 100,000 x 1,000 of them.
torch.save({"model": {"transformer.wte.weight": torch.zeros(1).expand(100000, 1000)}}, "stride0.pt")
def rewrite(src, dst, change):
    entries = [(i, zipfile.ZipFile(src).read(i.filename)) for i in zipfile.ZipFile(src).infolist()]
    with zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as z:
        for info, data in entries:
            z.writestr(info.filename, change(info.filename, data))
# A storage record shorter than the tensor it holds (its entry cut by 16 bytes).
rewrite("gpt-model.pt", "short.pt", lambda n, d: d[:-16] if n.endswith("/data/0") else d)
# Pickles that break an unpickler: a value taken from an empty stack, a memo never set.
rewrite("gpt-model.pt", "stack.pt", lambda n, d: b"\x80\x02a." if n.endswith("data.pkl") else d)
rewrite("gpt-model.pt", "memo.pt", lambda n, d: b"\x80\x02h\x07." if n.endswith("data.pkl") else d)
rewrite("gpt-model.pt", "cut.pt", lambda n, d: d[: len(d) // 2] if n.endswith("data.pkl") else d)
# Compressed entries (torch.save stores them as they are).
with zipfile.ZipFile("deflated.pt", "w", zipfile.ZIP_DEFLATED) as z:
    for i in zipfile.ZipFile("gpt-model.pt").infolist():
        z.writestr(i.filename, zipfile.ZipFile("gpt-model.pt").read(i.filename))
# The zip's end record gone.
data = open("gpt-model.pt", "rb").read()
open("noend.pt", "wb").write(data[:-22])
PY
refused "pickle code" "names the Python global 'posix.system', which tinylm never runs" import evil.pt --out evil.ckpt
[ -e pwned ] && { echo "FAIL: the pickle's code ran"; failures=$((failures + 1)); }
refused "stride-0 view" "describes a tensor reaching past its storage" import stride0.pt --out s0.ckpt
refused "short storage" "entry has" import short.pt --out short.ckpt
refused "empty stack" "takes a value from an empty stack" import stack.pt --out st.ckpt
refused "bad memo" "recalls a value it never stored" import memo.pt --out mm.ckpt
refused "cut pickle" "is cut short" import cut.pt --out cut.ckpt
refused "compressed entries" "is compressed; torch.save and LibTorch store it uncompressed" import deflated.pt --out z.ckpt
refused "no end record" "has no end record" import noend.pt --out ne.ckpt
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
for f in evil s0 short st mm cut z ne; do [ -e "$f.ckpt" ] && { echo "FAIL: $f.ckpt was written"; failures=$((failures + 1)); }; done
for f in m e s a b l t d tiny; do [ -e "$f.ckpt" ] || [ -e "$f.pt" ] && { echo "FAIL: $f was written"; failures=$((failures + 1)); }; done
[ "$failures" -eq 0 ] || { echo "$failures failure(s)"; exit 1; }
echo "all nanoGPT interop checks passed"
