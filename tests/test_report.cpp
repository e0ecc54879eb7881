// src/report.cpp: the causal check and the ASCII heatmap of attention weights.
#include "test_util.h"

#include <tinylm/nn/model.h>
#include <tinylm/report.h>

#include <algorithm>
#include <cmath>
#include <sstream>
#include <string>

using namespace tinylm;
using tinylm::test::error_message;

TEST_CASE("the causal check measures weight on the future and rows that do not sum to one",
          "[report]") {
  SECTION("causal softmax rows pass") {
    torch::manual_seed(1);
    auto scores = torch::randn({2, 3, 6, 6});
    auto w = torch::softmax(scores.masked_fill(torch::ones({6, 6}, torch::kBool).triu(1), -INFINITY), -1);
    const auto c = causal_check(w);
    CHECK(c.future_weight_sum == 0.0);  // softmax of -inf is exactly 0
    CHECK(c.max_row_error < 1e-6);
  }
  SECTION("uniform rows put 6 of 16 quarter weights on the future") {
    const auto c = causal_check(torch::full({4, 4}, 0.25));
    CHECK(c.future_weight_sum == Approx(1.5).margin(1e-12));
    CHECK(c.max_row_error < 1e-12);
  }
  SECTION("one leak in one head of one row of a batch is found") {
    auto w = torch::eye(5).expand({2, 3, 5, 5}).contiguous();  // each query sees itself only
    REQUIRE(causal_check(w).future_weight_sum == 0.0);
    w[1][2][0][3] = 0.125;  // query 0 sees key 3: the future; its row sums to 1.125
    const auto c = causal_check(w);
    CHECK(c.future_weight_sum == Approx(0.125).margin(1e-12));
    CHECK(c.max_row_error == Approx(0.125).margin(1e-12));
  }
  SECTION("a real model's weights pass") {
    torch::manual_seed(2);
    nn::TinyAttentionLM model(nn::TinyAttentionLMOptions(20, 8, 16, 4));
    auto w = model->forward(torch::randint(20, {3, 8}, torch::kLong), true).attention.at(0);
    const auto c = causal_check(w);
    CHECK(c.future_weight_sum < 1e-5);
    CHECK(c.max_row_error < 1e-5);
  }
  SECTION("weights that are not (..., T, T) are refused") {
    CHECK_THAT(error_message([] { causal_check(torch::ones({4})); }),
               Catch::Contains("causal_check: expected weights (..., T, T), got shape [4]"));
    CHECK_THAT(error_message([] { causal_check(torch::ones({2, 3, 4})); }),
               Catch::Contains("expected weights (..., T, T)"));
  }
}

TEST_CASE("the ASCII heatmap draws each weight against the largest, one row per query",
          "[report]") {
  // Levels 0..9 are " .:-=+*#%@"; a weight w is drawn at round(9 * w / max).
  const auto w = torch::tensor({{1.0f, 0.0f, 0.0f}, {0.5f, 0.5f, 0.0f}, {0.2f, 0.3f, 0.5f}});
  const std::string expected =
      "      0 1 2   (keys)\n"
      "   0  @    \n"
      "   1  + +  \n"  // 4.5 rounds to level 5
      "   2  : - +\n";  // 1.8 -> 2, 2.7 -> 3
  CHECK(ascii_heatmap(w) == expected);
  CHECK(ascii_heatmap(w * 0.125) == expected);  // relative to the largest (a power of two: exact)
  CHECK(ascii_heatmap(w.to(torch::kFloat64)) == expected);
  // No weight at all draws nothing (and divides by nothing).
  CHECK(ascii_heatmap(torch::zeros({2, 2})) == "      0 1   (keys)\n   0     \n   1     \n");

  SECTION("past ten keys the column labels give the last digit") {
    const std::string map = ascii_heatmap(torch::eye(12));
    CHECK(map.substr(0, map.find('\n')) == "      0 1 2 3 4 5 6 7 8 9 0 1   (keys)");
    CHECK(std::count(map.begin(), map.end(), '\n') == 13);
    CHECK(std::count(map.begin(), map.end(), '@') == 12);
  }
  SECTION("a causal model's map is blank above the diagonal") {
    torch::manual_seed(3);
    nn::TinyAttentionLM model(nn::TinyAttentionLMOptions(20, 6, 16, 4));
    auto weights = model->forward(torch::randint(20, {1, 6}, torch::kLong), true).attention.at(0)[0][0];
    const std::string map = ascii_heatmap(weights);
    std::istringstream lines(map);
    std::string line;
    std::getline(lines, line);  // the key labels
    for (int i = 0; i < 6; ++i) {
      REQUIRE(std::getline(lines, line));
      INFO(line);
      REQUIRE(line.size() == 5 + 2 * 6);
      for (int j = i + 1; j < 6; ++j) CHECK(line[5 + 2 * j + 1] == ' ');
      if (i == 0) CHECK(line[6] == '@');  // the first query sees only itself: weight 1
    }
  }
  SECTION("anything but one square matrix is refused") {
    CHECK_THAT(error_message([] { ascii_heatmap(torch::ones({2, 3})); }),
               Catch::Contains("ascii_heatmap: expected one (T, T) matrix, got shape [2, 3]"));
    CHECK_THAT(error_message([] { ascii_heatmap(torch::ones({1, 3, 3})); }),
               Catch::Contains("expected one (T, T) matrix"));
  }
}
