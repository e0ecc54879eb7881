// LayerNorm and RMSNorm through tinylm's vectorised loops (src/nn/cpu/kernels.inc): one autograd op,
// float32 on the CPU, rows spread over the intra-op threads; optionally with the residual
// add before it (pre-LN blocks: h = x + r, then LayerNorm(h)) in the same pass.
#pragma once

#include <tinylm/nn/kernel_policy.h>

#include <torch/types.h>

#include <utility>

namespace tinylm::nn {

/// torch::layer_norm(x, {D}, weight, bias, eps) over the last dimension (weight and bias
/// may be undefined: no gain, no bias), or with `rms` RMSNorm, x / sqrt(mean(x^2) + eps)
/// (times weight, plus bias): through tinylm's loops where x, weight and bias are float32
/// on the CPU and policy.layer_norm_loops is set, else through LibTorch's ops.
torch::Tensor layer_norm(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias,
                         double eps, const KernelPolicy& policy, bool rms = false);

/// {x + r, layer_norm(x + r, ...)}: where the loops run, the sum and the normalisation
/// in one pass, and in the backward the two gradients reaching the sum added as dx is
/// written.
std::pair<torch::Tensor, torch::Tensor> add_layer_norm(const torch::Tensor& x, const torch::Tensor& r,
                                                       const torch::Tensor& weight, const torch::Tensor& bias,
                                                       double eps, const KernelPolicy& policy, bool rms = false);

}  // namespace tinylm::nn
