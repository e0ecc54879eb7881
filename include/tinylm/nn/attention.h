// Multi-head self-attention with one fused QKV projection.
// B = batch, T = sequence length, D = d_model, H = heads, Dh = D / H, C = max context
#pragma once

#include <tinylm/nn/kernel_policy.h>

#include <torch/nn/cloneable.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include <cstdint>
#include <ostream>
#include <string>

namespace tinylm::nn {

const char* to_string(AttentionKernel kernel);

struct MultiHeadSelfAttentionOptions {
  MultiHeadSelfAttentionOptions(int64_t d_model, int64_t n_heads, int64_t context_length)
      : d_model_(d_model), n_heads_(n_heads), context_length_(context_length) {}
  TORCH_ARG(int64_t, d_model);
  TORCH_ARG(int64_t, n_heads);
  TORCH_ARG(int64_t, context_length);
  /// Drop probability on the attention weights (training only). Default 0.
  TORCH_ARG(double, attn_dropout) = 0.0;
  /// Drop probability on the output projection (training only). Default 0.
  TORCH_ARG(double, out_dropout) = 0.0;
  /// Mask future positions (decoder). false = bidirectional (encoder).
  TORCH_ARG(bool, causal) = true;
  /// Biases on the QKV and output projections.
  TORCH_ARG(bool, bias) = true;
  /// Key/value heads (grouped-query attention): each serves n_heads / n_kv_heads query
  /// heads, and the KV cache holds only these. 0: one per query head (multi-head); 1:
  /// multi-query. Must divide n_heads.
  TORCH_ARG(int64_t, n_kv_heads) = 0;
  /// Rotary positions (RoPE) on queries and keys, with this base (LLaMA's 10000): each
  /// head's two halves are rotated by position x base^(-2i/Dh), i < Dh/2 (Dh must be even).
  /// 0: none.
  TORCH_ARG(double, rotary_base) = 0.0;

  /// The attention kernel (see AttentionKernel). Default: the fastest that applies.
  TORCH_ARG(AttentionKernel, kernel) = AttentionKernel::automatic;
  /// The thresholds and backends behind the kernel choices (the model's, when in one).
  TORCH_ARG(SharedKernelPolicy, kernel_policy) = std::make_shared<const KernelPolicy>();
};

/// What attention returns: the output (B, T, D) and, when asked, weights (B, H, T, T).
struct AttentionOutput {
  torch::Tensor output;
  torch::Tensor weights;  // undefined unless requested
};

/// (B, T, D) -> (B, H, T, D/H): view then transpose.
torch::Tensor split_heads(const torch::Tensor& x, int64_t n_heads);
/// (B, H, T, Dh) -> (B, T, H*Dh): the inverse of split_heads.
torch::Tensor merge_heads(const torch::Tensor& x);

/// Self-attention through at::scaled_dot_product_attention: qkv (B, T, 3D) as the fused
/// projection gives it -> merged heads (B, T, D), with the causal flag and dropout (0 =
/// none) passed through. Throws where sdpa_available() is false.
torch::Tensor sdpa_self_attention(const torch::Tensor& qkv, int64_t n_heads, bool causal,
                                  double dropout_p = 0.0);

/// Rows of different lengths decoded together, one new token each (continuous batching:
/// see LanguageModelImpl::forward_rows). Made once per step by decode_rows() and handed to
/// every layer.
struct DecodeRows {
  std::vector<int64_t> lengths;  // each row's tokens before this step: its new token's position
  torch::Tensor positions;       // the same, (B) int64 on the model's device
  torch::Tensor allowed;         // (B, 1, 1, span) bool: the cached columns each row's new query sees;
                                 // undefined when every row has the same length (it sees them all)
  int64_t span = 0;              // max(lengths) + 1: the columns any row reads
};
DecodeRows decode_rows(std::vector<int64_t> lengths, const torch::Device& device);

class MultiHeadSelfAttentionImpl : public torch::nn::Cloneable<MultiHeadSelfAttentionImpl> {
 public:
  explicit MultiHeadSelfAttentionImpl(const MultiHeadSelfAttentionOptions& options);
  void reset() override;
  void reset_parameters();
  void pretty_print(std::ostream& os) const override;

  /// x: (B, T, D). padding_mask (optional): (B, T) bool, true where the token is real;
  /// keys at padded positions receive no attention. A query that can see no key at all
  /// (e.g. a left-padded position under the causal mask) gets all-zero weights.
  AttentionOutput forward(const torch::Tensor& x, bool return_weights = false,
                          const torch::Tensor& padding_mask = {});

  /// Incremental decoding: x holds the new tokens (B, Tn, D); keys/values (B, Hkv, Tc, Dh)
  /// hold the earlier ones (undefined when empty) and are extended in place. The new
  /// queries sit at positions Tc .. Tc + Tn - 1. Eval only (no dropout). With last_only,
  /// only the last new token's output (B, 1, D): every key and value is still kept.
  torch::Tensor forward_cached(const torch::Tensor& x, torch::Tensor& keys, torch::Tensor& values,
                               bool last_only = false);

  /// One new token for each of B rows of different lengths: x (B, 1, D); keys/values (B,
  /// Hkv, >= rows.span, Dh) hold row b's earlier tokens in columns [0, rows.lengths[b]).
  /// Each row's new key and value are written in place at its column lengths[b], and its
  /// query (at position lengths[b]) sees columns [0, lengths[b]]. Eval only.
  torch::Tensor forward_rows(const torch::Tensor& x, torch::Tensor& keys, torch::Tensor& values,
                             const DecodeRows& rows);

  /// The kernel forward() runs for input x (B, T, D): options.kernel() where it applies,
  /// else the step-by-step path, as options.kernel_policy() decides (KernelPolicy).
  AttentionKernel kernel_for(const torch::Tensor& x, bool return_weights,
                             bool has_padding_mask) const;

  /// The projection's output (B, T, D + 2 Hkv Dh) as [q | k | v] of H heads each (B, T,
  /// 3D), what every kernel takes: rotated for positions start .. start + T - 1 where
  /// rotary, key/value heads repeated for their query heads where grouped; else qkv itself.
  torch::Tensor full_qkv(const torch::Tensor& qkv, int64_t start) const;

  int64_t d_head() const { return options.d_model() / options.n_heads(); }
  int64_t n_heads() const { return options.n_heads(); }
  /// Key/value heads: options.n_kv_heads(), or n_heads() where that is 0.
  int64_t n_kv_heads() const { return options.n_kv_heads() > 0 ? options.n_kv_heads() : options.n_heads(); }

  MultiHeadSelfAttentionOptions options;
  torch::nn::Linear qkv_proj{nullptr};  // D -> D + 2 Hkv Dh, output split as q | k | v
  torch::nn::Linear out_proj{nullptr};  // D -> D
};
TORCH_MODULE(MultiHeadSelfAttention);

}  // namespace tinylm::nn
