// FeedForward and the transformer block (pre-LN or post-LN).
// B = batch, T = sequence length, D = d_model, H = heads
#pragma once

#include <tinylm/nn/attention.h>
#include <tinylm/nn/kernel_policy.h>

#include <torch/nn/cloneable.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include <string>
#include <utility>

namespace tinylm::nn {

/// The MLP's nonlinearity: GELU with the tanh approximation (GPT-2's, tinylm's default),
/// exact GELU (erf; PyTorch's nn.GELU() and nanoGPT's), or SwiGLU (LLaMA's gated MLP:
/// silu(x W_gate) * (x W_up), then the projection).
enum class Activation { gelu_tanh, gelu, swiglu };
const char* to_string(Activation a);

/// LayerNorm: (x - mean) / sqrt(var + eps). RMSNorm: x / sqrt(mean(x^2) + eps), no mean
/// taken away (LLaMA's).
enum class NormKind { layer_norm, rms_norm };
const char* to_string(NormKind n);

struct LayerNormOptions {
  explicit LayerNormOptions(int64_t d_model) : d_model_(d_model) {}
  TORCH_ARG(int64_t, d_model);
  TORCH_ARG(double, eps) = 1e-5;
  TORCH_ARG(NormKind, kind) = NormKind::layer_norm;
  /// A learned gain (ones at first); false: none.
  TORCH_ARG(bool, gain) = true;
  /// A learned bias (zeros at first); false: none (nanoGPT's bias=False; LLaMA's RMSNorm).
  TORCH_ARG(bool, bias) = true;
  /// Whether tinylm's loops compute it (KernelPolicy::layer_norm_loops).
  TORCH_ARG(SharedKernelPolicy, kernel_policy) = std::make_shared<const KernelPolicy>();
};

/// LayerNorm or RMSNorm over the last dimension (D), with a learned gain and a learned
/// bias, each optional (torch::nn::LayerNorm has both or neither).
class LayerNormImpl : public torch::nn::Cloneable<LayerNormImpl> {
 public:
  explicit LayerNormImpl(const LayerNormOptions& options);
  void reset() override;
  void reset_parameters();
  void pretty_print(std::ostream& os) const override;
  torch::Tensor forward(const torch::Tensor& x);  // (..., D) -> (..., D)
  /// {x + r, forward(x + r)}: a residual add and the LayerNorm after it, in one pass
  /// where tinylm's loops run.
  std::pair<torch::Tensor, torch::Tensor> forward_residual(const torch::Tensor& x, const torch::Tensor& r);

  LayerNormOptions options;
  torch::Tensor weight;  // (D), or undefined without a gain
  torch::Tensor bias;    // (D), or undefined without a bias
};
TORCH_MODULE(LayerNorm);

struct FeedForwardOptions {
  explicit FeedForwardOptions(int64_t d_model) : d_model_(d_model) {}
  TORCH_ARG(int64_t, d_model);
  /// Hidden width = expansion * d_model, unless `hidden` is set.
  TORCH_ARG(int64_t, expansion) = 4;
  /// Hidden width; 0: expansion * d_model. (SwiGLU's two input projections each have it.)
  TORCH_ARG(int64_t, hidden) = 0;
  /// Dropout after the second projection (training only).
  TORCH_ARG(double, dropout) = 0.0;
  TORCH_ARG(bool, bias) = true;
  TORCH_ARG(Activation, activation) = Activation::gelu_tanh;
  /// Who computes the two projections' products (KernelPolicy::linear_products).
  TORCH_ARG(SharedKernelPolicy, kernel_policy) = std::make_shared<const KernelPolicy>();
};

/// Linear(D, F) -> GELU (tanh approximation, or exact) -> Linear(F, D) -> dropout, F the
/// hidden width; SwiGLU: Linear(D, 2F) as [gate | up] -> silu(gate) * up -> Linear(F, D).
class FeedForwardImpl : public torch::nn::Cloneable<FeedForwardImpl> {
 public:
  explicit FeedForwardImpl(const FeedForwardOptions& options);
  void reset() override;
  void pretty_print(std::ostream& os) const override;
  torch::Tensor forward(const torch::Tensor& x);  // (B, T, D) -> (B, T, D)
  /// The hidden width F.
  int64_t hidden() const { return options.hidden() > 0 ? options.hidden() : options.expansion() * options.d_model(); }

  FeedForwardOptions options;
  torch::nn::Linear fc{nullptr};    // D -> F (SwiGLU: 2F, gate then up)
  torch::nn::Linear proj{nullptr};  // F -> D (a residual projection)
};
TORCH_MODULE(FeedForward);

/// A block's options hold its parts' options: each setting lives where it is used (the
/// attention's dropout in `attention`, the MLP's width in `mlp`, the norms' bias in
/// `norm`). The shape (width, heads, context) is set once, here, for every part.
struct TransformerBlockOptions {
  TransformerBlockOptions(int64_t d_model, int64_t n_heads, int64_t context_length)
      : attention_(d_model, n_heads, context_length), mlp_(d_model), norm_(d_model) {}
  int64_t d_model() const { return attention_.d_model(); }
  int64_t n_heads() const { return attention_.n_heads(); }
  int64_t context_length() const { return attention_.context_length(); }
  /// Sets the shape of the attention, the MLP and the norms.
  TransformerBlockOptions& shape(int64_t d_model, int64_t n_heads, int64_t context_length) {
    attention_.d_model(d_model).n_heads(n_heads).context_length(context_length);
    mlp_.d_model(d_model);
    norm_.d_model(d_model);
    return *this;
  }
  /// The self-attention (attn); its out_dropout is the residual dropout of its branch.
  TORCH_ARG(MultiHeadSelfAttentionOptions, attention);
  /// The MLP (mlp); its dropout is the residual dropout of its branch.
  TORCH_ARG(FeedForwardOptions, mlp);
  /// Both norms (ln1, ln2).
  TORCH_ARG(LayerNormOptions, norm);
  /// true: x + attn(ln1(x)), x + mlp(ln2(x)).  false: ln1(x + attn(x)), ln2(x + mlp(x)).
  TORCH_ARG(bool, pre_ln) = true;
  /// The policy of every part: reset() gives this one to the attention, MLP and norms.
  TORCH_ARG(SharedKernelPolicy, kernel_policy) = std::make_shared<const KernelPolicy>();
};

class TransformerBlockImpl : public torch::nn::Cloneable<TransformerBlockImpl> {
 public:
  explicit TransformerBlockImpl(const TransformerBlockOptions& options);
  void reset() override;
  void pretty_print(std::ostream& os) const override;
  /// x: (B, T, D) -> (B, T, D); weights (B, H, T, T) when asked.
  AttentionOutput forward(const torch::Tensor& x, bool return_weights = false,
                          const torch::Tensor& padding_mask = {});
  /// Pre-LN blocks only: the same output as forward's, as two terms {h, m} (output = h + m),
  /// from an input given as two terms too (x = x0 + x1; x1 undefined: x0 alone). The sum
  /// of the two terms is made by the norm that reads it (LayerNorm::forward_residual, one
  /// pass where tinylm's loops run), so a stack of blocks passes its residual stream on
  /// without an add of its own, forward or backward.
  std::pair<torch::Tensor, torch::Tensor> forward_terms(const torch::Tensor& x0, const torch::Tensor& x1,
                                                        const torch::Tensor& padding_mask = {});

  /// Incremental decoding through the block (see MultiHeadSelfAttention::forward_cached);
  /// with last_only, the last new token's output alone (B, 1, D).
  torch::Tensor forward_cached(const torch::Tensor& x, torch::Tensor& keys, torch::Tensor& values,
                               bool last_only = false);
  /// The same for rows of different lengths (see MultiHeadSelfAttention::forward_rows).
  torch::Tensor forward_rows(const torch::Tensor& x, torch::Tensor& keys, torch::Tensor& values,
                             const DecodeRows& rows);

  TransformerBlockOptions options;
  LayerNorm ln1{nullptr};
  MultiHeadSelfAttention attn{nullptr};
  LayerNorm ln2{nullptr};
  FeedForward mlp{nullptr};
};
TORCH_MODULE(TransformerBlock);

}  // namespace tinylm::nn
