// Kernel choice for the fused CPU ops: the matrix-product backends and the instruction
// set of tinylm's loops (src/nn/cpu/kernels.inc). Everything that picks a kernel by
// shape or by CPU is in this file.
#include <tinylm/nn/cpu_kernels.h>
#include <tinylm/nn/kernel_policy.h>

#include "nn/cpu/kernels.h"
#include "tinylm_kernels_config.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#ifdef TINYLM_HAVE_LIBXSMM
#include <libxsmm.h>
#include <libxsmm_version.h>
#endif

#include <dlfcn.h>

#include <atomic>
#include <climits>
#include <cstring>
#include <vector>

namespace tinylm::nn {

namespace {

std::atomic<int> g_isa{-1};  // -1: not chosen yet; else a CpuIsa

// ---- BLAS ------------------------------------------------------------------------------

/// Fortran sgemm (column-major), as every BLAS exports it.
using Sgemm = void (*)(const char*, const char*, const int*, const int*, const int*, const float*,
                       const float*, const int*, const float*, const int*, const float*, float*,
                       const int*);

/// The sgemm_ of the BLAS already loaded with LibTorch (Debian's libtorch links
/// libblas.so.3, which the alternatives system points at OpenBLAS), or null where no
/// visible sgemm_ exists (a LibTorch with a private MKL): products then go through at::mm.
Sgemm loaded_sgemm() {
  static const Sgemm f = reinterpret_cast<Sgemm>(dlsym(RTLD_DEFAULT, "sgemm_"));
  return f;
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
  if (accumulate) {
    c.addmm_(a, b);
  } else {
    c.copy_(at::mm(a, b));
  }
}

// ---- libxsmm ---------------------------------------------------------------------------

#ifdef TINYLM_HAVE_LIBXSMM
/// C = op(A) B (B not transposed) through a JIT kernel; false where libxsmm has none.
/// libxsmm is column-major: row-major C = op(A) B is column-major Cᵀ = Bᵀ op(A)ᵀ, where
/// B's storage is Bᵀ as it stands and op(A)ᵀ is A's storage, read transposed when A is.
bool xsmm_gemm(bool ta, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda,
               const float* B, int64_t ldb, float* C, int64_t ldc, bool accumulate) {
  const libxsmm_blasint m = N, n = M, k = K, xlda = ldb, xldb = lda, xldc = ldc;
  const float alpha = 1.f, beta = accumulate ? 1.f : 0.f;
  const int flags = ta ? LIBXSMM_GEMM_FLAG_TRANS_B : LIBXSMM_GEMM_FLAG_NONE;
  const libxsmm_smmfunction kernel =
      libxsmm_smmdispatch(m, n, k, &xlda, &xldb, &xldc, &alpha, &beta, &flags, nullptr);
  if (!kernel) return false;
  kernel(B, A, C);
  return true;
}
#endif

bool libxsmm_works() {
#ifdef TINYLM_HAVE_LIBXSMM
  // JIT needs an x86-64 CPU and executable memory: ask for one kernel once.
  static const bool works = [] {
    const libxsmm_blasint n = 8;
    const float alpha = 1.f, beta = 0.f;
    const int flags = LIBXSMM_GEMM_FLAG_NONE;
    return libxsmm_smmdispatch(n, n, n, &n, &n, &n, &alpha, &beta, &flags, nullptr) != nullptr;
  }();
  return works;
#else
  return false;
#endif
}

/// A thread's buffer for a transposed copy of B.
std::vector<float>& pack_buffer() {
  thread_local std::vector<float> buffer;
  return buffer;
}

}  // namespace

const char* to_string(GemmBackend backend) {
  switch (backend) {
    case GemmBackend::automatic: return "automatic";
    case GemmBackend::libxsmm: return "libxsmm";
    case GemmBackend::blas: return "blas";
    case GemmBackend::hand: return "hand";
  }
  return "?";
}

const char* to_string(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::automatic: return "automatic";
    case CpuIsa::generic: return "generic";
    case CpuIsa::avx2: return "avx2";
  }
  return "?";
}

GemmBackend gemm_backend_from_string(const std::string& name) {
  for (auto b : {GemmBackend::automatic, GemmBackend::libxsmm, GemmBackend::blas, GemmBackend::hand})
    if (name == to_string(b)) return b;
  TORCH_CHECK(false, "unknown matrix-product backend '", name, "': use automatic, libxsmm, blas or hand");
}

bool gemm_backend_available(GemmBackend backend) {
  return backend != GemmBackend::libxsmm || libxsmm_works();
}

bool cpu_isa_available(CpuIsa isa) {
  return isa != CpuIsa::avx2 || (cpu::avx2_table() != nullptr && cpu::cpu_has_avx2());
}

void set_cpu_isa(CpuIsa isa) {
  TORCH_CHECK(cpu_isa_available(isa), "the ", to_string(isa), " kernels cannot run here (",
              cpu::avx2_table() ? "this CPU lacks AVX2 or FMA" : "not built for this target",
              "): use automatic or generic");
  if (isa == CpuIsa::automatic) isa = cpu_isa_available(CpuIsa::avx2) ? CpuIsa::avx2 : CpuIsa::generic;
  g_isa = static_cast<int>(isa);
}

CpuIsa cpu_isa() {
  int isa = g_isa.load();
  if (isa < 0) {
    isa = static_cast<int>(cpu_isa_available(CpuIsa::avx2) ? CpuIsa::avx2 : CpuIsa::generic);
    g_isa = isa;
  }
  return static_cast<CpuIsa>(isa);
}

GemmBackend KernelPolicy::gemm_backend(int64_t M, int64_t N, int64_t K) const {
  if (gemm != GemmBackend::automatic) return gemm;
  if (2.0 * static_cast<double>(M) * static_cast<double>(N) * static_cast<double>(K) > small_gemm_flops)
    return GemmBackend::blas;
  if (libxsmm_works()) return GemmBackend::libxsmm;
  return cpu_isa() == CpuIsa::avx2 ? GemmBackend::hand : GemmBackend::blas;
}

void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda,
          const float* B, int64_t ldb, float* C, int64_t ldc, bool accumulate, GemmBackend backend) {
  TORCH_CHECK(M >= 0 && N >= 0 && K >= 0, "gemm: negative size M=", M, " N=", N, " K=", K);
  TORCH_CHECK(ldc >= N && lda >= (trans_a ? M : K) && ldb >= (trans_b ? K : N),
              "gemm: a row stride is shorter than its row (lda ", lda, ", ldb ", ldb, ", ldc ", ldc,
              " for M=", M, " N=", N, " K=", K, ")");
  if (M == 0 || N == 0) return;
  if (K == 0) {
    if (!accumulate)
      for (int64_t i = 0; i < M; ++i) std::memset(C + i * ldc, 0, N * sizeof(float));
    return;
  }
  if (backend == GemmBackend::automatic) {
    backend = KernelPolicy{}.gemm_backend(M, N, K);
  } else {
    TORCH_CHECK(gemm_backend_available(backend), "gemm: the ", to_string(backend),
                " backend is not available here");
  }
  if (backend == GemmBackend::blas) {
    blas_gemm(trans_a, trans_b, M, N, K, A, lda, B, ldb, C, ldc, accumulate);
    return;
  }
  // libxsmm and the hand kernel read B row by row: a transposed B is copied first (the
  // products here transpose only weight matrices, a few thousand floats).
  if (trans_b) {
    auto& packed = pack_buffer();
    packed.resize(static_cast<size_t>(K * N));
    for (int64_t n = 0; n < N; ++n)
      for (int64_t k = 0; k < K; ++k) packed[k * N + n] = B[n * ldb + k];
    B = packed.data();
    ldb = N;
  }
#ifdef TINYLM_HAVE_LIBXSMM
  if (backend == GemmBackend::libxsmm &&
      xsmm_gemm(trans_a, M, N, K, A, lda, B, ldb, C, ldc, accumulate))
    return;  // else: no kernel for this shape, the hand kernel computes it
#endif
  cpu::table().gemm(M, N, K, A, trans_a ? 1 : lda, trans_a ? lda : 1, B, ldb, C, ldc, accumulate);
}

std::string cpu_kernels_description() {
  std::string s = "products: ";
#ifdef TINYLM_HAVE_LIBXSMM
  if (libxsmm_works())
    s += std::string("libxsmm ") + LIBXSMM_CONFIG_VERSION + " (JIT for " + libxsmm_get_target_arch() + ")";
  else
    s += "libxsmm built in but unable to generate code here, hand kernel";
#else
  s += cpu_isa() == CpuIsa::avx2 ? "hand kernel (tinylm built without libxsmm)" : "BLAS";
#endif
  s += " up to " + std::to_string(static_cast<int64_t>(KernelPolicy{}.small_gemm_flops / 1e6)) + " MFLOP, ";
  s += loaded_sgemm() ? "BLAS sgemm above" : "LibTorch's matmul above (no sgemm_ symbol visible)";
  s += std::string("; loops: ") + to_string(cpu_isa());
  return s;
}

namespace cpu {
const KernelTable& table() {
  return cpu_isa() == CpuIsa::avx2 ? *avx2_table() : generic_table();
}
}  // namespace cpu

}  // namespace tinylm::nn
