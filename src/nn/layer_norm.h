// LayerNorm and RMSNorm through tinylm's vectorised loops (src/nn/cpu/kernels.inc): one autograd op,
// float32 on the CPU, rows spread over the intra-op threads; optionally with the residual
// add before it (pre-LN blocks: h = x + r, then LayerNorm(h)) in the same pass.
#pragma once

#include <tinylm/nn/kernel_policy.h>

#include <torch/types.h>

#include <cstdint>
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

/// The loops' backward over `rows` rows of D (float32, packed; x what was normalised, mean
/// and rstd its rows'): dx = the gradient through the norm + dres (dres may be null); the
/// gain's gradient (D) into dgain and the bias's into *dbias where dbias is given, each
/// summed in blocks of rows over the threads and the blocks added in order (the same bits
/// at any thread count). Where dx16 is given, dx is also rounded to bfloat16 there as each
/// block is made (the next product's operand), and where dx_sums is given dx's column sums
/// (that product's bias gradient) go into it, summed the same way.
void layer_norm_backward_rows(const float* x, const float* dy, const float* gain, const float* mean, const float* rstd,
                              const float* dres, float* dx, torch::Tensor& dgain, torch::Tensor* dbias, int64_t rows,
                              int64_t D, bool center, uint16_t* dx16 = nullptr, torch::Tensor* dx_sums = nullptr);

}  // namespace tinylm::nn
