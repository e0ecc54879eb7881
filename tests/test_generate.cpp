// src/generate.cpp: sampling, the KV cache, and what generate() refuses.
#include "test_util.h"

#include <tinylm/generate.h>
#include <tinylm/nn/model.h>

#include <ATen/CPUGeneratorImpl.h>

#include <cmath>
#include <map>
#include <string>
#include <tuple>
#include <vector>

using namespace tinylm;
using namespace tinylm::nn;
using tinylm::test::error_message;
using tinylm::test::max_abs_diff;

namespace {
TransformerLM small_model() {
  torch::manual_seed(0);
  return TransformerLM(TransformerLMOptions(30, 8, 16, 2, 1));
}
}  // namespace

TEST_CASE("generate appends exactly max_new_tokens after the prompt", "[generate]") {
  auto model = small_model();
  auto prompt = torch::randint(30, {2, 3}, torch::kLong);
  GenerateOptions o;
  o.max_new_tokens = 5;
  o.seed = 1;
  auto out = generate(*model, prompt, o);
  CHECK(out.sizes() == torch::IntArrayRef({2, 8}));
  CHECK(torch::equal(out.narrow(1, 0, 3), prompt));
  CHECK(out.min().item<int64_t>() >= 0);
  CHECK(out.max().item<int64_t>() < 30);
  o.max_new_tokens = 0;
  CHECK(torch::equal(generate(*model, prompt, o), prompt));
}

TEST_CASE("a prompt longer than the context still generates (sliding window)", "[generate]") {
  auto model = small_model();  // context 8
  auto prompt = torch::randint(30, {1, 20}, torch::kLong);
  GenerateOptions o;
  o.max_new_tokens = 4;
  o.greedy = true;
  auto out = generate(*model, prompt, o);
  CHECK(out.size(1) == 24);
  // The first new token depends only on the last 8 prompt tokens.
  auto tail = generate(*model, prompt.narrow(1, 12, 8), o);
  CHECK(out[0][20].item<int64_t>() == tail[0][8].item<int64_t>());
}

TEST_CASE("the same seed gives the same tokens and leaves the global RNG untouched", "[generate]") {
  auto model = small_model();
  auto prompt = torch::zeros({3, 2}, torch::kLong);
  GenerateOptions o;
  o.max_new_tokens = 12;
  o.seed = 7;
  torch::manual_seed(123);
  auto a = generate(*model, prompt, o);
  auto after = torch::rand({1}).item<double>();
  torch::manual_seed(123);
  auto b = generate(*model, prompt, o);
  CHECK(torch::equal(a, b));
  CHECK(torch::rand({1}).item<double>() == after);
  o.seed = 8;
  CHECK_FALSE(torch::equal(generate(*model, prompt, o), a));
}

TEST_CASE("streaming generate tells each token as it is made and stops when told", "[generate]") {
  auto model = small_model();
  auto prompt = torch::randint(30, {2, 3}, torch::kLong);
  GenerateOptions o;
  o.max_new_tokens = 9;
  o.seed = 5;
  const auto whole = generate(*model, prompt, o);
  std::vector<torch::Tensor> told;
  auto streamed = generate(*model, prompt, o, [&](const torch::Tensor& next) {
    told.push_back(next.clone());
    return true;
  });
  CHECK(torch::equal(streamed, whole));  // the same tokens as without a callback
  REQUIRE(told.size() == 9);
  for (int64_t i = 0; i < 9; ++i) CHECK(torch::equal(told[i], whole.narrow(1, 3 + i, 1)));
  // Stopping after the fourth token keeps those four, the same as the whole run's.
  int64_t calls = 0;
  auto stopped = generate(*model, prompt, o, [&](const torch::Tensor&) { return ++calls < 4; });
  CHECK(calls == 4);
  CHECK(torch::equal(stopped, whole.narrow(1, 0, 7)));
}

TEST_CASE("generate restores train/eval mode and records no gradients", "[generate]") {
  auto model = small_model();
  GenerateOptions o;
  o.max_new_tokens = 2;
  model->train();
  auto out = generate(*model, torch::zeros({1, 1}, torch::kLong), o);
  CHECK(model->is_training());
  CHECK_FALSE(out.requires_grad());
  model->eval();
  generate(*model, torch::zeros({1, 1}, torch::kLong), o);
  CHECK_FALSE(model->is_training());
}

TEST_CASE("top-k and top-p filter the distribution", "[generate]") {
  auto logits = torch::tensor({{1.0f, 3.0f, 2.0f, 0.0f}});
  GenerateOptions o;
  o.top_k = 2;
  auto p = sampling_probabilities(logits, o);
  CHECK(p[0][0].item<double>() == 0.0);
  CHECK(p[0][3].item<double>() == 0.0);
  CHECK(p.sum().item<double>() == Approx(1.0).margin(1e-6));
  o.top_k = 100;  // capped at V: nothing removed
  CHECK((sampling_probabilities(logits, o) > 0).all().item<bool>());
  o.top_k = 0;
  o.top_p = 0.5;  // the top token alone has p = 0.644 >= 0.5
  p = sampling_probabilities(logits, o);
  CHECK(p[0][1].item<double>() == Approx(1.0).margin(1e-6));  // top token alone: 0.644
  o.top_p = 0.85;  // needs the top two (0.644 + 0.237 = 0.881)
  p = sampling_probabilities(logits, o);
  CHECK((p > 0).sum().item<int64_t>() == 2);
  o.top_p = 1.0;
  o.temperature = 100.0;  // near uniform
  CHECK(sampling_probabilities(logits, o).max().item<double>() < 0.26);
}

TEST_CASE("sample_tokens draws what torch::multinomial draws, rows together or one at a time", "[generate]") {
  torch::manual_seed(3);
  const auto probs = torch::softmax(torch::randn({6, 50}) * 3, -1);  // (R, V) float32
  auto seeded = [](uint64_t seed) -> c10::optional<at::Generator> {
    return at::make_generator<at::CPUGeneratorImpl>(seed);
  };
  // One generator each: row r as multinomial draws it alone with generator r.
  for (uint64_t round = 0; round < 20; ++round) {
    std::vector<c10::optional<at::Generator>> gens;
    for (int64_t r = 0; r < 6; ++r) gens.push_back(seeded(round * 10 + r));
    const auto together = sample_tokens(probs, gens);
    REQUIRE(together.size() == 6);
    for (int64_t r = 0; r < 6; ++r)
      CHECK(together[r] == torch::multinomial(probs.narrow(0, r, 1), 1, false, seeded(round * 10 + r)).item<int64_t>());
    // One generator shared by every row: multinomial over the whole (R, V).
    const auto shared = seeded(round);
    const auto mine = sample_tokens(probs, std::vector<c10::optional<at::Generator>>(6, shared));
    const auto theirs = torch::multinomial(probs, 1, false, seeded(round)).contiguous();
    for (int64_t r = 0; r < 6; ++r) CHECK(mine[r] == theirs[r][0].item<int64_t>());
  }
  // The draws follow the distribution: a token of probability 0 is never drawn, and the
  // likeliest of a skewed row is drawn most.
  auto skewed = torch::tensor({{0.0f, 0.7f, 0.2f, 0.1f}});
  std::map<int64_t, int> counts;
  auto gen = seeded(7);
  for (int i = 0; i < 2000; ++i) ++counts[sample_tokens(skewed, {gen}).front()];
  CHECK(counts.count(0) == 0);
  CHECK(counts[1] > 1200);
  CHECK(counts[1] < 1600);
  // Not a distribution: refused, as multinomial refuses it.
  for (const auto& bad : {torch::tensor({{0.5f, NAN}}), torch::tensor({{-0.1f, 1.1f}}), torch::tensor({{0.0f, 0.0f}}),
                          torch::tensor({{1.0f, INFINITY}})})
    CHECK_THAT(error_message([&] { sample_tokens(bad, {gen}); }), Catch::Contains("not finite"));
  CHECK_THAT(error_message([&] { sample_tokens(probs, {gen}); }), Catch::Contains("6 rows but 1 generators"));
  CHECK_THAT(error_message([&] { sample_tokens(probs.to(torch::kFloat64), std::vector<c10::optional<at::Generator>>(6)); }),
             Catch::Contains("expected float32"));
}

TEST_CASE("generate rejects bad options and prompts", "[generate][errors]") {
  auto model = small_model();
  auto prompt = torch::zeros({1, 2}, torch::kLong);
  GenerateOptions o;
  o.temperature = 0.0;
  CHECK_THAT(error_message([&] { generate(*model, prompt, o); }),
             Catch::Contains("temperature must be > 0, got 0"));
  o.temperature = 1.0;
  o.top_p = 0.0;
  CHECK_THAT(error_message([&] { generate(*model, prompt, o); }),
             Catch::Contains("top_p must be in (0, 1], got 0"));
  o.top_p = 1.0;
  o.max_new_tokens = -1;
  CHECK_THAT(error_message([&] { generate(*model, prompt, o); }),
             Catch::Contains("max_new_tokens must be >= 0, got -1"));
  o.max_new_tokens = 1;
  CHECK_THAT(error_message([&] { generate(*model, torch::full({1, 2}, 99, torch::kLong), o); }),
             Catch::Contains("token ids must be in [0, 30)"));
  CHECK_THAT(error_message([&] { generate(*model, torch::zeros({2}, torch::kLong), o); }),
             Catch::Contains("prompt must be (B, T)"));
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

  // Greedy, from prompts shorter than the context, as long, and longer: each token the
  // argmax of forward() over the last C tokens, with the cache and without. (Weights of
  // N(0, 1), so that each token depends on the tokens before it.)
  for (auto* m : {static_cast<torch::nn::Module*>(model.get()), static_cast<torch::nn::Module*>(tiny.get())})
    for (auto& p : m->parameters()) p.normal_(0.0, 1.0);
  tiny->eval();
  const auto long_ids = torch::randint(50, {1, 20}, torch::kLong);
  int64_t distinct = 0;
  for (int64_t T : {3, 11, 12, 15, 16, 20}) {
    for (LanguageModelImpl* m : {static_cast<LanguageModelImpl*>(model.get()), static_cast<LanguageModelImpl*>(tiny.get())}) {
      INFO("prompt " << T << ", context " << m->context_length());
      GenerateOptions g;
      g.greedy = true;
      g.max_new_tokens = 8;
      auto expected = long_ids.narrow(1, 0, T);
      for (int i = 0; i < 8; ++i) {
        const int64_t n = expected.size(1), C = m->context_length();
        const auto window = expected.narrow(1, std::max<int64_t>(0, n - C), std::min(n, C));
        expected = torch::cat({expected, m->forward(window).logits.select(1, -1).argmax(-1, true)}, 1);
      }
      distinct += std::get<0>(at::_unique(expected.narrow(1, T, 8))).numel();
      for (bool cached : {true, false}) {
        g.use_kv_cache = cached;
        CHECK(torch::equal(generate(*m, long_ids.narrow(1, 0, T), g), expected));
      }
    }
  }
  CHECK(distinct > 2 * 12);  // the tokens made vary (a model that always says the same proves little)
}

TEST_CASE("KV-cache decoding with rotary positions and grouped-query attention gives full recomputation's "
          "logits, and the cache holds only the key/value heads",
          "[generate][kvcache]") {
  const auto [kv_heads, rotary, llama] = GENERATE(std::make_tuple(0, true, false), std::make_tuple(2, false, false),
                                                  std::make_tuple(1, true, false), std::make_tuple(2, true, true));
  INFO("n_kv_heads " << kv_heads << " rotary " << rotary << " rms-norm and swiglu " << llama);
  torch::manual_seed(12);
  std::map<std::string, std::string> set{{"n_kv_heads", std::to_string(kv_heads)}};
  if (llama) set.insert({{"norm", "rms-norm"}, {"activation", "swiglu"}, {"mlp_hidden", "40"}, {"bias", "false"}});
  TransformerLM model(tinylm::test::with(
      TransformerLMOptions(50, 16, 32, 4, 2).positions(rotary ? PositionEncoding::rotary : PositionEncoding::learned),
      set));
  model->eval();
  torch::NoGradGuard no_grad;
  auto ids = torch::randint(50, {2, 10}, torch::kLong);
  KVCache cache;
  auto first = model->forward_cached(ids.narrow(1, 0, 6), cache);
  auto second = model->forward_cached(ids.narrow(1, 6, 1), cache);  // one token
  auto rest = model->forward_cached(ids.narrow(1, 7, 3), cache);
  CHECK(max_abs_diff(torch::cat({first, second, rest}, 1), model->forward(ids).logits) < 1e-4);
  CHECK(cache.keys[0].sizes() == torch::IntArrayRef({2, kv_heads ? kv_heads : 4, 10, 8}));
  CHECK(cache.values[1].sizes() == cache.keys[0].sizes());
  GenerateOptions o;
  o.max_new_tokens = 24;  // past the context (16)
  o.seed = 5;
  o.use_kv_cache = true;
  auto with_cache = generate(*model, ids.narrow(1, 0, 3), o);
  o.use_kv_cache = false;
  CHECK(torch::equal(with_cache, generate(*model, ids.narrow(1, 0, 3), o)));
}

TEST_CASE("a tiny temperature samples the most likely token instead of failing", "[generate]") {
  auto logits = torch::tensor({{1.0f, 3.0f, 2.0f, -50.0f}});
  GenerateOptions o;
  o.temperature = 1e-300;  // valid (> 0), below float's smallest number
  auto p = sampling_probabilities(logits, o);
  CHECK_FALSE(torch::isnan(p).any().item<bool>());
  CHECK(p[0][1].item<float>() == 1.0f);
  CHECK(p.sum().item<float>() == Approx(1.0f));
}
