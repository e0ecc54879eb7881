// The BLAS LibTorch loads (Debian: OpenBLAS through libblas.so.3), for tinylm's products.
#pragma once

#include <cstdint>
#include <string>

namespace tinylm::nn {

/// Row-major C = op(A) op(B) (or C +=) through the loaded BLAS's sgemm_, or through
/// LibTorch's matmul where no sgemm_ is visible or a size exceeds the BLAS's int.
void blas_gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda,
               const float* B, int64_t ldb, float* C, int64_t ldc, bool accumulate);

/// A function of the BLAS LibTorch loaded (sgemm_, openblas_set_num_threads ...): from
/// the process's global symbols, else from libblas.so.3 if it is loaded; nullptr where
/// neither has it.
void* blas_symbol(const char* name);

/// Whether a BLAS sgemm_ is visible in the process (else products go through at::mm).
bool blas_sgemm_visible();

/// The CPU core OpenBLAS chose its kernels for ("Haswell", "SkylakeX", ...), or "" where
/// the BLAS is not OpenBLAS. OPENBLAS_CORETYPE can hold it below what the CPU runs.
std::string blas_core();

/// Whether the BLAS runs AVX-512 kernels (OpenBLAS's names for its AVX-512 cores).
bool blas_runs_avx512();

}  // namespace tinylm::nn
