#include "../test_util.h"

#include <tinylm/tinylm.h>

#include <ATen/CPUGeneratorImpl.h>

using namespace tinylm;
using namespace tinylm::nn;
using tinylm::test::max_abs_diff;

TEST_CASE(".to(cuda) moves parameters and buffers", "[cuda]") {
  TinyAttentionLM model(TinyAttentionLMOptions(64, 12, 32, 4));
  model->to(torch::kCUDA);
  for (const auto& p : model->parameters()) CHECK(p.is_cuda());
  for (const auto& b : model->buffers()) CHECK(b.is_cuda());
  CHECK(model->attention->causal_mask.is_cuda());
  CHECK(model->sinusoidal_positions->pe.is_cuda());
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
