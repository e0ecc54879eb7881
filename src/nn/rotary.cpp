// Rotary positions on tinylm's loops (see rotary.h).
#include "nn/rotary.h"

#include "nn/cpu/kernels.h"

#include <ATen/Parallel.h>
#include <ATen/record_function.h>
#include <torch/types.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>

namespace tinylm::nn {

namespace {

/// cos and sin of the angles of positions start .. start + T - 1, (T, Dh/2) each: in double,
/// as the reference computes them, then in `options`' type.
std::pair<torch::Tensor, torch::Tensor> angles(int64_t start, int64_t T, int64_t half, double base,
                                               const torch::TensorOptions& options) {
  const auto f64 = torch::TensorOptions().dtype(torch::kFloat64);
  auto inv_freq = torch::pow(base, torch::arange(half, f64) * (-2.0 / static_cast<double>(2 * half)));  // (Dh/2)
  auto a = torch::arange(start, start + T, f64).unsqueeze(1) * inv_freq.unsqueeze(0);                 // (T, Dh/2)
  return {a.cos().to(options), a.sin().to(options)};
}

/// Token groups per task: about 16K floats.
int64_t grain(int64_t row) { return std::max<int64_t>(1, 16384 / row); }

/// Rotates (B, T, H, Dh) rows whose tokens lie at a uniform stride (heads packed within).
torch::Tensor run(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin, bool inverse) {
  const int64_t B = x.size(0), T = x.size(1), H = x.size(2), Dh = x.size(3), half = Dh / 2;
  auto y = torch::empty({B, T, H, Dh}, x.options());
  const float *in = x.data_ptr<float>(), *c = cos.data_ptr<float>(), *s = sin.data_ptr<float>();
  float* out = y.data_ptr<float>();
  const int64_t stride = x.stride(1);
  const auto& k = cpu::table();
  at::parallel_for(0, B * T, grain(H * Dh), [&](int64_t begin, int64_t end) {
    for (int64_t g = begin; g < end;) {  // runs of one batch row: the angles go on with t
      const int64_t b = g / T, t = g % T, n = std::min(end - g, T - t);
      k.rotate_halves(in + b * x.stride(0) + t * stride, stride, c + t * half, s + t * half, out + g * H * Dh, n, H,
                      half, inverse);
      g += n;
    }
  });
  return y;
}

/// Whether x's tokens are at one stride with its heads packed: a view of the projection.
bool packed_heads(const torch::Tensor& x) {
  return x.stride(3) == 1 && x.stride(2) == x.size(3) && x.stride(1) >= x.size(2) * x.size(3) &&
         x.stride(0) == x.size(1) * x.stride(1);
}

class RotateFunction : public torch::autograd::Function<RotateFunction> {
 public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x_in,
                                                const torch::Tensor& cos, const torch::Tensor& sin) {
    RECORD_USER_SCOPE("tinylm::rotate_halves");
    const auto x = packed_heads(x_in) ? x_in : x_in.contiguous();
    ctx->save_for_backward({cos, sin});
    return {run(x, cos, sin, /*inverse=*/false)};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    RECORD_USER_SCOPE("tinylm::rotate_halves_backward");
    const auto saved = ctx->get_saved_variables();
    // A rotation's transpose is the rotation by the opposite angle.
    return {run(grads[0].contiguous(), saved[0], saved[1], /*inverse=*/true), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor rotate_halves(const torch::Tensor& x, int64_t start, double base, const KernelPolicy& policy) {
  TORCH_CHECK(x.dim() == 4 && x.size(3) % 2 == 0, "rotate_halves: expected (B, T, H, Dh) with Dh even, got ",
              x.sizes());
  TORCH_CHECK(base > 0 && start >= 0, "rotate_halves: base must be > 0 and start >= 0, got ", base, " and ", start);
  const int64_t T = x.size(1), half = x.size(3) / 2;
  auto [cos, sin] = angles(start, T, half, base, x.options().requires_grad(false));
  if (policy.rotary_loops && x.device().is_cpu() && x.scalar_type() == torch::kFloat32 && x.numel() > 0)
    return RotateFunction::apply(x, cos, sin)[0];
  cos = cos.view({1, T, 1, half});
  sin = sin.view({1, T, 1, half});
  auto x1 = x.narrow(3, 0, half), x2 = x.narrow(3, half, half);
  return torch::cat({x1 * cos - x2 * sin, x2 * cos + x1 * sin}, /*dim=*/3);  // (B, T, H, Dh)
}

}  // namespace tinylm::nn
