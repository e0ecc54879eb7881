// Linear layers through tinylm's gemm (see linear.h), in float32 or with bfloat16 products
// (KernelPolicy::bf16_products). M rows of x, K input features, N outputs; W is N x K.
//   forward:  y = x Wᵀ (+ b, written first and accumulated into)
//   backward: dx = dy W;  dW = dyᵀ x;  db = Σ_rows dy
#include "nn/linear.h"

#include "nn/bf16_operands.h"
#include "nn/cpu/kernels.h"
#include "nn/float_data.h"
#include "nn/gelu.h"
#include "nn/gradient_slots.h"
#include "nn/saved_policy.h"
#include "nn/weight_packing.h"

#include <tinylm/nn/cpu_kernels.h>

#include <ATen/Parallel.h>
#include <ATen/record_function.h>
#include <torch/types.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/nn/functional/linear.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <iterator>
#include <mutex>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

namespace tinylm::nn {

namespace {

/// y (M x N) viewed with x's leading dimensions: (..., N) for x (..., K).
torch::Tensor rows_as(const torch::Tensor& y, const torch::Tensor& x) {
  auto sizes = x.sizes().vec();
  sizes.back() = y.size(-1);
  return y.view(sizes);
}

/// What products make of a weight: its bfloat16 copy, or its copy packed for the float32
/// products that read it transposed (weight_packing.h).
enum class Copy { rounded, panels, transposed };

/// Copies of weights, each made when a product first needs it and again only once the
/// weight has changed (its version counter moved, or its data moved): a bfloat16 copy
/// rounded once per optimizer step in training, once in all in generation; a packed copy
/// once per weight while generating, where gemm would pack it for every token. Shared by
/// every thread (a server's decode loops); an entry goes when its weight does. Past
/// kKeptBytes of copies, a copy is made for its call alone.
class WeightCopies {
 public:
  static constexpr size_t kKeptBytes = size_t{512} << 20;

  template <typename Make>
  torch::Tensor of(const torch::Tensor& w, Copy kind, Make&& make) {
    // An inference tensor has no version counter to tell a change by: copied every time.
    if (w.is_inference()) return make();
    const auto version = w._version();
    std::lock_guard<std::mutex> lock(mutex_);
    const Key key{w.unsafeGetTensorImpl(), kind};
    auto it = entries_.find(key);
    if (it != entries_.end() && it->second.version == version && it->second.data == w.data_ptr() &&
        it->second.shape == w.sizes().vec())
      return it->second.copy;
    // Forget the weights that are gone (their keys could be reused only once their weak
    // references here are dropped) and this one's stale copy.
    for (auto e = entries_.begin(); e != entries_.end();) {
      if (!e->second.owner.expired() && e != it) {
        ++e;
        continue;
      }
      kept_ -= e->second.copy.nbytes();
      e = entries_.erase(e);
    }
    auto copy = make();
    if (kept_ + copy.nbytes() > kKeptBytes) return copy;
    kept_ += copy.nbytes();
    entries_.emplace(key, Entry{c10::weak_intrusive_ptr<c10::TensorImpl>(w.getIntrusivePtr()), version, w.data_ptr(),
                                w.sizes().vec(), copy});
    return copy;
  }

  /// Whether a copy of this kind of w is kept, current or not.
  bool keeps(const torch::Tensor& w, Copy kind) {
    std::lock_guard<std::mutex> lock(mutex_);
    return entries_.count(Key{w.unsafeGetTensorImpl(), kind}) > 0;
  }

  /// `copy` (made elsewhere) as w's copy of this kind at w's version now.
  void provide(const torch::Tensor& w, Copy kind, const torch::Tensor& copy) {
    if (w.is_inference()) return;
    std::lock_guard<std::mutex> lock(mutex_);
    const Key key{w.unsafeGetTensorImpl(), kind};
    auto it = entries_.find(key);
    if (it != entries_.end()) {
      kept_ -= it->second.copy.nbytes();
      entries_.erase(it);
    }
    if (kept_ + copy.nbytes() > kKeptBytes) return;
    kept_ += copy.nbytes();
    entries_.emplace(key, Entry{c10::weak_intrusive_ptr<c10::TensorImpl>(w.getIntrusivePtr()), w._version(),
                                w.data_ptr(), w.sizes().vec(), copy});
  }

 private:
  struct Key {
    const c10::TensorImpl* impl;
    Copy kind;
    bool operator==(const Key& o) const { return impl == o.impl && kind == o.kind; }
  };
  struct KeyHash {
    size_t operator()(const Key& k) const {
      return std::hash<const void*>()(k.impl) ^ (static_cast<size_t>(k.kind) << 1);
    }
  };
  struct Entry {
    c10::weak_intrusive_ptr<c10::TensorImpl> owner;
    int64_t version;
    const void* data;
    std::vector<int64_t> shape;
    torch::Tensor copy;
  };
  std::mutex mutex_;
  std::unordered_map<Key, Entry, KeyHash> entries_;
  size_t kept_ = 0;
};

WeightCopies& weight_copies() {
  static WeightCopies* copies = new WeightCopies();  // never destroyed: used by threads until exit
  return *copies;
}

}  // namespace

torch::Tensor rounded_weight(const torch::Tensor& w) {
  return weight_copies().of(w, Copy::rounded, [&] { return rounded(w); });
}

bool keeps_rounded_weight(const torch::Tensor& w) { return weight_copies().keeps(w, Copy::rounded); }

void provide_rounded_weight(const torch::Tensor& w, const torch::Tensor& copy) {
  TORCH_CHECK(copy.scalar_type() == torch::kBFloat16 && copy.sizes() == w.sizes() && copy.device() == w.device(),
              "provide_rounded_weight: a bfloat16 copy of the weight's shape ", w.sizes(), " and device, got ",
              copy.scalar_type(), " ", copy.sizes());
  weight_copies().provide(w, Copy::rounded, copy);
}

namespace {

/// One Linear layer as an autograd op, its three products on tinylm's gemm as `policy`
/// chooses, or with policy.bf16_products in bfloat16: x and dy rounded as they come, W once
/// per change (weight_copies), what the backward needs kept rounded (half the memory of
/// x in float32), the sums and the gradients float32.
class LinearFunction : public torch::autograd::Function<LinearFunction> {
 public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                                                const torch::Tensor& weight, const torch::Tensor& bias,
                                                const KernelPolicy& policy) {
    const bool bf16 = policy.bf16_products;
    RECORD_USER_SCOPE(bf16 ? "tinylm::linear_bf16" : "tinylm::linear");
    const int64_t N = weight.size(0), K = weight.size(1), M = x.numel() / K;
    auto x2 = bf16 ? rounded(x.reshape({M, K})) : x.reshape({M, K}).contiguous();
    auto w = bf16 ? rounded_weight(weight) : weight.contiguous();
    auto y = torch::empty({M, N}, x.options());
    const bool has_bias = bias.numel() > 0;  // (N), or (0) for none
    if (bf16) {  // the bias added in oneDNN's pass
      const auto b = has_bias ? bias.contiguous() : bias;
      nn::gemm_bf16(false, true, M, N, K, bits(x2), K, bits(w), K, floats(y), N, false,
                    has_bias ? b.data_ptr<float>() : nullptr);
    } else {
      if (has_bias) y.copy_(bias.expand({M, N}));
      nn::gemm(false, true, M, N, K, floats(x2), K, floats(w), K, floats(y), N, has_bias, policy);
    }
    ctx->save_for_backward({x2, w});
    save_policy(ctx, policy);
    ctx->saved_data["weight"] = weight;  // the parameter itself: where dW may go (gradient_destination)
    ctx->saved_data["has_bias"] = has_bias;
    ctx->saved_data["x_sizes"] = x.sizes().vec();
    return {rows_as(y, x)};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const auto& x = saved[0];  // (M, K), bfloat16 with bf16_products
    const auto& w = saved[1];  // (N, K), likewise
    const int64_t M = x.size(0), K = x.size(1), N = w.size(0);
    const KernelPolicy policy = saved_policy(ctx);
    auto dy = grads[0].reshape({M, N}).contiguous();
    const bool bias_grad = ctx->saved_data["has_bias"].toBool() && ctx->needs_input_grad(2);
    torch::Tensor dy_operand = dy, db;
    if (policy.bf16_products && bias_grad && dy.device().is_cpu())
      std::tie(dy_operand, db) = rounded_with_column_sums(dy);  // one pass over dy, not two
    else if (policy.bf16_products)
      dy_operand = rounded(dy);
    if (bias_grad && !db.defined()) db = dy.sum(0);
    // C (rows x cols) = op(A) B, A stored as the gemm takes it: float32 or bfloat16 operands.
    auto product = [&](bool trans_a, int64_t rows, int64_t cols, int64_t inner, const torch::Tensor& A, int64_t lda,
                       const torch::Tensor& B, torch::Tensor& C) {
      if (policy.bf16_products)
        nn::gemm_bf16(trans_a, false, rows, cols, inner, bits(A), lda, bits(B), cols, floats(C), cols, false);
      else
        nn::gemm(trans_a, false, rows, cols, inner, floats(A), lda, floats(B), cols, floats(C), cols, false, policy);
    };
    torch::Tensor dx, dw;
    if (ctx->needs_input_grad(0)) {
      dx = torch::empty({M, K}, dy.options());
      product(false, M, K, N, dy_operand, N, w, dx);  // dx = dy W
      dx = dx.view(ctx->saved_data["x_sizes"].toIntVector());
    }
    if (ctx->needs_input_grad(1)) {
      dw = gradient_destination(ctx->saved_data["weight"].toTensor());
      product(true, N, K, M, dy_operand, N, x, dw);  // dW = dyᵀ x
    }
    return {dx, dw, db, torch::Tensor()};
  }
};

/// fc, GELU, proj as one autograd op with bfloat16 products (linear_gelu_linear): the
/// same arithmetic as LinearFunction, gelu and LinearFunction again, without GELU's
/// float32 output or its float32 gradient ever written out: GELU's result is rounded to
/// bfloat16 as it is made (what proj multiplies and keeps), and its gradient is rounded
/// (and summed for fc's bias) as it is made.
class Bf16GeluMlp : public torch::autograd::Function<Bf16GeluMlp> {
 public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                                                const torch::Tensor& w1, const torch::Tensor& b1,
                                                const torch::Tensor& w2, const torch::Tensor& b2, bool exact) {
    RECORD_USER_SCOPE("tinylm::linear_bf16");
    const int64_t D = w1.size(1), F = w1.size(0), N = w2.size(0), M = x.numel() / D;
    auto x2 = rounded(x.reshape({M, D}));
    auto fc = rounded_weight(w1), proj = rounded_weight(w2);
    auto a = torch::empty({M, F}, x.options().requires_grad(false));  // GELU's input
    const auto bias1 = b1.numel() > 0 ? b1.contiguous() : b1, bias2 = b2.numel() > 0 ? b2.contiguous() : b2;
    nn::gemm_bf16(false, true, M, F, D, bits(x2), D, bits(fc), D, floats(a), F, false,
                  b1.numel() > 0 ? bias1.data_ptr<float>() : nullptr);
    torch::Tensor h;
    {
      RECORD_USER_SCOPE("tinylm::gelu");
      h = gelu_rounded(a, exact);  // (M, F) bfloat16
    }
    auto y = torch::empty({M, N}, x.options());
    nn::gemm_bf16(false, true, M, N, F, bits(h), F, bits(proj), F, floats(y), N, false,
                  b2.numel() > 0 ? bias2.data_ptr<float>() : nullptr);
    ctx->save_for_backward({x2, fc, a, h, proj});
    ctx->saved_data["weights"] = std::vector<torch::Tensor>{w1, w2};  // where dW1, dW2 may go (gradient_destination)
    ctx->saved_data["exact"] = exact;
    ctx->saved_data["bias1"] = b1.numel() > 0;
    ctx->saved_data["bias2"] = b2.numel() > 0;
    ctx->saved_data["x_sizes"] = x.sizes().vec();
    return {rows_as(y, x)};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    RECORD_USER_SCOPE("tinylm::linear_bf16_backward");
    auto saved = ctx->get_saved_variables();
    const auto &x2 = saved[0], &fc = saved[1], &a = saved[2], &h = saved[3], &proj = saved[4];
    const int64_t M = x2.size(0), D = x2.size(1), F = fc.size(0), N = proj.size(0);
    auto dy = grads[0].reshape({M, N}).contiguous();
    torch::Tensor dy16, db2, da16, db1, dx, dw1, dw2;
    if (ctx->saved_data["bias2"].toBool() && ctx->needs_input_grad(4))
      std::tie(dy16, db2) = rounded_with_column_sums(dy);
    else
      dy16 = rounded(dy);
    if (ctx->needs_input_grad(3)) {  // dW2 = dyᵀ h
      dw2 = gradient_destination(ctx->saved_data["weights"].toTensorVector()[1]);
      nn::gemm_bf16(true, false, N, F, M, bits(dy16), N, bits(h), F, floats(dw2), F, false);
    }
    auto dh = torch::empty({M, F}, dy.options());  // dh = dy W2
    nn::gemm_bf16(false, false, M, F, N, bits(dy16), N, bits(proj), F, floats(dh), F, false);
    {
      RECORD_USER_SCOPE("tinylm::gelu_backward");
      std::tie(da16, db1) = rounded_with_column_sums(dh, a, ctx->saved_data["exact"].toBool(),
                                                     ctx->saved_data["bias1"].toBool() && ctx->needs_input_grad(2));
    }
    if (ctx->needs_input_grad(1)) {  // dW1 = daᵀ x
      dw1 = gradient_destination(ctx->saved_data["weights"].toTensorVector()[0]);
      nn::gemm_bf16(true, false, F, D, M, bits(da16), F, bits(x2), D, floats(dw1), D, false);
    }
    if (ctx->needs_input_grad(0)) {  // dx = da W1
      dx = torch::empty({M, D}, dy.options());
      nn::gemm_bf16(false, false, M, D, F, bits(da16), F, bits(fc), D, floats(dx), D, false);
      dx = dx.view(ctx->saved_data["x_sizes"].toIntVector());
    }
    return {dx, dw1, db1, dw2, db2, torch::Tensor()};
  }
};

}  // namespace

torch::Tensor linear(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias,
                     const KernelPolicy& policy) {
  if (policy.bf16_products && x.defined() && x.is_cuda() && x.scalar_type() == torch::kFloat32 &&
      weight.scalar_type() == torch::kFloat32) {
    // On CUDA (generation and serving): the product on the tensor cores, x and W rounded to
    // bfloat16 (W once per change), float32 sums rounded to bfloat16 as autocast's are,
    // then float32 again, the bias added in float32.
    auto y = torch::matmul(rounded(x), rounded_weight(weight).t()).to(torch::kFloat32);
    return bias.defined() ? y.add_(bias) : y;
  }
  const bool fits = x.defined() && x.dim() >= 1 && x.device().is_cpu() && x.scalar_type() == torch::kFloat32 &&
                    weight.dim() == 2 && weight.device().is_cpu() && weight.scalar_type() == torch::kFloat32 &&
                    x.size(-1) == weight.size(1) && x.numel() > 0 &&
                    (!bias.defined() || (bias.dim() == 1 && bias.size(0) == weight.size(0) &&
                                         bias.scalar_type() == torch::kFloat32 && bias.device().is_cpu()));
  if (!fits || !policy.linear_uses_gemm(x.numel() / x.size(-1), weight.size(0), weight.size(1)))
    return torch::nn::functional::linear(x, weight, bias);
  // Without autograd (generation, evaluation): no node, and where the product copies the
  // weight before multiplying, that copy kept from call to call while the weight is unchanged.
  const int64_t N = weight.size(0), K = weight.size(1), M = x.numel() / K;
  const auto packing = weight_packing(M, N, K, policy);
  if (!torch::GradMode::is_enabled() && packing != WeightPacking::none && weight.is_contiguous()) {
    RECORD_USER_SCOPE("tinylm::linear");
    const auto packed = weight_copies().of(weight, packing == WeightPacking::panels ? Copy::panels : Copy::transposed,
                                           [&] {
                                             auto out = torch::empty({N * K}, weight.options().requires_grad(false));
                                             pack_weight(packing, floats(weight), N, K, K, floats(out));
                                             return out;
                                           });
    const auto x2 = x.reshape({M, K}).contiguous();
    auto y = torch::empty({M, N}, x.options().requires_grad(false));
    if (bias.defined()) y.copy_(bias.expand({M, N}));
    gemm_prepacked(packing, M, N, K, floats(x2), K, floats(weight), K, floats(packed), floats(y), N, bias.defined(),
                   policy);
    return rows_as(y, x);
  }
  // LibTorch 1.13's Function::apply cannot take an undefined tensor: no bias is an empty one.
  const torch::Tensor b = bias.defined() ? bias : torch::empty({0}, weight.options());
  return LinearFunction::apply(x, weight, b, policy)[0];
}

}  // namespace tinylm::nn

namespace tinylm::nn {

bool linear_gelu_linear_fused(const torch::Tensor& x, const torch::Tensor& w1, const torch::Tensor& b1,
                              const torch::Tensor& w2, const torch::Tensor& b2, const KernelPolicy& policy) {
  auto cpu_float = [](const torch::Tensor& t) {
    return t.defined() && t.device().is_cpu() && t.scalar_type() == torch::kFloat32;
  };
  return policy.bf16_products && policy.gelu_loops && torch::GradMode::is_enabled() && cpu_float(x) &&
         x.dim() >= 1 && x.numel() > 0 && cpu_float(w1) && cpu_float(w2) && w1.dim() == 2 && w2.dim() == 2 &&
         x.size(-1) == w1.size(1) && w2.size(1) == w1.size(0) && (!b1.defined() || (cpu_float(b1) &&
         b1.dim() == 1 && b1.size(0) == w1.size(0))) && (!b2.defined() || (cpu_float(b2) && b2.dim() == 1 &&
         b2.size(0) == w2.size(0)));
}

torch::Tensor linear_gelu_linear(const torch::Tensor& x, const torch::Tensor& w1, const torch::Tensor& b1,
                                 const torch::Tensor& w2, const torch::Tensor& b2, bool exact,
                                 const KernelPolicy& policy) {
  if (!linear_gelu_linear_fused(x, w1, b1, w2, b2, policy))
    return linear(gelu(linear(x, w1, b1, policy), exact, policy), w2, b2, policy);
  const auto none = torch::empty({0}, w1.options());  // LibTorch 1.13's apply: no undefined tensors
  return Bf16GeluMlp::apply(x, w1, b1.defined() ? b1 : none, w2, b2.defined() ? b2 : none, exact)[0];
}

}  // namespace tinylm::nn
