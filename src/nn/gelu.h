// GELU through tinylm's vectorised loops (src/nn/cpu/kernels.inc): one autograd op,
// float32 on the CPU, spread over the intra-op threads.
#pragma once

#include <tinylm/nn/kernel_policy.h>

#include <torch/types.h>

namespace tinylm::nn {

/// torch::gelu(x, exact ? "none" : "tanh"): through tinylm's loops where x is float32 on
/// the CPU and policy.gelu_loops is set, else through LibTorch's gelu. The loops agree
/// with LibTorch's to a few float32 ulps (exact: Φ to 2e-7 absolute, 1.2e-7 relative in
/// the tails).
torch::Tensor gelu(const torch::Tensor& x, bool exact, const KernelPolicy& policy);

}  // namespace tinylm::nn
