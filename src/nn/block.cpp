// FeedForward and the transformer block.
// B = batch, T = sequence length, D = d_model, e = mlp expansion
#include <tinylm/nn/block.h>
#include <tinylm/log.h>
#include "nn/layer_norm.h"
#include "nn/linear.h"

#include <torch/types.h>
#include <torch/utils.h>
#include <torch/nn/modules/linear.h>

#include <tuple>
#include <utility>

namespace tinylm::nn {

// ---- LayerNorm -----------------------------------------------------------------

LayerNormImpl::LayerNormImpl(const LayerNormOptions& options_) : options(options_) { reset(); }

void LayerNormImpl::reset() {
  const int64_t D = options.d_model();
  TORCH_CHECK(D >= 1, "LayerNorm: d_model must be >= 1, got ", D);
  TORCH_CHECK(options.eps() > 0, "LayerNorm: eps must be > 0, got ", options.eps());
  if (options.gain()) weight = register_parameter("weight", torch::empty({D}));
  else weight = torch::Tensor();
  if (options.bias()) bias = register_parameter("bias", torch::empty({D}));
  else bias = torch::Tensor();
  reset_parameters();
}

void LayerNormImpl::reset_parameters() {
  torch::NoGradGuard no_grad;
  if (weight.defined()) weight.fill_(1.0);
  if (bias.defined()) bias.zero_();
}

void LayerNormImpl::pretty_print(std::ostream& os) const {
  os << "tinylm::nn::" << (options.kind() == NormKind::rms_norm ? "RMSNorm" : "LayerNorm")
     << "(d_model=" << options.d_model() << ", eps=" << options.eps()
     << ", gain=" << (options.gain() ? "true" : "false") << ", bias=" << (options.bias() ? "true" : "false") << ")";
}

torch::Tensor LayerNormImpl::forward(const torch::Tensor& x) {
  return layer_norm(x, weight, bias, options.eps(), *options.kernel_policy(), options.kind() == NormKind::rms_norm);
}

std::pair<torch::Tensor, torch::Tensor> LayerNormImpl::forward_residual(const torch::Tensor& x,
                                                                        const torch::Tensor& r) {
  return add_layer_norm(x, r, weight, bias, options.eps(), *options.kernel_policy(),
                        options.kind() == NormKind::rms_norm);
}

// ---- FeedForward ---------------------------------------------------------------

FeedForwardImpl::FeedForwardImpl(const FeedForwardOptions& options_) : options(options_) {
  reset();
}

const char* to_string(Activation a) {
  switch (a) {
    case Activation::gelu_tanh: return "gelu-tanh";
    case Activation::gelu: return "gelu";
    case Activation::swiglu: return "swiglu";
  }
  return "?";
}

const char* to_string(NormKind n) { return n == NormKind::rms_norm ? "rms-norm" : "layer-norm"; }

void FeedForwardImpl::reset() {
  const int64_t D = options.d_model(), F = hidden();
  TORCH_CHECK(D >= 1, "FeedForward: d_model must be >= 1, got ", D);
  TORCH_CHECK(options.expansion() >= 1, "FeedForward: expansion must be >= 1, got ", options.expansion());
  TORCH_CHECK(options.hidden() >= 0, "FeedForward: hidden must be >= 0 (0: expansion * d_model), got ",
              options.hidden());
  TORCH_CHECK(options.dropout() >= 0 && options.dropout() < 1,
              "FeedForward: dropout must be in [0, 1), got ", options.dropout());
  const int64_t inputs = options.activation() == Activation::swiglu ? 2 * F : F;
  fc = register_module("fc", torch::nn::Linear(torch::nn::LinearOptions(D, inputs).bias(options.bias())));
  proj = register_module("proj",
                         torch::nn::Linear(torch::nn::LinearOptions(F, D).bias(options.bias())));
}

void FeedForwardImpl::pretty_print(std::ostream& os) const {
  os << "tinylm::nn::FeedForward(d_model=" << options.d_model() << ", hidden=" << hidden()
     << ", activation=" << to_string(options.activation()) << ")";
}

torch::Tensor FeedForwardImpl::forward(const torch::Tensor& x) {
  const KernelPolicy& policy = *options.kernel_policy();
  torch::Tensor y;  // (B, T, D)
  if (options.activation() == Activation::swiglu) {
    auto a = linear(x, fc->weight, fc->bias, policy);  // (B, T, 2F)
    auto gate_up = a.chunk(2, /*dim=*/-1);
    y = linear(torch::silu(gate_up[0]) * gate_up[1], proj->weight, proj->bias, policy);
  } else {  // fc, GELU, proj: one op with bfloat16 products (linear.h)
    y = linear_gelu_linear(x, fc->weight, fc->bias, proj->weight, proj->bias,
                           options.activation() == Activation::gelu, policy);
  }
  return torch::dropout(y, options.dropout(), is_training());
}

// ---- TransformerBlock ----------------------------------------------------------

TransformerBlockImpl::TransformerBlockImpl(const TransformerBlockOptions& options_)
    : options(options_) {
  reset();
}

void TransformerBlockImpl::reset() {
  // Each part as its options say, with the block's shape and the block's policy.
  const auto& policy = options.kernel_policy();
  auto norm = options.norm();
  norm.d_model(options.d_model()).kernel_policy(policy);
  auto attention = options.attention();
  attention.kernel_policy(policy);
  auto feed_forward = options.mlp();
  feed_forward.d_model(options.d_model()).kernel_policy(policy);
  ln1 = register_module("ln1", LayerNorm(norm));
  attn = register_module("attn", MultiHeadSelfAttention(attention));
  ln2 = register_module("ln2", LayerNorm(norm));
  mlp = register_module("mlp", FeedForward(feed_forward));
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

std::pair<torch::Tensor, torch::Tensor> TransformerBlockImpl::forward_terms(const torch::Tensor& x0,
                                                                           const torch::Tensor& x1,
                                                                           const torch::Tensor& padding_mask) {
  TORCH_CHECK(options.pre_ln(), "TransformerBlock::forward_terms: pre-LN blocks only (this one is post-LN)");
  torch::Tensor x = x0, normed;
  if (x1.defined())
    std::tie(x, normed) = ln1->forward_residual(x0, x1);  // x = x0 + x1, ln1(x)
  else
    normed = ln1(x0);
  auto a = attn(normed, false, padding_mask);
  auto [h, normed2] = ln2->forward_residual(x, a.output);  // h = x + attn(ln1(x)), ln2(h)
  return {h, mlp(normed2)};                                  // h + mlp(ln2(h)), as two terms
}

torch::Tensor TransformerBlockImpl::forward_cached(const torch::Tensor& x, torch::Tensor& keys,
                                                  torch::Tensor& values, bool last_only) {
  // The residual path of the rows the attention returns: the last alone with last_only.
  const auto rows = last_only ? x.narrow(1, x.size(1) - 1, 1) : x;  // (B, Tn or 1, D)
  if (options.pre_ln()) {
    auto [h, normed] = ln2->forward_residual(rows, attn->forward_cached(ln1(x), keys, values, last_only));
    return h + mlp(normed);
  }
  auto h = ln1(rows + attn->forward_cached(x, keys, values, last_only));
  return ln2(h + mlp(h));
}

torch::Tensor TransformerBlockImpl::forward_rows(const torch::Tensor& x, torch::Tensor& keys, torch::Tensor& values,
                                                const DecodeRows& rows) {
  if (options.pre_ln()) {
    auto [h, normed] = ln2->forward_residual(x, attn->forward_rows(ln1(x), keys, values, rows));
    return h + mlp(normed);
  }
  auto h = ln1(x + attn->forward_rows(x, keys, values, rows));
  return ln2(h + mlp(h));
}

}  // namespace tinylm::nn
