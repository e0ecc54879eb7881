// Linear layers through tinylm's gemm (see linear.h). M rows of x, K input features, N
// outputs; W is N x K.
//   forward:  y = x Wᵀ (+ b, written first and accumulated into)
//   backward: dx = dy W;  dW = dyᵀ x;  db = Σ_rows dy
#include "nn/linear.h"

#include "nn/saved_policy.h"

#include <tinylm/nn/cpu_kernels.h>

#include <ATen/record_function.h>
#include <torch/torch.h>

#include <vector>

namespace tinylm::nn {

namespace {

float* floats(const torch::Tensor& t) { return t.data_ptr<float>(); }

class LinearFunction : public torch::autograd::Function<LinearFunction> {
 public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                                                const torch::Tensor& weight, const torch::Tensor& bias,
                                                const KernelPolicy& policy) {
    RECORD_USER_SCOPE("tinylm::linear");
    const int64_t N = weight.size(0), K = weight.size(1), M = x.numel() / K;
    auto x2 = x.reshape({M, K}).contiguous();
    auto w = weight.contiguous();
    auto y = torch::empty({M, N}, x.options());
    const bool has_bias = bias.numel() > 0;  // (N), or (0) for none
    if (has_bias) y.copy_(bias.expand({M, N}));
    nn::gemm(false, true, M, N, K, floats(x2), K, floats(w), K, floats(y), N, has_bias, policy);
    ctx->save_for_backward({x2, w});
    save_policy(ctx, policy);
    ctx->saved_data["has_bias"] = has_bias;
    ctx->saved_data["x_sizes"] = x.sizes().vec();
    auto out_sizes = x.sizes().vec();
    out_sizes.back() = N;
    return {y.view(out_sizes)};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const auto& x = saved[0];  // (M, K)
    const auto& w = saved[1];  // (N, K)
    const int64_t M = x.size(0), K = x.size(1), N = w.size(0);
    const KernelPolicy policy = saved_policy(ctx);
    auto dy = grads[0].reshape({M, N}).contiguous();
    torch::Tensor dx, dw, db;
    if (ctx->needs_input_grad(0)) {
      dx = torch::empty({M, K}, x.options());
      nn::gemm(false, false, M, K, N, floats(dy), N, floats(w), K, floats(dx), K, false, policy);
      dx = dx.view(ctx->saved_data["x_sizes"].toIntVector());
    }
    if (ctx->needs_input_grad(1)) {
      dw = torch::empty({N, K}, x.options());
      nn::gemm(true, false, N, K, M, floats(dy), N, floats(x), K, floats(dw), K, false, policy);
    }
    if (ctx->saved_data["has_bias"].toBool() && ctx->needs_input_grad(2)) db = dy.sum(0);
    return {dx, dw, db, torch::Tensor()};
  }
};

}  // namespace

torch::Tensor linear(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias,
                     const KernelPolicy& policy) {
  const bool fits = x.defined() && x.dim() >= 1 && x.device().is_cpu() && x.scalar_type() == torch::kFloat32 &&
                    weight.dim() == 2 && weight.device().is_cpu() && weight.scalar_type() == torch::kFloat32 &&
                    x.size(-1) == weight.size(1) && x.numel() > 0 &&
                    (!bias.defined() || (bias.dim() == 1 && bias.size(0) == weight.size(0) &&
                                         bias.scalar_type() == torch::kFloat32 && bias.device().is_cpu()));
  if (!fits || !policy.linear_uses_gemm(x.numel() / x.size(-1), weight.size(0), weight.size(1)))
    return torch::nn::functional::linear(x, weight, bias);
  // LibTorch 1.13's Function::apply cannot take an undefined tensor: no bias is an empty one.
  const torch::Tensor b = bias.defined() ? bias : torch::empty({0}, weight.options());
  return LinearFunction::apply(x, weight, b, policy)[0];
}

}  // namespace tinylm::nn
