// Where the kernel choices sent the work: counted by the kernels, read by kernel_counts()
// (cpu_kernels.h).
#pragma once

#include <tinylm/nn/cpu_kernels.h>

namespace tinylm::nn {

/// One product run on `backend` (libxsmm, blas or hand).
void count_gemm(GemmBackend backend);
/// One bfloat16 product (gemm_bf16), which took `seconds`.
void count_bf16_gemm(double seconds);
/// One fused-attention pass (forward or backward) with its T x T products through BLAS,
/// or through the loops (on bfloat16 operands with `bf16`).
void count_attention_products(bool blas, bool bf16 = false);
/// One whole-model fused loss (its forward).
void count_fused_model();

}  // namespace tinylm::nn
