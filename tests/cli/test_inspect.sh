#!/usr/bin/env bash
# tinylm inspect: what a checkpoint holds, as text and as JSON, checked against the
# fixtures (formats 1 to 3; format 1 also after `tinylm upgrade`); --verify rebuilds the
# model; bad files (damaged format-1 files given to upgrade too) end with one line.
# usage: test_inspect.sh path/to/tinylm fixtures-dir scratch-dir
set -u
tinylm=$1; fixtures=$2; work=$3
rm -rf "$work" && mkdir -p "$work" && cd "$work" || exit 1
failures=0
fail() { echo "FAIL $*"; failures=$((failures + 1)); }

refused() {  # refused NAME EXPECTED args...: one line naming the problem, non-zero
  local name="$1" expected="$2"; shift 2
  local out status
  out="$("$tinylm" inspect "$@" 2>&1)"; status=$?
  if [ "$status" -eq 0 ]; then fail "$name: exited 0"; return; fi
  if ! grep -qF -- "$expected" <<<"$out"; then fail "$name: no '$expected' in: $out"; return; fi
  if [ "$(grep -c . <<<"$out")" -ne 1 ]; then fail "$name: not one line: $out"; return; fi
  echo "ok   $name: $out"
}
for ck in "$fixtures"/v*-step12.ckpt; do
  name=$(basename "$ck")
  if [ "${name#v1-}" != "$name" ]; then
    # Format 1 (a LibTorch archive, read by tinylm's own reader) is inspected as it is,
    # then upgraded, and the copy inspected in its place.
    "$tinylm" inspect "$ck" --verify > "v1-$name.txt" 2>&1 || fail "inspect $name: status $?: $(cat "v1-$name.txt")"
    grep -q "^checkpoint .*, format 1 (tinylm 0.1.0), checksum ok$" "v1-$name.txt" || fail "inspect $name: $(head -1 "v1-$name.txt")"
    "$tinylm" upgrade "$ck" --out "up-$name" > "up-$name.txt" 2>&1 || { fail "upgrade $name: status $?"; cat "up-$name.txt"; continue; }
    grep -q "^upgraded .* (format 1, step 12) to up-$name (format 3)$" "up-$name.txt" || fail "upgrade $name: $(cat "up-$name.txt")"
    out=$("$tinylm" upgrade "$ck" --out "up-$name" 2>&1) && fail "upgrade over an existing file exited 0"
    grep -q "already exists: tinylm never overwrites" <<<"$out" || fail "upgrade over an existing file: $out"
    ck="up-$name"
  fi
  "$tinylm" inspect "$ck" --verify > "$name.txt" 2>&1 || { fail "$name: status $?"; cat "$name.txt"; continue; }
  grep -q "^step 12 | world size 1" "$name.txt" || fail "$name: no step line"
  grep -q "^verify: model rebuilt from its architecture, .* weights fit, .*: ok$" "$name.txt" || fail "$name: not verified"
  "$tinylm" inspect "$ck" --json > "$name.json" 2>&1 || { fail "$name --json: status $?"; continue; }
  /usr/bin/python3 - "$name.json" "$name.txt" "$name" <<'PY' || failures=$((failures + 1))
import json, sys
d = json.load(open(sys.argv[1]))
text = open(sys.argv[2]).read()
problems = []
if d["step"] != 12: problems.append(f"step {d['step']}")
if d["checksum"] != "ok": problems.append("checksum")
counts = sum(p["count"] for p in d["parameters"])
if counts != d["parameter_count"]: problems.append(f"counts {counts} != total {d['parameter_count']}")
for p in d["parameters"]:
    n = 1
    for s in p["shape"]: n *= s
    if n != p["count"]: problems.append(f"{p['name']}: shape {p['shape']} but count {p['count']}")
    if not (p["norm"] >= 0): problems.append(f"{p['name']}: norm {p['norm']}")
    if p["name"] not in text: problems.append(f"{p['name']} missing from the text")
total = f"{d['parameter_count']:,}"
if total not in text: problems.append(f"total {total} not in the text")
kind = "tiny" if "tiny" in sys.argv[3] else "transformer"
if d["model"]["kind"] != kind: problems.append(f"kind {d['model']['kind']}")
print(("FAIL " if problems else "ok   ") + f"{sys.argv[3]}: {len(d['parameters'])} parameters, {total} values, format {d['format_version']}" + (": " + "; ".join(problems) if problems else ""))
sys.exit(1 if problems else 0)
PY
done

good="$fixtures/v3-transformer-adamw-step12.ckpt"
size=$(stat -c %s "$good")
head -c $((size / 2)) "$good" > truncated.ckpt
cp "$good" corrupt.ckpt
printf '\x55' | dd of=corrupt.ckpt bs=1 seek=$((size - 100)) conv=notrunc status=none
echo "not a checkpoint" > text.ckpt
mkdir -p empty-run
refused "truncated" "is truncated" truncated.ckpt
refused "corrupt" "is corrupt: its checksum does not match" corrupt.ckpt
refused "not a checkpoint" "is not a tinylm checkpoint" text.ckpt
refused "no checkpoint in a directory" "holds no step-*.ckpt checkpoint" empty-run
# Export refuses them as inspect does, in one line, and writes nothing.
for bad in "truncated:is truncated" "corrupt:is corrupt: its checksum does not match" "text:is not a tinylm checkpoint"; do
  for format in pytorch onnx web; do
    out=$("$tinylm" export "${bad%%:*}.ckpt" --format "$format" --out "bad-${bad%%:*}-$format" 2>&1) &&
      fail "export --format $format of ${bad%%:*}.ckpt exited 0"
    grep -qF -- "${bad#*:}" <<<"$out" && [ "$(grep -c . <<<"$out")" -eq 1 ] ||
      fail "export --format $format of ${bad%%:*}.ckpt: $out"
    [ -e "bad-${bad%%:*}-$format" ] && fail "export --format $format of ${bad%%:*}.ckpt wrote bad-${bad%%:*}-$format"
  done
done
echo "ok   export (pytorch, onnx, web) refuses a truncated, corrupt or foreign file as inspect does"

# Strings from the file (its version, option names and values) never reach the terminal
# as escape sequences.
/usr/bin/python3 - "$good" escape.ckpt <<'PY'
import json, struct, sys, zlib
b = open(sys.argv[1], "rb").read()
payload = b[32:]
n = struct.unpack("<Q", payload[:8])[0]
index, data = json.loads(payload[8:8 + n]), payload[8 + n:]
meta = index["__metadata__"]
meta["tinylm_version"] = "\x1b]0;title\x07\x1b[31mred"
model = json.loads(meta["model"])
model["options"]["\x1b[2Jkey"] = "\x1b[5mvalue"
meta["model"] = json.dumps(model)
j = json.dumps(index).encode()
j += b" " * ((8 - len(j) % 8) % 8)
p = struct.pack("<Q", len(j)) + j + data
h = bytearray(b[:32])
h[16:24] = struct.pack("<Q", len(p))
h[24:28] = struct.pack("<I", zlib.crc32(p) & 0xFFFFFFFF)
open(sys.argv[2], "wb").write(bytes(h) + p)
PY
"$tinylm" inspect escape.ckpt --verify > escape.txt 2>&1 || fail "escape: status $?"
if grep -q $'\x1b' escape.txt; then fail "escape: an escape sequence reached the terminal"
elif ! grep -qF 'tinylm \x1B]0;title\x07\x1B[31mred' escape.txt || ! grep -qF '\x1B[2Jkey=\x1B[5mvalue' escape.txt; then
  fail "escape: the strings are not shown escaped: $(head -3 escape.txt)"
else echo "ok   escape sequences in a file's strings are printed escaped"; fi
# A damaged format-1 file (checksums recomputed, so tinylm's own checks must catch it):
# `upgrade` ends with one line and writes nothing.
/usr/bin/python3 - "$fixtures/v1-tiny-adam-step12.ckpt" <<'PY'
import struct, sys, zlib
good = open(sys.argv[1], "rb").read()
def damaged(out, entry, edit, keep_crc=False):
    p = bytearray(good[32:])
    eocd = len(p) - 22
    count, at = struct.unpack_from("<H", p, eocd + 10)[0], struct.unpack_from("<I", p, eocd + 16)[0]
    for _ in range(count):
        n, x, c = struct.unpack_from("<HHH", p, at + 28)
        if p[at + 46:at + 46 + n].decode() == entry:
            size, local = struct.unpack_from("<I", p, at + 24)[0], struct.unpack_from("<I", p, at + 42)[0]
            data = local + 30 + sum(struct.unpack_from("<HH", p, local + 26))
            body = bytearray(p[data:data + size])
            edit(body)
            p[data:data + size] = body
            if not keep_crc:
                struct.pack_into("<I", p, at + 16, zlib.crc32(body))
                struct.pack_into("<I", p, local + 14, zlib.crc32(body))
            break
        at += 46 + n + x + c
    h = bytearray(good[:32])
    h[16:24] = struct.pack("<Q", len(p))
    h[24:28] = struct.pack("<I", zlib.crc32(p))
    open(out, "wb").write(bytes(h) + p)
def short(b):  # lm_head.bias (the storage's last 64 floats) made 65 long
    at = b.find(b"(K@t", b.find(b"model.lm_head.bias"))
    b[at + 2] = ord("A")
def opcode(b):
    b[b.find(b"\x89")] = ord("I")
def flip(b):
    b[100] ^= 1
damaged("v1-short-storage.ckpt", "archive/data.pkl", short)
damaged("v1-opcode.ckpt", "archive/data.pkl", opcode)
damaged("v1-bad-crc.ckpt", "archive/data/2", flip, keep_crc=True)
PY
for bad in v1-short-storage:"reaching past its storage '2'" v1-opcode:"uses opcode 0x49" \
           v1-bad-crc:"the checksum of 'archive/data/2' does not match"; do
  file=${bad%%:*}.ckpt expected=${bad#*:}
  before=$(ls | sort)
  out=$("$tinylm" upgrade "$file" --out "up-$file" 2>&1); status=$?
  after=$(ls | sort)
  if [ "$status" -eq 0 ]; then fail "upgrade $file: exited 0"
  elif ! grep -qF -- "$expected" <<<"$out"; then fail "upgrade $file: no '$expected' in: $out"
  elif [ "$(grep -c . <<<"$out")" -ne 1 ]; then fail "upgrade $file: not one line: $out"
  elif [ "$before" != "$after" ]; then fail "upgrade $file: wrote $(comm -13 <(echo "$before") <(echo "$after"))"
  else echo "ok   upgrade $file: nothing written: $out"; fi
done

# Today's architectures through the whole command line: trained, checkpointed, inspected
# (options and parameter shapes), evaluated, sampled with the KV cache, refused by export.
"$tinylm" train --model transformer --positions rotary --norm rms-norm --no-layer-norm-bias --no-bias \
  --activation swiglu --mlp-hidden 40 --n-kv-heads 2 --d-model 32 --n-heads 4 --n-layers 2 --task copy \
  --epochs 1 --steps-per-epoch 20 --out-dir llama > llama.txt 2>&1 || fail "llama-style train: $(tail -2 llama.txt)"
"$tinylm" inspect llama/best.ckpt --verify > llama-inspect.txt 2>&1 || fail "llama-style inspect: $(tail -2 llama-inspect.txt)"
for want in "activation=swiglu" "n_kv_heads=2" "norm=rms-norm" "positions=rotary" "mlp_hidden=40" ": ok"; do
  grep -qF -- "$want" llama-inspect.txt || fail "llama-style inspect: no '$want'"
done
# q (32) and two key/value heads of 8 for keys and values; SwiGLU's gate and up (2 x 40).
for want in 'blocks\.0\.attn\.qkv_proj\.weight +\[64, 32\]' 'blocks\.1\.mlp\.fc\.weight +\[80, 32\]'; do
  grep -qE -- "$want" llama-inspect.txt || fail "llama-style inspect: no '$want'"
done
"$tinylm" eval llama/best.ckpt --batches 2 > llama-eval.txt 2>&1 || fail "llama-style eval: $(tail -2 llama-eval.txt)"
"$tinylm" sample llama/best.ckpt --prompt "1 2 3" --max-new-tokens 20 > llama-sample.txt 2>&1 ||
  fail "llama-style sample: $(tail -2 llama-sample.txt)"
out=$("$tinylm" export llama/best.ckpt --out llama.pt 2>&1) && fail "llama-style export exited 0"
grep -qF "its attention shares key/value heads" <<<"$out" || fail "llama-style export: $out"
[ -e llama.pt ] && fail "llama-style export wrote llama.pt"
# ... which ONNX takes (tests/python/onnx_export.py checks the graphs' numbers), once.
"$tinylm" export llama/best.ckpt --format onnx --out llama.onnx > llama-onnx.txt 2>&1 ||
  fail "llama-style ONNX export: $(tail -2 llama-onnx.txt)"
grep -qF "wrote llama.onnx: ONNX opset 17" llama-onnx.txt || fail "llama-style ONNX export: $(cat llama-onnx.txt)"
[ "$(head -c 2 llama.onnx | od -An -tx1 | tr -d ' ')" = 0808 ] || fail "llama.onnx does not start as a ModelProto"
cp llama.onnx llama-first.onnx
out=$("$tinylm" export llama/best.ckpt --format onnx --out llama.onnx 2>&1) && fail "ONNX export over a file exited 0"
grep -qF "already exists" <<<"$out" || fail "ONNX export over a file: $out"
cmp -s llama.onnx llama-first.onnx || fail "a refused ONNX export changed llama.onnx"
out=$("$tinylm" export llama/best.ckpt --format html --out llama.html 2>&1) && fail "--format html exited 0"
grep -qF "must be pytorch" <<<"$out" || fail "--format html: $out"
out=$("$tinylm" export llama/best.ckpt --format web --out llama-page 2>&1) && fail "--format web without the runtime exited 0"
grep -qF "give --onnxruntime-web DIR" <<<"$out" || fail "--format web without the runtime: $out"
echo "ok   a rotary, RMSNorm, SwiGLU, grouped-query model trains, inspects, evaluates, samples; nanoGPT export refuses it, ONNX takes it"

refused "missing" "missing.ckpt" missing.ckpt
refused "not a regular file" "/dev/null" /dev/null

if [ "$failures" -ne 0 ]; then echo "$failures failure(s)"; exit 1; fi
echo "all inspect checks passed"
