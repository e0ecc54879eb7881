// The CUDA suite: device moves, CPU/CUDA agreement, training, generation, bfloat16 products
// and SDPA on the GPU (tests/cuda/main.cpp skips it where CUDA is not available).
#include "../test_util.h"
#include "nn/linear.h"

#include <tinylm/tinylm.h>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/version.h>

#include <algorithm>
#include <cmath>

using namespace tinylm;
using namespace tinylm::nn;
using tinylm::test::max_abs_diff;

TEST_CASE(".to(cuda) moves parameters and buffers", "[cuda]") {
  TinyAttentionLM model(TinyAttentionLMOptions(64, 12, 32, 4));
  model->to(torch::kCUDA);
  for (const auto& p : model->parameters()) CHECK(p.is_cuda());
  for (const auto& b : model->buffers()) CHECK(b.is_cuda());
  CHECK(model->sinusoidal_positions->forward(5).is_cuda());
}

TEST_CASE("CUDA forward matches CPU forward", "[cuda]") {
  torch::manual_seed(0);
  TransformerLM cpu(TransformerLMOptions(64, 16, 32, 4, 2));
  auto ids = torch::randint(64, {3, 16}, torch::kLong);
  auto expected = cpu->forward(ids, true);
  cpu->to(torch::kCUDA);
  auto got = cpu->forward(ids.to(torch::kCUDA), true);
  CHECK(max_abs_diff(got.logits.cpu(), expected.logits) < 1e-4);
  CHECK(max_abs_diff(got.attention[1].cpu(), expected.attention[1]) < 1e-5);
}

TEST_CASE("TinyAttentionLM learns the repeat task on CUDA", "[cuda][train]") {
  torch::manual_seed(0);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(0);
  TinyAttentionLM model(TinyAttentionLMOptions(32, 10, 16, 4));
  model->to(torch::kCUDA);
  torch::optim::Adam adam(model->parameters(), torch::optim::AdamOptions(5e-3));
  double first = 0, last = 0;
  for (int step = 0; step < 150; ++step) {
    auto b = data::repeat_batch(16, 10, 32, gen, torch::kCUDA);
    auto loss = torch::nn::functional::cross_entropy(
        model->forward(b.inputs).logits.reshape({-1, 32}), b.targets.reshape({-1}));
    adam.zero_grad();
    loss.backward();
    adam.step();
    last = loss.item<double>();
    if (step == 0) first = last;
  }
  CHECK(last < 0.5 * first);
}

TEST_CASE("greedy generation gives the same tokens on CUDA and CPU", "[cuda][generate]") {
  torch::manual_seed(0);
  TransformerLM model(TransformerLMOptions(30, 8, 16, 2, 1));
  GenerateOptions o;
  o.max_new_tokens = 12;
  o.greedy = true;
  auto prompt = torch::randint(30, {2, 3}, torch::kLong);
  auto cpu = generate(*model, prompt, o);
  model->to(torch::kCUDA);
  auto gpu = generate(*model, prompt, o);
  CHECK(gpu.is_cuda());
  CHECK(torch::equal(gpu.cpu(), cpu));
}

TEST_CASE("bfloat16 products on CUDA (sample/serve --bf16): rounded operands, float32 elsewhere", "[cuda][bf16]") {
  torch::manual_seed(0);
  torch::NoGradGuard no_grad;
  // One product: the operands rounded to bfloat16, float32 sums (within 2e-5 sqrt(K) of
  // float64's, as the CPU test allows), the result rounded to bfloat16 (half an ulp, 2^-9
  // of it; 2^-8 allowed), the bias added in float32. And it is not float32's product.
  KernelPolicy policy;
  policy.bf16_products = true;
  auto x = torch::randn({3, 5, 96}, torch::kCUDA), w = torch::randn({40, 96}, torch::kCUDA);
  auto b = torch::randn({40}, torch::kCUDA);
  auto y = nn::linear(x, w, b, policy);
  CHECK(y.scalar_type() == torch::kFloat32);
  auto exact = torch::matmul(x.to(torch::kBFloat16).to(torch::kFloat64),
                             w.to(torch::kBFloat16).to(torch::kFloat64).t());
  auto err = ((y.to(torch::kFloat64) - b.to(torch::kFloat64)) - exact).abs();
  CHECK((err <= exact.abs() * std::ldexp(1.0, -8) + 2e-5 * std::sqrt(96.0)).all().item<bool>());
  CHECK(max_abs_diff(y.cpu(), nn::linear(x, w, b, KernelPolicy()).cpu()) > 1e-3);

  // A transformer: logits within bfloat16's reach of float32's, generation on the GPU.
  TransformerLM model(TransformerLMOptions(64, 16, 64, 4, 2));
  model->to(torch::kCUDA);
  model->eval();
  auto ids = torch::randint(64, {2, 16}, torch::kLong).to(torch::kCUDA);
  auto f32 = model->forward(ids).logits;
  use_bf16_products(*model);
  CHECK(model->kernel_policy()->bf16_products);
  auto low = model->forward(ids).logits;
  CHECK(low.scalar_type() == torch::kFloat32);
  const double scale = f32.abs().max().item<double>();
  CHECK(max_abs_diff(low.cpu(), f32.cpu()) < 3e-2 * std::max(scale, 1.0));
  CHECK(max_abs_diff(low.cpu(), f32.cpu()) > 0);
  GenerateOptions o;
  o.max_new_tokens = 10;
  o.greedy = true;
  auto tokens = generate(*model, ids.narrow(1, 0, 3).cpu(), o);
  CHECK(tokens.is_cuda());
  CHECK(tokens.size(1) == 13);
}

#if TORCH_VERSION_MAJOR >= 2
TEST_CASE("SDPA on CUDA equals the step-by-step path, forward and every gradient", "[cuda][sdpa]") {
  // float32 on the GPU: SDPA's kernels and the plain path's matmuls accumulate in
  // different orders, so 1e-4 rather than the CPU test's 1e-5. Then bfloat16 SDPA against
  // the float32 plain path, within bfloat16's 8 bits of mantissa (2e-2 of the largest).
  const auto [B, T, D, H] = GENERATE(std::make_tuple(16, 12, 32, 4), std::make_tuple(3, 128, 64, 4),
                                     std::make_tuple(2, 1, 8, 2));
  const bool causal = GENERATE(true, false);
  INFO("B " << B << " T " << T << " D " << D << " H " << H << " causal " << causal);
  REQUIRE(sdpa_available());
  torch::manual_seed(B * 10 + T);
  const auto cuda = torch::Device(torch::kCUDA);
  MultiHeadSelfAttention plain(
      MultiHeadSelfAttentionOptions(D, H, 128).causal(causal).kernel(AttentionKernel::plain));
  MultiHeadSelfAttention sdpa(
      MultiHeadSelfAttentionOptions(D, H, 128).causal(causal).kernel(AttentionKernel::sdpa));
  {
    torch::NoGradGuard g;
    auto src = plain->named_parameters();
    for (auto& p : sdpa->named_parameters()) p.value().copy_(src[p.key()]);
  }
  plain->to(cuda);
  sdpa->to(cuda);
  auto x1 = torch::randn({B, T, D}, torch::device(cuda)).requires_grad_(true);
  auto x2 = x1.detach().clone().requires_grad_(true);
  auto a = plain(x1).output, b = sdpa(x2).output;
  CHECK(max_abs_diff(a.cpu(), b.cpu()) < 1e-4);
  auto w = torch::randn({B, T, D}, torch::device(cuda));
  (a * w).sum().backward();
  (b * w).sum().backward();
  CHECK(max_abs_diff(x1.grad().cpu(), x2.grad().cpu()) < 1e-4);
  auto pa = plain->named_parameters();
  for (const auto& p : sdpa->named_parameters()) {
    INFO(p.key());
    CHECK(max_abs_diff(p.value().grad().cpu(), pa[p.key()].grad().cpu()) < 1e-4);
  }

  torch::NoGradGuard g;
  sdpa->to(torch::kBFloat16);
  auto low = sdpa(x2.detach().to(torch::kBFloat16)).output.to(torch::kFloat32);
  const double scale = a.abs().max().item<double>();
  CHECK(max_abs_diff(low.cpu(), a.detach().cpu()) < 2e-2 * std::max(scale, 1.0));
}
#endif
