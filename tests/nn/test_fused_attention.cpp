// src/nn/fused_attention.cpp: the fused CPU attention kernel equals the step-by-step path.
#include "../test_util.h"

#include <tinylm/nn/attention.h>
#include <tinylm/nn/cpu_kernels.h>

#include "nn/fused_attention.h"

#include <algorithm>
#include <cmath>
#include <tuple>

using namespace tinylm::nn;
using tinylm::test::KernelGuard;
using tinylm::test::max_abs_diff;
using tinylm::test::runnable_isas;

TEST_CASE("fused attention equals the step-by-step path, forward and backward",
          "[nn][attention][fused]") {
  const auto [B, T, D, H] = GENERATE(std::make_tuple(16, 12, 32, 4), std::make_tuple(2, 1, 8, 2),
                                     std::make_tuple(3, 33, 48, 6), std::make_tuple(1, 64, 64, 1),
                                     std::make_tuple(2, 9, 30, 3), std::make_tuple(1, 31, 20, 2));
  const bool causal = GENERATE(true, false);
  const CpuIsa isa = GENERATE(from_range(runnable_isas()));
  // The T x T products on tinylm's loops (the default at these lengths) or through BLAS.
  const bool blas_products = GENERATE(false, true);
  INFO("B " << B << " T " << T << " D " << D << " H " << H << " causal " << causal << " loops "
            << to_string(isa) << " BLAS products " << blas_products);
  KernelGuard kernels(isa);
  torch::manual_seed(B * 100 + T);
  KernelPolicy policy;
  policy.attention_blas_min_seq_len = blas_products ? 1 : 1 << 20;
  MultiHeadSelfAttention plain(MultiHeadSelfAttentionOptions(D, H, 64).causal(causal).kernel(AttentionKernel::plain));
  MultiHeadSelfAttention fused(
      MultiHeadSelfAttentionOptions(D, H, 64).causal(causal).kernel(AttentionKernel::fused).kernel_policy(std::make_shared<const KernelPolicy>(policy)));
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
  MultiHeadSelfAttention plain(MultiHeadSelfAttentionOptions(16, 4, 64).kernel(AttentionKernel::plain));
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

TEST_CASE("with bfloat16 products the fused attention's T x T products take bfloat16 operands where they fit",
          "[nn][attention][fused][bf16]") {
  KernelPolicy f32, bf16;
  bf16.bf16_products = true;
  // T and Dh multiples of 16: the bfloat16 loops; T = 12: the float32 ones, the same bits.
  const auto [T, fits] = GENERATE(std::make_tuple(32, true), std::make_tuple(12, false));
  INFO("T " << T);
  torch::manual_seed(5);
  const auto qkv = torch::randn({2, T, 3 * 64});
  const auto upstream = torch::randn({2, T, 64});
  auto run = [&](const KernelPolicy& policy) {
    auto x = qkv.clone().requires_grad_(true);
    auto out = fused_self_attention(x, 2, true, nullptr, policy);
    out.backward(upstream);
    return std::make_pair(out.detach(), x.grad());
  };
  const auto [out32, grad32] = run(f32);
  const auto before = kernel_counts();
  const auto [out16, grad16] = run(bf16);
  const auto counts = kernel_counts() - before;
  CHECK(counts.attention_loops == 2);  // forward and backward
  CHECK(counts.attention_bf16 == (fits ? 2 : 0));
  if (fits) {
    // bfloat16's rounding (2^-9 relative per operand), not float32's, and not more.
    const double out_error = max_abs_diff(out16, out32) / out32.abs().max().item<double>();
    const double grad_error = max_abs_diff(grad16, grad32) / grad32.abs().max().item<double>();
    CHECK(out_error > 1e-5);
    CHECK(out_error < 3e-2);
    CHECK(grad_error > 1e-5);
    CHECK(grad_error < 3e-2);
  } else {
    CHECK(torch::equal(out16, out32));
    CHECK(torch::equal(grad16, grad32));
  }
  // Weights asked for: kept and returned (the backward reads them); not asked for, as in
  // training: neither, the backward recomputes them. The same output, gradients to
  // bfloat16's rounding of a weight on either side.
  if (fits) {
    auto x = qkv.clone().requires_grad_(true);
    torch::Tensor weights;
    auto out = fused_self_attention(x, 2, true, &weights, bf16);
    out.backward(upstream);
    CHECK(weights.sizes() == torch::IntArrayRef({2, 2, T, T}));
    CHECK(torch::equal(out.detach(), out16));
    CHECK(max_abs_diff(x.grad(), grad16) / grad16.abs().max().item<double>() < 1e-3);
  }
  // bf16_attention false: the Linear layers' products alone in bfloat16, these float32.
  KernelPolicy linears_only = bf16;
  linears_only.bf16_attention = false;
  const auto again = kernel_counts();
  const auto [out_l, grad_l] = run(linears_only);
  CHECK((kernel_counts() - again).attention_bf16 == 0);
  CHECK(torch::equal(out_l, out32));
  CHECK(torch::equal(grad_l, grad32));
}
