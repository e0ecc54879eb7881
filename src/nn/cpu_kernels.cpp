// Kernel choice for the fused CPU ops: the matrix-product backends and the instruction
// set of tinylm's loops (src/nn/cpu/kernels.inc). Everything that picks a kernel by
// shape or by CPU is in this file.
// Over 400 lines on purpose: every path a product takes (BLAS, dot products, libxsmm's
// tiles and single kernels, the hand kernel) and the copies of B each makes, beside
// weight_packing(), which must name the same path for the same product.
#include <tinylm/nn/cpu_kernels.h>
#include <tinylm/nn/kernel_policy.h>

#include "nn/blas.h"
#include "nn/cpu/kernels.h"
#include "nn/kernel_counts.h"
#include "nn/weight_packing.h"
#include "tinylm_kernels_config.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#ifdef TINYLM_HAVE_LIBXSMM
#include <libxsmm.h>
#include <libxsmm_version.h>
#endif

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <limits>
#include <cstring>
#include <vector>

namespace tinylm::nn {

namespace {

std::atomic<int> g_isa{-1};  // -1: not chosen yet; else a CpuIsa

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

/// A thread's buffer for a transposed copy of B.
std::vector<float>& pack_buffer() {
  thread_local std::vector<float> buffer;
  return buffer;
}

/// out (K x N) <- B (N x K, row stride ldb) transposed, in 16 x 16 blocks (each block's
/// reads and writes stay in a few cache lines).
void transpose_into(const float* B, int64_t N, int64_t K, int64_t ldb, float* out) {
  constexpr int64_t b = 16;
  for (int64_t n0 = 0; n0 < N; n0 += b)
    for (int64_t k0 = 0; k0 < K; k0 += b) {
      const int64_t n1 = std::min(N, n0 + b), k1 = std::min(K, k0 + b);
      for (int64_t n = n0; n < n1; ++n)
        for (int64_t k = k0; k < k1; ++k) out[k * N + n] = B[n * ldb + k];
    }
}

/// Products of at most this many rows against a transposed weight take dot products
/// (cpu::KernelTable::gemm_bt_rows).
constexpr int64_t kDotRows = 4;

#ifdef TINYLM_HAVE_LIBXSMM
/// The tiles of a tiled product: C in 64 x 64 blocks, K in steps of 256 (an L1/L2-sized
/// working set; measured against 32, 128 and other steps on P2's products).
constexpr int64_t kTileM = 64, kTileN = 64, kTileK = 256;

/// C = op(A) op(B) as libxsmm kernels over tiles of C, the tiles shared out among
/// LibTorch's intra-op threads; false, with C untouched, where libxsmm has no kernel for a
/// tile shape. A transposed B, and B under a product of 1024 rows or more, is first copied
/// into column panels (K x 64, contiguous), so a tile reads its B block at a short stride
/// whatever B's row stride (a 4 KiB stride puts every row in one cache set: 1.4x on P2's
/// MLP products); under fewer rows the copy would cost more than it saves (K N copies
/// against 2 M N K flops: 20% of the weight gradient's time). Column-major as in xsmm_gemm: a tile's
/// kernel computes its Cᵀ block from B's panel and A's rows (A's columns, read
/// transposed, when A is transposed).
/// Panel j holds B's columns [j * 64, j * 64 + nb) as K rows of nb, from K * j * 64 on:
/// B (N x K, row stride ldb) stored transposed, its panels written over the threads.
void pack_transposed_panels(const float* B, int64_t N, int64_t K, int64_t ldb, float* packed) {
  const int64_t tiles_n = (N + kTileN - 1) / kTileN;
  at::parallel_for(0, tiles_n, 1, [&](int64_t begin, int64_t end) {
    for (int64_t j = begin; j < end; ++j) {
      const int64_t j0 = j * kTileN, nb = std::min(kTileN, N - j0);
      transpose_into(B + j0 * ldb, nb, K, ldb, packed + K * j0);
    }
  });
}

/// (With `prepacked`: B's panels as pack_transposed_panels wrote them, tb must be true,
/// and nothing is copied.)
bool xsmm_tiled_gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda,
                     const float* B, int64_t ldb, float* C, int64_t ldc, bool accumulate,
                     const float* prepacked = nullptr) {
  // Every kernel the tiles need, before any tile is written: [edge row][edge column]
  // [edge K step][first K step]. An edge is the remainder where a size is not a multiple.
  const bool pack = tb || M >= 1024;
  libxsmm_smmfunction kernels[2][2][2][2] = {};
  const int64_t sizes_m[2] = {kTileM, M % kTileM}, sizes_n[2] = {kTileN, N % kTileN},
                sizes_k[2] = {kTileK, K % kTileK};
  const libxsmm_blasint xldb = lda, xldc = ldc;
  const float alpha = 1.f;
  const int flags = ta ? LIBXSMM_GEMM_FLAG_TRANS_B : LIBXSMM_GEMM_FLAG_NONE;
  for (int em = 0; em < 2; ++em)
    for (int en = 0; en < 2; ++en)
      for (int ek = 0; ek < 2; ++ek)
        for (int first = 0; first < 2; ++first) {
          const int64_t m = std::min(sizes_m[em], M), n = std::min(sizes_n[en], N), k = std::min(sizes_k[ek], K);
          if (m == 0 || n == 0 || k == 0) continue;
          const float beta = (first && !accumulate) ? 0.f : 1.f;
          const libxsmm_blasint xm = n, xn = m, xk = k, xlda = pack ? n : ldb;  // a panel's row is its width
          kernels[em][en][ek][first] =
              libxsmm_smmdispatch(xm, xn, xk, &xlda, &xldb, &xldc, &alpha, &beta, &flags, nullptr);
          if (!kernels[em][en][ek][first]) return false;
        }
  const int64_t tiles_m = (M + kTileM - 1) / kTileM, tiles_n = (N + kTileN - 1) / kTileN;
  // Panel j holds B's columns [j * 64, j * 64 + nb) as K rows of nb, from K * j * 64 on.
  const float* packed = prepacked;
  if (tb && !prepacked) {  // B stored N x K: each panel is the transpose of its rows
    auto& panels = pack_buffer();
    panels.resize(static_cast<size_t>(K * N));
    pack_transposed_panels(B, N, K, ldb, panels.data());
    packed = panels.data();
  } else if (pack && !prepacked) {
    auto& panels = pack_buffer();
    panels.resize(static_cast<size_t>(K * N));
    at::parallel_for(0, tiles_n, 1, [&](int64_t begin, int64_t end) {
      for (int64_t j = begin; j < end; ++j) {
        const int64_t j0 = j * kTileN, nb = std::min(kTileN, N - j0);
        for (int64_t k = 0; k < K; ++k)
          std::memcpy(panels.data() + K * j0 + k * nb, B + k * ldb + j0, nb * sizeof(float));
      }
    });
    packed = panels.data();
  }
  at::parallel_for(0, tiles_m * tiles_n, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t i0 = t / tiles_n * kTileM, j0 = t % tiles_n * kTileN;
      const int em = M - i0 < kTileM, en = N - j0 < kTileN;
      const int64_t nb = std::min(kTileN, N - j0);
      for (int64_t k0 = 0; k0 < K; k0 += kTileK) {
        const int ek = K - k0 < kTileK;
        const float* a = ta ? A + k0 * lda + i0 : A + i0 * lda + k0;
        const float* b = pack ? packed + K * j0 + k0 * nb : B + k0 * ldb + j0;
        kernels[em][en][ek][k0 == 0](b, a, C + i0 * ldc + j0);
      }
    }
  });
  return true;
}

/// Whether libxsmm writes AVX-512 code here.
bool libxsmm_avx512() { return libxsmm_get_target_archid() >= LIBXSMM_X86_AVX512_CORE; }
#endif

bool libxsmm_works() {
#ifdef TINYLM_HAVE_LIBXSMM
  // JIT needs an x86-64 CPU and executable memory: ask for one kernel once.
  static const bool works = [] {
    // libxsmm_init() puts OMP_PROC_BIND=TRUE into the environment where it is unset: every
    // process started afterwards would bind its OpenMP threads (bench dp's workers: on CPU 0).
    const bool bind_was_set = std::getenv("OMP_PROC_BIND") != nullptr;
    libxsmm_init();
    if (!bind_was_set) ::unsetenv("OMP_PROC_BIND");
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
    case CpuIsa::avx512: return "avx512";
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
  switch (isa) {
    case CpuIsa::avx2: return cpu::avx2_table() != nullptr && cpu::cpu_has_avx2();
    case CpuIsa::avx512: return cpu::avx512_table() != nullptr && cpu::cpu_has_avx512();
    default: return true;
  }
}

namespace {
CpuIsa widest_isa() {
  for (auto isa : {CpuIsa::avx512, CpuIsa::avx2})
    if (cpu_isa_available(isa)) return isa;
  return CpuIsa::generic;
}
}  // namespace

void set_cpu_isa(CpuIsa isa) {
  TORCH_CHECK(cpu_isa_available(isa), "the ", to_string(isa),
              " kernels cannot run here (not built for this target, or the CPU or OS lacks them): "
              "use automatic or generic");
  if (isa == CpuIsa::automatic) isa = widest_isa();
  g_isa = static_cast<int>(isa);
}

CpuIsa cpu_isa() {
  int isa = g_isa.load();
  if (isa < 0) {
    isa = static_cast<int>(widest_isa());
    g_isa = isa;
  }
  return static_cast<CpuIsa>(isa);
}

std::string blas_core_name() { return blas_core(); }

int64_t default_sdpa_cpu_min_seq_len() {
  return cpu_isa() == CpuIsa::avx512 ? std::numeric_limits<int64_t>::max() : 64;
}

bool tiles_for_large_products() {
#ifdef TINYLM_HAVE_LIBXSMM
  if (!libxsmm_works()) return false;
  if (libxsmm_avx512()) return true;  // as wide as any BLAS's kernels
  return libxsmm_get_target_archid() >= LIBXSMM_X86_AVX2 && !blas_runs_avx512();
#else
  return false;
#endif
}

GemmBackend KernelPolicy::gemm_backend(int64_t M, int64_t N, int64_t K) const {
  if (gemm != GemmBackend::automatic) return gemm;
  if (2.0 * static_cast<double>(M) * static_cast<double>(N) * static_cast<double>(K) > small_gemm_flops) {
    if (large_gemm != GemmBackend::automatic) return large_gemm;
    return tiles_for_large_products() ? GemmBackend::libxsmm : GemmBackend::blas;
  }
  if (libxsmm_works()) return GemmBackend::libxsmm;
  return cpu_isa() != CpuIsa::generic ? GemmBackend::hand : GemmBackend::blas;
}

bool KernelPolicy::linear_uses_gemm(int64_t M, int64_t N, int64_t K) const {
  if (bf16_products) return true;  // LibTorch's linear would run it in float32
  return linear_products &&
         2.0 * static_cast<double>(M) * static_cast<double>(N) * static_cast<double>(K) > small_gemm_flops &&
         gemm_backend(M, N, K) != GemmBackend::blas;
}

void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda,
          const float* B, int64_t ldb, float* C, int64_t ldc, bool accumulate, GemmBackend backend) {
  KernelPolicy policy;  // a default one, with `backend` for every product
  policy.gemm = backend;
  gemm(trans_a, trans_b, M, N, K, A, lda, B, ldb, C, ldc, accumulate, policy);
}

namespace {

/// gemm's body; with `prepacked` (trans_b only), B's copy as pack_weight(`packing`) made it.
void gemm_with(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda,
               const float* B, int64_t ldb, float* C, int64_t ldc, bool accumulate, const KernelPolicy& policy,
               const float* prepacked, WeightPacking packing) {
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
  if (policy.bf16_products) {
    gemm_bf16(trans_a, trans_b, M, N, K, A, lda, B, ldb, C, ldc, accumulate);
    return;
  }
  const GemmBackend backend = policy.gemm_backend(M, N, K);
  TORCH_CHECK(gemm_backend_available(backend), "gemm: the ", to_string(backend), " backend is not available here");
  count_gemm(backend);
  if (backend == GemmBackend::blas) {
    blas_gemm(trans_a, trans_b, M, N, K, A, lda, B, ldb, C, ldc, accumulate);
    return;
  }
  // A few rows against a weight as Linear stores it (a decode step's last position): dot
  // products along the weight's rows, where packing it transposed would copy as many
  // floats as the product multiplies.
  if (trans_b && !trans_a && M <= kDotRows) {
    cpu::table().gemm_bt_rows(M, N, K, A, lda, B, ldb, C, ldc, accumulate);
    return;
  }
#ifdef TINYLM_HAVE_LIBXSMM
  const bool small = 2.0 * static_cast<double>(M) * static_cast<double>(N) * static_cast<double>(K) <=
                     policy.small_gemm_flops;
  // A larger product: tiles, which copy B into panels themselves (from either orientation).
  if (backend == GemmBackend::libxsmm && !small) {
    TORCH_CHECK(!prepacked || packing == WeightPacking::panels, "gemm: a weight packed otherwise than in panels");
    if (!xsmm_tiled_gemm(trans_a, trans_b, M, N, K, A, lda, B, ldb, C, ldc, accumulate, prepacked))
      blas_gemm(trans_a, trans_b, M, N, K, A, lda, B, ldb, C, ldc, accumulate);  // no kernel for a shape
    return;
  }
#endif
  // libxsmm's single kernel and the hand kernel read B row by row: a transposed B is
  // copied first (the products here transpose only weight matrices: at most a few
  // percent of the product's time, K N copies against 2 M N K flops).
  if (trans_b && prepacked) {
    TORCH_CHECK(packing == WeightPacking::transposed, "gemm: a weight packed otherwise than transposed");
    B = prepacked;
    ldb = N;
  } else if (trans_b) {
    auto& packed = pack_buffer();
    packed.resize(static_cast<size_t>(K * N));
    transpose_into(B, N, K, ldb, packed.data());
    B = packed.data();
    ldb = N;
  }
#ifdef TINYLM_HAVE_LIBXSMM
  if (backend == GemmBackend::libxsmm && xsmm_gemm(trans_a, M, N, K, A, lda, B, ldb, C, ldc, accumulate))
    return;  // else: no kernel for this shape, the hand kernel computes it
#endif
  cpu::table().gemm(M, N, K, A, trans_a ? 1 : lda, trans_a ? lda : 1, B, ldb, C, ldc, accumulate);
}

}  // namespace

void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda,
          const float* B, int64_t ldb, float* C, int64_t ldc, bool accumulate, const KernelPolicy& policy) {
  gemm_with(trans_a, trans_b, M, N, K, A, lda, B, ldb, C, ldc, accumulate, policy, nullptr, WeightPacking::none);
}

WeightPacking weight_packing(int64_t M, int64_t N, int64_t K, const KernelPolicy& policy) {
  if (M <= kDotRows || N == 0 || K == 0 || policy.bf16_products) return WeightPacking::none;
  const GemmBackend backend = policy.gemm_backend(M, N, K);
  if (backend == GemmBackend::blas || !gemm_backend_available(backend)) return WeightPacking::none;
#ifdef TINYLM_HAVE_LIBXSMM
  const bool small = 2.0 * static_cast<double>(M) * static_cast<double>(N) * static_cast<double>(K) <=
                     policy.small_gemm_flops;
  if (backend == GemmBackend::libxsmm && !small) return WeightPacking::panels;
#endif
  return WeightPacking::transposed;
}

void pack_weight(WeightPacking packing, const float* B, int64_t N, int64_t K, int64_t ldb, float* out) {
  TORCH_CHECK(packing != WeightPacking::none, "pack_weight: no packing to make");
#ifdef TINYLM_HAVE_LIBXSMM
  if (packing == WeightPacking::panels) return pack_transposed_panels(B, N, K, ldb, out);
#else
  TORCH_CHECK(packing == WeightPacking::transposed, "pack_weight: panels need libxsmm");
#endif
  transpose_into(B, N, K, ldb, out);
}

void gemm_prepacked(WeightPacking packing, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda,
                    const float* B, int64_t ldb, const float* packed, float* C, int64_t ldc, bool accumulate,
                    const KernelPolicy& policy) {
  TORCH_CHECK(packed && packing == weight_packing(M, N, K, policy), "gemm_prepacked: the weight was packed for ",
              "another product");
  gemm_with(false, true, M, N, K, A, lda, B, ldb, C, ldc, accumulate, policy, packed, packing);
}

std::string cpu_kernels_description() {
  std::string s = "products: ";
#ifdef TINYLM_HAVE_LIBXSMM
  if (libxsmm_works())
    s += std::string("libxsmm ") + LIBXSMM_CONFIG_VERSION + " (JIT for " + libxsmm_get_target_arch() + ")";
  else
    s += "libxsmm built in but unable to generate code here, hand kernel";
#else
  s += cpu_isa() != CpuIsa::generic ? "hand kernel (tinylm built without libxsmm)" : "BLAS";
#endif
  s += " up to " + std::to_string(static_cast<int64_t>(KernelPolicy{}.small_gemm_flops / 1e6)) + " MFLOP, ";
  const std::string blas = blas_sgemm_visible() ? "BLAS sgemm" : "LibTorch's matmul (no sgemm_ symbol visible)";
  const std::string core = blas_core().empty() ? "" : " (OpenBLAS " + blas_core() + ")";
  std::string large = blas + core;
#ifdef TINYLM_HAVE_LIBXSMM
  if (tiles_for_large_products())
    large = std::string("libxsmm's tiles (") + libxsmm_get_target_arch() + " code, as wide as " + large + " or wider)";
#endif
  s += large + " above";
  s += std::string("; loops: ") + to_string(cpu_isa());
  if (cpu::bf16_table().bf16_dot) s += " (bfloat16 attention on AVX512-BF16)";
  return s;
}

namespace cpu {
const KernelTable& table() {
  switch (cpu_isa()) {
    case CpuIsa::avx512: return *avx512_table();
    case CpuIsa::avx2: return *avx2_table();
    default: return generic_table();
  }
}

const KernelTable& bf16_table() {
  static const bool native = avx512bf16_table() != nullptr && cpu_has_avx512_bf16();
  return native && cpu_isa() == CpuIsa::avx512 ? *avx512bf16_table() : table();
}
}  // namespace cpu

}  // namespace tinylm::nn
