// GELU's forward and backward on tinylm's loops (see gelu.h).
#include "nn/gelu.h"

#include "nn/cpu/kernels.h"

#include <ATen/Parallel.h>
#include <ATen/record_function.h>
#include <torch/types.h>
#include <torch/csrc/autograd/custom_function.h>

namespace tinylm::nn {

namespace {

/// Elements per task: a few L1-sized chunks, so two threads share a layer's activations.
constexpr int64_t kGrain = 16384;

class GeluFunction : public torch::autograd::Function<GeluFunction> {
 public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x_in,
                                                bool exact) {
    RECORD_USER_SCOPE("tinylm::gelu");
    auto x = x_in.contiguous();
    auto y = torch::empty_like(x);
    const float* in = x.data_ptr<float>();
    float* out = y.data_ptr<float>();
    const auto& k = cpu::table();
    at::parallel_for(0, x.numel(), kGrain, [&](int64_t begin, int64_t end) {
      k.gelu_forward(in + begin, out + begin, end - begin, exact);
    });
    ctx->save_for_backward({x});
    ctx->saved_data["exact"] = exact;
    return {y};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    RECORD_USER_SCOPE("tinylm::gelu_backward");
    const auto x = ctx->get_saved_variables()[0];
    const bool exact = ctx->saved_data["exact"].toBool();
    auto dy = grads[0].contiguous();
    auto dx = torch::empty_like(x);
    const float *in = x.data_ptr<float>(), *up = dy.data_ptr<float>();
    float* out = dx.data_ptr<float>();
    const auto& k = cpu::table();
    at::parallel_for(0, x.numel(), kGrain, [&](int64_t begin, int64_t end) {
      k.gelu_backward(in + begin, up + begin, out + begin, end - begin, exact);
    });
    return {dx, torch::Tensor()};
  }
};

}  // namespace

torch::Tensor gelu(const torch::Tensor& x, bool exact, const KernelPolicy& policy) {
  if (!policy.gelu_loops || !x.defined() || !x.device().is_cpu() || x.scalar_type() != torch::kFloat32 ||
      x.numel() == 0)
    return torch::gelu(x, exact ? "none" : "tanh");
  return GeluFunction::apply(x, exact)[0];
}

}  // namespace tinylm::nn
