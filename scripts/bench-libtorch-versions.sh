#!/usr/bin/env bash
# P1 and P2 with LibTorch 1.13 (this Debian 12 build) against LibTorch 2.6 (the build
# scripts/check-debian13.sh left in the Debian 13 root), rounds alternating so that a
# noisy machine slows both alike. Prints each round and the median ratio (2.6 / 1.13).
# usage: scripts/bench-libtorch-versions.sh [rounds]     (needs root; about 1 min a round)
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
root=${TINYLM_DEBIAN13_ROOT:-/var/cache/tinylm/debian13}
rounds=${1:-3}
here="$repo/build/release/tinylm"
[ -x "$here" ] || { echo "build tinylm first: cmake --build --preset release" >&2; exit 1; }
[ -x "$root/root/tinylm/build/release/tinylm" ] || { echo "run scripts/check-debian13.sh first" >&2; exit 1; }
for fs in proc sys dev; do mountpoint -q "$root/$fs" || mount --bind "/$fs" "$root/$fs"; done
trap 'for fs in dev sys proc; do umount -l "$root/$fs" 2> /dev/null || true; done' EXIT
there() { chroot "$root" /usr/bin/env -i HOME=/root PATH=/usr/bin:/bin /root/tinylm/build/release/tinylm "$@"; }
out=$(mktemp -d)
for r in $(seq 1 "$rounds"); do
  "$here" bench --cases p1,p2 > "$out/old-$r.jsonl"
  there bench --cases p1,p2 > "$out/new-$r.jsonl"
done
python3 - "$out" "$rounds" <<'PY'
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
def figures(path):
    f = {}
    for line in open(path):
        d = json.loads(line)
        if d["case"] in ("p1", "p1_plain") or (d["case"] == "p2" and d["metric"] == "train_tokens_per_s"):
            f[d["case"]] = d["value"]
    return f
ratios = {}
for r in range(1, rounds + 1):
    old, new = figures(f"{out}/old-{r}.jsonl"), figures(f"{out}/new-{r}.jsonl")
    for case in ("p1", "p1_plain", "p2"):
        ratios.setdefault(case, []).append(new[case] / old[case])
        print(f"round {r} {case:9s} LibTorch 1.13 {old[case]:9.1f}  2.6 {new[case]:9.1f}  ratio {new[case] / old[case]:.2f}")
for case, rs in ratios.items():
    print(f"median ratio 2.6 / 1.13, {case}: {statistics.median(rs):.2f} ({', '.join(f'{x:.2f}' for x in rs)})")
PY
