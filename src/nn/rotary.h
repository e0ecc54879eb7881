// Rotary positions (RoPE) on queries and keys: each head's two halves rotated by its
// token's angles, through tinylm's vectorised loops (src/nn/cpu/kernels.inc) as one
// autograd op, or LibTorch's ops.
#pragma once

#include <tinylm/nn/kernel_policy.h>

#include <torch/types.h>

#include <cstdint>

namespace tinylm::nn {

/// x (B, T, H, Dh), Dh even, each head's halves (a, b) -> (a cos - b sin, b cos + a sin) with
/// the angles (start + t) base^(-2i/Dh), i < Dh/2, computed in double then rounded to x's
/// type. On the loops where x is float32 on the CPU and policy.rotary_loops is set (x may
/// be a view of the QKV projection's output: heads packed, tokens at any stride), else
/// through LibTorch's ops; the result is contiguous.
torch::Tensor rotate_halves(const torch::Tensor& x, int64_t start, double base, const KernelPolicy& policy = {});

}  // namespace tinylm::nn
