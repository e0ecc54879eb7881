// src/nn/embedding.cpp: token and position embeddings.
#include "../test_util.h"

#include <tinylm/nn/embedding.h>

#include <cmath>
#include <vector>

using namespace tinylm::nn;
using tinylm::test::error_message;

TEST_CASE("token embedding maps (B, T) ids to (B, T, D) with N(0, 0.02) weights",
          "[nn][embedding]") {
  torch::manual_seed(0);
  TokenEmbedding emb(TokenEmbeddingOptions(500, 64));
  auto ids = torch::randint(500, {3, 7}, torch::kLong);
  auto out = emb(ids);
  CHECK(out.sizes() == torch::IntArrayRef({3, 7, 64}));
  CHECK(torch::equal(out[1][2], emb->weight[ids[1][2].item<int64_t>()]));
  CHECK(emb->weight.std().item<double>() == Approx(0.02).margin(0.001));
  CHECK(emb->weight.mean().item<double>() == Approx(0.0).margin(0.001));
}

TEST_CASE("token embedding rejects non-int64 ids and bad sizes", "[nn][embedding][errors]") {
  TokenEmbedding emb(TokenEmbeddingOptions(10, 4));
  CHECK_THAT(error_message([&] { emb(torch::zeros({1, 2}, torch::kInt)); }),
             Catch::Contains("TokenEmbedding: ids must be int64"));
  CHECK_THAT(error_message([] { TokenEmbedding(TokenEmbeddingOptions(0, 4)); }),
             Catch::Contains("vocab_size must be >= 1, got 0"));
  CHECK_THAT(error_message([] { TokenEmbedding(TokenEmbeddingOptions(10, 0)); }),
             Catch::Contains("d_model must be >= 1, got 0"));
}

TEST_CASE("sinusoidal table follows sin/cos of p / base^(2i/D)", "[nn][positional]") {
  const double base = GENERATE(10000.0, 100.0);
  SinusoidalPositionalEmbedding pos(SinusoidalPositionalEmbeddingOptions(16, 8).base(base));
  auto pe = pos(16);
  REQUIRE(pe.sizes() == torch::IntArrayRef({16, 8}));
  for (int64_t p : {0, 1, 5, 15}) {
    for (int64_t i = 0; i < 4; ++i) {
      const double angle = p / std::pow(base, 2.0 * i / 8.0);
      CHECK(pe[p][2 * i].item<double>() == Approx(std::sin(angle)).margin(1e-6));
      CHECK(pe[p][2 * i + 1].item<double>() == Approx(std::cos(angle)).margin(1e-6));
    }
  }
  CHECK(torch::equal(pos(5), pe.narrow(0, 0, 5)));
}

TEST_CASE("sinusoidal positions have no parameters and hold no table for their maximum context",
          "[nn][positional]") {
  // A context of 2^40 rows would be 16 TiB as a table: rows are made for the lengths used.
  const int64_t huge = int64_t{1} << 40;
  SinusoidalPositionalEmbedding pos(SinusoidalPositionalEmbeddingOptions(huge, 6));
  CHECK(pos->parameters().empty());
  for (const auto& b : pos->buffers()) CHECK(b.numel() == 0);
  auto late = pos->rows(huge - 3, 2);  // the far end of the context, exactly
  REQUIRE(late.sizes() == torch::IntArrayRef({2, 6}));
  const double p = static_cast<double>(huge - 2), angle = p / std::pow(10000.0, 2.0 / 6.0);
  CHECK(late[1][2].item<double>() == Approx(static_cast<float>(std::sin(angle))).margin(1e-6));
  CHECK(late[1][3].item<double>() == Approx(static_cast<float>(std::cos(angle))).margin(1e-6));
  // Rows asked for one by one (a sampler) equal the rows of one longer request.
  SinusoidalPositionalEmbedding small(SinusoidalPositionalEmbeddingOptions(300, 6));
  std::vector<torch::Tensor> one_by_one;
  for (int64_t p = 0; p < 300; ++p) one_by_one.push_back(small->rows(p, 1));
  SinusoidalPositionalEmbedding whole(SinusoidalPositionalEmbeddingOptions(300, 6));
  CHECK(torch::equal(torch::cat(one_by_one), whole(300)));
  // .to(dtype) applies to rows made before and after it.
  small->to(torch::kFloat64);
  CHECK(small(5).scalar_type() == torch::kFloat64);
  CHECK(torch::allclose(small(5), whole(5).to(torch::kFloat64)));
}

TEST_CASE("sinusoidal positions reject bad configurations and lengths",
          "[nn][positional][errors]") {
  using O = SinusoidalPositionalEmbeddingOptions;
  CHECK_THAT(error_message([] { SinusoidalPositionalEmbedding(O(0, 8)); }),
             Catch::Contains("context_length must be >= 1, got 0"));
  CHECK_THAT(error_message([] { SinusoidalPositionalEmbedding(O(8, 0)); }),
             Catch::Contains("d_model must be >= 1, got 0"));
  CHECK_THAT(error_message([] { SinusoidalPositionalEmbedding(O(8, 7)); }),
             Catch::Contains("d_model must be even, got 7"));
  SinusoidalPositionalEmbedding pos(O(8, 4));
  CHECK_THAT(error_message([&] { pos(0); }), Catch::Contains("seq_len must be >= 1, got 0"));
  CHECK_THAT(error_message([&] { pos(9); }),
             Catch::Contains("seq_len 9 exceeds context_length 8"));
}

TEST_CASE("learned positions return the first T rows and reject overflow", "[nn][positional]") {
  LearnedPositionalEmbedding pos(LearnedPositionalEmbeddingOptions(10, 4));
  CHECK(pos(3).sizes() == torch::IntArrayRef({3, 4}));
  CHECK(torch::equal(pos(3), pos->weight.narrow(0, 0, 3)));
  CHECK(pos->parameters().size() == 1);
  CHECK_THAT(error_message([&] { pos(11); }),
             Catch::Contains("seq_len 11 exceeds context_length 10"));
}
