// Internal: the attention kernels shared by the fused ops (fused_attention.cpp and
// fused_tiny_lm.cpp): (batch, head) pairs split over LibTorch's threads, each thread
// running the loops of src/nn/cpu/kernels.inc for the instruction set in use.
//
// Pointer layouts (all float32, row-major, contiguous; s = dims_of(...)):
//   qkv   (B, T, 3D)     row (b, t) = [q | k | v], each D = H heads x Dh features
//   out   (B, T, D)      heads merged: feature h * Dh + e of row (b, t)
//   p     (B, H, T, T)   softmax weights; row i holds keys 0..T-1, zero past i if causal
//   dout  (B, T, D)      gradient of out
//   dqkv  (B, T, 3D)     gradient of qkv, same layout as qkv; written, not accumulated
// B = batch, T = sequence length, D = d_model, H = heads, Dh = D / H
#pragma once

#include <ATen/Parallel.h>
#include <torch/types.h>

#include "nn/cpu/kernels.h"

#include <array>
#include <cmath>
#include <memory>
#include <vector>

namespace tinylm::nn::kernels {

/// In place over rows of s (BH, T, T): p = softmax(scale * s) with keys j > i masked.
inline void masked_softmax_rows(float* s, int64_t rows_total, int64_t T, float scale, bool causal) {
  const auto& k = cpu::table();
  at::parallel_for(0, rows_total, 64, [&](int64_t begin, int64_t end) {
    k.masked_softmax_rows(s, begin, end, T, scale, causal);
  });
}

/// (B, T, 3D) -> q, k, v each (B*H, T, Dh), contiguous.
inline std::array<torch::Tensor, 3> split_qkv(const torch::Tensor& qkv, int64_t B, int64_t T, int64_t H, int64_t Dh) {
  auto x = qkv.view({B, T, 3, H, Dh}).permute({2, 0, 3, 1, 4});  // (3, B, H, T, Dh)
  return {x[0].reshape({B * H, T, Dh}), x[1].reshape({B * H, T, Dh}), x[2].reshape({B * H, T, Dh})};
}

using Dims = cpu::AttentionDims;

/// Sizes with the scale 1 / sqrt(Dh); D must be divisible by H.
inline Dims make_dims(int64_t B, int64_t T, int64_t D, int64_t H, bool causal) {
  return {B, T, D, H, D / H, static_cast<float>(1.0 / std::sqrt(static_cast<double>(D / H))), causal};
}

inline Dims dims_of(const torch::Tensor& qkv, int64_t H, bool causal) {
  TORCH_CHECK(qkv.dim() == 3 && qkv.size(2) % 3 == 0,
              "fused_self_attention: expected qkv (B, T, 3D), got ", qkv.sizes());
  const int64_t D = qkv.size(2) / 3;
  TORCH_CHECK(H >= 1 && D % H == 0, "fused_self_attention: D=", D,
              " is not divisible by n_heads=", H);
  return make_dims(qkv.size(0), qkv.size(1), D, H, causal);
}

/// A thread's scratch for the bfloat16 kernels, left uninitialised (hundreds of KB, which
/// zeroing would cost as much as a small call's work): they write every part they read
/// (tests/nn/test_cpu_kernels.cpp gives them NaN-filled scratch).
inline std::unique_ptr<float[]> bf16_scratch(const Dims& s) {
  return std::unique_ptr<float[]>(new float[cpu::attention_bf16_scratch_floats(s)]);
}

/// qkv (B, T, 3D) -> out (B, T, D) and p (B, H, T, T); layouts above. With `bf16` (sizes
/// as cpu::attention_bf16_fits allows) the T x T products on bfloat16 operands, and then p
/// may be null with `lse` (B, H, T) given instead (see KernelTable::attention_forward_bf16).
inline void forward_kernel(const Dims& s, const float* qkv, float* out, float* p, bool bf16 = false,
                           float* lse = nullptr) {
  const auto& k = bf16 ? cpu::bf16_table() : cpu::table();
  at::parallel_for(0, s.B * s.H, 1, [&](int64_t begin, int64_t end) {
    if (bf16) {
      const auto scratch = bf16_scratch(s);
      k.attention_forward_bf16(s, qkv, out, p, lse, begin, end, scratch.get());
    } else {
      std::vector<float> scratch(cpu::attention_scratch_floats(s));
      k.attention_forward(s, qkv, out, p, begin, end, scratch.data());
    }
  });
}

/// qkv (B, T, 3D), p (B, H, T, T), dout (B, T, D) -> dqkv (B, T, 3D); layouts above.
/// `bf16` and `lse` as forward_kernel's (p null: the weights recomputed from lse).
inline void backward_kernel(const Dims& s, const float* qkv, const float* p, const float* dout,
                            float* dqkv, bool bf16 = false, const float* lse = nullptr) {
  const auto& k = bf16 ? cpu::bf16_table() : cpu::table();
  at::parallel_for(0, s.B * s.H, 1, [&](int64_t begin, int64_t end) {
    if (bf16) {
      const auto scratch = bf16_scratch(s);
      k.attention_backward_bf16(s, qkv, p, lse, dout, dqkv, begin, end, scratch.get());
    } else {
      std::vector<float> scratch(cpu::attention_scratch_floats(s));
      k.attention_backward(s, qkv, p, dout, dqkv, begin, end, scratch.data());
    }
  });
}

}  // namespace tinylm::nn::kernels
