#!/usr/bin/env bash
# tinylm inspect: what a checkpoint holds, as text and as JSON, checked against the
# fixtures (formats 1 to 3); --verify rebuilds the model; bad files end with one line.
# usage: test_inspect.sh path/to/tinylm fixtures-dir scratch-dir
set -u
tinylm=$1; fixtures=$2; work=$3
rm -rf "$work" && mkdir -p "$work" && cd "$work" || exit 1
failures=0
fail() { echo "FAIL $*"; failures=$((failures + 1)); }

for ck in "$fixtures"/v*-step12.ckpt; do
  name=$(basename "$ck")
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

refused() {  # refused NAME EXPECTED args...: one line naming the problem, non-zero
  local name="$1" expected="$2"; shift 2
  local out status
  out="$("$tinylm" inspect "$@" 2>&1)"; status=$?
  if [ "$status" -eq 0 ]; then fail "$name: exited 0"; return; fi
  if ! grep -qF -- "$expected" <<<"$out"; then fail "$name: no '$expected' in: $out"; return; fi
  if [ "$(grep -c . <<<"$out")" -ne 1 ]; then fail "$name: not one line: $out"; return; fi
  echo "ok   $name: $out"
}
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
refused "missing" "missing.ckpt" missing.ckpt
refused "not a regular file" "/dev/null" /dev/null

if [ "$failures" -ne 0 ]; then echo "$failures failure(s)"; exit 1; fi
echo "all inspect checks passed"
