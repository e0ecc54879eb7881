#!/usr/bin/env bash
# Installs what tinylm needs from Debian 12's archive, if it is missing. Idempotent.
# Run as root (or with sudo available). Nothing is downloaded from anywhere else.
#   scripts/setup.sh             what the build and the tests need
#   scripts/setup.sh --fortunes  also the `fortunes` package: the English text of
#                                configs/fortunes.toml (scripts/fortunes.sh)
set -euo pipefail

packages=(cmake ninja-build g++ libtorch-dev libopenblas0-pthread libcli11-dev
          libspdlog-dev catch2 libtomlplusplus-dev nlohmann-json3-dev libgloo-dev
          libsentencepiece-dev libblas-dev python3-matplotlib)
# libxsmm (JIT small-matrix kernels for the fused CPU ops) exists for x86-64 only; the
# build falls back to its own kernels or BLAS without it.
if [ "$(dpkg --print-architecture)" = "amd64" ]; then packages+=(libxsmm-dev); fi
for arg in "$@"; do
  case "$arg" in
    --fortunes) packages+=(fortunes) ;;
    *) echo "setup: unknown option '$arg' (known: --fortunes)" >&2; exit 2 ;;
  esac
done
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  if [ "$(id -u)" -eq 0 ]; then sudo=""; elif command -v sudo > /dev/null; then sudo="sudo"; else
    echo "setup: missing packages (${missing[*]}) and not root: run this script as root" >&2
    exit 1
  fi
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" > /dev/null
fi

# LibTorch's BLAS calls go through libblas.so.3: make sure that is OpenBLAS, not the
# reference BLAS (~37x slower matmul here).
alt=libblas.so.3-x86_64-linux-gnu
openblas=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3
if [ -e "$openblas" ] && [ "$(readlink -f /etc/alternatives/$alt 2>/dev/null)" != "$(readlink -f $openblas)" ]; then
  echo "setup: selecting OpenBLAS for libblas.so.3"
  if [ "$(id -u)" -eq 0 ]; then update-alternatives --set "$alt" "$openblas"; else sudo update-alternatives --set "$alt" "$openblas"; fi
fi
