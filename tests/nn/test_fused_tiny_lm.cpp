// src/nn/fused_tiny_lm.cpp: the TinyAttentionLM's fused loss equals the step-by-step one.
#include "../test_util.h"

#include <tinylm/nn/cpu_kernels.h>
#include <tinylm/nn/model.h>

#include "nn/fused_tiny_lm.h"

#include <algorithm>
#include <cmath>
#include <tuple>

using namespace tinylm::nn;
using tinylm::test::KernelGuard;
using tinylm::test::max_abs_diff;
using tinylm::test::runnable_backends;
using tinylm::test::runnable_isas;

namespace {

/// The fused op on a model's own tensors and policy, whatever loss() would pick.
torch::Tensor fused_tiny_lm_loss(TinyAttentionLMImpl& m, const torch::Tensor& ids, const torch::Tensor& targets) {
  const auto& a = *m.attention;
  const TinyLMTensors tensors{m.token_embedding->weight, m.sinusoidal_positions->forward(ids.size(1)),
                              a.qkv_proj->weight, a.qkv_proj->bias, a.out_proj->weight, a.out_proj->bias,
                              m.lm_head->weight, m.lm_head->bias, m.options.n_heads(), m.options.context_length(),
                              kIgnoreTarget};
  return tinylm::nn::fused_tiny_lm_loss(tensors, ids, targets, *a.options.kernel_policy());
}

}  // namespace

TEST_CASE("the fused TinyAttentionLM loss is exact for an overconfident model",
          "[nn][model][fused]") {
  // Logits hundreds of nats apart: the true cross-entropy is in the hundreds. A loss
  // formed from a clamped probability would stop at -ln(1e-38) = 87.5 per token.
  torch::manual_seed(9);
  TinyAttentionLM m(TinyAttentionLMOptions(16, 6, 8, 2));
  {
    torch::NoGradGuard g;
    m->lm_head->weight.mul_(2000.0);
  }
  auto ids = torch::randint(16, {4, 6}, torch::kLong), targets = torch::randint(16, {4, 6}, torch::kLong);
  const double reference = torch::nn::functional::cross_entropy(
      m->forward(ids).logits.reshape({-1, 16}).to(torch::kFloat64), targets.reshape({-1})).item<double>();
  const double fused = fused_tiny_lm_loss(*m, ids, targets).item<double>();
  INFO("reference " << reference << ", fused " << fused);
  REQUIRE(reference > 100.0);
  CHECK(std::abs(fused - reference) / reference < 1e-5);
}

TEST_CASE("the fused TinyAttentionLM loss equals the step-by-step loss and gradients",
          "[nn][model][fused]") {
  const auto [V, D, H, T, B] = GENERATE(std::make_tuple(64, 32, 4, 12, 16), std::make_tuple(7, 6, 3, 5, 2),
                                        std::make_tuple(50, 16, 1, 1, 3), std::make_tuple(37, 20, 2, 11, 3));
  const CpuIsa isa = GENERATE(from_range(runnable_isas()));
  const GemmBackend backend = GENERATE(from_range(runnable_backends()));
  INFO("V " << V << " D " << D << " H " << H << " T " << T << " B " << B << " loops "
            << to_string(isa) << " products " << to_string(backend));
  KernelGuard kernels(isa);
  torch::manual_seed(V + T);
  TinyAttentionLM a(TinyAttentionLMOptions(V, 12, D, H).attention_kernel(AttentionKernel::plain));
  KernelPolicy products;
  products.gemm = backend;  // every product of the fused op through this backend
  TinyAttentionLM b(TinyAttentionLMOptions(V, 12, D, H).kernel_policy(products));
  {
    torch::NoGradGuard g;
    auto src = a->named_parameters();
    for (auto& p : b->named_parameters()) p.value().copy_(src[p.key()]);
  }
  auto ids = torch::randint(V, {B, T}, torch::kLong), targets = torch::randint(V, {B, T}, torch::kLong);
  if (T > 1) targets.select(1, 0).fill_(kIgnoreTarget);  // an unscored first position
  // Both through loss(): the plain model takes the default path, the other the fused op.
  auto plain = a->loss(ids, targets);
  auto fused = b->loss(ids, targets);
  CHECK(fused.dim() == 0);
  CHECK(fused.item<double>() == fused_tiny_lm_loss(*b, ids, targets).item<double>());
  const double by_hand = torch::nn::functional::cross_entropy(
      a->forward(ids).logits.reshape({-1, V}), targets.reshape({-1}),
      torch::nn::functional::CrossEntropyFuncOptions().ignore_index(kIgnoreTarget)).item<double>();
  CHECK(plain.item<double>() == Approx(by_hand).epsilon(1e-6));
  CHECK(std::abs(plain.item<double>() - fused.item<double>()) < 1e-5);
  (plain * 3.0).backward();  // a non-unit upstream gradient
  (fused * 3.0).backward();
  auto pa = a->named_parameters();
  for (const auto& p : b->named_parameters()) {
    INFO(p.key());
    REQUIRE(p.value().grad().defined());
    CHECK(max_abs_diff(p.value().grad(), pa[p.key()].grad()) < 2e-5);
  }
}

TEST_CASE("the fused TinyAttentionLM loss's gradients match finite differences",
          "[nn][model][fused]") {
  // The fused op is float32-only: compare its gradient of every parameter with central
  // differences of its own loss, on each instruction set.
  const CpuIsa isa = GENERATE(from_range(runnable_isas()));
  INFO("loops " << to_string(isa));
  KernelGuard kernels(isa);
  torch::manual_seed(3);
  TinyAttentionLM m(TinyAttentionLMOptions(11, 6, 12, 3));
  auto ids = torch::randint(11, {2, 6}, torch::kLong), targets = torch::randint(11, {2, 6}, torch::kLong);
  targets[0][0] = kIgnoreTarget;
  fused_tiny_lm_loss(*m, ids, targets).backward();
  const float h = 1e-2f;
  for (const auto& p : m->named_parameters()) {
    if (!p.value().grad().defined()) continue;
    INFO(p.key());
    auto flat = p.value().view({-1});
    auto grad = p.value().grad().view({-1});
    double worst = 0;
    for (int64_t i = 0; i < flat.numel(); i += std::max<int64_t>(1, flat.numel() / 12)) {
      torch::NoGradGuard g;
      const float saved = flat[i].item<float>();
      flat[i] = saved + h;
      const double up = fused_tiny_lm_loss(*m, ids, targets).item<double>();
      flat[i] = saved - h;
      const double down = fused_tiny_lm_loss(*m, ids, targets).item<double>();
      flat[i] = saved;
      worst = std::max(worst, std::abs((up - down) / (2 * h) - grad[i].item<double>()));
    }
    INFO("largest |numeric - analytic| " << worst);
    CHECK(worst < 2e-3);
  }
}
