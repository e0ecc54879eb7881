// LayerNorm's forward and backward on tinylm's loops (see layer_norm.h).
#include "nn/layer_norm.h"

#include "nn/cpu/kernels.h"
#include "nn/float_data.h"

#include <ATen/Parallel.h>
#include <ATen/record_function.h>
#include <torch/types.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>

namespace tinylm::nn {

namespace {

/// Rows per task: about 16K floats, a few L1-sized chunks, as GELU's.
int64_t grain_rows(int64_t D) { return std::max<int64_t>(1, 16384 / D); }

/// Rows per block of the backward: each block sums its rows' gain and bias gradients
/// apart, and the blocks are added in order, so those sums have the same bits on any
/// number of threads.
constexpr int64_t kBlockRows = 64;

bool fits(const torch::Tensor& t) {
  return t.defined() && t.device().is_cpu() && t.scalar_type() == torch::kFloat32;
}

/// Inputs: x, r (empty: no residual), weight, bias (empty: none); empty, not undefined,
/// as LibTorch 1.13's Function::apply needs every input defined. Outputs: {y}, or
/// {h = x + r, y} with a residual.
class LayerNormFunction : public torch::autograd::Function<LayerNormFunction> {
 public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x_in,
                                                const torch::Tensor& r_in, const torch::Tensor& weight,
                                                const torch::Tensor& bias, double eps, bool center) {
    RECORD_USER_SCOPE("tinylm::layer_norm");
    const int64_t D = weight.numel(), rows = x_in.numel() / D;
    const bool fused = r_in.numel() > 0, has_bias = bias.numel() > 0;
    auto x = x_in.contiguous();
    auto r = fused ? r_in.contiguous() : r_in;
    auto h = fused ? torch::empty_like(x) : x;
    auto y = torch::empty_like(x);
    auto mean = torch::empty({rows}, x.options()), rstd = torch::empty({rows}, x.options());
    auto w = weight.contiguous(), b = has_bias ? bias.contiguous() : torch::Tensor();
    const auto& k = cpu::table();
    at::parallel_for(0, rows, grain_rows(D), [&](int64_t begin, int64_t end) {
      k.layer_norm_forward(floats(x) + begin * D, fused ? floats(r) + begin * D : nullptr,
                           fused ? floats(h) + begin * D : nullptr, floats(w), floats(b), floats(y) + begin * D,
                           floats(mean) + begin, floats(rstd) + begin, end - begin, D, static_cast<float>(eps),
                           center);
    });
    ctx->save_for_backward({h, w, mean, rstd});
    ctx->saved_data["fused"] = fused;
    ctx->saved_data["has_bias"] = has_bias;
    ctx->saved_data["center"] = center;
    if (fused) return {h, y};
    return {y};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    RECORD_USER_SCOPE("tinylm::layer_norm_backward");
    const auto saved = ctx->get_saved_variables();
    const auto &h = saved[0], &w = saved[1], &mean = saved[2], &rstd = saved[3];
    const bool fused = ctx->saved_data["fused"].toBool(), has_bias = ctx->saved_data["has_bias"].toBool(),
               center = ctx->saved_data["center"].toBool();
    auto dy = grads[fused ? 1 : 0];
    dy = dy.defined() ? dy.contiguous() : torch::zeros_like(h);  // y unused, h used
    const auto dh = fused && grads[0].defined() ? grads[0].contiguous() : torch::Tensor();
    const int64_t D = w.numel(), rows = h.numel() / D, blocks = (rows + kBlockRows - 1) / kBlockRows;
    auto dx = torch::empty_like(h);
    auto partial = torch::zeros({blocks, has_bias ? 2 : 1, D}, h.options());
    const auto& k = cpu::table();
    at::parallel_for(0, blocks, 1, [&](int64_t begin, int64_t end) {
      for (int64_t block = begin; block < end; ++block) {
        const int64_t r0 = block * kBlockRows, n = std::min(kBlockRows, rows - r0);
        float* sums = floats(partial) + block * partial.stride(0);
        k.layer_norm_backward(floats(h) + r0 * D, floats(dy) + r0 * D, floats(w), floats(mean) + r0,
                              floats(rstd) + r0, dh.defined() ? floats(dh) + r0 * D : nullptr,
                              floats(dx) + r0 * D, sums, has_bias ? sums + D : nullptr, n, D, center);
      }
    });
    auto sums = torch::zeros({has_bias ? 2 : 1, D}, h.options());
    float* total = floats(sums);
    const float* part = floats(partial);
    const int64_t width = sums.numel();  // the gain's sums, then the bias's
    for (int64_t block = 0; block < blocks; ++block)  // blocks in order
      for (int64_t i = 0; i < width; ++i) total[i] += part[block * width + i];
    return {dx, fused ? dx : torch::Tensor(), sums[0].view_as(w), has_bias ? sums[1].view_as(w) : torch::Tensor(),
            torch::Tensor(), torch::Tensor()};
  }
};

bool loops_run(const torch::Tensor& x, const torch::Tensor& r, const torch::Tensor& weight,
               const torch::Tensor& bias, const KernelPolicy& policy) {
  const int64_t D = x.dim() >= 1 ? x.size(-1) : 0;
  return policy.layer_norm_loops && fits(x) && x.numel() > 0 &&
         (!weight.defined() || (fits(weight) && weight.dim() == 1 && weight.size(0) == D)) &&
         (!bias.defined() || (fits(bias) && bias.dim() == 1 && bias.size(0) == D)) &&
         (!r.defined() || (fits(r) && r.sizes() == x.sizes()));
}

/// LibTorch's ops for what the loops do not take.
torch::Tensor reference_norm(const torch::Tensor& h, const torch::Tensor& weight, const torch::Tensor& bias,
                             double eps, bool rms) {
  if (!rms) return torch::layer_norm(h, {h.size(-1)}, weight, bias, eps);
  auto y = h * torch::rsqrt(h.pow(2).mean(-1, /*keepdim=*/true) + eps);
  if (weight.defined()) y = y * weight;
  return bias.defined() ? y + bias : y;
}

/// The loops' inputs: a gain of ones where there is none (its gradient goes nowhere), an
/// empty tensor for no bias or residual.
torch::autograd::variable_list run_loops(const torch::Tensor& x, const torch::Tensor& r, const torch::Tensor& weight,
                                         const torch::Tensor& bias, double eps, bool rms) {
  const auto none = torch::empty({0}, x.options());
  return LayerNormFunction::apply(x, r.defined() ? r : none, weight.defined() ? weight : torch::ones({x.size(-1)}, x.options()),
                                  bias.defined() ? bias : none, eps, !rms);
}

}  // namespace

torch::Tensor layer_norm(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias,
                         double eps, const KernelPolicy& policy, bool rms) {
  if (!loops_run(x, {}, weight, bias, policy)) return reference_norm(x, weight, bias, eps, rms);
  return run_loops(x, {}, weight, bias, eps, rms)[0];
}

std::pair<torch::Tensor, torch::Tensor> add_layer_norm(const torch::Tensor& x, const torch::Tensor& r,
                                                       const torch::Tensor& weight, const torch::Tensor& bias,
                                                       double eps, const KernelPolicy& policy, bool rms) {
  if (!loops_run(x, r, weight, bias, policy)) {
    auto h = x + r;
    return {h, reference_norm(h, weight, bias, eps, rms)};
  }
  auto out = run_loops(x, r, weight, bias, eps, rms);
  return {out[0], out[1]};
}

}  // namespace tinylm::nn
