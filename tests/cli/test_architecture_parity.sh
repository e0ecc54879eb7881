#!/usr/bin/env bash
# Rotary positions, RMSNorm, SwiGLU and grouped-query attention against PyTorch: tinylm
# writes models of each (and all together) with their logits, loss and gradients, through
# every attention kernel this build has; tests/python/architecture_parity.py computes the
# same in plain PyTorch from the published formulas and requires float32 rounding.
# Needs Debian's python3-torch (exit 77 = skipped where absent).
# usage: test_architecture_parity.sh TINYLM_TESTS SOURCE_DIR WORK_DIR
set -u
tests=$1 src=$2 work=$3
/usr/bin/python3 -c "import importlib.util as u, sys; sys.exit(u.find_spec('torch') is None)" 2>/dev/null ||
  { echo "SKIPPED: python3-torch is not installed"; exit 77; }
rm -rf "$work" && mkdir -p "$work" || exit 1
TINYLM_PARITY_DIR="$work" "$tests" "[architecture-parity]" > "$work/write.log" 2>&1 || { cat "$work/write.log"; exit 1; }
/usr/bin/python3 "$src/tests/python/architecture_parity.py" "$work"
