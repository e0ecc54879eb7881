// The CPU kernels behind tinylm's fused ops (the whole-model TinyAttentionLM loss and the
// fused attention): the matrix-product backends, and the instruction set tinylm's own
// loops use. Which backend computes a product is the model's KernelPolicy's choice
// (kernel_policy.h); the instruction set is the machine's, detected once (its setter
// exists for comparisons and to step around a platform problem, and is process-wide).
#pragma once

#include <cstdint>
#include <string>

namespace tinylm::nn {

/// Who computes a matrix product.
enum class GemmBackend {
  /// By shape (KernelPolicy::gemm_backend): small products go to libxsmm where tinylm was
  /// built with it, else to the hand kernel where the AVX2 or AVX-512 loops run, else BLAS; larger
  /// ones to BLAS (multi-threaded).
  automatic,
  /// libxsmm's JIT-generated kernels (Debian: libxsmm-dev), x86-64 only.
  libxsmm,
  /// sgemm of the BLAS LibTorch loads (OpenBLAS on Debian), called directly where its
  /// symbol is visible, else through LibTorch's matmul.
  blas,
  /// tinylm's register-blocked loop, compiled for the instruction set in use (CpuIsa).
  hand,
};

/// The instruction set of tinylm's own CPU loops (attention, softmax, the hand product).
enum class CpuIsa {
  automatic,  ///< the widest set built in that the CPU runs: avx512, avx2, then generic
  generic,    ///< the target's baseline (SSE2 on x86-64, NEON on arm64)
  avx2,       ///< AVX2 + FMA (x86-64), 8 floats per vector
  avx512,     ///< AVX-512 F/DQ/VL/BW + FMA (x86-64), 16 floats per vector
};

const char* to_string(GemmBackend backend);
const char* to_string(CpuIsa isa);
/// "automatic" | "libxsmm" | "blas" | "hand"; throws on anything else.
GemmBackend gemm_backend_from_string(const std::string& name);

/// Whether the backend / instruction set can run here (built in, and the CPU has it).
bool gemm_backend_available(GemmBackend backend);
bool cpu_isa_available(CpuIsa isa);

/// The CPU core OpenBLAS picked its kernels for ("Haswell", "SkylakeX", ...; the
/// OPENBLAS_CORETYPE variable can hold it below the CPU), "" where the BLAS is not OpenBLAS.
std::string blas_core_name();
/// Whether products above the small size go to libxsmm's tiles (KernelPolicy::large_gemm
/// automatic): where libxsmm works and writes code at least as wide as the BLAS's kernels
/// (AVX-512, or AVX2 against an OpenBLAS core without AVX-512). The tiles are on par with
/// OpenBLAS at equal width and run on LibTorch's threads, so the BLAS's own thread pool
/// stays at one thread instead of spinning on the cores those threads need.
bool tiles_for_large_products();

/// The instruction set tinylm's loops use from now on; throws if unavailable.
void set_cpu_isa(CpuIsa isa);
CpuIsa cpu_isa();  ///< the one in use: generic, avx2 or avx512, never automatic

/// C (M x N) = op(A) op(B), or C += op(A) op(B) with accumulate; float32, row-major, each
/// matrix with its own row stride (lda, ldb, ldc). op(X) is X, or Xᵀ when trans_*: A is
/// then stored K x M, B N x K. `backend` automatic: a default KernelPolicy's choice for
/// the shape. Throws if `backend` is not available here.
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const float* A,
          int64_t lda, const float* B, int64_t ldb, float* C, int64_t ldc,
          bool accumulate = false, GemmBackend backend = GemmBackend::automatic);

struct KernelPolicy;  // kernel_policy.h
/// The same product on the backend `policy` picks for its shape (gemm_backend), a small
/// one (policy.small_gemm_flops) as one libxsmm kernel, a larger one in its tiles.
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const float* A,
          int64_t lda, const float* B, int64_t ldb, float* C, int64_t ldc, bool accumulate,
          const KernelPolicy& policy);

/// Where the kernel choices sent the work since the process started: products gemm() ran
/// on each backend (the one chosen; libxsmm falls back inside for a shape it has no kernel
/// for), and fused-attention passes, forward and backward, whose T x T products went
/// through BLAS or the loops (attention_bf16: those of the loops' passes whose products
/// took bfloat16 operands). Tests and profiles compare two readings.
struct KernelCounts {
  int64_t gemm_libxsmm = 0, gemm_blas = 0, gemm_hand = 0, gemm_bf16 = 0;
  int64_t attention_blas = 0, attention_loops = 0, attention_bf16 = 0;
  /// Whole-model fused losses run (KernelPolicy::fuse_whole_model): the TransformerLM's.
  int64_t fused_models = 0;
  /// Seconds inside gemm_bf16's products (their calls' wall times, summed over calls).
  double gemm_bf16_seconds = 0;
  KernelCounts operator-(const KernelCounts& earlier) const;
};
KernelCounts kernel_counts();

/// One line for logs and benchmark output, e.g.
/// "products: libxsmm 1.17 (JIT, avx512_...) for small, BLAS sgemm for large; loops: avx2".
std::string cpu_kernels_description();

/// x rounded to bfloat16 (to nearest, ties to even; NaN stays NaN), as a float.
float round_to_bf16(float x);
/// n floats rounded as above, as bfloat16 bits (the upper half of a float32's), through the
/// vectorised loops of the instruction set in use (cpu_isa()).
void round_to_bf16(const float* x, uint16_t* y, int64_t n);

/// bfloat16 products (issue 40): C (+)= op(A) op(B) as gemm() takes them, with A and B
/// rounded to bfloat16 (round_to_bf16) and the products summed in float32, by oneDNN's
/// kernel for this CPU (AMX tiles, AVX512-BF16 dot products). Throws where
/// bf16_products_missing() says why not.
void gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda,
               const float* B, int64_t ldb, float* C, int64_t ldc, bool accumulate);
/// The same with operands already in bfloat16 (bits as round_to_bf16 writes them), stored
/// as gemm() takes them: a weight rounded once serves every product until it changes.
/// `bias` (N floats, or null) is added to every row of C, in float32, in the same pass.
void gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const uint16_t* A, int64_t lda,
               const uint16_t* B, int64_t ldb, float* C, int64_t ldc, bool accumulate,
               const float* bias = nullptr);

/// "" where gemm_bf16 runs here, else why not: a build without oneDNN, or a CPU without
/// bfloat16 instructions (there oneDNN converts to float32, slower than float32 itself).
/// With the environment's TINYLM_BF16_EMULATION=1, "" everywhere: the products are then
/// emulated in float32 (operands rounded, widened, multiplied by gemm()), slower than
/// float32, so that the bfloat16 path is tested on any machine. Any value but 0 or 1 throws.
std::string bf16_products_missing();

/// Whether gemm_bf16 is the float32 emulation (TINYLM_BF16_EMULATION=1).
bool bf16_products_emulated();

/// What gemm_bf16 runs here ("bfloat16 products: oneDNN 2.6 (brg:avx512_core_amx_bf16 ...)"),
/// or why it does not.
std::string bf16_products_description();

}  // namespace tinylm::nn
