#!/usr/bin/env bash
# ONNX export against tinylm's logits: tinylm writes models of each kind and option with
# the logits it gives ("[onnx-export]"); tests/python/onnx_export.py runs ONNX's checker
# and evaluates each graph (and runs ONNX Runtime where Debian packages it: Debian 13).
# Needs Debian's python3-onnx and python3-torch (exit 77 = skipped where absent).
# usage: test_onnx_export.sh TINYLM_TESTS SOURCE_DIR WORK_DIR
set -u
tests=$1 src=$2 work=$3
for module in onnx torch; do
  /usr/bin/python3 -c "import importlib.util as u, sys; sys.exit(u.find_spec('$module') is None)" 2>/dev/null ||
    { echo "SKIPPED: python3-$module is not installed (scripts/setup.sh installs it)"; exit 77; }
done
rm -rf "$work" && mkdir -p "$work" || exit 1
TINYLM_ONNX_DIR="$work" "$tests" "[onnx-export]" > "$work/write.log" 2>&1 || { cat "$work/write.log"; exit 1; }
/usr/bin/python3 "$src/tests/python/onnx_export.py" "$work"
