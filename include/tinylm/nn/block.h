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

/// The MLP's nonlinearity: GELU with the tanh approximation (GPT-2's, tinylm's default)
/// or exact GELU (erf; PyTorch's nn.GELU() and nanoGPT's).
enum class Activation { gelu_tanh, gelu };
const char* to_string(Activation a);
/// "gelu-tanh" | "gelu"; throws on anything else.
Activation activation_from_string(const std::string& s);

struct LayerNormOptions {
  explicit LayerNormOptions(int64_t d_model) : d_model_(d_model) {}
  TORCH_ARG(int64_t, d_model);
  TORCH_ARG(double, eps) = 1e-5;
  /// false: a gain only, no bias (nanoGPT's bias=False).
  TORCH_ARG(bool, bias) = true;
  /// Whether tinylm's loops compute it (KernelPolicy::layer_norm_loops).
  TORCH_ARG(SharedKernelPolicy, kernel_policy) = std::make_shared<const KernelPolicy>();
};

/// LayerNorm over the last dimension (D) with a learned gain (ones at first) and,
/// optionally, a learned bias (zeros): torch::nn::LayerNorm has both or neither.
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
  torch::Tensor weight;  // (D)
  torch::Tensor bias;    // (D), or undefined without a bias
};
TORCH_MODULE(LayerNorm);

struct FeedForwardOptions {
  explicit FeedForwardOptions(int64_t d_model) : d_model_(d_model) {}
  TORCH_ARG(int64_t, d_model);
  /// Hidden width = expansion * d_model.
  TORCH_ARG(int64_t, expansion) = 4;
  /// Dropout after the second projection (training only).
  TORCH_ARG(double, dropout) = 0.0;
  TORCH_ARG(bool, bias) = true;
  TORCH_ARG(Activation, activation) = Activation::gelu_tanh;
  /// Who computes the two projections' products (KernelPolicy::linear_products).
  TORCH_ARG(SharedKernelPolicy, kernel_policy) = std::make_shared<const KernelPolicy>();
};

/// Linear(D, eD) -> GELU (tanh approximation, or exact) -> Linear(eD, D) -> dropout.
class FeedForwardImpl : public torch::nn::Cloneable<FeedForwardImpl> {
 public:
  explicit FeedForwardImpl(const FeedForwardOptions& options);
  void reset() override;
  void pretty_print(std::ostream& os) const override;
  torch::Tensor forward(const torch::Tensor& x);  // (B, T, D) -> (B, T, D)

  FeedForwardOptions options;
  torch::nn::Linear fc{nullptr};    // D -> eD
  torch::nn::Linear proj{nullptr};  // eD -> D (a residual projection)
};
TORCH_MODULE(FeedForward);

struct TransformerBlockOptions {
  TransformerBlockOptions(int64_t d_model, int64_t n_heads, int64_t context_length)
      : d_model_(d_model), n_heads_(n_heads), context_length_(context_length) {}
  TORCH_ARG(int64_t, d_model);
  TORCH_ARG(int64_t, n_heads);
  TORCH_ARG(int64_t, context_length);
  TORCH_ARG(int64_t, mlp_expansion) = 4;
  TORCH_ARG(double, attn_dropout) = 0.0;
  /// Dropout on each residual branch (attention output and MLP output).
  TORCH_ARG(double, residual_dropout) = 0.0;
  TORCH_ARG(bool, bias) = true;
  /// Biases in the two LayerNorms (false: gains only, as nanoGPT's bias=False).
  TORCH_ARG(bool, layer_norm_bias) = true;
  /// true: x + attn(ln1(x)), x + mlp(ln2(x)).  false: ln1(x + attn(x)), ln2(x + mlp(x)).
  TORCH_ARG(bool, pre_ln) = true;
  TORCH_ARG(Activation, activation) = Activation::gelu_tanh;
  TORCH_ARG(bool, causal) = true;
  TORCH_ARG(double, ln_eps) = 1e-5;
  TORCH_ARG(AttentionKernel, attention_kernel) = AttentionKernel::automatic;
  /// Shared by its attention, MLP and LayerNorms.
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

  /// Incremental decoding through the block (see MultiHeadSelfAttention::forward_cached).
  torch::Tensor forward_cached(const torch::Tensor& x, torch::Tensor& keys, torch::Tensor& values);

  TransformerBlockOptions options;
  LayerNorm ln1{nullptr};
  MultiHeadSelfAttention attn{nullptr};
  LayerNorm ln2{nullptr};
  FeedForward mlp{nullptr};
};
TORCH_MODULE(TransformerBlock);

}  // namespace tinylm::nn
