// FeedForward and the transformer block.
// B = batch, T = sequence length, D = d_model, e = mlp expansion
#include <tinylm/nn/block.h>
#include <tinylm/log.h>
#include "nn/gelu.h"
#include "nn/layer_norm.h"
#include "nn/linear.h"

#include <torch/torch.h>

namespace tinylm::nn {

// ---- LayerNorm -----------------------------------------------------------------

LayerNormImpl::LayerNormImpl(const LayerNormOptions& options_) : options(options_) { reset(); }

void LayerNormImpl::reset() {
  const int64_t D = options.d_model();
  TORCH_CHECK(D >= 1, "LayerNorm: d_model must be >= 1, got ", D);
  TORCH_CHECK(options.eps() > 0, "LayerNorm: eps must be > 0, got ", options.eps());
  weight = register_parameter("weight", torch::empty({D}));
  if (options.bias()) bias = register_parameter("bias", torch::empty({D}));
  else bias = torch::Tensor();
  reset_parameters();
}

void LayerNormImpl::reset_parameters() {
  torch::NoGradGuard no_grad;
  weight.fill_(1.0);
  if (bias.defined()) bias.zero_();
}

void LayerNormImpl::pretty_print(std::ostream& os) const {
  os << "tinylm::nn::LayerNorm(d_model=" << options.d_model() << ", eps=" << options.eps()
     << ", bias=" << (options.bias() ? "true" : "false") << ")";
}

torch::Tensor LayerNormImpl::forward(const torch::Tensor& x) {
  return layer_norm(x, weight, bias, options.eps(), *options.kernel_policy());
}

std::pair<torch::Tensor, torch::Tensor> LayerNormImpl::forward_residual(const torch::Tensor& x,
                                                                        const torch::Tensor& r) {
  return add_layer_norm(x, r, weight, bias, options.eps(), *options.kernel_policy());
}

// ---- FeedForward ---------------------------------------------------------------

FeedForwardImpl::FeedForwardImpl(const FeedForwardOptions& options_) : options(options_) {
  reset();
}

const char* to_string(Activation a) { return a == Activation::gelu ? "gelu" : "gelu-tanh"; }

Activation activation_from_string(const std::string& s) {
  if (s == "gelu-tanh") return Activation::gelu_tanh;
  if (s == "gelu") return Activation::gelu;
  TORCH_CHECK(false, "unknown activation '", printable(s), "': use gelu-tanh or gelu");
  return Activation::gelu_tanh;
}

void FeedForwardImpl::reset() {
  const int64_t D = options.d_model(), e = options.expansion();
  TORCH_CHECK(D >= 1, "FeedForward: d_model must be >= 1, got ", D);
  TORCH_CHECK(e >= 1, "FeedForward: expansion must be >= 1, got ", e);
  TORCH_CHECK(options.dropout() >= 0 && options.dropout() < 1,
              "FeedForward: dropout must be in [0, 1), got ", options.dropout());
  fc = register_module("fc", torch::nn::Linear(torch::nn::LinearOptions(D, e * D).bias(options.bias())));
  proj = register_module("proj",
                         torch::nn::Linear(torch::nn::LinearOptions(e * D, D).bias(options.bias())));
}

void FeedForwardImpl::pretty_print(std::ostream& os) const {
  os << "tinylm::nn::FeedForward(d_model=" << options.d_model()
     << ", expansion=" << options.expansion() << ")";
}

torch::Tensor FeedForwardImpl::forward(const torch::Tensor& x) {
  const KernelPolicy& policy = *options.kernel_policy();
  auto h = gelu(linear(x, fc->weight, fc->bias, policy), options.activation() == Activation::gelu, policy);  // (B, T, eD)
  return torch::dropout(linear(h, proj->weight, proj->bias, policy), options.dropout(), is_training());    // (B, T, D)
}

// ---- TransformerBlock ----------------------------------------------------------

TransformerBlockImpl::TransformerBlockImpl(const TransformerBlockOptions& options_)
    : options(options_) {
  reset();
}

void TransformerBlockImpl::reset() {
  const int64_t D = options.d_model();
  TORCH_CHECK(options.residual_dropout() >= 0 && options.residual_dropout() < 1,
              "TransformerBlock: residual_dropout must be in [0, 1), got ",
              options.residual_dropout());
  const auto norm = LayerNormOptions(D).eps(options.ln_eps()).bias(options.layer_norm_bias()).kernel_policy(options.kernel_policy());
  ln1 = register_module("ln1", LayerNorm(norm));
  attn = register_module(
      "attn", MultiHeadSelfAttention(
                  MultiHeadSelfAttentionOptions(D, options.n_heads(), options.context_length())
                      .attn_dropout(options.attn_dropout())
                      .out_dropout(options.residual_dropout())
                      .causal(options.causal())
                      .bias(options.bias())
                      .kernel(options.attention_kernel())
                      .kernel_policy(options.kernel_policy())));
  ln2 = register_module("ln2", LayerNorm(norm));
  mlp = register_module("mlp", FeedForward(FeedForwardOptions(D)
                                               .expansion(options.mlp_expansion())
                                               .dropout(options.residual_dropout())
                                               .bias(options.bias())
                                               .activation(options.activation())
                                               .kernel_policy(options.kernel_policy())));
}

void TransformerBlockImpl::pretty_print(std::ostream& os) const {
  os << "tinylm::nn::TransformerBlock(d_model=" << options.d_model()
     << ", n_heads=" << options.n_heads() << ", pre_ln=" << (options.pre_ln() ? "true" : "false")
     << ")";
}

AttentionOutput TransformerBlockImpl::forward(const torch::Tensor& x, bool return_weights,
                                              const torch::Tensor& padding_mask) {
  if (options.pre_ln()) {
    auto a = attn(ln1(x), return_weights, padding_mask);
    auto [h, normed] = ln2->forward_residual(x, a.output);  // h = x + attn(ln1(x)), ln2(h)
    return {h + mlp(normed), a.weights};                     // h + mlp(ln2(h))
  }
  auto a = attn(x, return_weights, padding_mask);
  auto h = ln1(x + a.output);  // ln1(x + attn(x))
  h = ln2(h + mlp(h));         // ln2(x + mlp(x))
  return {h, a.weights};
}

torch::Tensor TransformerBlockImpl::forward_cached(const torch::Tensor& x, torch::Tensor& keys,
                                                  torch::Tensor& values) {
  if (options.pre_ln()) {
    auto [h, normed] = ln2->forward_residual(x, attn->forward_cached(ln1(x), keys, values));
    return h + mlp(normed);
  }
  auto h = ln1(x + attn->forward_cached(x, keys, values));
  return ln2(h + mlp(h));
}

}  // namespace tinylm::nn
