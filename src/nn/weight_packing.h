// Internal: a weight's copy for the products that read it transposed, made once and
// reused (linear.cpp keeps them while the weight is unchanged), where gemm would copy it
// again on every call.
// M rows of A, a weight B stored N x K (as Linear stores it).
#pragma once

#include <tinylm/nn/kernel_policy.h>

#include <cstdint>

namespace tinylm::nn {

/// How gemm(false, true, M, N, K, ...) copies its B before multiplying: not at all (the
/// BLAS, dot products for a few rows, bfloat16), into column panels (libxsmm's tiles), or
/// transposed whole (one libxsmm kernel or the hand kernel). Each copy is K * N floats.
enum class WeightPacking { none, panels, transposed };
WeightPacking weight_packing(int64_t M, int64_t N, int64_t K, const KernelPolicy& policy);

/// B (N x K, row stride ldb) copied as `packing` says into out (K * N floats).
void pack_weight(WeightPacking packing, const float* B, int64_t N, int64_t K, int64_t ldb, float* out);

/// gemm(false, true, M, N, K, A, lda, B, ldb, C, ldc, accumulate, policy) on B's copy
/// `packed`, made by pack_weight with weight_packing(M, N, K, policy): the same products,
/// without the copy. B stays the fallback where libxsmm has no kernel for a shape.
void gemm_prepacked(WeightPacking packing, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda,
                    const float* B, int64_t ldb, const float* packed, float* C, int64_t ldc, bool accumulate,
                    const KernelPolicy& policy);

}  // namespace tinylm::nn
