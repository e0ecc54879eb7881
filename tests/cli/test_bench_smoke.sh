#!/usr/bin/env bash
# The benchmark harness works (not how fast): every case prints well-formed JSON lines.
# usage: test_bench_smoke.sh path/to/tinylm
set -u
out=$("$1" bench --quick) || { echo "FAIL: tinylm bench --quick exited $?"; exit 1; }
echo "$out"
/usr/bin/python3 - "$out" <<'PY' || exit 1
import json, sys
lines = [json.loads(l) for l in sys.argv[1].splitlines()]
seen = {(r["case"], r["metric"]) for r in lines}
need = {("peak", "matmul_gflops"), ("p1", "train_steps_per_s"), ("p1_plain", "train_steps_per_s"),
        ("p2", "train_tokens_per_s"), ("p2", "mfu"), ("p2", "peak_rss"),
        ("p3_kv_cache", "generate_tokens_per_s"), ("p3_recompute", "generate_tokens_per_s"),
        ("p3", "identical_tokens"), ("attention_manual", "fwd_bwd_per_s"), ("attention_fused", "fwd_bwd_per_s"),
        ("dp_1proc_1thread", "train_tokens_per_s"), ("dp_1proc_2threads", "train_tokens_per_s"),
        ("dp_2proc_1thread", "train_tokens_per_s"), ("dp_2proc_vs_1proc_1thread", "speedup"),
        ("dp_2proc_1thread", "allreduce_ms_per_step"), ("dp_2proc_1thread", "allreduce_share_of_step")}
missing = need - seen
bad = [r for r in lines if not (r["value"] > 0 or r["metric"] == "identical_tokens")]
if missing or bad:
    print("FAIL: missing", sorted(missing), "non-positive", bad)
    sys.exit(1)
ident = [r["value"] for r in lines if r["metric"] == "identical_tokens"]
if ident != [1]:
    print("FAIL: KV-cache and recomputed generation gave different tokens")
    sys.exit(1)
print(f"ok: {len(lines)} figures, every case present")
PY
