// Process-wide counts of the kernel choices (see kernel_counts.h): relaxed atomic
// increments, one per product or attention pass, next to work of thousands of flops (and
// a bfloat16 product's time, two clock readings next to tens of microseconds).
#include "nn/kernel_counts.h"

#include <atomic>
#include <cstdint>

namespace tinylm::nn {

namespace {

std::atomic<int64_t> g_gemm[4], g_gemm_bf16, g_gemm_bf16_ns, g_attention_blas, g_attention_loops, g_attention_bf16,
    g_fused_models;

}  // namespace

void count_gemm(GemmBackend backend) {
  g_gemm[static_cast<int>(backend)].fetch_add(1, std::memory_order_relaxed);
}

void count_bf16_gemm(double seconds) {
  g_gemm_bf16.fetch_add(1, std::memory_order_relaxed);
  g_gemm_bf16_ns.fetch_add(static_cast<int64_t>(seconds * 1e9), std::memory_order_relaxed);
}

void count_attention_products(bool blas, bool bf16) {
  (blas ? g_attention_blas : g_attention_loops).fetch_add(1, std::memory_order_relaxed);
  if (bf16) g_attention_bf16.fetch_add(1, std::memory_order_relaxed);
}

void count_fused_model() { g_fused_models.fetch_add(1, std::memory_order_relaxed); }

KernelCounts kernel_counts() {
  KernelCounts c;
  c.gemm_libxsmm = g_gemm[static_cast<int>(GemmBackend::libxsmm)].load(std::memory_order_relaxed);
  c.gemm_blas = g_gemm[static_cast<int>(GemmBackend::blas)].load(std::memory_order_relaxed);
  c.gemm_hand = g_gemm[static_cast<int>(GemmBackend::hand)].load(std::memory_order_relaxed);
  c.gemm_bf16 = g_gemm_bf16.load(std::memory_order_relaxed);
  c.gemm_bf16_seconds = static_cast<double>(g_gemm_bf16_ns.load(std::memory_order_relaxed)) * 1e-9;
  c.attention_blas = g_attention_blas.load(std::memory_order_relaxed);
  c.attention_loops = g_attention_loops.load(std::memory_order_relaxed);
  c.attention_bf16 = g_attention_bf16.load(std::memory_order_relaxed);
  c.fused_models = g_fused_models.load(std::memory_order_relaxed);
  return c;
}

KernelCounts KernelCounts::operator-(const KernelCounts& o) const {
  KernelCounts d;
  d.gemm_libxsmm = gemm_libxsmm - o.gemm_libxsmm;
  d.gemm_blas = gemm_blas - o.gemm_blas;
  d.gemm_hand = gemm_hand - o.gemm_hand;
  d.gemm_bf16 = gemm_bf16 - o.gemm_bf16;
  d.gemm_bf16_seconds = gemm_bf16_seconds - o.gemm_bf16_seconds;
  d.attention_blas = attention_blas - o.attention_blas;
  d.attention_loops = attention_loops - o.attention_loops;
  d.attention_bf16 = attention_bf16 - o.attention_bf16;
  d.fused_models = fused_models - o.fused_models;
  return d;
}

}  // namespace tinylm::nn
