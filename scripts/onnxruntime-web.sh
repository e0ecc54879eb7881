#!/usr/bin/env bash
# ONNX Runtime Web (the npm package onnxruntime-web), whose script and WebAssembly
# `tinylm export --format web` copies into its page: fetched once from the npm registry,
# checked against the registry's sha512, unpacked into a cache (scripts/setup.sh --test
# runs this for the web export's browser test). Prints the package's folder, what
# --onnxruntime-web takes.
#   scripts/onnxruntime-web.sh          fetch it if it is not there yet; print the folder
#   scripts/onnxruntime-web.sh --where  print the folder if it is there, else exit 1
set -euo pipefail
version=1.30.0
integrity=q0y+JrrtukXSzsBWEMccVfqX25LRmosXHF+CaRJmg8pZClzcV7svNc4rKY3jL02Vb7QmRMDs1SigqR4CXAfKYQ==
url=https://registry.npmjs.org/onnxruntime-web/-/onnxruntime-web-$version.tgz
cache=${TINYLM_CACHE:-/var/cache/tinylm}
if ! mkdir -p "$cache/npm" 2> /dev/null || [ ! -w "$cache/npm" ]; then
  cache=${XDG_CACHE_HOME:-$HOME/.cache}/tinylm
  mkdir -p "$cache/npm"
fi
dir=$cache/npm/onnxruntime-web-$version
if [ -f "$dir/package/package.json" ]; then
  echo "$dir/package"
  exit 0
fi
[ "${1:-}" = --where ] && exit 1
echo "onnxruntime-web.sh: fetching onnxruntime-web $version from the npm registry" >&2
partial=$dir.partial-$$
rm -rf "$partial" && mkdir -p "$partial"
trap 'rm -rf "$partial"' EXIT
python3 - "$url" "$partial/package.tgz" "$integrity" <<'PY'
import base64, hashlib, sys, urllib.request
url, out, integrity = sys.argv[1:]
with urllib.request.urlopen(url, timeout=120) as reply:
    data = reply.read(256 << 20)
digest = base64.b64encode(hashlib.sha512(data).digest()).decode()
if digest != integrity:
    sys.exit("onnxruntime-web.sh: %s has sha512 %s, the registry says %s: not used" % (url, digest, integrity))
open(out, "wb").write(data)
PY
tar -xzf "$partial/package.tgz" -C "$partial" --no-same-owner
rm "$partial/package.tgz"
[ -f "$partial/package/dist/ort.wasm.min.js" ] || { echo "onnxruntime-web.sh: the package has no dist/ort.wasm.min.js" >&2; exit 1; }
mv "$partial" "$dir"
trap - EXIT
echo "$dir/package"
