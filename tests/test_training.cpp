#include "test_util.h"

#include <tinylm/data/tasks.h>
#include <tinylm/nn/model.h>

#include <ATen/CPUGeneratorImpl.h>

using namespace tinylm;

TEST_CASE("repeat task: each row is one id repeated, targets are inputs shifted",
          "[data][repeat]") {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(3);
  auto b = data::repeat_batch(16, 10, 32, gen);
  CHECK(b.inputs.sizes() == torch::IntArrayRef({16, 10}));
  CHECK(torch::equal(b.inputs, b.targets));  // one id per row: shifting changes nothing
  CHECK(torch::equal(b.inputs, b.inputs.select(1, 0).unsqueeze(1).expand({16, 10})));
  CHECK(b.inputs.max().item<int64_t>() < 32);
  CHECK(torch::bincount(b.inputs.select(1, 0)).gt(0).sum().item<int64_t>() > 4);  // rows differ
  auto again = at::make_generator<at::CPUGeneratorImpl>(3);
  CHECK(torch::equal(data::repeat_batch(16, 10, 32, again).inputs, b.inputs));
}

// The reference training check: TinyAttentionLM (V 32, D 16, 4 heads, T 10, B 16,
// Adam 5e-3) gets below half its first loss within 150 steps, seeded.
TEST_CASE("TinyAttentionLM learns the repeat task", "[train][repeat][slow]") {
  torch::manual_seed(0);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(0);
  nn::TinyAttentionLM model(nn::TinyAttentionLMOptions(32, 10, 16, 4));
  torch::optim::Adam adam(model->parameters(), torch::optim::AdamOptions(5e-3));
  double first = 0, last = 0;
  for (int step = 0; step < 150; ++step) {
    auto b = data::repeat_batch(16, 10, 32, gen);
    auto logits = model->forward(b.inputs).logits;  // (B, T, V)
    auto loss = torch::nn::functional::cross_entropy(logits.reshape({-1, 32}),
                                                     b.targets.reshape({-1}));
    adam.zero_grad();
    loss.backward();
    adam.step();
    last = loss.item<double>();
    if (step == 0) first = last;
  }
  INFO("first loss " << first << ", loss after 150 steps " << last);
  CHECK(first == Approx(std::log(32.0)).margin(0.5));
  CHECK(last < 0.5 * first);
}
