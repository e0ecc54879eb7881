// Every kernel choice a model makes, in one value: which attention computation runs a
// call, from which length the fused attention's T x T products go through BLAS, which
// products count as small, who computes small and large ones, whether Linear layers and
// GELU run on tinylm's kernels, and whether the tiny model runs as one op.
// A model holds its own (options().kernel_policy(), set_kernel_policy()), one object that
// its modules share; nothing here is process-wide. The instruction set of tinylm's loops is the machine's (cpu_kernels.h).
#pragma once

#include <tinylm/nn/cpu_kernels.h>

#include <cstdint>
#include <memory>

namespace tinylm::nn {

/// Which computation MultiHeadSelfAttention runs from the QKV projection to the merged
/// heads. All compute the same function; a kernel that does not apply to a call (see
/// each) falls back to the step-by-step path.
enum class AttentionKernel {
  /// The fastest that applies, as measured (KernelPolicy::attention_kernel): with
  /// LibTorch >= 2, SDPA on CUDA and on the CPU from sdpa_cpu_min_seq_len; otherwise
  /// tinylm's fused CPU kernel (float32); otherwise SDPA (LibTorch >= 2); otherwise step
  /// by step.
  automatic,
  /// Step by step: scores, mask, softmax, dropout, weighted sum. Always applies.
  plain,
  /// tinylm's fused CPU kernel (src/nn/fused_attention.h): float32 on the CPU, no padding
  /// mask, no attention dropout in training, no weights asked for with autograd on.
  fused,
  /// at::scaled_dot_product_attention (flash / memory-efficient kernels on CUDA): needs
  /// LibTorch >= 2, no padding mask, no weights asked for. Dropout is passed through.
  sdpa,
};

/// What an attention call is: what decides the kernel that can run it.
struct AttentionCall {
  bool cuda = false;              // the input is on a CUDA device
  bool fused_supported = false;   // float32 on the CPU, rank 3 (what the fused kernel takes)
  int64_t seq_len = 0;            // T
  bool padding_mask = false;      // a padding mask is given
  bool dropout = false;           // attention dropout is active (training, p > 0)
  bool return_weights = false;    // the weights are asked for
  bool grad_enabled = false;      // autograd is on (the fused kernel's weights carry no gradient)
};

/// The default of KernelPolicy::sdpa_cpu_min_seq_len for the loops in use (cpu_isa()):
/// never (INT64_MAX) where they run AVX-512, else 64.
int64_t default_sdpa_cpu_min_seq_len();

struct KernelPolicy {
  /// SDPA on the CPU from this sequence length (where LibTorch has it), when automatic
  /// would otherwise pick the fused kernel. Set when the policy is made, from the loops
  /// in use; the measurements behind the default (`tinylm bench --cases attention`) are
  /// in docs/performance.md, not here, so that a new measurement recompiles nothing.
  int64_t sdpa_cpu_min_seq_len = default_sdpa_cpu_min_seq_len();
  /// The fused attention's two T x T products through BLAS batched matmuls from this
  /// length; shorter ones are faster as plain loops (no copies, no per-call overhead,
  /// half the work under the causal mask). The default is the shortest length at which
  /// BLAS has not lost (docs/performance.md).
  int64_t attention_blas_min_seq_len = 512;
  /// Products up to this many flops (2 M N K) count as small: nearly all call overhead
  /// in BLAS, where libxsmm's JIT kernels take a fraction of the time.
  double small_gemm_flops = 8.0 * 1024 * 1024;
  /// Who computes the fused ops' products: automatic (by shape, gemm_backend()), or one
  /// backend for all (comparisons, or stepping around a platform problem).
  GemmBackend gemm = GemmBackend::automatic;
  /// Who computes products above small_gemm_flops (when `gemm` is automatic): automatic
  /// is libxsmm's kernels in tiles over the intra-op threads where its code is as wide as
  /// the BLAS's or wider (nn::tiles_for_large_products()), else BLAS.
  GemmBackend large_gemm = GemmBackend::automatic;
  /// Linear layers (the transformer's projections, MLP and head) compute their products
  /// with tinylm's gemm, the bias added in the product, wherever the input is float32 on
  /// the CPU and the forward product is above small_gemm_flops and goes to a backend
  /// other than BLAS (else LibTorch's linear runs them, as before).
  bool linear_products = true;
  /// Mixed precision on the CPU (issue 40): every product gemm runs for the model (its
  /// Linear layers at every size, wherever the input is float32 on the CPU, and the tiny
  /// model's fused op) in bfloat16 (gemm_bf16: operands rounded to bfloat16, sums in
  /// float32), the weights rounded once per change, and so do the fused attention's T x T
  /// products on its loops where T and the head width are multiples of 16 (AVX512-BF16's
  /// dot products where the CPU has them); everything else (softmax, norms, the loss, the
  /// optimizer, the weights themselves) stays float32. Set only where
  /// bf16_products_missing() is empty; gemm throws elsewhere.
  bool bf16_products = false;
  /// With bf16_products, the fused attention's T x T products in bfloat16 too (where they
  /// fit, above); false keeps them float32 (the products of the Linear layers alone).
  bool bf16_attention = true;
  /// GELU (the transformer's MLP, exact or tanh) through tinylm's vectorised loops over
  /// the intra-op threads wherever its input is float32 on the CPU (else LibTorch's).
  bool gelu_loops = true;
  /// LayerNorm through tinylm's vectorised loops over the intra-op threads wherever its
  /// input is float32 on the CPU (else LibTorch's), with a pre-LN block's residual add
  /// in the same pass.
  bool layer_norm_loops = true;
  /// Rotary positions through tinylm's vectorised loops over the intra-op threads
  /// wherever the queries and keys are float32 on the CPU (else LibTorch's ops).
  bool rotary_loops = true;
  /// The tiny model's training loss as one op (embedding to cross-entropy) wherever its
  /// attention would run the fused kernel with its T x T products on the loops; and the
  /// pre-LN TransformerLM's, with bfloat16 products on the CPU, where its blocks are what
  /// that op computes (TransformerLMImpl::loss).
  bool fuse_whole_model = true;

  /// The kernel that runs `call` when `requested` is asked for.
  AttentionKernel attention_kernel(AttentionKernel requested, const AttentionCall& call) const;
  /// The backend of a product of this shape: small ones to libxsmm where it works, else
  /// the hand kernel where the AVX2 or AVX-512 loops run, else BLAS; large ones as large_gemm says.
  GemmBackend gemm_backend(int64_t M, int64_t N, int64_t K) const;
  /// Whether a Linear layer's (M x K) by (N x K)ᵀ product runs tinylm's gemm (see
  /// linear_products).
  bool linear_uses_gemm(int64_t M, int64_t N, int64_t K) const;
  /// Whether the fused attention's T x T products go through BLAS at this length.
  bool attention_products_use_blas(int64_t seq_len) const { return seq_len >= attention_blas_min_seq_len; }
};

/// The policy a module follows, in its options: a model's modules all hold the model's one
/// object, so that set_kernel_policy() changes it for every one at once (and the autograd
/// functions keep a copy of the forward's for its backward); a module made alone holds a
/// default of its own.
using SharedKernelPolicy = std::shared_ptr<const KernelPolicy>;

/// Whether this LibTorch has at::scaled_dot_product_attention (2.0 and later).
bool sdpa_available();

}  // namespace tinylm::nn
