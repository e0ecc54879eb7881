// LayerNorm's forward and backward on tinylm's loops (see layer_norm.h).
#include "nn/layer_norm.h"

#include "nn/cpu/kernels.h"
#include "nn/float_data.h"

#include <ATen/Parallel.h>
#include <ATen/record_function.h>
#include <torch/types.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <cstdint>
#include <vector>

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
    const int64_t D = w.numel(), rows = h.numel() / D;
    auto dx = torch::empty_like(h);
    torch::Tensor dgain, dbias;
    layer_norm_backward_rows(floats(h), floats(dy), floats(w), floats(mean), floats(rstd),
                             dh.defined() ? floats(dh) : nullptr, floats(dx), dgain, has_bias ? &dbias : nullptr, rows, D,
                             center);
    return {dx, fused ? dx : torch::Tensor(), dgain.view_as(w), has_bias ? dbias.view_as(w) : torch::Tensor(),
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

void layer_norm_backward_rows(const float* x, const float* dy, const float* gain, const float* mean, const float* rstd,
                              const float* dres, float* dx, torch::Tensor& dgain, torch::Tensor* dbias, int64_t rows,
                              int64_t D, bool center, uint16_t* dx16, torch::Tensor* dx_sums) {
  const int64_t blocks = (rows + kBlockRows - 1) / kBlockRows, width = dbias ? 2 * D : D;
  std::vector<float> partial(static_cast<size_t>(blocks * width), 0.f);
  std::vector<float> dx_partial(dx_sums ? static_cast<size_t>(blocks * D) : 0, 0.f);
  const auto& k = cpu::table();
  const auto& k16 = cpu::bf16_table();  // (its rounding in one instruction where it can)
  at::parallel_for(0, blocks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      const int64_t r0 = b * kBlockRows, n = std::min(kBlockRows, rows - r0);
      float* sums = partial.data() + b * width;
      k.layer_norm_backward(x + r0 * D, dy + r0 * D, gain, mean + r0, rstd + r0, dres ? dres + r0 * D : nullptr,
                            dx + r0 * D, sums, dbias ? sums + D : nullptr, n, D, center);
      if (dx16 && dx_sums)
        k16.round_bf16_colsum(dx + r0 * D, dx16 + r0 * D, n, D, dx_partial.data() + b * D);
      else if (dx16)
        k16.round_bf16(dx + r0 * D, dx16 + r0 * D, n * D);
    }
  });
  // the blocks' sums, in block order
  auto ordered = [&](const std::vector<float>& part, int64_t w) {
    auto total = torch::zeros({w}, torch::kFloat32);
    float* t = total.data_ptr<float>();
    for (int64_t b = 0; b < blocks; ++b)
      for (int64_t i = 0; i < w; ++i) t[i] += part[b * w + i];
    return total;
  };
  const auto total = ordered(partial, width);
  dgain = total.narrow(0, 0, D);
  if (dbias) *dbias = total.narrow(0, D, D);
  if (dx_sums) *dx_sums = ordered(dx_partial, D);
}

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
