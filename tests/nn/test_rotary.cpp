// src/nn/rotary.h: rotary positions on tinylm's loops against LibTorch's ops, on every
// instruction set that runs here, from a view of a projection's output as the attention
// hands it over.
#include "../test_util.h"

#include <tinylm/nn/cpu_kernels.h>
#include <tinylm/nn/kernel_policy.h>

#include "nn/rotary.h"

#include <cmath>

using namespace tinylm::nn;
using tinylm::test::KernelGuard;
using tinylm::test::max_abs_diff;
using tinylm::test::runnable_isas;

TEST_CASE("rotary positions on tinylm's loops: LibTorch's rotation and its gradient to float32 rounding",
          "[nn][rotary]") {
  const CpuIsa isa = GENERATE(from_range(runnable_isas()));
  // Head widths: whole vectors at every width (half 16), tails (half 5, 13), under one (1).
  const int64_t Dh = GENERATE(32, 10, 26, 2);
  const int64_t start = GENERATE(0, 7);
  KernelGuard guard(isa);
  INFO("loops " << to_string(isa) << " Dh " << Dh << " start " << start);
  torch::manual_seed(Dh + start);
  const int64_t B = 3, T = 9, H = 2, Hkv = 1;
  // The projection's output [q | k | v] (B, T, (H + 2 Hkv) Dh); q as the attention takes it.
  auto qkv = torch::randn({B, T, (H + 2 * Hkv) * Dh}).requires_grad_();
  auto qkv2 = qkv.detach().clone().requires_grad_();
  KernelPolicy loops, libtorch;
  libtorch.rotary_loops = false;
  auto q = qkv.narrow(2, 0, H * Dh).view({B, T, H, Dh});
  auto q2 = qkv2.narrow(2, 0, H * Dh).view({B, T, H, Dh});
  REQUIRE_FALSE(q.is_contiguous());
  auto y = rotate_halves(q, start, 500.0, loops), y2 = rotate_halves(q2, start, 500.0, libtorch);
  CHECK(max_abs_diff(y, y2) < 1e-6);
  // A rotation keeps each pair's length.
  auto pairs = [&](const torch::Tensor& t) {
    return t.narrow(3, 0, Dh / 2).pow(2) + t.narrow(3, Dh / 2, Dh / 2).pow(2);
  };
  CHECK(max_abs_diff(pairs(y), pairs(q.detach())) < 1e-5);
  if (start == 0) CHECK(max_abs_diff(y.select(1, 0), q.detach().select(1, 0)) == 0);  // position 0: no turn
  auto upstream = torch::randn({B, T, H, Dh});
  y.backward(upstream);
  y2.backward(upstream);
  CHECK(max_abs_diff(qkv.grad(), qkv2.grad()) < 1e-6);
  CHECK(max_abs_diff(qkv.grad().narrow(2, H * Dh, 2 * Hkv * Dh), torch::zeros({B, T, 2 * Hkv * Dh})) == 0);
}
