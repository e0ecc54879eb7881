// Internal: tinylm's own CPU loops for the fused ops, compiled once per instruction set.
//
// kernels.inc holds them, written with GCC/Clang vector extensions, and is compiled
// four times: kernels_avx512.cpp (16 floats per vector) with -mavx512f/dq/vl/bw,
// kernels_avx512bf16.cpp (the same with -mavx512bf16: its bfloat16 attention products on
// VDPBF16PS, every other loop as the AVX-512 set's), kernels_avx2.cpp (8) with -mavx2
// -mfma (x86-64 only; CMake adds the flags to those files alone), and kernels_generic.cpp
// (4) with the target's baseline (SSE2 on x86-64, NEON on arm64). table() hands out the
// widest set the CPU runs.
// No such file includes LibTorch or any C++ template library: an inline function emitted
// by both would be one symbol, and the linker could keep the AVX2 copy for everyone.
//
// Pointer layouts (float32, row-major): see src/nn/fused_attention.cpp for attention's;
// a matrix X(i, k) given as (X, row stride, column stride) may be a transposed view.
#pragma once

#include <cstdint>

namespace tinylm::nn::cpu {

/// Attention sizes: B batch, T sequence, D model width, H heads, Dh = D / H.
struct AttentionDims {
  int64_t B, T, D, H, Dh;
  float scale;  // 1 / sqrt(Dh)
  bool causal;
};

/// Floats of scratch attention_forward / attention_backward need: two (T, T16) tiles and
/// one (Dh, T16), T16 = T rounded up to a multiple of 16 (the widest set's padding).
inline int64_t attention_scratch_floats(const AttentionDims& s) {
  const int64_t Tp = (s.T + 15) / 16 * 16;
  return s.Dh * Tp + 2 * s.T * Tp;
}

/// Whether attention_forward_bf16 / attention_backward_bf16 take these sizes: T and Dh
/// multiples of 16.
inline bool attention_bf16_fits(const AttentionDims& s) { return s.T > 0 && s.T % 16 == 0 && s.Dh % 16 == 0; }

/// Heads of one batch element whose operands attention_forward_bf16 /
/// attention_backward_bf16 convert at once: each token's row read for all of them in turn,
/// one stretch of memory (a head's row alone is 2 cache lines at a stride of 3D floats,
/// which the hardware prefetcher does not follow), as many as fit 256 KB of bfloat16 copies
/// (the backward's seven, 3.5 T Dh floats a head), at least one.
inline int64_t attention_bf16_heads_packed(const AttentionDims& s) {
  const int64_t per_head = 7 * s.T * s.Dh / 2;
  const int64_t fit = per_head > 0 ? 65536 / per_head : 1;
  return fit < 1 ? 1 : fit > s.H ? s.H : fit;
}

/// Floats of scratch attention_forward_bf16 / attention_backward_bf16 need: the bfloat16
/// copies of the operands of attention_bf16_heads_packed heads (packed pairwise) and a
/// pair's (T, T) float32 tiles.
inline int64_t attention_bf16_scratch_floats(const AttentionDims& s) {
  return attention_bf16_heads_packed(s) * 7 * s.T * s.Dh / 2 + 4 * s.T * s.T;
}

/// One Adam(W) update's constants, from the step count and the learning rate.
struct AdamStep {
  float beta1, beta2, one_minus_beta1, one_minus_beta2, eps;
  float step_size;     // lr / (1 - beta1^t)
  float inv_sqrt_bc2;  // 1 / sqrt(1 - beta2^t)
  float decay;         // lr * weight_decay (AdamW), 0 for Adam and where AdamW does not decay
  float grad_scale = 1.f;  // each gradient multiplied by it first (gradient clipping's factor)
};

/// One instruction set's kernels.
struct KernelTable {
  const char* isa;  // "avx512", "avx2" or "generic"
  /// C(M x N) = A B, or += with accumulate; A(i, k) = A[i * a_row + k * a_col] (a
  /// transposed A is a_row = 1), B (K x N) row-major with row stride ldb, C row stride ldc.
  void (*gemm)(int64_t M, int64_t N, int64_t K, const float* A, int64_t a_row, int64_t a_col,
               const float* B, int64_t ldb, float* C, int64_t ldc, bool accumulate);
  /// Attention for the (batch, head) pairs [bh_begin, bh_end): qkv (B, T, 3D) -> out
  /// (B, T, D) heads merged, p (B, H, T, T) softmax weights (zero past i when causal).
  /// `scratch` holds attention_scratch_floats(s) floats (per thread).
  void (*attention_forward)(const AttentionDims& s, const float* qkv, float* out, float* p,
                            int64_t bh_begin, int64_t bh_end, float* scratch);
  /// Its backward for the same pairs: writes (does not add) their slices of dqkv (B, T, 3D).
  void (*attention_backward)(const AttentionDims& s, const float* qkv, const float* p,
                             const float* dout, float* dqkv, int64_t bh_begin, int64_t bh_end,
                             float* scratch);
  /// Rows [begin, end) of s (rows of length T, row r is query r % T), in place:
  /// softmax(scale * s) with keys past the query masked when causal.
  void (*masked_softmax_rows)(float* s, int64_t begin, int64_t end, int64_t T, float scale,
                              bool causal);
  /// Softmax cross-entropy over rows of z (N x V): returns the sum over rows whose target
  /// is not `ignore` of logsumexp(z) - z[target], and overwrites z with its gradient
  /// (softmax - onehot) * inv_count (zero rows where ignored). Targets must be in range.
  double (*softmax_cross_entropy)(float* z, const int64_t* targets, int64_t N, int64_t V,
                                  int64_t ignore, float inv_count);
  /// y[i] = exp(x[i]) (in place allowed): the vectorised exp the kernels use.
  void (*exp)(const float* x, float* y, int64_t n);
  /// y[i] = gelu(x[i]): x Φ(x) when exact, else the tanh approximation
  /// 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))); the factor of x to 2e-7 absolute
  /// where |x| <= 3.54 (exact: to 1.2e-7 relative beyond). Each element's result depends
  /// on it alone.
  void (*gelu_forward)(const float* x, float* y, int64_t n, bool exact);
  /// dx[i] = dy[i] gelu'(x[i]) (dx may be dy).
  void (*gelu_backward)(const float* x, const float* dy, float* dx, int64_t n, bool exact);
  /// LayerNorm over `rows` rows of D: y = (x - mean) rstd gain (+ bias), with each row's
  /// mean and rstd = 1 / sqrt(var + eps) written out. With `residual`, x + residual is
  /// written to h and normalised instead. bias and residual may be null. Without `center`,
  /// RMSNorm: the mean is taken as 0 (and written so), rstd = 1 / sqrt(mean(x^2) + eps).
  void (*layer_norm_forward)(const float* x, const float* residual, float* h, const float* gain,
                             const float* bias, float* y, float* mean, float* rstd, int64_t rows,
                             int64_t D, float eps, bool center);
  /// Its backward for those rows (x: what was normalised): dx, plus `dresidual` where given
  /// (a gradient that reaches x by another path); adds each row's dy x̂ into dgain (D) and
  /// dy into dbias (D, may be null).
  void (*layer_norm_backward)(const float* x, const float* dy, const float* gain, const float* mean,
                              const float* rstd, const float* dresidual, float* dx, float* dgain,
                              float* dbias, int64_t rows, int64_t D, bool center);
  /// Rotary positions: `groups` groups (one per token) of `heads` rows of 2 x half floats,
  /// the rows of group g at x + g * group_stride, one after another; each row's halves
  /// (a, b) become (a cos - b sin, b cos + a sin) with group g's cos and sin (half each,
  /// at cos + g * half), written to y packed (groups x heads x 2 half). `inverse` rotates
  /// the other way (sin negated): the backward.
  void (*rotate_halves)(const float* x, int64_t group_stride, const float* cos, const float* sin, float* y,
                        int64_t groups, int64_t heads, int64_t half, bool inverse);
  /// Adam(W) over n parameters held as flat arrays: p *= 1 - decay (s.decay: 0 where AdamW
  /// does not decay, so a caller splits the arrays at the decayed spans); m = beta1 m +
  /// (1 - beta1) g; v = beta2 v + (1 - beta2) g^2; p -= step_size m / (sqrt(v) inv_sqrt_bc2 + eps).
  void (*adam_step)(float* p, const float* g, float* m, float* v, int64_t n, const AdamStep& s);
  /// One new query per row over that row's cache (rows decoded together), for rows
  /// [b_begin, b_end): out[b, h] = softmax(scale K_b,g q[b, h]) V_b,g over the first
  /// lengths[b] + 1 cached positions, g = h / (H / Hkv) (grouped-query heads share theirs).
  /// q and out (B, H, Dh), keys and values (B, Hkv, capacity, Dh), all contiguous.
  /// `scores` holds capacity floats (per thread).
  void (*decode_attention)(const float* q, const float* keys, const float* values, float* out,
                           const int64_t* lengths, int64_t b_begin, int64_t b_end, int64_t H, int64_t Hkv,
                           int64_t capacity, int64_t Dh, float scale, float* scores);
  /// y[i] = x[i] as bfloat16 bits (round_to_bf16: to nearest, ties to even; NaN stays NaN).
  void (*round_bf16)(const float* x, uint16_t* y, int64_t n);
  /// C (M x N) = A Bᵀ, or += with accumulate: A (M x K) and B (N x K) row-major with row
  /// strides lda and ldb (a weight as Linear stores it), one dot product per entry: for a
  /// few rows, where copying B transposed for gemm would cost as much as the product.
  void (*gemm_bt_rows)(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B, int64_t ldb,
                       float* C, int64_t ldc, bool accumulate);
  /// rows x cols floats (packed) to bfloat16 bits as round_bf16 rounds them, and each
  /// column's float32 sum over the rows, in row order, added into colsum (cols floats).
  void (*round_bf16_colsum)(const float* x, uint16_t* y, int64_t rows, int64_t cols, float* colsum);
  /// attention_forward with its two T x T products on operands rounded to bfloat16 (q, k,
  /// the weights p, v), float32 sums; p and out float32 as ever. p may be null (the
  /// weights not kept: each pair's in scratch); with `lse` (B, H, T) each row's
  /// log-sum-exp of its scaled scores is written there, from which the backward
  /// recomputes the weights. Sizes as attention_bf16_fits allows; `scratch` holds
  /// attention_bf16_scratch_floats(s) floats.
  void (*attention_forward_bf16)(const AttentionDims& s, const float* qkv, float* out, float* p, float* lse,
                                 int64_t bh_begin, int64_t bh_end, float* scratch);
  /// attention_backward likewise: its four products on bfloat16 operands (do, v, p, ds, k,
  /// q). Given p, the weights are read from it; with p null, recomputed from q, k and lse
  /// (exp(scale q·k - lse), the same bfloat16 products as the forward's).
  void (*attention_backward_bf16)(const AttentionDims& s, const float* qkv, const float* p, const float* lse,
                                  const float* dout, float* dqkv, int64_t bh_begin, int64_t bh_end,
                                  float* scratch);
  /// Whether those two run AVX512-BF16's dot products (else the same arithmetic in float32).
  bool bf16_dot;
};

/// The generic set (always there), the AVX2, AVX-512 and AVX-512 + AVX512-BF16 sets
/// (nullptr where not compiled in).
const KernelTable& generic_table();
const KernelTable* avx2_table();
const KernelTable* avx512_table();
const KernelTable* avx512bf16_table();
/// Whether this CPU runs AVX512-BF16 code (and the AVX-512 set's).
bool cpu_has_avx512_bf16();
/// The set bfloat16 attention and the rounding to bfloat16 run: the AVX-512 set built with
/// AVX512-BF16 where the AVX-512 set is in use and the CPU has it, else table() (its
/// products emulated, its rounding in integer arithmetic: the same bits).
const KernelTable& bf16_table();
/// Whether this CPU runs AVX2 + FMA code.
bool cpu_has_avx2();
/// Whether this CPU and OS run AVX-512 F/DQ/VL/BW code (and AVX2 + FMA).
bool cpu_has_avx512();
/// The set in use (see tinylm::nn::set_cpu_isa).
const KernelTable& table();

}  // namespace tinylm::nn::cpu
