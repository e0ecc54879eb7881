#!/usr/bin/env bash
# The test suite on Debian 13 (trixie: LibTorch 2.6, Catch2 v3, GCC 14), from a clean
# clone of this repository's HEAD, inside a cached Debian 13 root.
#
#   scripts/check-debian13.sh            build and test HEAD in the root (makes the root first if needed)
#   scripts/check-debian13.sh --prepare  only make (or refresh) the cached root
#   scripts/check-debian13.sh --shell    a shell in the root, with /proc, /sys, /dev mounted
#
# The root lives outside the clone, in $TINYLM_DEBIAN13_ROOT (default
# /var/cache/tinylm/debian13), so later runs on the same machine reuse it: made with
# `debootstrap --variant=minbase trixie` from Debian's archive, then the packages of
# scripts/setup.sh installed inside. Needs root. Cold: about 3 min for debootstrap and
# 8 for the packages; then the build and tests (about 10 min on 2 cores).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
root=${TINYLM_DEBIAN13_ROOT:-/var/cache/tinylm/debian13}
mirror=${TINYLM_DEBIAN_MIRROR:-http://deb.debian.org/debian}
mode=${1:-test}

[ "$(id -u)" -eq 0 ] || { echo "check-debian13: needs root (debootstrap, chroot, mount)" >&2; exit 1; }
mkdir -p "$(dirname "$root")"
exec 9> "$root.lock"
flock -n 9 || { echo "check-debian13: another run holds $root.lock" >&2; exit 1; }

mounted=()
cleanup() {
  for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do umount -l "${mounted[$i]}" 2> /dev/null || true; done
}
trap cleanup EXIT
mount_system() {
  for fs in proc sys dev; do
    mountpoint -q "$root/$fs" && continue
    case "$fs" in
      proc) mount -t proc proc "$root/proc" ;;
      *) mount --bind "/$fs" "$root/$fs" ;;
    esac
    mounted+=("$root/$fs")
  done
  cp /etc/resolv.conf "$root/etc/resolv.conf" 2> /dev/null || true
}
in_root() { chroot "$root" /usr/bin/env -i HOME=/root PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 "$@"; }

started=$(date +%s)
if [ ! -f "$root/.tinylm-root-ready" ]; then
  command -v debootstrap > /dev/null || {
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap > /dev/null
  }
  echo "check-debian13: making a Debian 13 root in $root (debootstrap, about 3 min)"
  rm -rf "$root"
  debootstrap --variant=minbase trixie "$root" "$mirror" > "$root.debootstrap.log" 2>&1 ||
    { tail -n 20 "$root.debootstrap.log"; exit 1; }
  mount_system
  echo "check-debian13: installing scripts/setup.sh's packages inside (about 8 min)"
  cp "$repo/scripts/setup.sh" "$root/root/setup.sh"
  in_root bash /root/setup.sh
  touch "$root/.tinylm-root-ready"
  echo "check-debian13: root ready after $(( $(date +%s) - started )) s"
fi
[ "$mode" = --prepare ] && exit 0
mount_system
[ "$mode" = --shell ] && { in_root bash -l; exit 0; }

# A clean clone of HEAD (committed work only), built from scratch.
rm -rf "$root/root/tinylm"
git clone -q "$repo" "$root/root/tinylm"
echo "check-debian13: testing $(git -C "$repo" rev-parse --short HEAD) on $(in_root sh -c '. /etc/os-release; echo $PRETTY_NAME')"
in_root bash -c 'cd /root/tinylm && scripts/quickstart.sh test'
echo "check-debian13: passed in $(( $(date +%s) - started )) s"
