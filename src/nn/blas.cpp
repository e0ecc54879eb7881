// The BLAS LibTorch already loaded, called directly: its sgemm, and which CPU core
// OpenBLAS chose its kernels for.
#include "nn/blas.h"

#include <ATen/ATen.h>

#include <dlfcn.h>

#include <climits>
#include <string>

namespace tinylm::nn {

namespace {

/// Fortran sgemm (column-major), as every BLAS exports it.
using Sgemm = void (*)(const char*, const char*, const int*, const int*, const int*, const float*,
                       const float*, const int*, const float*, const int*, const float*, float*,
                       const int*);

/// The sgemm_ of the BLAS already loaded with LibTorch (Debian's libtorch links
/// libblas.so.3, which the alternatives system points at OpenBLAS), or null where no
/// visible sgemm_ exists (a LibTorch with a private MKL): products then go through at::mm.
Sgemm loaded_sgemm() {
  static const Sgemm f = reinterpret_cast<Sgemm>(blas_symbol("sgemm_"));
  return f;
}

}  // namespace

void* blas_symbol(const char* name) {
  if (void* f = dlsym(RTLD_DEFAULT, name)) return f;
  if (void* lib = dlopen("libblas.so.3", RTLD_NOW | RTLD_NOLOAD)) return dlsym(lib, name);
  return nullptr;
}

bool blas_sgemm_visible() { return loaded_sgemm() != nullptr; }

std::string blas_core() {
  static const std::string name = [] {
    const auto f = reinterpret_cast<char* (*)()>(blas_symbol("openblas_get_corename"));
    const char* n = f ? f() : nullptr;
    return std::string(n ? n : "");
  }();
  return name;
}

bool blas_runs_avx512() {
  const std::string core = blas_core();
  for (const char* wide : {"SkylakeX", "Cooperlake", "SapphireRapids"})
    if (core.find(wide) != std::string::npos) return true;
  return false;
}

void blas_gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda,
               const float* B, int64_t ldb, float* C, int64_t ldc, bool accumulate) {
  if (const Sgemm sgemm = loaded_sgemm();
      sgemm && M <= INT_MAX && N <= INT_MAX && K <= INT_MAX && lda <= INT_MAX && ldb <= INT_MAX &&
      ldc <= INT_MAX) {
    // Row-major C = op(A) op(B) is column-major Cᵀ = op(B)ᵀ op(A)ᵀ, and a row-major
    // matrix's storage is its transpose in column-major: the same flags, A and B swapped.
    const int m = static_cast<int>(N), n = static_cast<int>(M), k = static_cast<int>(K);
    const int la = static_cast<int>(ldb), lb = static_cast<int>(lda), lc = static_cast<int>(ldc);
    const float one = 1.f, beta = accumulate ? 1.f : 0.f;
    sgemm(tb ? "T" : "N", ta ? "T" : "N", &m, &n, &k, &one, B, &la, A, &lb, &beta, C, &lc);
    return;
  }
  auto a = ta ? at::from_blob(const_cast<float*>(A), {K, M}, {lda, 1}).t()
              : at::from_blob(const_cast<float*>(A), {M, K}, {lda, 1});
  auto b = tb ? at::from_blob(const_cast<float*>(B), {N, K}, {ldb, 1}).t()
              : at::from_blob(const_cast<float*>(B), {K, N}, {ldb, 1});
  auto c = at::from_blob(C, {M, N}, {ldc, 1});
  if (accumulate) c.addmm_(a, b);
  else c.copy_(at::mm(a, b));
}

}  // namespace tinylm::nn
