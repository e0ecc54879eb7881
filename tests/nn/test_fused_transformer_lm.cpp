// src/nn/fused_transformer_lm.cpp: the TransformerLM's fused bfloat16 loss equals its
// modules' (the same kernels and roundings), and is used exactly where it applies.
#include "../test_util.h"

#include <tinylm/nn/cpu_kernels.h>
#include <tinylm/nn/model.h>

#include <cmath>
#include <string>
#include <tuple>
#include <vector>

using namespace tinylm::nn;

namespace {

struct FusedCase {
  bool bias, norm_bias, rms, exact, tied;
  PositionEncoding positions;
  int64_t layers;
};

TransformerLMOptions fused_case_options(const FusedCase& c) {
  TransformerLMOptions o(40, 32, 32, 2, c.layers);  // V 40, context 32, D 32, 2 heads (Dh 16)
  o.tie_weights(c.tied).positions(c.positions);
  o.block().attention().bias(c.bias);
  o.block().mlp().bias(c.bias).activation(c.exact ? Activation::gelu : Activation::gelu_tanh);
  o.block().norm().bias(c.norm_bias).kind(c.rms ? NormKind::rms_norm : NormKind::layer_norm);
  KernelPolicy policy;
  policy.bf16_products = true;
  o.kernel_policy(policy);
  return o;
}

/// The model's loss on (ids, targets) and its gradients, its backward from `scale`; and
/// how many fused losses ran for it.
struct LossAndGrads {
  double loss = 0;
  std::vector<torch::Tensor> grads;
  int64_t fused = 0;
};

LossAndGrads loss_and_grads(TransformerLM& m, const torch::Tensor& ids, const torch::Tensor& targets, double scale) {
  m->zero_grad();
  const auto before = kernel_counts();
  auto loss = m->loss(ids, targets);
  const int64_t fused = (kernel_counts() - before).fused_models;
  loss.backward(torch::full({}, scale));
  LossAndGrads out{loss.item<double>(), {}, fused};
  for (const auto& p : m->parameters()) out.grads.push_back(p.grad().defined() ? p.grad().clone() : torch::Tensor());
  return out;
}

}  // namespace

TEST_CASE("the fused TransformerLM loss equals its modules' loss and gradients with bfloat16 products",
          "[nn][model][fused][bf16]") {
  const auto c = GENERATE(FusedCase{false, false, false, true, true, PositionEncoding::learned, 2},  // nanoGPT's
                          FusedCase{true, true, false, false, false, PositionEncoding::sinusoidal, 3},
                          FusedCase{true, false, true, true, true, PositionEncoding::none, 1},
                          FusedCase{false, true, false, false, false, PositionEncoding::learned, 2});
  const double scale = GENERATE(1.0, 2.5);
  INFO("bias " << c.bias << " norm bias " << c.norm_bias << " rms " << c.rms << " exact " << c.exact << " tied "
               << c.tied << " positions " << static_cast<int>(c.positions) << " layers " << c.layers << " scale "
               << scale);
  torch::manual_seed(3);
  auto ids = torch::randint(40, {3, 16}, torch::kLong), targets = torch::randint(40, {3, 16}, torch::kLong);
  targets[1][4] = kIgnoreTarget;  // a position nothing predicts
  torch::manual_seed(4);
  TransformerLM m(fused_case_options(c));
  if (!bf16_products_missing().empty()) {  // where the products cannot run, nor can the op
    CHECK_THROWS(m->loss(ids, targets));
    return;
  }
  {  // weights away from their initial zeros and ones, so that every gradient term shows
    torch::NoGradGuard no_grad;
    for (auto& p : m->parameters()) p.add_(torch::randn_like(p) * 0.1);
  }
  const auto fused = loss_and_grads(m, ids, targets, scale);
  auto policy = *m->kernel_policy();
  policy.fuse_whole_model = false;
  m->set_kernel_policy(policy);
  const auto modules = loss_and_grads(m, ids, targets, scale);
  CHECK(fused.fused == 1);
  CHECK(modules.fused == 0);
  CHECK(std::abs(fused.loss - modules.loss) < 1e-5 * modules.loss);
  const auto names = m->named_parameters().keys();
  REQUIRE(fused.grads.size() == modules.grads.size());
  for (size_t i = 0; i < fused.grads.size(); ++i) {
    INFO("parameter " << names[i]);
    REQUIRE(fused.grads[i].defined());
    REQUIRE(modules.grads[i].defined());
    const double size = modules.grads[i].abs().max().item<double>();
    CHECK(size > 0);
    // The same products and roundings; the sums of bias, gain and residual gradients in
    // another order: float32 rounding (measured: 1e-6 of the largest gradient at most).
    CHECK((fused.grads[i] - modules.grads[i]).abs().max().item<double>() <= 1e-4 * size);
  }
}

TEST_CASE("the TransformerLM's loss is fused only where the op computes what the modules would",
          "[nn][model][fused][bf16]") {
  if (!bf16_products_missing().empty()) return;  // (the case above checks the refusal)
  torch::manual_seed(5);
  auto ids = torch::randint(40, {2, 16}, torch::kLong), targets = torch::randint(40, {2, 16}, torch::kLong);
  auto fused_runs = [&](TransformerLMOptions o, bool grad = true, bool train = true) {
    TransformerLM m(o);
    m->train(train);
    torch::AutoGradMode mode(grad);
    const auto before = kernel_counts();
    auto loss = m->loss(ids, targets);
    CHECK(std::isfinite(loss.item<double>()));
    return (kernel_counts() - before).fused_models;
  };
  const auto base = fused_case_options({false, false, false, true, true, PositionEncoding::learned, 1});
  CHECK(fused_runs(base) == 1);
  CHECK(fused_runs(base, /*grad=*/false) == 0);  // evaluation: the modules
  auto o = base;
  o.dropout(0.1);  // (one dropout for the architecture)
  o.block().attention().out_dropout(0.1);
  o.block().mlp().dropout(0.1);
  CHECK(fused_runs(o) == 0);
  CHECK(fused_runs(o, true, /*train=*/false) == 1);  // dropout off outside training
  o = base;
  o.block().mlp().activation(Activation::swiglu);
  CHECK(fused_runs(o) == 0);
  o = base;
  o.positions(PositionEncoding::rotary);
  CHECK(fused_runs(o) == 0);
  o = base;
  o.block().attention().n_kv_heads(1);
  CHECK(fused_runs(o) == 0);
  o = base;
  o.block().pre_ln(false);
  CHECK(fused_runs(o) == 0);
  auto ids_odd = torch::randint(40, {2, 12}, torch::kLong);  // T not a multiple of 16: no bfloat16 attention
  {
    TransformerLM m(base);
    const auto before = kernel_counts();
    m->loss(ids_odd, ids_odd).backward();
    CHECK((kernel_counts() - before).fused_models == 0);
  }
  auto f32 = base;
  f32.kernel_policy(KernelPolicy{});
  CHECK(fused_runs(f32) == 0);  // float32 products: the modules
}

TEST_CASE("the fused TransformerLM loss refuses a target outside the vocabulary", "[nn][model][fused][bf16]") {
  if (!bf16_products_missing().empty()) return;
  TransformerLM m(fused_case_options({false, false, false, true, true, PositionEncoding::learned, 1}));
  auto ids = torch::randint(40, {2, 16}, torch::kLong), targets = torch::randint(40, {2, 16}, torch::kLong);
  targets[0][3] = 40;
  const auto before = kernel_counts();
  CHECK_THAT(tinylm::test::error_message([&] { m->loss(ids, targets); }),
             Catch::Contains("target 40 is outside the vocabulary [0, 40)"));
  CHECK((kernel_counts() - before).fused_models == 1);  // the op's own check, before any work
}
