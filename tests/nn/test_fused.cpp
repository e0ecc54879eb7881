// The fast paths compute what the plain paths compute, within stated tolerances.
#include "../test_util.h"

#include <tinylm/nn/attention.h>
#include <tinylm/nn/cpu_kernels.h>
#include <tinylm/generate.h>
#include "nn/fused_attention.h"
#include "nn/fused_tiny_lm.h"
#include <tinylm/nn/model.h>
#include <tinylm/train/optimizer.h>

#include <torch/version.h>

using namespace tinylm;
using namespace tinylm::nn;
using tinylm::test::max_abs_diff;

namespace {

/// The instruction sets of tinylm's loops that run here (generic always; avx2 where the
/// CPU and the build have it), each set for the life of a guard.
std::vector<CpuIsa> runnable_isas() {
  std::vector<CpuIsa> v = {CpuIsa::generic};
  if (cpu_isa_available(CpuIsa::avx2)) v.push_back(CpuIsa::avx2);
  return v;
}

/// The product backends that run here.
std::vector<GemmBackend> runnable_backends() {
  std::vector<GemmBackend> v = {GemmBackend::blas, GemmBackend::hand};
  if (gemm_backend_available(GemmBackend::libxsmm)) v.push_back(GemmBackend::libxsmm);
  return v;
}

struct KernelGuard {
  KernelGuard(CpuIsa isa, GemmBackend backend = GemmBackend::automatic) {
    set_cpu_isa(isa);
    set_gemm_backend(backend);
  }
  ~KernelGuard() {
    set_cpu_isa(CpuIsa::automatic);
    set_gemm_backend(GemmBackend::automatic);
  }
};

}  // namespace

TEST_CASE("fused attention equals the step-by-step path, forward and backward",
          "[nn][attention][fused]") {
  const auto [B, T, D, H] = GENERATE(std::make_tuple(16, 12, 32, 4), std::make_tuple(2, 1, 8, 2),
                                     std::make_tuple(3, 33, 48, 6), std::make_tuple(1, 64, 64, 1),
                                     std::make_tuple(2, 9, 30, 3), std::make_tuple(1, 31, 20, 2));
  const bool causal = GENERATE(true, false);
  const CpuIsa isa = GENERATE(from_range(runnable_isas()));
  INFO("B " << B << " T " << T << " D " << D << " H " << H << " causal " << causal << " loops "
            << to_string(isa));
  KernelGuard kernels(isa);
  torch::manual_seed(B * 100 + T);
  MultiHeadSelfAttention plain(MultiHeadSelfAttentionOptions(D, H, 64).causal(causal).fused(false));
  MultiHeadSelfAttention fused(
      MultiHeadSelfAttentionOptions(D, H, 64).causal(causal).kernel(AttentionKernel::fused));
  {
    torch::NoGradGuard g;
    auto src = plain->named_parameters();
    for (auto& p : fused->named_parameters()) p.value().copy_(src[p.key()]);
  }
  auto x1 = torch::randn({B, T, D}, torch::requires_grad());
  auto x2 = x1.detach().clone().requires_grad_(true);
  auto a = plain(x1, true), b = fused(x2);  // the fused kernel: no weights asked for
  CHECK(max_abs_diff(a.output, b.output) < 1e-5);
  {
    torch::NoGradGuard no_grad;  // weights without autograd come from the fused kernel too
    CHECK(max_abs_diff(a.weights, fused(x2, true).weights) < 1e-6);
  }
  auto w = torch::randn({B, T, D});  // a random upstream gradient
  (a.output * w).sum().backward();
  (b.output * w).sum().backward();
  CHECK(max_abs_diff(x1.grad(), x2.grad()) < 1e-5);
  CHECK(max_abs_diff(plain->qkv_proj->weight.grad(), fused->qkv_proj->weight.grad()) < 1e-4);
  CHECK(max_abs_diff(plain->qkv_proj->bias.grad(), fused->qkv_proj->bias.grad()) < 1e-4);
  CHECK(max_abs_diff(plain->out_proj->weight.grad(), fused->out_proj->weight.grad()) < 1e-4);
}

TEST_CASE("fused attention gradients match finite differences",
          "[nn][attention][fused]") {
  // The kernel is float32-only; check its gradient against finite differences of itself.
  const CpuIsa isa = GENERATE(from_range(runnable_isas()));
  const bool causal = GENERATE(true, false);
  INFO("loops " << to_string(isa) << " causal " << causal);
  KernelGuard kernels(isa);
  torch::manual_seed(7);
  auto qkv = torch::randn({2, 5, 12});
  auto w = torch::randn({2, 5, 4});
  auto f = [&](const torch::Tensor& in) { return (fused_self_attention(in, 2, causal) * w).sum(); };
  auto x = qkv.clone().requires_grad_(true);
  f(x).backward();
  auto analytic = x.grad();
  const float h = 1e-2f;
  double worst = 0;
  for (int64_t i = 0; i < qkv.numel(); i += 3) {
    auto plus = qkv.clone(), minus = qkv.clone();
    plus.view({-1})[i] += h;
    minus.view({-1})[i] -= h;
    const double numeric = (f(plus).item<double>() - f(minus).item<double>()) / (2 * h);
    worst = std::max(worst, std::abs(numeric - analytic.view({-1})[i].item<double>()));
  }
  INFO("largest |numeric - analytic| " << worst);
  CHECK(worst < 2e-3);
}

TEST_CASE("attention weights asked for with autograd on carry gradients on every path",
          "[nn][attention][fused]") {
  // A loss on the weights themselves (an attention penalty, a distillation target) must
  // reach the parameters: the fused kernel's weights are not differentiable, so asking
  // for weights with grad mode on takes the step-by-step path.
  const int64_t T = GENERATE(12, 40);  // the loop kernel and the batched-BLAS kernel
  torch::manual_seed(T);
  MultiHeadSelfAttention plain(MultiHeadSelfAttentionOptions(16, 4, 64).fused(false));
  MultiHeadSelfAttention fused(MultiHeadSelfAttentionOptions(16, 4, 64));
  {
    torch::NoGradGuard g;
    auto src = plain->named_parameters();
    for (auto& p : fused->named_parameters()) p.value().copy_(src[p.key()]);
  }
  auto x = torch::randn({3, T, 16});
  auto target = torch::rand({3, 4, T, T});
  auto loss_of = [&](MultiHeadSelfAttention& m) {
    auto out = m(x, /*return_weights=*/true);
    REQUIRE(out.weights.requires_grad());
    return (out.weights * target).sum() + 0.1 * out.output.sum();
  };
  loss_of(plain).backward();
  loss_of(fused).backward();
  const double g = fused->qkv_proj->weight.grad().abs().max().item<double>();
  INFO("largest |dL/dWqkv| " << g);
  CHECK(g > 1e-3);  // the weights' term reached the projection
  CHECK(max_abs_diff(plain->qkv_proj->weight.grad(), fused->qkv_proj->weight.grad()) < 1e-5);
  CHECK(max_abs_diff(plain->qkv_proj->bias.grad(), fused->qkv_proj->bias.grad()) < 1e-5);
}

TEST_CASE("fused attention is used only where it applies", "[nn][attention][fused]") {
  CHECK(fused_attention_supported(torch::zeros({1, 2, 6})));
  CHECK_FALSE(fused_attention_supported(torch::zeros({1, 2, 6}, torch::kFloat64)));
  // With a padding mask or attention dropout the plain path runs and still gives weights.
  MultiHeadSelfAttention attn(MultiHeadSelfAttentionOptions(8, 2, 8).attn_dropout(0.5));
  auto x = torch::randn({1, 4, 8});
  attn->train();
  CHECK(attn(x, true).weights.defined());
  attn->eval();
  CHECK(attn(x, true, torch::ones({1, 4}, torch::kBool)).weights.sizes() == torch::IntArrayRef({1, 2, 4, 4}));
}

namespace {

/// Trains two identical models for `steps` steps, one with LibTorch's Adam/AdamW and one
/// with the flat fused version; returns the largest parameter difference at the end.
double optimizer_divergence(bool adamw, int steps) {
  torch::manual_seed(3);
  TransformerLM a(TransformerLMOptions(40, 8, 16, 2, 2).dropout(0.0));
  TransformerLM b(TransformerLMOptions(40, 8, 16, 2, 2).dropout(0.0));
  {
    torch::NoGradGuard g;
    auto src = a->named_parameters();
    for (auto& p : b->named_parameters()) p.value().copy_(src[p.key()]);
  }
  train::AdamConfig c;
  c.lr = 1e-2;
  c.decoupled = adamw;
  c.weight_decay = adamw ? 0.1 : 0.0;
  auto opt_a = train::make_torch_adam(*a, c);
  auto opt_b = train::make_flat_adam(*b, c);
  for (int s = 0; s < steps; ++s) {
    auto ids = torch::randint(40, {4, 8}, torch::kLong);
    for (auto [model, opt] : {std::make_pair(a.ptr().get(), opt_a.get()),
                              std::make_pair(b.ptr().get(), opt_b.get())}) {
      opt->zero_grad();
      auto logits = model->forward(ids).logits;
      torch::nn::functional::cross_entropy(logits.reshape({-1, 40}), ids.reshape({-1})).backward();
      opt->clip_grad_norm(0.5);
      opt->step(c.lr);
    }
  }
  double worst = 0;
  auto pa = a->named_parameters();
  for (const auto& p : b->named_parameters()) worst = std::max(worst, max_abs_diff(p.value(), pa[p.key()]));
  return worst;
}

}  // namespace

TEST_CASE("flat Adam's update matches LibTorch's to float rounding, also at beta2 near 1",
          "[train][optim][fused]") {
  // One parameter matrix, the same gradients, five steps. Compared with
  // torch::optim::Adam/AdamW: the second moments and the updates agree to 1e-6 relative.
  // Forming 1 - beta in float32 from the rounded beta made the second moment 1.3e-5
  // (beta2 0.999) to 1.3e-4 (0.9999) too small and every update 6.7e-6 to 1.7e-4 too
  // large: both beyond this tolerance. The parameters start at 0 so that the updates are
  // not drowned by the rounding of large weights.
  const double beta2 = GENERATE(0.999, 0.9999);
  const bool adamw = GENERATE(false, true);
  INFO("beta2 " << beta2 << (adamw ? " AdamW" : " Adam"));
  torch::manual_seed(5);
  struct Holder : torch::nn::Module {
    torch::Tensor w;
    Holder() {  // a Linear layer's weight: AdamW decays it
      auto layer = register_module("lin", torch::nn::Linear(torch::nn::LinearOptions(64, 64).bias(false)));
      w = layer->weight;
      torch::NoGradGuard no_grad;
      w.zero_();
    }
  };
  Holder a, b;
  train::AdamConfig c;
  c.lr = 1e-3;
  c.beta2 = beta2;
  c.decoupled = adamw;
  c.weight_decay = adamw ? 0.1 : 0.0;
  auto ref = train::make_torch_adam(a, c);
  auto flat = train::make_flat_adam(b, c);
  for (int step = 0; step < 5; ++step) {
    auto g = torch::randn({64, 64});
    a.w.mutable_grad() = g.clone();
    b.w.grad().copy_(g);
    ref->step(c.lr);
    flat->step(c.lr);
  }
  auto relative = [](const torch::Tensor& x, const torch::Tensor& y) {
    return max_abs_diff(x, y) / y.abs().max().item<double>();
  };
  const auto v_ref = ref->state_dict().at("lin.weight.exp_avg_sq");
  const auto v_flat = flat->state_dict().at("exp_avg_sq").view({64, 64});
  const double v_rel = relative(v_flat, v_ref), p_rel = relative(b.w.detach(), a.w.detach());
  INFO("second moment " << v_rel << ", parameters " << p_rel << " (relative)");
  CHECK(v_rel < 1e-6);
  CHECK(p_rel < 1e-6);
}

TEST_CASE("flat fused Adam and AdamW follow LibTorch's within float rounding", "[train][optim][fused]") {
  const bool adamw = GENERATE(false, true);
  const double d = optimizer_divergence(adamw, 20);
  INFO((adamw ? "AdamW" : "Adam") << ": largest parameter difference after 20 steps " << d);
  CHECK(d < 1e-4);
}

TEST_CASE("flat Adam keeps parameters and gradients in one buffer each", "[train][optim][fused]") {
  TransformerLM m(TransformerLMOptions(20, 8, 8, 2, 1));
  train::AdamConfig c;
  auto opt = train::make_flat_adam(*m, c);
  auto params = m->parameters();
  // Each parameter's storage is the first one's: views into one flat buffer.
  for (const auto& p : params) CHECK(p.storage().is_alias_of(params.front().storage()));
  auto ids = torch::randint(20, {2, 8}, torch::kLong);
  torch::nn::functional::cross_entropy(m->forward(ids).logits.reshape({-1, 20}), ids.reshape({-1})).backward();
  for (const auto& p : params) {
    REQUIRE(p.grad().defined());
    CHECK(p.grad().storage().is_alias_of(params.front().grad().storage()));
  }
  opt->zero_grad();
  for (const auto& p : params) CHECK(p.grad().abs().max().item<double>() == 0.0);
}

TEST_CASE("KV-cache decoding gives the same logits and tokens as full recomputation",
          "[generate][kvcache]") {
  torch::manual_seed(11);
  TransformerLM model(TransformerLMOptions(50, 16, 32, 4, 2));
  model->eval();
  torch::NoGradGuard no_grad;
  auto ids = torch::randint(50, {2, 10}, torch::kLong);
  KVCache cache;
  auto first = model->forward_cached(ids.narrow(1, 0, 6), cache);   // 6 tokens at once
  auto rest = model->forward_cached(ids.narrow(1, 6, 4), cache);    // then 4 more
  auto full = model->forward(ids).logits;
  CHECK(cache.length == 10);
  CHECK(max_abs_diff(torch::cat({first, rest}, 1), full) < 1e-4);

  TinyAttentionLM tiny(TinyAttentionLMOptions(50, 12, 16, 4));
  KVCache tc;
  auto t1 = tiny->forward_cached(ids.narrow(1, 0, 9), tc);
  auto t2 = tiny->forward_cached(ids.narrow(1, 9, 1), tc);
  CHECK(max_abs_diff(torch::cat({t1, t2}, 1), tiny->forward(ids).logits) < 1e-4);

  // Generation: same tokens with and without the cache, also past the context (16).
  GenerateOptions o;
  o.max_new_tokens = 30;
  o.seed = 5;
  o.use_kv_cache = true;
  auto with_cache = generate(*model, ids.narrow(1, 0, 3), o);
  o.use_kv_cache = false;
  auto without = generate(*model, ids.narrow(1, 0, 3), o);
  CHECK(torch::equal(with_cache, without));
}

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
  KernelGuard kernels(isa, backend);
  torch::manual_seed(V + T);
  TinyAttentionLM a(TinyAttentionLMOptions(V, 12, D, H).attention_kernel(AttentionKernel::plain));
  TinyAttentionLM b(TinyAttentionLMOptions(V, 12, D, H));
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

#if TORCH_VERSION_MAJOR >= 2
TEST_CASE("SDPA attention equals the step-by-step path, forward and every gradient",
          "[nn][attention][sdpa]") {
  // LibTorch >= 2 only (this test is compiled there): at::scaled_dot_product_attention
  // through the module's kernel switch, against the plain path, at 1e-5.
  const auto [B, T, D, H] = GENERATE(std::make_tuple(16, 12, 32, 4), std::make_tuple(2, 1, 8, 2),
                                     std::make_tuple(3, 40, 48, 6));
  const bool causal = GENERATE(true, false);
  INFO("B " << B << " T " << T << " D " << D << " H " << H << " causal " << causal);
  REQUIRE(sdpa_available());
  torch::manual_seed(B * 10 + T);
  MultiHeadSelfAttention plain(
      MultiHeadSelfAttentionOptions(D, H, 64).causal(causal).kernel(AttentionKernel::plain));
  MultiHeadSelfAttention sdpa(
      MultiHeadSelfAttentionOptions(D, H, 64).causal(causal).kernel(AttentionKernel::sdpa));
  {
    torch::NoGradGuard g;
    auto src = plain->named_parameters();
    for (auto& p : sdpa->named_parameters()) p.value().copy_(src[p.key()]);
  }
  auto x1 = torch::randn({B, T, D}, torch::requires_grad());
  auto x2 = x1.detach().clone().requires_grad_(true);
  auto a = plain(x1).output, b = sdpa(x2).output;
  CHECK(max_abs_diff(a, b) < 1e-5);
  auto w = torch::randn({B, T, D});
  (a * w).sum().backward();
  (b * w).sum().backward();
  CHECK(max_abs_diff(x1.grad(), x2.grad()) < 1e-5);
  auto pa = plain->named_parameters();
  for (const auto& p : sdpa->named_parameters()) {
    INFO(p.key());
    CHECK(max_abs_diff(p.value().grad(), pa[p.key()].grad()) < 1e-5);
  }
}

TEST_CASE("SDPA is chosen where it applies and steps aside where it does not",
          "[nn][attention][sdpa]") {
  MultiHeadSelfAttention attn(MultiHeadSelfAttentionOptions(8, 2, 8).kernel(AttentionKernel::sdpa));
  auto x = torch::randn({2, 4, 8});
  // Weights asked for or a padding mask: the step-by-step path gives them.
  CHECK(attn(x, true).weights.sizes() == torch::IntArrayRef({2, 2, 4, 4}));
  CHECK(attn(x, false, torch::ones({2, 4}, torch::kBool)).output.sizes() == x.sizes());
  // Attention dropout goes through SDPA in training: outputs vary between calls.
  MultiHeadSelfAttention dropped(
      MultiHeadSelfAttentionOptions(8, 2, 8).attn_dropout(0.5).kernel(AttentionKernel::sdpa));
  dropped->train();
  CHECK_FALSE(torch::allclose(dropped(x).output, dropped(x).output));
  dropped->eval();
  CHECK(torch::allclose(dropped(x).output, dropped(x).output));
}
#else
TEST_CASE("SDPA is reported unavailable before LibTorch 2", "[nn][attention][sdpa]") {
  CHECK_FALSE(sdpa_available());
  CHECK_THAT(tinylm::test::error_message([] { sdpa_self_attention(torch::zeros({1, 2, 6}), 2, true); }),
             Catch::Contains("needs LibTorch 2.0 or later"));
}
#endif
