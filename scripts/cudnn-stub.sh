#!/usr/bin/env bash
# For CI roots only (scripts/check-debian13.sh --cuda), never for a machine that runs
# models: builds a stub libcudnn.so.9 so that Debian 13's CUDA LibTorch links and loads
# where NVIDIA's cuDNN cannot be downloaded. It defines every cudnn* function
# libtorch_cuda.so imports, under the version node it imports them from, and each one
# aborts with its name: on a machine without a GPU none is ever called. Installed in
# /usr/local/lib/cudnn-stub (registered with ldconfig); a real libcudnn.so.9 wins where
# one is installed.
set -euo pipefail
lib=$(ls /usr/lib/*/libtorch_cuda.so 2> /dev/null | head -n 1)
[ -n "$lib" ] || { echo "cudnn-stub: no libtorch_cuda.so: install libtorch-cuda-dev first" >&2; exit 1; }
if ldconfig -p | grep -q "libcudnn.so.9 " && ! ldconfig -p | grep "libcudnn.so.9 " | grep -q cudnn-stub; then
  echo "cudnn-stub: a real libcudnn.so.9 is installed; no stub needed"
  exit 0
fi
symbols=$(nm -D --undefined-only "$lib" | sed -n 's/^ *U \(cudnn[A-Za-z0-9_]*\)@libcudnn\.so\.9$/\1/p' | sort -u)
[ -n "$symbols" ] || { echo "cudnn-stub: $lib imports nothing from libcudnn.so.9" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
{
  echo '#include <stdio.h>'
  echo '#include <stdlib.h>'
  echo 'static void stub(const char* f) {'
  echo '  fprintf(stderr, "libcudnn.so.9 stub (tinylm CI): %s called; this system has no cuDNN\n", f);'
  echo '  abort();'
  echo '}'
  for s in $symbols; do echo "void $s(void) { stub(\"$s\"); }"; done
} > "$work/stub.c"
{ echo 'libcudnn.so.9 {'; echo ' global:'; for s in $symbols; do echo "  $s;"; done; echo ' local: *;'; echo '};'; } > "$work/stub.map"
mkdir -p /usr/local/lib/cudnn-stub
gcc -shared -fPIC -O1 -Wl,-soname,libcudnn.so.9 -Wl,--version-script="$work/stub.map" \
  -o /usr/local/lib/cudnn-stub/libcudnn.so.9 "$work/stub.c"
echo /usr/local/lib/cudnn-stub > /etc/ld.so.conf.d/tinylm-cudnn-stub.conf
ldconfig
echo "cudnn-stub: /usr/local/lib/cudnn-stub/libcudnn.so.9 with $(wc -w <<< "$symbols") functions"
