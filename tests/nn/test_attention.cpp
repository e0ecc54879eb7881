// src/nn/attention.cpp: self-attention: shapes, causal and padding masks, dropout, SDPA.
#include "../test_util.h"

#include <tinylm/nn/attention.h>
#include <tinylm/nn/model.h>

#include <torch/version.h>

#include <cmath>
#include <tuple>

using namespace tinylm::nn;
using tinylm::test::error_message;
using tinylm::test::max_abs_diff;

namespace {
MultiHeadSelfAttention make_attention(int64_t d = 32, int64_t h = 4, int64_t ctx = 16) {
  return MultiHeadSelfAttention(MultiHeadSelfAttentionOptions(d, h, ctx));
}
}  // namespace

// ---- construction ----------------------------------------------------------------

TEST_CASE("construction rejects d_model not divisible by n_heads", "[nn][attention][errors]") {
  CHECK_THAT(error_message([] { make_attention(30, 4); }),
             Catch::Contains("MultiHeadSelfAttention: d_model 30 must be divisible by n_heads 4"));
}

TEST_CASE("construction rejects zero heads and other bad sizes", "[nn][attention][errors]") {
  CHECK_THAT(error_message([] { make_attention(32, 0); }),
             Catch::Contains("n_heads must be >= 1, got 0"));
  CHECK_THAT(error_message([] { make_attention(0, 1); }),
             Catch::Contains("d_model must be >= 1, got 0"));
  CHECK_THAT(error_message([] { make_attention(8, 2, 0); }),
             Catch::Contains("context_length must be >= 1, got 0"));
  CHECK_THAT(error_message([] {
               MultiHeadSelfAttention(MultiHeadSelfAttentionOptions(8, 2, 4).attn_dropout(1.0));
             }),
             Catch::Contains("attn_dropout must be in [0, 1), got 1"));
}

TEST_CASE("d_head and n_heads are exposed", "[nn][attention]") {
  auto attn = make_attention(32, 4);
  CHECK(attn->d_head() == 8);
  CHECK(attn->n_heads() == 4);
}

// ---- shapes ------------------------------------------------------------------------

TEST_CASE("output has the input's shape and weights are (B, H, T, T)", "[nn][attention][shape]") {
  auto attn = make_attention(32, 4, 16);
  auto x = torch::randn({2, 7, 32});
  auto r = attn(x, /*return_weights=*/true);
  CHECK(r.output.sizes() == x.sizes());
  CHECK(r.weights.sizes() == torch::IntArrayRef({2, 4, 7, 7}));
  CHECK_FALSE(attn(x).weights.defined());
}

TEST_CASE("wrong feature dim, rank and overlong sequences are rejected",
          "[nn][attention][shape][errors]") {
  auto attn = make_attention(32, 4, 16);
  CHECK_THAT(error_message([&] { attn(torch::randn({2, 7, 31})); }),
             Catch::Contains("input feature dim 31 does not match d_model 32"));
  CHECK_THAT(error_message([&] { attn(torch::randn({2, 17, 32})); }),
             Catch::Contains("sequence length 17 exceeds context_length 16"));
  CHECK_THAT(error_message([&] { attn(torch::randn({7, 32})); }),
             Catch::Contains("expected input of rank 3 (B, T, D), got rank 2"));
}

// ---- causal mask -------------------------------------------------------------------

TEST_CASE("causal mask: no weight on the future, rows sum to one", "[nn][attention][causal]") {
  torch::manual_seed(1);
  auto attn = make_attention(32, 4, 16);
  auto w = attn(torch::randn({3, 12, 32}), true).weights;  // (B, H, T, T)
  auto future = torch::ones({12, 12}, torch::kBool).triu(1);
  CHECK(w.masked_select(future).sum().item<double>() < 1e-5);
  CHECK(torch::allclose(w.sum(-1), torch::ones({3, 4, 12}), /*rtol=*/0, /*atol=*/1e-5));
}

TEST_CASE("causal mask: changing tokens at positions >= 4 leaves earlier outputs unchanged",
          "[nn][attention][causal]") {
  torch::manual_seed(2);
  TinyAttentionLM model(TinyAttentionLMOptions(64, 12, 32, 4));
  auto ids = torch::randint(64, {2, 12}, torch::kLong);
  auto changed = ids.clone();
  changed.narrow(1, 4, 8).copy_((changed.narrow(1, 4, 8) + 7) % 64);
  auto a = model->forward(ids).logits;
  auto b = model->forward(changed).logits;
  CHECK(max_abs_diff(a.narrow(1, 0, 4), b.narrow(1, 0, 4)) < 1e-6);
  CHECK(max_abs_diff(a.narrow(1, 4, 8), b.narrow(1, 4, 8)) > 1e-3);  // the change is seen later
}

TEST_CASE("bidirectional attention sees the future", "[nn][attention][causal]") {
  torch::manual_seed(3);
  MultiHeadSelfAttention attn(MultiHeadSelfAttentionOptions(16, 2, 8).causal(false));
  auto x = torch::randn({1, 6, 16});
  auto r = attn(x, true);
  auto future = torch::ones({6, 6}, torch::kBool).triu(1);
  CHECK(r.weights.masked_select(future).min().item<double>() > 0.0);
  auto y = x.clone();
  y.narrow(1, 5, 1).add_(1.0);
  CHECK(max_abs_diff(attn(y).output.narrow(1, 0, 1), r.output.narrow(1, 0, 1)) > 1e-4);
}

// ---- head split --------------------------------------------------------------------

TEST_CASE("split then merge heads is the identity", "[nn][attention][heads]") {
  auto x = torch::randn({2, 5, 24});
  auto s = split_heads(x, 6);
  CHECK(s.sizes() == torch::IntArrayRef({2, 6, 5, 4}));
  CHECK(torch::equal(merge_heads(s), x));
  // head h of token t holds features [4h, 4h + 4)
  CHECK(torch::equal(s[1][3][2], x[1][2].narrow(0, 12, 4)));
}

TEST_CASE("the fused projection maps (1, 5, 16) to (1, 5, 48)", "[nn][attention][heads]") {
  auto attn = make_attention(16, 4, 8);
  CHECK(attn->qkv_proj(torch::randn({1, 5, 16})).sizes() == torch::IntArrayRef({1, 5, 48}));
  CHECK(attn->out_proj->weight.sizes() == torch::IntArrayRef({16, 16}));
}

TEST_CASE("attention equals the written-out formula", "[nn][attention]") {
  torch::manual_seed(4);
  auto attn = make_attention(8, 2, 8);
  auto x = torch::randn({1, 5, 8});
  auto qkv = attn->qkv_proj(x).chunk(3, -1);
  std::vector<torch::Tensor> heads;
  for (int64_t h = 0; h < 2; ++h) {
    auto q = qkv[0].narrow(2, 4 * h, 4), k = qkv[1].narrow(2, 4 * h, 4), v = qkv[2].narrow(2, 4 * h, 4);
    auto s = q.matmul(k.transpose(1, 2)) / 2.0;  // sqrt(4)
    s = s.masked_fill(torch::ones({5, 5}, torch::kBool).triu(1), -INFINITY);
    heads.push_back(torch::softmax(s, -1).matmul(v));
  }
  auto expected = attn->out_proj(torch::cat(heads, -1));
  CHECK(max_abs_diff(attn(x).output, expected) < 1e-5);
}

// ---- softmax and gradients ------------------------------------------------------------

TEST_CASE("softmax weights are non-negative and rows sum to one", "[nn][attention]") {
  auto attn = make_attention(32, 8, 16);
  auto w = attn(torch::randn({4, 16, 32}) * 10, true).weights;
  CHECK(w.min().item<double>() >= 0.0);
  CHECK(torch::allclose(w.sum(-1), torch::ones({4, 8, 16}), 0, 1e-5));
}

TEST_CASE("gradients reach the QKV and output projections", "[nn][attention][grad]") {
  auto attn = make_attention(32, 4, 16);
  attn(torch::randn({2, 6, 32})).output.sum().backward();
  CHECK(attn->qkv_proj->weight.grad().abs().sum().item<double>() > 0);
  CHECK(attn->out_proj->weight.grad().abs().sum().item<double>() > 0);
}

// ---- padding mask and dropout -----------------------------------------------------------

TEST_CASE("padding mask: padded keys get no weight, real positions are unaffected",
          "[nn][attention][padding]") {
  torch::manual_seed(5);
  SECTION("causal, right padding") {
    auto attn = make_attention(16, 2, 8);
    auto x = torch::randn({1, 6, 16});
    auto padded = torch::cat({x, torch::randn({1, 2, 16})}, 1);  // 2 pad tokens
    auto mask = torch::tensor({1, 1, 1, 1, 1, 1, 0, 0}, torch::kBool).view({1, 8});
    auto r = attn(padded, true, mask);
    CHECK(max_abs_diff(r.output.narrow(1, 0, 6), attn(x).output) < 1e-5);
    CHECK(r.weights.narrow(3, 6, 2).abs().max().item<double>() == 0.0);
  }
  SECTION("bidirectional, batch of two lengths") {
    MultiHeadSelfAttention attn(MultiHeadSelfAttentionOptions(16, 2, 8).causal(false));
    auto x = torch::randn({2, 5, 16});
    auto mask = torch::tensor({1, 1, 1, 1, 1, 1, 1, 1, 0, 0}, torch::kBool).view({2, 5});
    auto r = attn(x, true, mask);
    auto alone = attn(x.narrow(0, 1, 1).narrow(1, 0, 3)).output;  // the short row, unpadded
    CHECK(max_abs_diff(r.output[1].narrow(0, 0, 3), alone[0]) < 1e-5);
    CHECK(r.weights[1].narrow(2, 3, 2).abs().max().item<double>() == 0.0);
  }
  SECTION("causal, left padding gives zero rows, not NaN") {
    auto attn = make_attention(16, 2, 8);
    auto mask = torch::tensor({0, 0, 1, 1}, torch::kBool).view({1, 4});
    auto r = attn(torch::randn({1, 4, 16}), true, mask);
    CHECK_FALSE(r.output.isnan().any().item<bool>());
    CHECK(r.weights.narrow(2, 0, 2).abs().max().item<double>() == 0.0);
  }
  SECTION("a mask of the wrong shape or type is rejected") {
    auto attn = make_attention(16, 2, 8);
    auto x = torch::randn({2, 4, 16});
    CHECK_THAT(error_message([&] { attn(x, false, torch::ones({2, 5}, torch::kBool)); }),
               Catch::Contains("padding_mask must be (B, T) = (2, 4)"));
    CHECK_THAT(error_message([&] { attn(x, false, torch::ones({2, 4})); }),
               Catch::Contains("padding_mask must be bool"));
  }
}

TEST_CASE("dropout acts in training only", "[nn][attention][dropout]") {
  torch::manual_seed(6);
  MultiHeadSelfAttention attn(
      MultiHeadSelfAttentionOptions(16, 2, 8).attn_dropout(0.5).out_dropout(0.5));
  auto x = torch::randn({2, 8, 16});
  attn->eval();
  auto a = attn(x).output, b = attn(x).output;
  CHECK(torch::equal(a, b));
  attn->train();
  CHECK(max_abs_diff(attn(x).output, a) > 1e-3);
}

TEST_CASE(".to(dtype) converts the buffers and forward still works", "[nn][attention][device]") {
  auto attn = make_attention(16, 2, 8);
  attn->to(torch::kFloat64);
  auto r = attn(torch::randn({1, 5, 16}, torch::kFloat64), true);
  CHECK(r.output.scalar_type() == torch::kFloat64);
  CHECK(torch::allclose(r.weights.sum(-1), torch::ones({1, 2, 5}, torch::kFloat64), 0, 1e-9));
}

// ---- SDPA (LibTorch >= 2) ----------------------------------------------------------------

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
