#!/usr/bin/env bash
# Installs what tinylm needs from Debian's archive (12 or 13), if it is missing. Idempotent.
# Run as root (or with sudo available). Nothing is downloaded from anywhere else.
#   scripts/setup.sh             what building and training need (LibTorch, its BLAS,
#                                the compiler and the libraries tinylm links; Catch2's
#                                headers too, since the build configures the tests)
#   scripts/setup.sh --test      also what the tests need: python3-torch (the tests
#                                compare tinylm with PyTorch), python3-matplotlib (the plot
#                                script), chromium, chromium-driver and python3-selenium
#                                (tinylm serve's page in a headless browser), wrk (its
#                                benchmark), python3-onnx (ONNX's checker), and where
#                                packaged (Debian 13) python3-openai (OpenAI's client)
#                                and python3-onnxruntime + libonnxruntime-dev (ONNX Runtime);
#                                then ONNX Runtime Web from the npm registry
#                                (scripts/onnxruntime-web.sh: the web export's test)
#   scripts/setup.sh --fortunes  also the `fortunes` package: the English text of
#                                configs/fortunes.toml (scripts/fortunes.sh)
#   scripts/setup.sh --cuda      Debian 13 only, `contrib` and `non-free` enabled: LibTorch
#                                built with CUDA 12.4 (libtorch-cuda-dev, which replaces
#                                libtorch-dev), NCCL, nvcc (Caffe2's CMake config needs it)
#                                and PyTorch with CUDA; NVIDIA's cuDNN is fetched by the
#                                nvidia-cudnn package's own installer, from NVIDIA
#   scripts/setup.sh --ci        also what CI uses: ccache
#   scripts/setup.sh --fuzz      also clang and libFuzzer (scripts/fuzz.sh)
set -euo pipefail
. "$(dirname "$0")/phase.sh"

cuda=0
test=0
extra=()
for arg in "$@"; do
  case "$arg" in
    --test) test=1 ;;
    --fortunes) extra+=(fortunes) ;;
    --ci) extra+=(ccache) ;;
    --fuzz)  # libFuzzer comes with clang's runtime: libfuzzer-14-dev on Debian 12, -19 on 13
      llvm=$(apt-cache policy clang 2> /dev/null | sed -n 's/.*Candidate: 1:\([0-9]*\).*/\1/p')
      extra+=(clang "libfuzzer-$llvm-dev") ;;
    --cuda) cuda=1 ;;
    *) echo "setup: unknown option '$arg' (known: --test, --fortunes, --cuda, --ci, --fuzz)" >&2; exit 2 ;;
  esac
done

# A system that has the CUDA LibTorch keeps it (the CPU packages would replace it).
if dpkg-query -W -f='${Status}' libtorch-cuda-dev 2> /dev/null | grep -q "install ok installed"; then
  cuda=1
fi
if [ "$cuda" = 1 ]; then
  # LibTorch, Gloo and PyTorch in their CUDA builds (each conflicts with its CPU twin).
  packages=(libtorch-cuda-dev libgloo-cuda-dev libnccl-dev nvidia-cuda-toolkit)
  tests=(python3-torch-cuda)
  if ! apt-cache show libtorch-cuda-dev > /dev/null 2>&1; then
    echo "setup: libtorch-cuda-dev is not in this system's package lists: it is in Debian 13's" \
         "'contrib' component (and cuDNN in 'non-free'); add 'contrib non-free' to /etc/apt/sources.list" \
         "and run apt-get update" >&2
    exit 1
  fi
else
  packages=(libtorch-dev libgloo-dev)
  tests=(python3-torch)
fi
packages+=(cmake ninja-build g++ libopenblas0-pthread libcli11-dev libspdlog-dev catch2
           libtomlplusplus-dev nlohmann-json3-dev libsentencepiece-dev libblas-dev "${extra[@]}")
if [ "$test" = 1 ]; then
  packages+=("${tests[@]}" python3-matplotlib chromium chromium-driver python3-selenium wrk python3-onnx)
  # OpenAI's Python client, for tinylm serve's client test, and ONNX Runtime, for the ONNX
  # export test: packaged from Debian 13 on.
  if apt-cache show python3-openai > /dev/null 2>&1; then packages+=(python3-openai); fi
  if apt-cache show python3-onnxruntime > /dev/null 2>&1; then packages+=(python3-onnxruntime libonnxruntime-dev); fi
fi
# libxsmm (JIT small-matrix kernels for the fused CPU ops) exists for x86-64 only; the
# build falls back to its own kernels or BLAS without it.
if [ "$(dpkg --print-architecture)" = "amd64" ]; then packages+=(libxsmm-dev); fi
# oneDNN: bfloat16 products with the CPU's AVX512-BF16 and AMX kernels (the bench's bfloat16
# peak; the build does without it).
packages+=(libdnnl-dev)
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
  # Another apt on this system (CI prepares a Debian 13 root beside this) is waited for.
  # Downloading (the package lists, then the packages) and installing are timed apart:
  # the first depends on the network and the mirror, the second on this machine.
  apt=($sudo apt-get -o DPkg::Lock::Timeout=600 -y -qq --no-install-recommends)
  download_packages() {
    "${apt[@]}" update &&
      DEBIAN_FRONTEND=noninteractive "${apt[@]}" install --download-only "${missing[@]}" > /dev/null
  }
  install_packages() { DEBIAN_FRONTEND=noninteractive "${apt[@]}" install "${missing[@]}" > /dev/null; }
  phase download download_packages
  phase install install_packages
  total=$(dpkg-query -W -f='${Status}\n' 2> /dev/null | grep -c "install ok installed")
  echo "setup: $total packages installed on this system now"
fi

# LibTorch's BLAS calls go through libblas.so.3: make sure that is OpenBLAS, not the
# reference BLAS (~37x slower matmul here).
alt=libblas.so.3-x86_64-linux-gnu
openblas=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3
if [ -e "$openblas" ] && [ "$(readlink -f /etc/alternatives/$alt 2>/dev/null)" != "$(readlink -f $openblas)" ]; then
  echo "setup: selecting OpenBLAS for libblas.so.3"
  if [ "$(id -u)" -eq 0 ]; then update-alternatives --set "$alt" "$openblas"; else sudo update-alternatives --set "$alt" "$openblas"; fi
fi

# ONNX Runtime Web from the npm registry, for the web export's browser test (its script
# and WebAssembly go into the page): fetched once into a cache, checked by its sha512.
if [ "$test" = 1 ]; then
  fetch_onnxruntime_web() { "$(dirname "$0")/onnxruntime-web.sh" > /dev/null; }
  phase download fetch_onnxruntime_web
fi
