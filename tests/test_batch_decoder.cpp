// src/batch_decoder.cpp: continuous batching gives every sequence what generate() gives it
// alone, with sequences joining, leaving and waiting, for every model kind.
#include "test_util.h"

#include <tinylm/batch_decoder.h>
#include <tinylm/generate.h>
#include <tinylm/nn/model.h>

#include <algorithm>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

using namespace tinylm;
using namespace tinylm::nn;
using tinylm::test::error_message;

namespace {

/// A model that decodes one row at a time (a program's own kind without forward_rows).
class RowByRow : public LanguageModelImpl {
 public:
  explicit RowByRow(LanguageModel inner) : inner_(register_module("inner", std::move(inner))) {}
  LMOutput forward(const torch::Tensor& ids, bool w, const torch::Tensor& m) override { return inner_->forward(ids, w, m); }
  int64_t vocab_size() const override { return inner_->vocab_size(); }
  int64_t context_length() const override { return inner_->context_length(); }
  torch::Tensor forward_cached(const torch::Tensor& ids, KVCache& cache) override {
    return inner_->forward_cached(ids, cache);
  }

 private:
  LanguageModel inner_;
};

struct Request {
  std::vector<int64_t> prompt;
  GenerateOptions options;
  int64_t arrives = 0;  // the step before which it is added
};

/// Requests of mixed prompt lengths, lengths to make and sampling (greedy, seeded), some
/// arriving while others decode.
std::vector<Request> mixed_requests(int64_t n, int64_t vocab, int64_t context, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<Request> out;
  for (int64_t i = 0; i < n; ++i) {
    Request r;
    const int64_t length = 1 + static_cast<int64_t>(rng() % static_cast<uint32_t>(context + 4));  // some past C
    for (int64_t t = 0; t < length; ++t) r.prompt.push_back(static_cast<int64_t>(rng() % vocab));
    r.options.max_new_tokens = 1 + static_cast<int64_t>(rng() % static_cast<uint32_t>(context + 6));
    r.options.greedy = rng() % 2 == 0;
    r.options.temperature = 0.8;
    r.options.top_k = rng() % 3 == 0 ? 5 : 0;
    r.options.seed = 1000 + i;
    r.arrives = static_cast<int64_t>(rng() % 6);
    out.push_back(r);
  }
  return out;
}

/// The tokens generate() makes for each request alone.
std::vector<std::vector<int64_t>> alone(LanguageModelImpl& model, const std::vector<Request>& requests) {
  std::vector<std::vector<int64_t>> out;
  for (const auto& r : requests) {
    const auto prompt = torch::tensor(r.prompt, torch::kLong).unsqueeze(0);
    const auto all = generate(model, prompt, r.options);
    const auto made = all.narrow(1, prompt.size(1), all.size(1) - prompt.size(1)).squeeze(0).contiguous();
    out.emplace_back(made.data_ptr<int64_t>(), made.data_ptr<int64_t>() + made.numel());
  }
  return out;
}

struct Run {
  std::vector<std::vector<int64_t>> tokens;
  int64_t widest = 0;  // the most sequences one batched pass decoded
  int64_t steps = 0;
};

/// The requests through one decoder, each added at its step; `drop`: requests removed
/// after their third token.
Run batched(LanguageModelImpl& model, const std::vector<Request>& requests, BatchDecoderOptions options,
            const std::vector<size_t>& drop = {}) {
  BatchDecoder decoder(model, options);
  Run run;
  run.tokens.resize(requests.size());
  std::map<int64_t, size_t> index;  // decoder id -> request
  size_t added = 0;
  for (int64_t step = 0; added < requests.size() || !decoder.idle(); ++step) {
    for (size_t i = 0; i < requests.size(); ++i)
      if (requests[i].arrives == step) index[decoder.add(requests[i].prompt, requests[i].options)] = i, ++added;
    for (const auto& t : decoder.step()) {
      const size_t i = index.at(t.sequence);
      run.tokens[i].push_back(t.token);
      const bool dropped = std::find(drop.begin(), drop.end(), i) != drop.end();
      if (dropped && run.tokens[i].size() == 3 && !t.last) CHECK(decoder.remove(t.sequence));
    }
    run.widest = std::max(run.widest, decoder.last_batch());
    ++run.steps;
    REQUIRE(step < 10000);
  }
  return run;
}

LanguageModel model_of(const TransformerLMOptions& o) {
  torch::manual_seed(3);
  return LanguageModel(TransformerLM(o).ptr());
}

}  // namespace

TEST_CASE("every sequence of a mixed batch gets the tokens it gets alone", "[batch_decoder]") {
  torch::manual_seed(3);
  TransformerLMOptions rotary(40, 12, 32, 4, 2);
  rotary.positions(PositionEncoding::rotary);
  rotary.block().attention().n_kv_heads(2);
  rotary.block().norm().kind(NormKind::rms_norm);
  rotary.block().mlp().activation(Activation::swiglu);
  const std::vector<std::pair<std::string, LanguageModel>> models = {
      {"tiny", [] {
         torch::manual_seed(3);
         return LanguageModel(TinyAttentionLM(TinyAttentionLMOptions(40, 12, 32, 4)).ptr());
       }()},
      {"transformer, learned positions", model_of(TransformerLMOptions(40, 12, 32, 4, 2))},
      {"transformer, sinusoidal, post-LN",
       model_of([] {
         TransformerLMOptions o(40, 12, 32, 4, 2);
         o.positions(PositionEncoding::sinusoidal);
         o.block().pre_ln(false);
         return o;
       }())},
      {"transformer, rotary, grouped-query, RMSNorm, SwiGLU", model_of(rotary)}};
  for (const auto& [name, model] : models) {
    INFO(name);
    REQUIRE(model->supports_rows());
    const auto requests = mixed_requests(14, 40, 12, 5);
    const auto expected = alone(*model, requests);
    BatchDecoderOptions o;
    o.max_batch = 6;      // fewer rows than requests: some wait their turn
    o.prefill_chunk = 5;  // longer prompts are prefilled over several steps
    const auto run = batched(*model, requests, o);
    CHECK(run.widest >= 4);  // really batched
    for (size_t i = 0; i < requests.size(); ++i) {
      INFO("request " << i << ": prompt " << requests[i].prompt.size() << ", "
                      << requests[i].options.max_new_tokens << " tokens");
      CHECK(run.tokens[i] == expected[i]);
    }
  }
}

TEST_CASE("sequences removed midway leave the others' tokens unchanged", "[batch_decoder]") {
  auto model = model_of(TransformerLMOptions(40, 16, 32, 4, 1));
  auto requests = mixed_requests(10, 40, 16, 9);
  for (auto& r : requests) r.options.max_new_tokens = std::max<int64_t>(r.options.max_new_tokens, 6);
  const auto expected = alone(*model, requests);
  const std::vector<size_t> drop = {1, 4, 7};
  const auto run = batched(*model, requests, BatchDecoderOptions{}, drop);
  for (size_t i = 0; i < requests.size(); ++i) {
    INFO("request " << i);
    if (std::find(drop.begin(), drop.end(), i) != drop.end()) {
      CHECK(run.tokens[i].size() == 3);
      CHECK(std::equal(run.tokens[i].begin(), run.tokens[i].end(), expected[i].begin()));
    } else {
      CHECK(run.tokens[i] == expected[i]);
    }
  }
}

TEST_CASE("a model without forward_rows is decoded row by row, with the same tokens", "[batch_decoder]") {
  auto inner = model_of(TransformerLMOptions(40, 12, 32, 4, 1));
  auto model = std::make_shared<RowByRow>(inner);
  CHECK_FALSE(model->supports_rows());
  CHECK_THAT(error_message([&] {
               KVCache c;
               c.lengths = {1};
               model->forward_rows(torch::zeros({1, 1}, torch::kLong), c);
             }),
             Catch::Contains("does not decode rows of different lengths together"));
  auto requests = mixed_requests(6, 40, 12, 11);
  for (auto& r : requests) {  // within the context: no windows to read together
    r.prompt.resize(std::min<size_t>(r.prompt.size(), 5));
    r.options.max_new_tokens = std::min<int64_t>(r.options.max_new_tokens, 6);
  }
  const auto run = batched(*model, requests, BatchDecoderOptions{});
  CHECK(run.widest == 0);
  CHECK(run.tokens == alone(*inner, requests));
}

TEST_CASE("one step waits for at most prefill_chunk prompt tokens", "[batch_decoder]") {
  auto model = model_of(TransformerLMOptions(40, 64, 32, 4, 1));
  BatchDecoderOptions o;
  o.prefill_chunk = 8;
  BatchDecoder d(*model, o);
  GenerateOptions g;
  g.greedy = true;
  g.max_new_tokens = 30;
  const auto first = d.add({1, 2, 3}, g);
  CHECK(d.step().size() == 1);  // its first token, from the prefill
  d.add(std::vector<int64_t>(40, 5), g);  // a long prompt: five steps of prefill
  for (int i = 0; i < 4; ++i) {
    const auto tokens = d.step();
    REQUIRE(tokens.size() == 1);  // the decoding one goes on meanwhile
    CHECK(tokens[0].sequence == first);
    CHECK(d.joining() == 1);
  }
  CHECK(d.step().size() == 2);  // the long one's first token, and the other's
  CHECK(d.joining() == 0);
  CHECK(d.decoding() == 2);
  CHECK(d.step().size() == 2);
  CHECK(d.last_batch() == 2);
}

TEST_CASE("the decoder refuses what it cannot decode", "[batch_decoder][errors]") {
  auto model = model_of(TransformerLMOptions(40, 12, 32, 4, 1));
  CHECK_THAT(error_message([&] { BatchDecoder(*model, BatchDecoderOptions{0, 64}); }),
             Catch::Contains("max_batch must be >= 1, got 0"));
  BatchDecoder d(*model);
  GenerateOptions g;
  CHECK_THAT(error_message([&] { d.add({}, g); }), Catch::Contains("a prompt needs at least one token"));
  CHECK_THAT(error_message([&] { d.add({40}, g); }), Catch::Contains("token id 40 is outside the vocabulary [0, 40)"));
  g.max_new_tokens = 0;
  CHECK_THAT(error_message([&] { d.add({1}, g); }), Catch::Contains("max_new_tokens must be >= 1, got 0"));
  g.max_new_tokens = 2;
  g.temperature = 0;
  CHECK_THAT(error_message([&] { d.add({1}, g); }), Catch::Contains("temperature must be > 0"));
  CHECK(d.idle());
  CHECK(d.step().empty());
  CHECK_FALSE(d.remove(12));
}

TEST_CASE("prompts of one length arriving together are prefilled in one pass, each as alone", "[batch_decoder]") {
  auto model = model_of(TransformerLMOptions(40, 16, 32, 4, 2));
  auto requests = mixed_requests(12, 40, 16, 21);
  std::mt19937 rng(4);
  for (auto& r : requests) {  // the same length (5), different tokens and settings, all at once
    r.prompt.resize(5);
    for (auto& id : r.prompt) id = static_cast<int64_t>(rng() % 40);
    r.arrives = 0;
  }
  const auto expected = alone(*model, requests);
  BatchDecoderOptions o;
  o.prefill_chunk = 64;  // 12 prompts of 5 tokens fit in one step
  BatchDecoder d(*model, o);
  for (const auto& r : requests) d.add(r.prompt, r.options);
  const auto first = d.step();
  CHECK(first.size() == requests.size());  // every first token from the one prefill step
  CHECK(d.joining() == 0);
  const auto run = batched(*model, requests, o);
  CHECK(run.tokens == expected);
}
