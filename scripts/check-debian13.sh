#!/usr/bin/env bash
# The test suite on Debian 13 (trixie: LibTorch 2.6, Catch2 v3, GCC 14), from a clean
# clone of this repository's HEAD, inside a cached Debian 13 root.
#
#   scripts/check-debian13.sh [--cuda]            build and test HEAD in the root (makes the root first if needed)
#   scripts/check-debian13.sh [--cuda] --prepare  only make (or bring up to date) the cached root
#   scripts/check-debian13.sh [--cuda] --shell    a shell in the root, with /proc, /sys, /dev mounted
#
# --cuda: the root has Debian 13's CUDA LibTorch (libtorch-cuda-dev 2.6, CUDA 12.4, from
# `contrib`) with NCCL and nvcc, so tinylm builds with CUDA and NCCL; everything is built,
# and the tests whose behaviour differs on that build run: the unit tests, data-parallel
# training (labels unit, distributed) and the CUDA tests, which report Skipped without a
# GPU. The rest of the suite runs on the Debian 13 CPU build. cuDNN is the one part Debian
# cannot ship (its nvidia-cudnn package downloads it from NVIDIA after asking to accept
# NVIDIA's licence): the root declines, and a stub libcudnn.so.9 (scripts/cudnn-stub.sh;
# every function aborts, none is called on a CPU) lets the CUDA LibTorch link and load.
# The stub lives in that CI root only; a real CUDA machine has the real cuDNN.
#
# The roots live outside the clone, in $TINYLM_DEBIAN13_ROOT (default
# /var/cache/tinylm/debian13; --cuda: the same with -cuda), so later runs on the same
# machine reuse them: made with `debootstrap --variant=minbase trixie` from Debian's
# archive (the CUDA root starts as a copy of the CPU one), then scripts/setup.sh runs
# inside on every use, which installs only what is missing. Needs root.
# CI (scripts/ci.sh) passes a compiler cache (CMAKE_CXX_COMPILER_LAUNCHER and CCACHE_*,
# the cache directory bind-mounted into the root), TINYLM_TIMINGS and TINYLM_JUNIT (host
# paths: the phases' times and the test results are copied there).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
. "$repo/scripts/phase.sh"
cuda=0
mode=test
for arg in "$@"; do
  case "$arg" in
    --cuda) cuda=1 ;;
    --prepare|--shell|test) mode=$arg ;;
    *) echo "usage: scripts/check-debian13.sh [--cuda] [--prepare|--shell]" >&2; exit 2 ;;
  esac
done
cpu_root=${TINYLM_DEBIAN13_ROOT:-/var/cache/tinylm/debian13}
root=$cpu_root
[ "$cuda" = 1 ] && root=$cpu_root-cuda
name=$([ "$cuda" = 1 ] && echo "check-debian13 --cuda" || echo "check-debian13")
mirror=${TINYLM_DEBIAN_MIRROR:-http://deb.debian.org/debian}

[ "$(id -u)" -eq 0 ] || { echo "$name: needs root (debootstrap, chroot, mount)" >&2; exit 1; }
mkdir -p "$(dirname "$root")"
exec 9> "$root.lock"
lock() {
  flock -n 9 && return
  echo "$name: waiting for another run that holds $root.lock (up to 40 min)"
  flock -w 2400 9 || { echo "$name: $root.lock is still held after 40 min" >&2; exit 1; }
}
phase wait lock

mounted=()
cleanup() {
  for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do umount -l "${mounted[$i]}" 2> /dev/null || true; done
}
trap cleanup EXIT
bind() {  # bind HOST_DIR DIR_IN_ROOT
  mkdir -p "$1" "$root$2"
  mountpoint -q "$root$2" && return
  mount --bind "$1" "$root$2"
  mounted+=("$root$2")
}
mount_system() {
  for fs in proc sys dev dev/pts; do
    mountpoint -q "$root/$fs" && continue
    case "$fs" in
      proc) mount -t proc proc "$root/proc" ;;
      *) mount --bind "/$fs" "$root/$fs" ;;
    esac
    mounted+=("$root/$fs")
  done
  cp /etc/resolv.conf "$root/etc/resolv.conf" 2> /dev/null || true
}
# The root's environment: nothing from the host's but the compiler cache's settings.
in_root() {
  local pass=()
  for v in CMAKE_CXX_COMPILER_LAUNCHER CCACHE_DIR CCACHE_MAXSIZE CCACHE_SLOPPINESS CCACHE_NOHASHDIR; do
    [ -n "${!v:-}" ] && pass+=("$v=${!v}")
  done
  chroot "$root" /usr/bin/env -i HOME=/root PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 \
    DEBIAN_FRONTEND=noninteractive "${pass[@]}" "$@"
}

make_root() {
  if [ "$cuda" = 1 ] && [ -f "$cpu_root/.tinylm-root-ready" ]; then
    # Under the CPU root's lock: a run testing in that root has /proc, /sys and /dev mounted
    # in it and may be installing packages (CI's roots job met its debian13 leg so once, and
    # copying /proc/kcore filled the disk). -x: nothing from another file system, whatever
    # is mounted there.
    local cpu_lock
    exec {cpu_lock}> "$cpu_root.lock"
    flock -n "$cpu_lock" || {
      echo "$name: waiting for the run that holds $cpu_root.lock before copying it (up to 40 min)"
      flock -w 2400 "$cpu_lock" || { echo "$name: $cpu_root.lock is still held after 40 min" >&2; return 1; }
    }
    echo "$name: copying the Debian 13 root $cpu_root to $root"
    rm -rf "$root"
    cp -a -x --reflink=auto "$cpu_root" "$root" || return
    exec {cpu_lock}>&-
    rm -f "$root/.tinylm-root-ready"
    return
  fi
  command -v debootstrap > /dev/null || {
    apt-get -o DPkg::Lock::Timeout=600 update -qq
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends \
      debootstrap > /dev/null
  } || return
  echo "$name: making a Debian 13 root in $root (debootstrap, about 3 min)"
  rm -rf "$root"
  debootstrap --variant=minbase trixie "$root" "$mirror" > "$root.debootstrap.log" 2>&1 ||
    { tail -n 20 "$root.debootstrap.log"; exit 1; }
}

# The root exists and has every package scripts/setup.sh lists (it installs only what is
# missing, so a root made by an older HEAD catches up here). Each step's failure is
# returned by hand: `phase` runs this in a test, where bash ignores set -e.
prepare() {
  [ -f "$root/.tinylm-root-ready" ] || make_root || return
  mount_system
  # dpkg without fsync: this root is a cache that can be remade, and unpacking LibTorch
  # (and CUDA) file by file with fsync is most of its set-up time.
  echo force-unsafe-io > "$root/etc/dpkg/dpkg.cfg.d/tinylm-unsafe-io"
  local setup_args=(--ci --test)
  if [ "$cuda" = 1 ]; then
    setup_args=(--ci --cuda)  # the CUDA leg runs no test that needs the test tools
    if ! grep -q contrib "$root/etc/apt/sources.list"; then
      echo "deb $mirror trixie main contrib non-free non-free-firmware" > "$root/etc/apt/sources.list"
      in_root apt-get update -qq || return
    fi
    # Decline NVIDIA's cuDNN licence: the package then installs without downloading.
    echo "nvidia-cudnn nvidia-cudnn/question select I Decline" | in_root debconf-set-selections
  fi
  cp "$repo/scripts/setup.sh" "$repo/scripts/phase.sh" "$repo/scripts/onnxruntime-web.sh" "$root/root/" || return
  if [ "$cuda" = 0 ]; then
    # ONNX Runtime Web (the web export's test) is fetched here, with this machine's
    # certificates (a root made by debootstrap has Debian's alone), and copied in.
    local ort_web
    ort_web=$("$repo/scripts/onnxruntime-web.sh") || return
    mkdir -p "$root/var/cache/tinylm/npm"
    [ -d "$root/var/cache/tinylm/npm/$(basename "$(dirname "$ort_web")")" ] ||
      cp -a "$(dirname "$ort_web")" "$root/var/cache/tinylm/npm/" || return
  fi
  in_root bash /root/setup.sh "${setup_args[@]}" || return
  if [ "$cuda" = 1 ]; then
    cp "$repo/scripts/cudnn-stub.sh" "$root/root/cudnn-stub.sh"
    in_root bash /root/cudnn-stub.sh || return
  fi
  touch "$root/.tinylm-root-ready"
}

started=$(date +%s)
phase root prepare
echo "$name: root ready ($(in_root sh -c '. /etc/os-release; echo $PRETTY_NAME'), $(( $(date +%s) - started )) s)"
[ "$mode" = --prepare ] && exit 0
[ "$mode" = --shell ] && { in_root bash -l; exit 0; }

# The compiler cache, shared by both Debian 13 roots (the CUDA LibTorch's headers are the
# CPU one's, so most of the CUDA build comes from the cache).
[ -n "${CCACHE_DIR:-}" ] && bind "$CCACHE_DIR" "$CCACHE_DIR"

# A clean clone of HEAD (committed work only), built from scratch.
rm -rf "$root/root/tinylm" "$root/root/ci"
mkdir -p "$root/root/ci"
git clone -q "$repo" "$root/root/tinylm"
echo "$name: testing $(git -C "$repo" rev-parse --short HEAD)"
status=0
if [ "$cuda" = 1 ]; then
  # Everything is built; the tests whose behaviour differs on this build run (the unit
  # tests, data-parallel training, the CUDA tests, which report Skipped without a GPU),
  # data-parallel at the small sizes (the Debian 13 leg runs the full ones).
  leg='. scripts/phase.sh
    phase setup scripts/setup.sh --ci --cuda
    configure() { cmake --preset release | sed -n "s/^-- tinylm: /tinylm: /p"; }
    phase configure configure
    phase build cmake --build --preset release
    TINYLM_TEST_SMALL=1 phase test ctest --preset release -L "^(unit|cuda|distributed)\$" \
      ${TINYLM_JUNIT:+--output-junit "$TINYLM_JUNIT"}'
else
  leg='scripts/quickstart.sh test'
fi
in_root env ${TINYLM_TIMINGS:+TINYLM_TIMINGS=/root/ci/timings} ${TINYLM_JUNIT:+TINYLM_JUNIT=/root/ci/junit.xml} \
  bash -c "set -euo pipefail; cd /root/tinylm && $leg" || status=$?
# The in-root phases (setup, configure, build, test) after this script's own (root).
[ -n "${TINYLM_TIMINGS:-}" ] && [ -f "$root/root/ci/timings" ] && cat "$root/root/ci/timings" >> "$TINYLM_TIMINGS"
[ -n "${TINYLM_JUNIT:-}" ] && [ -f "$root/root/ci/junit.xml" ] && cp "$root/root/ci/junit.xml" "$TINYLM_JUNIT"
[ "$status" = 0 ] || { echo "$name: failed after $(( $(date +%s) - started )) s" >&2; exit "$status"; }
echo "$name: passed in $(( $(date +%s) - started )) s"
