// Linear layers through tinylm's matrix products: y = x Wᵀ + b as one autograd op whose
// forward and backward products run tinylm::nn::gemm with the model's KernelPolicy
// (libxsmm's AVX-512 tiles over the intra-op threads where that beats the BLAS).
#pragma once

#include <tinylm/nn/kernel_policy.h>

#include <torch/types.h>

namespace tinylm::nn {

/// torch::nn::functional::linear(x, weight, bias) (bias may be undefined): through
/// tinylm's gemm where policy.linear_uses_gemm says so for x's rows (float32 on the CPU),
/// else through LibTorch's linear. The two agree to float32 rounding. With
/// policy.bf16_products its three products run in bfloat16 (gemm_bf16) wherever x is
/// float32 on the CPU, the weight rounded once per change of its version counter; without
/// autograd (generation, evaluation), a product that copies the weight before multiplying
/// (transposed, or in panels) keeps that copy likewise. What writes a weight through its
/// data pointer must bump that counter.
torch::Tensor linear(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias,
                     const KernelPolicy& policy);

/// linear(gelu(linear(x, w1, b1), exact), w2, b2): a feed-forward's three ops. Where
/// linear_gelu_linear_fused says so (bfloat16 products, GELU's loops, autograd on, float32
/// on the CPU) one autograd op with the same arithmetic, bit for bit, that never writes
/// GELU's output or its gradient in float32; elsewhere the three ops.
torch::Tensor linear_gelu_linear(const torch::Tensor& x, const torch::Tensor& w1, const torch::Tensor& b1,
                                 const torch::Tensor& w2, const torch::Tensor& b2, bool exact,
                                 const KernelPolicy& policy);
bool linear_gelu_linear_fused(const torch::Tensor& x, const torch::Tensor& w1, const torch::Tensor& b1,
                              const torch::Tensor& w2, const torch::Tensor& b2, const KernelPolicy& policy);

}  // namespace tinylm::nn
