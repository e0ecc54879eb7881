// src/nn/layer_norm.h: LayerNorm and RMSNorm (and the residual add before them) on
// tinylm's loops, against LibTorch's ops, on every instruction set that runs here.
#include "../test_util.h"

#include <tinylm/nn/cpu_kernels.h>
#include <tinylm/nn/kernel_policy.h>

#include "nn/layer_norm.h"

#include <ATen/Parallel.h>

#include <cmath>
#include <vector>

using namespace tinylm::nn;
using tinylm::test::KernelGuard;
using tinylm::test::max_abs_diff;
using tinylm::test::runnable_isas;

namespace {

/// Leaf tensors for one case: x (2, rows, D) with a mean and spread of its own, r like x,
/// weight and bias (D) away from 1 and 0.
struct Inputs {
  torch::Tensor x, r, weight, bias;
  Inputs(int64_t rows, int64_t D, bool with_bias, bool with_gain = true) {
    x = (3 * torch::randn({2, rows, D}) + 1).requires_grad_();
    r = torch::randn({2, rows, D}).requires_grad_();
    if (with_gain) weight = (1 + 0.5 * torch::randn({D})).requires_grad_();
    if (with_bias) bias = torch::randn({D}).requires_grad_();
  }
  Inputs copy() const {
    Inputs c = *this;
    for (auto* t : {&c.x, &c.r, &c.weight, &c.bias})
      if (t->defined()) *t = t->detach().clone().requires_grad_();
    return c;
  }
};

}  // namespace

TEST_CASE("LayerNorm and RMSNorm on tinylm's loops: LibTorch's output and gradients to float32 rounding, "
          "with and without the residual add, gain and bias",
          "[nn][layer_norm]") {
  const CpuIsa isa = GENERATE(from_range(runnable_isas()));
  // Widths: whole vectors at every width, tails, under one vector; rows: several blocks,
  // one. (At D = 1 the output is exactly the bias; LibTorch's is its rounding of x - mean
  // times 1 / sqrt(eps), off by 3e-5.)
  const auto [rows, D] = GENERATE(std::make_pair(130, 128), std::make_pair(70, 37), std::make_pair(3, 3),
                                  std::make_pair(1, 256));
  const bool bias = GENERATE(true, false);
  const bool residual = GENERATE(true, false);
  const bool rms = GENERATE(false, true);
  const bool gain = GENERATE(true, false);
  KernelGuard guard(isa);
  INFO("loops " << to_string(isa) << " rows " << rows << " D " << D << " bias " << bias << " residual " << residual
                << " rms " << rms << " gain " << gain);
  torch::manual_seed(rows + D);
  Inputs ours(rows, D, bias, gain);
  Inputs theirs = ours.copy();
  KernelPolicy loops, libtorch;
  libtorch.layer_norm_loops = false;
  auto upstream = torch::randn({2, rows, D}), upstream_h = torch::randn({2, rows, D});
  if (residual) {
    auto [h, y] = add_layer_norm(ours.x, ours.r, ours.weight, ours.bias, 1e-5, loops, rms);
    auto [h2, y2] = add_layer_norm(theirs.x, theirs.r, theirs.weight, theirs.bias, 1e-5, libtorch, rms);
    CHECK(max_abs_diff(h, h2) == 0);  // one float32 addition either way
    CHECK(max_abs_diff(y, y2) < 1e-5);
    // Both outputs feed the loss: h's gradient joins the normalisation's on the way to x.
    ((y * upstream).sum() + (h * upstream_h).sum()).backward();
    ((y2 * upstream).sum() + (h2 * upstream_h).sum()).backward();
    CHECK(max_abs_diff(ours.r.grad(), theirs.r.grad()) < 1e-5 * std::sqrt(static_cast<double>(D)));
  } else {
    auto y = layer_norm(ours.x, ours.weight, ours.bias, 1e-5, loops, rms);
    auto y2 = layer_norm(theirs.x, theirs.weight, theirs.bias, 1e-5, libtorch, rms);
    CHECK(max_abs_diff(y, y2) < 1e-5);
    y.backward(upstream);
    y2.backward(upstream);
  }
  CHECK(max_abs_diff(ours.x.grad(), theirs.x.grad()) < 1e-5 * std::sqrt(static_cast<double>(D)));
  const double sum_tol = 2e-5 * std::sqrt(2.0 * static_cast<double>(rows));  // sums over rows
  if (gain) CHECK(max_abs_diff(ours.weight.grad(), theirs.weight.grad()) < sum_tol);
  if (bias) CHECK(max_abs_diff(ours.bias.grad(), theirs.bias.grad()) < sum_tol);
}

TEST_CASE("LayerNorm on tinylm's loops: the same bits on one thread and on two", "[nn][layer_norm]") {
  const bool residual = GENERATE(true, false);
  const int before = at::get_num_threads();
  std::vector<torch::Tensor> runs[2];
  for (int threads : {1, 2}) {
    at::set_num_threads(threads);
    torch::manual_seed(5);
    Inputs in(300, 96, true);  // several backward blocks and forward tasks
    auto upstream = torch::randn({2, 300, 96});
    torch::Tensor y;
    if (residual) {
      auto out = add_layer_norm(in.x, in.r, in.weight, in.bias, 1e-5, KernelPolicy{});
      y = out.second;
      ((out.second + out.first) * upstream).sum().backward();
    } else {
      y = layer_norm(in.x, in.weight, in.bias, 1e-5, KernelPolicy{});
      y.backward(upstream);
    }
    runs[threads - 1] = {y, in.x.grad(), in.weight.grad(), in.bias.grad()};
  }
  at::set_num_threads(before);
  for (size_t i = 0; i < runs[0].size(); ++i) {
    INFO("tensor " << i);
    CHECK(torch::equal(runs[0][i], runs[1][i]));
  }
}

TEST_CASE("LayerNorm on tinylm's loops: a row's output and gradient are the same bits alone as among others",
          "[nn][layer_norm]") {
  // Each row's result depends on that row alone, not on the rows a call takes with it (a
  // kernel that took one row's statistics for another's, or blocked rows in a way that
  // changed their sums, fails here).
  const CpuIsa isa = GENERATE(from_range(runnable_isas()));
  const int64_t D = GENERATE(128, 37, 300);  // whole vectors, a tail, longer rows
  const bool residual = GENERATE(true, false);
  const bool rms = GENERATE(false, true);
  KernelGuard guard(isa);
  INFO("loops " << to_string(isa) << " D " << D << " residual " << residual << " rms " << rms);
  const int64_t rows = 21;
  torch::manual_seed(D);
  Inputs all(rows, D, true);
  auto upstream = torch::randn({2, rows, D});
  auto normed = [&](const torch::Tensor& x, const torch::Tensor& r, const torch::Tensor& w, const torch::Tensor& b) {
    return residual ? add_layer_norm(x, r, w, b, 1e-5, KernelPolicy{}, rms).second
                    : layer_norm(x, w, b, 1e-5, KernelPolicy{}, rms);
  };
  auto y = normed(all.x, all.r, all.weight, all.bias);
  y.backward(upstream);
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t i = 0; i < rows; ++i) {
      INFO("batch " << b << " row " << i);
      auto x = all.x.detach()[b][i].clone().requires_grad_(), r = all.r.detach()[b][i].clone();
      auto alone = normed(x, r, all.weight.detach(), all.bias.detach());
      alone.backward(upstream[b][i]);
      CHECK(torch::equal(alone, y.detach()[b][i]));
      CHECK(torch::equal(x.grad(), all.x.grad()[b][i]));
    }
}
