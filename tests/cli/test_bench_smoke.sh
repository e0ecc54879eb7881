#!/usr/bin/env bash
# The benchmark harness works (not how fast): every case prints well-formed JSON lines.
# usage: test_bench_smoke.sh path/to/tinylm
set -u
out=$("$1" bench --quick) || { echo "FAIL: tinylm bench --quick exited $?"; exit 1; }
echo "$out"
/usr/bin/python3 - "$out" <<'PY' || exit 1
import json, sys
records = [json.loads(l) for l in sys.argv[1].splitlines()]
# A case that cannot run here says why (BPE in a sanitizer build, which cannot load
# SentencePiece; bfloat16 products on a CPU without AVX512-BF16 or AMX, or a build without
# oneDNN); it must name a reason and is listed, not counted as a figure.
skipped = [r for r in records if "skipped" in r]
lines = [r for r in records if "skipped" not in r]
for r in skipped:
    if not r["skipped"]:
        print("FAIL: a skipped case gives no reason:", r)
        sys.exit(1)
    print(f"skipped: {r['case']}: {r['skipped']}")
flags = set(open("/proc/cpuinfo").read().split()) if sys.platform.startswith("linux") else set()
bf16_cpu = bool({"avx512_bf16", "amx_bf16"} & flags)
bf16_cases = {"peak_bf16_onednn", "peak_bf16_p2_linears"}
for r in skipped:
    # bfloat16 may be skipped only where the build has no oneDNN or the CPU no bfloat16
    # instructions: on a CPU that has them, a skip is a fault.
    if r["case"] in bf16_cases and bf16_cpu and "no oneDNN" not in r["skipped"]:
        print("FAIL: this CPU has bfloat16 instructions, yet", r["case"], "was skipped:", r["skipped"])
        sys.exit(1)
if {r["case"] for r in skipped} - {"prepare_bpe"} - bf16_cases:
    print("FAIL: only prepare_bpe and the bfloat16 peaks may be skipped:", skipped)
    sys.exit(1)
seen = {(r["case"], r["metric"]) for r in lines}
need = {("peak", "matmul_gflops"), ("peak_blas", "matmul_gflops"), ("p2_ops_matmul", "share"),
        ("nanogpt", "ms_per_iter"), ("nanogpt", "mfu"), ("p1", "train_steps_per_s"), ("p1_plain", "train_steps_per_s"),
        ("p2", "train_tokens_per_s"), ("p2", "mfu"), ("p2", "peak_rss"),
        ("p3_kv_cache", "generate_tokens_per_s"), ("p3_recompute", "generate_tokens_per_s"),
        ("p3", "identical_tokens"), ("attention_manual", "fwd_bwd_per_s"), ("attention_fused", "fwd_bwd_per_s"),
        ("dp_1proc_1thread", "train_tokens_per_s"), ("dp_1proc_2threads", "train_tokens_per_s"),
        ("dp_2proc_1thread", "train_tokens_per_s"), ("dp_2proc_vs_1proc_1thread", "speedup"),
        ("dp_2proc_1thread", "allreduce_ms_per_step"), ("dp_2proc_1thread", "allreduce_share_of_step"),
        ("dp_2proc_1thread", "worker_cpu_use"), ("dp_1proc_2threads", "idle_cpu_use_after_steps"),
        ("prepare_byte", "encode_mb_per_s"), ("data_mmap_big", "train_tokens_per_s"),
        ("data_in_memory_big", "train_tokens_per_s"), ("data_mmap_vs_in_memory", "tokens_per_s_ratio"),
        ("data_mmap_big", "peak_rss_mib"), ("data_mmap_small", "peak_rss_mib"),
        ("data_mmap_big_vs_small", "peak_rss_ratio"),
        ("gemm_qkv_forward", "us_per_call"), ("gemm_head_grad_weight", "us_per_call"),
        ("p1_gemm_blas", "train_steps_per_s"), ("p1_gemm_hand", "train_steps_per_s"),
        ("p1_loops_generic", "train_steps_per_s"), ("p1_step", "us_per_step"),
        ("p1_step_forward", "share"), ("p1_step_backward", "share"),
        ("p1_step_optimizer", "share"), ("p1_step_other", "share"),
        ("arch_attention_rotary_vs_attention", "time_ratio"), ("arch_attention_gqa2_vs_attention", "time_ratio"),
        ("arch_mlp_swiglu_vs_mlp_gelu", "time_ratio"), ("arch_rms_norm_vs_layer_norm", "time_ratio"),
        ("arch_p2_gpt_style", "steps_per_s"), ("arch_p2_llama_style", "steps_per_s"),
        ("arch_p2_llama_style_vs_gpt_style", "time_ratio"),
        ("decode_reference_single", "generate_tokens_per_s"), ("decode_p2_single", "generate_tokens_per_s")}
need |= {("decode_%s_batch_%d" % (m, s), k) for m in ("reference", "p2") for s in (1, 8, 64)
         for k in ("decode_tokens_per_s", "over_single_stream")}
if "prepare_bpe" not in {r["case"] for r in skipped}:
    need |= {("prepare_bpe", "encode_mb_per_s"), ("prepare_bpe", "tokenizer_training_s")}
missing = need - seen
bad = [r for r in lines if not (r["value"] > 0 or r["metric"] in ("identical_tokens", "idle_cpu_use_after_steps"))]
if missing or bad:
    print("FAIL: missing", sorted(missing), "non-positive", bad)
    sys.exit(1)
# Every product is timed through BLAS, the generic hand kernel and LibTorch at least.
for product in ("qkv_forward", "qkv_grad_input", "qkv_grad_weight", "out_forward", "out_grad_input",
                "out_grad_weight", "head_forward", "head_grad_input", "head_grad_weight"):
    got = {r["config"]["candidate"] for r in lines if r["case"] == "gemm_" + product}
    if not {"blas", "hand_generic", "libtorch"} <= got:
        print("FAIL: gemm_" + product, "lacks candidates:", got)
        sys.exit(1)
parts = [r["value"] for r in lines if r["case"].startswith("p1_step_") and r["metric"] == "share"]
shares = sum(parts)
# Each share is printed to six significant digits, off by at most 5e-7: their sum is 1
# within 1e-6 per part (a CI run once summed four to 1.0000014).
if len(parts) < 3 or abs(shares - 1) > 1e-6 * len(parts):
    print("FAIL: the parts of a P1 step add up to", shares, "of it")
    sys.exit(1)
ident = [r["value"] for r in lines if r["metric"] == "identical_tokens"]
if ident != [1]:
    print("FAIL: KV-cache and recomputed generation gave different tokens")
    sys.exit(1)
# The data-parallel workers ran as `train --nproc` runs them: one LibTorch thread each, no
# more for OpenBLAS, and free to run on every CPU this process may use (not pinned).
report = next(r for r in lines if r["metric"] == "worker_cpu_use")["config"]
for w in report["workers"]:
    if w["intra_op_threads"] != 1 or w["blas_threads"] > 1 or w["cpus_allowed"] != report["cpus_available"]:
        print("FAIL: a data-parallel worker ran", w, "on a machine with", report["cpus_available"], "CPUs")
        sys.exit(1)
print(f"dp workers: {report['workers']}")
print(f"ok: {len(lines)} figures, every case present" + (f", {len(skipped)} skipped" if skipped else ""))
PY
