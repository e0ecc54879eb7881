// src/nn/block.cpp: the feed-forward layer and the transformer block.
#include "../test_util.h"

#include <tinylm/nn/block.h>
#include <tinylm/nn/model.h>

#include <cmath>
#include <tuple>

using namespace tinylm::nn;
using tinylm::test::error_message;
using tinylm::test::max_abs_diff;

TEST_CASE("LayerNorm: a gain and a bias, or a gain only", "[nn][block]") {
  torch::manual_seed(4);
  auto x = torch::randn({2, 3, 8});
  LayerNorm with(LayerNormOptions(8));
  LayerNorm gain_only(LayerNormOptions(8).bias(false));
  CHECK(with->named_parameters().keys() == std::vector<std::string>{"weight", "bias"});
  CHECK(gain_only->named_parameters().keys() == std::vector<std::string>{"weight"});
  CHECK_FALSE(gain_only->bias.defined());
  {
    torch::NoGradGuard no_grad;
    with->weight.uniform_(0.5, 1.5);
    with->bias.uniform_(-1, 1);
    gain_only->weight.copy_(with->weight);
  }
  // LibTorch's own LayerNorm with the same gain and bias is the reference.
  torch::nn::LayerNorm reference(torch::nn::LayerNormOptions({8}));
  {
    torch::NoGradGuard no_grad;
    reference->weight.copy_(with->weight);
    reference->bias.copy_(with->bias);
  }
  CHECK(max_abs_diff(with(x), reference(x)) < 1e-6);
  {
    torch::NoGradGuard no_grad;
    reference->bias.zero_();
  }
  CHECK(max_abs_diff(gain_only(x), reference(x)) < 1e-6);
  CHECK(max_abs_diff(gain_only(x), with(x)) > 0.1);  // the bias mattered above
  auto copy = std::dynamic_pointer_cast<LayerNormImpl>(gain_only->clone());
  REQUIRE(copy);
  CHECK(copy->named_parameters().size() == 1);
  CHECK(torch::equal(copy->forward(x), gain_only(x)));
  CHECK_THAT(error_message([] { LayerNorm(LayerNormOptions(0)); }), Catch::Contains("LayerNorm: d_model must be >= 1, got 0"));
}

TEST_CASE("feed-forward is Linear -> GELU(tanh) -> Linear with expansion 4", "[nn][block]") {
  torch::manual_seed(0);
  FeedForward ff(FeedForwardOptions(8));
  CHECK(ff->fc->weight.sizes() == torch::IntArrayRef({32, 8}));
  CHECK(ff->proj->weight.sizes() == torch::IntArrayRef({8, 32}));
  auto x = torch::randn({2, 3, 8});
  auto h = ff->fc(x);
  const double c = std::sqrt(2.0 / M_PI);
  auto gelu_tanh = 0.5 * h * (1 + torch::tanh(c * (h + 0.044715 * h.pow(3))));
  CHECK(max_abs_diff(ff(x), ff->proj(gelu_tanh)) < 1e-5);
  CHECK_THAT(error_message([] { FeedForward(FeedForwardOptions(8).expansion(0)); }),
             Catch::Contains("FeedForward: expansion must be >= 1, got 0"));
}

TEST_CASE("transformer block: pre-LN and post-LN follow their formulas", "[nn][block]") {
  torch::manual_seed(1);
  auto x = torch::randn({2, 6, 16});
  SECTION("pre-LN: x + attn(ln1(x)), then + mlp(ln2(.))") {
    TransformerBlock b(TransformerBlockOptions(16, 4, 8).pre_ln(true));
    auto h = x + b->attn(b->ln1(x)).output;
    CHECK(max_abs_diff(b(x).output, h + b->mlp(b->ln2(h))) < 1e-5);
  }
  SECTION("post-LN: ln1(x + attn(x)), then ln2(. + mlp(.)); output is normalised") {
    TransformerBlock b(TransformerBlockOptions(16, 4, 8).pre_ln(false));
    auto h = b->ln1(x + b->attn(x).output);
    auto out = b(x).output;
    CHECK(max_abs_diff(out, b->ln2(h + b->mlp(h))) < 1e-5);
    CHECK(out.mean(-1).abs().max().item<double>() < 1e-5);
  }
  TransformerBlock b(TransformerBlockOptions(16, 4, 8));
  CHECK(b->ln1->options.eps() == 1e-5);
  CHECK(b(x, true).weights.sizes() == torch::IntArrayRef({2, 4, 6, 6}));
}

TEST_CASE("forward_terms: a stack's output as two terms, the same values and gradients as forward",
          "[nn][block]") {
  torch::manual_seed(5);
  TransformerBlock b1(TransformerBlockOptions(16, 4, 8)), b2(TransformerBlockOptions(16, 4, 8));
  LayerNorm ln_f(LayerNormOptions(16));
  auto run = [&](bool terms) {
    for (auto* m : {static_cast<torch::nn::Module*>(b1.get()), static_cast<torch::nn::Module*>(b2.get()),
                    static_cast<torch::nn::Module*>(ln_f.get())})
      m->zero_grad();
    torch::manual_seed(6);
    auto x = torch::randn({2, 6, 16}, torch::requires_grad());
    torch::Tensor out;
    if (terms) {
      auto [h1, m1] = b1->forward_terms(x, {});
      auto [h2, m2] = b2->forward_terms(h1, m1);  // b2 reads h1 + m1 through its ln1
      out = ln_f->forward_residual(h2, m2).second;
    } else {
      out = ln_f(b2(b1(x).output).output);
    }
    (out * torch::randn({2, 6, 16})).sum().backward();  // (LayerNorm's output squared is near constant)
    return std::make_tuple(out.detach(), x.grad(), b1->attn->qkv_proj->weight.grad().clone(),
                           b2->ln1->weight.grad().clone());
  };
  const auto [y0, dx0, dw0, dg0] = run(false);
  const auto [y1, dx1, dw1, dg1] = run(true);
  CHECK(max_abs_diff(y0, y1) < 1e-5);
  CHECK(max_abs_diff(dx0, dx1) < 1e-4);
  CHECK(max_abs_diff(dw0, dw1) < 1e-4);
  CHECK(max_abs_diff(dg0, dg1) < 1e-4);  // the norm that adds the terms passes on their gradient
  CHECK(dg0.abs().max().item<double>() > 1e-2);
  // The first block's terms alone are not its output: h1 + m1 is.
  auto [h1, m1] = b1->forward_terms(torch::randn({2, 6, 16}), {});
  CHECK(max_abs_diff(h1, h1 + m1) > 1e-2);
  TransformerBlock post(TransformerBlockOptions(16, 4, 8).pre_ln(false));
  CHECK_THAT(error_message([&] { post->forward_terms(torch::randn({2, 6, 16}), {}); }),
             Catch::Contains("pre-LN blocks only"));
}

// The reference demo: an embedding of 128 ids (PyTorch's default init), 6 blocks
// (d 192, 6 heads, ctx 64, no dropout), a final LayerNorm, loss = sum of squares of its
// output, batch 2 x 32. Pre-LN lets far more gradient reach the embedding than post-LN
// with the very same weights (the reference printed 0.002255 vs 0.000010, ~218x).
TEST_CASE("pre-LN passes far more gradient to the embedding than post-LN", "[nn][block][slow]") {
  struct Stack {
    explicit Stack(bool pre_ln) {
      for (int i = 0; i < 6; ++i)
        blocks->push_back(TransformerBlock(TransformerBlockOptions(192, 6, 64).pre_ln(pre_ln)));
      module->register_module("embedding", embedding);
      module->register_module("blocks", blocks);
      module->register_module("ln_f", ln_f);
    }
    double embedding_grad_norm(const torch::Tensor& ids) {
      auto x = embedding(ids);
      for (const auto& b : *blocks) x = b->as<TransformerBlock>()->forward(x).output;
      ln_f(x).pow(2).sum().backward();
      return embedding->weight.grad().norm().item<double>();
    }
    std::shared_ptr<torch::nn::Module> module = std::make_shared<torch::nn::Module>();
    torch::nn::Embedding embedding{128, 192};
    torch::nn::ModuleList blocks;
    torch::nn::LayerNorm ln_f{torch::nn::LayerNormOptions({192})};
  };
  torch::manual_seed(0);
  Stack pre(true), post(false);
  {
    torch::NoGradGuard no_grad;
    auto src = pre.module->named_parameters();
    for (auto& p : post.module->named_parameters()) p.value().copy_(src[p.key()]);
  }
  auto ids = torch::randint(128, {2, 32}, torch::kLong);
  const double g_pre = pre.embedding_grad_norm(ids), g_post = post.embedding_grad_norm(ids);
  INFO("embedding grad norm: pre-LN " << g_pre << ", post-LN " << g_post << ", ratio "
                                      << g_pre / g_post);
  CHECK(g_pre > 10 * g_post);
}
