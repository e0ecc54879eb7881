// src/train/optimizer.cpp: flat Adam/AdamW against LibTorch's, weight decay, refusals.
#include "../test_util.h"
#include "core_runs.h"
#include "nn/bf16_operands.h"
#include "nn/linear.h"

#include <tinylm/nn/cpu_kernels.h>
#include <tinylm/nn/model.h>
#include <tinylm/train/optimizer.h>
#include <tinylm/train/trainer.h>

#include <algorithm>
#include <set>
#include <string>
#include <utility>

using namespace tinylm;
using namespace tinylm::nn;
using namespace tinylm::train;
using tinylm::test::BigramImpl;
using tinylm::test::error_message;
using tinylm::test::max_abs_diff;

namespace {

/// `to`'s parameters set to `from`'s (the same architecture).
void copy_parameters(const torch::nn::Module& from, torch::nn::Module& to) {
  torch::NoGradGuard g;
  auto src = from.named_parameters();
  for (auto& p : to.named_parameters()) p.value().copy_(src[p.key()]);
}

/// Two small transformers with the same weights (drawn after `seed`).
std::pair<TransformerLM, TransformerLM> twin_models(uint64_t seed) {
  torch::manual_seed(seed);
  TransformerLM a(TransformerLMOptions(40, 8, 16, 2, 2).dropout(0.0));
  TransformerLM b(TransformerLMOptions(40, 8, 16, 2, 2).dropout(0.0));
  copy_parameters(*a, *b);
  return {a, b};
}

/// Trains two identical models for `steps` steps, one with LibTorch's Adam/AdamW and one
/// with the flat fused version; returns the largest parameter difference at the end.
double optimizer_divergence(bool adamw, int steps) {
  auto [a, b] = twin_models(3);
  train::AdamConfig c;
  c.lr = 1e-2;
  c.decoupled = adamw;
  c.weight_decay = adamw ? 0.1 : 0.0;
  auto opt_a = train::make_torch_adam(*a, c);
  auto opt_b = train::make_flat_adam(*b, c);
  for (int s = 0; s < steps; ++s) {
    auto ids = torch::randint(40, {4, 8}, torch::kLong);
    for (auto [model, opt] : {std::make_pair(a.ptr().get(), opt_a.get()),
                              std::make_pair(b.ptr().get(), opt_b.get())}) {
      opt->zero_grad();
      auto logits = model->forward(ids).logits;
      torch::nn::functional::cross_entropy(logits.reshape({-1, 40}), ids.reshape({-1})).backward();
      opt->clip_grad_norm(0.5);
      opt->step(c.lr);
    }
  }
  double worst = 0;
  auto pa = a->named_parameters();
  for (const auto& p : b->named_parameters()) worst = std::max(worst, max_abs_diff(p.value(), pa[p.key()]));
  return worst;
}

/// A run that logs nothing, in its own scratch directory.
tinylm::test::CoreRun optimizer_run(const std::string& name) {
  tinylm::test::CoreRun c;
  c.trainer.out_dir(tinylm::test::scratch_dir("optimizer_" + name).string());
  c.trainer.log_every(1000);
  c.trainer.eval_batches(2);
  return c;
}

}  // namespace

TEST_CASE("flat Adam's update matches LibTorch's to float rounding, also at beta2 near 1",
          "[train][optim][fused]") {
  // One parameter matrix, the same gradients, five steps. Compared with
  // torch::optim::Adam/AdamW: the second moments and the updates agree to 1e-6 relative.
  // Forming 1 - beta in float32 from the rounded beta made the second moment 1.3e-5
  // (beta2 0.999) to 1.3e-4 (0.9999) too small and every update 6.7e-6 to 1.7e-4 too
  // large: both beyond this tolerance. The parameters start at 0 so that the updates are
  // not drowned by the rounding of large weights.
  const double beta2 = GENERATE(0.999, 0.9999);
  const bool adamw = GENERATE(false, true);
  const auto isa = GENERATE(from_range(tinylm::test::runnable_isas()));  // the update's loops
  tinylm::test::KernelGuard guard(isa);
  INFO("beta2 " << beta2 << (adamw ? " AdamW" : " Adam") << " loops " << tinylm::nn::to_string(isa));
  torch::manual_seed(5);
  struct Holder : torch::nn::Module {
    torch::Tensor w;
    Holder() {  // a Linear layer's weight: AdamW decays it
      auto layer = register_module("lin", torch::nn::Linear(torch::nn::LinearOptions(64, 64).bias(false)));
      w = layer->weight;
      torch::NoGradGuard no_grad;
      w.zero_();
    }
  };
  Holder a, b;
  train::AdamConfig c;
  c.lr = 1e-3;
  c.beta2 = beta2;
  c.decoupled = adamw;
  c.weight_decay = adamw ? 0.1 : 0.0;
  auto ref = train::make_torch_adam(a, c);
  auto flat = train::make_flat_adam(b, c);
  for (int step = 0; step < 5; ++step) {
    auto g = torch::randn({64, 64});
    a.w.mutable_grad() = g.clone();
    b.w.grad().copy_(g);
    ref->step(c.lr);
    flat->step(c.lr);
  }
  auto relative = [](const torch::Tensor& x, const torch::Tensor& y) {
    return max_abs_diff(x, y) / y.abs().max().item<double>();
  };
  const auto v_ref = ref->state_dict().at("lin.weight.exp_avg_sq");
  const auto v_flat = flat->state_dict().at("exp_avg_sq").view({64, 64});
  const double v_rel = relative(v_flat, v_ref), p_rel = relative(b.w.detach(), a.w.detach());
  INFO("second moment " << v_rel << ", parameters " << p_rel << " (relative)");
  CHECK(v_rel < 1e-6);
  CHECK(p_rel < 1e-6);
}

TEST_CASE("flat AdamW decays its spans only and across the loops' chunks", "[train][optim][fused]") {
  // Decayed weights of 20,000 and 30,000 values around undecayed biases and a norm: the
  // flat arrays' chunks (16,384 values and up) start and end inside spans of either kind.
  // Parameters start away from 0, so a decay applied where it should not be (or missed)
  // moves them by lr * weight_decay = 5e-3 relative, far beyond float rounding.
  const auto isa = GENERATE(from_range(tinylm::test::runnable_isas()));
  tinylm::test::KernelGuard guard(isa);
  INFO("loops " << tinylm::nn::to_string(isa));
  struct Holder : torch::nn::Module {
    Holder() {
      register_module("first", torch::nn::Linear(200, 100));
      register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({100})));
      register_module("second", torch::nn::Linear(100, 300));
    }
  };
  Holder a, b;
  {
    torch::NoGradGuard no_grad;
    torch::manual_seed(11);
    auto pa = a.named_parameters(), pb = b.named_parameters();
    for (auto& p : pa) {
      p.value().copy_(torch::randn(p.value().sizes()) + 1.0);
      pb[p.key()].copy_(p.value());
    }
  }
  train::AdamConfig c;
  c.lr = 1e-2;
  c.decoupled = true;
  c.weight_decay = 0.5;
  auto ref = train::make_torch_adam(a, c);
  auto flat = train::make_flat_adam(b, c);
  for (int step = 0; step < 3; ++step) {
    for (auto& p : a.named_parameters()) {
      auto g = torch::randn(p.value().sizes());
      p.value().mutable_grad() = g.clone();
      b.named_parameters()[p.key()].grad().copy_(g);
    }
    ref->step(c.lr);
    flat->step(c.lr);
  }
  auto pb = b.named_parameters();
  for (const auto& p : a.named_parameters()) {
    INFO(p.key());
    CHECK(max_abs_diff(pb[p.key()].detach(), p.value().detach()) < 1e-5);
  }
}

TEST_CASE("flat fused Adam and AdamW follow LibTorch's within float rounding", "[train][optim][fused]") {
  const bool adamw = GENERATE(false, true);
  const double d = optimizer_divergence(adamw, 20);
  INFO((adamw ? "AdamW" : "Adam") << ": largest parameter difference after 20 steps " << d);
  CHECK(d < 1e-4);
}

TEST_CASE("flat Adam keeps parameters and gradients in one buffer each", "[train][optim][fused]") {
  TransformerLM m(TransformerLMOptions(20, 8, 8, 2, 1));
  train::AdamConfig c;
  auto opt = train::make_flat_adam(*m, c);
  auto params = m->parameters();
  // Each parameter's storage is the first one's: views into one flat buffer.
  for (const auto& p : params) CHECK(p.storage().is_alias_of(params.front().storage()));
  auto ids = torch::randint(20, {2, 8}, torch::kLong);
  torch::nn::functional::cross_entropy(m->forward(ids).logits.reshape({-1, 20}), ids.reshape({-1})).backward();
  for (const auto& p : params) {
    REQUIRE(p.grad().defined());
    CHECK(p.grad().storage().is_alias_of(params.front().grad().storage()));
  }
  // zero_grad sets them to None, as PyTorch's does; the optimizer reads zeros for them.
  opt->zero_grad();
  for (const auto& p : params) CHECK_FALSE(p.grad().defined());
  CHECK(opt->gradients()[0].abs().max().item<double>() == 0.0);
  for (const auto& p : params) CHECK(p.grad().storage().is_alias_of(opt->gradients()[0].storage()));
}

namespace {

/// With the gradients set to None, each Linear layer's dW goes straight to its place in the
/// flat buffer (nn::gradient_destination); the rest (biases, norms, embeddings, a tied
/// head's second use) is gathered. Every gradient must equal, bit for bit, what a twin
/// model without the optimizer gets from autograd, after one backward and after a second
/// one adding to it (micro-batches).
void check_gradients_in_place(bool bf16) {
  const bool tied = GENERATE(false, true);
  INFO((tied ? "tied head" : "own head") << (bf16 ? ", bfloat16 products" : ", float32"));
  torch::manual_seed(4);
  auto options = TransformerLMOptions(40, 16, 32, 2, 2).dropout(0.0).tie_weights(tied);
  TransformerLM a(options), b(options);
  copy_parameters(*a, *b);
  KernelPolicy policy;
  policy.small_gemm_flops = 0;  // every Linear product through tinylm's (linear_uses_gemm)
  policy.bf16_products = bf16;
  a->set_kernel_policy(policy);
  b->set_kernel_policy(policy);
  train::AdamConfig c;
  auto opt = train::make_flat_adam(*b, c);
  const auto flat = b->parameters().front().grad().storage();  // the flat gradient buffer
  auto ids = torch::randint(40, {3, 16}, torch::kLong);
  // Pass 0 before any zero_grad (the gradients are the buffer's zeros, as the optimizer was
  // built); passes 1 and 2 after one (None): 1 writes in place, 2 adds into it.
  for (int pass = 0; pass <= 2; ++pass) {
    if (pass == 1) {
      opt->zero_grad();
      a->zero_grad();
    }
    for (auto* model : {a.ptr().get(), b.ptr().get()})
      torch::nn::functional::cross_entropy(model->forward(ids).logits.reshape({-1, 40}), ids.reshape({-1})).backward();
    auto pa = a->named_parameters();
    int64_t in_place = 0;
    for (const auto& p : b->named_parameters()) {
      INFO("pass " << pass << ": " << p.key());
      REQUIRE(p.value().grad().defined());
      CHECK(torch::equal(p.value().grad(), pa[p.key()].grad()));
      in_place += p.value().grad().storage().is_alias_of(flat) ? 1 : 0;
    }
    // At least the four Linear weights of each block in the buffer.
    CHECK(in_place >= 8);
    // What the optimizer reads: every gradient, in parameter order.
    std::vector<torch::Tensor> expected;
    for (const auto& p : b->named_parameters()) expected.push_back(pa[p.key()].grad().reshape({-1}));
    CHECK(torch::equal(opt->gradients()[0], torch::cat(expected)));
  }
  // After zero_grad, a parameter that gets no gradient reads 0, not the last step's.
  opt->zero_grad();
  b->blocks[0]->as<TransformerBlock>()->mlp->fc->weight.mul(0).sum().backward();
  CHECK(opt->gradients()[0].abs().max().item<double>() == 0.0);
  // One weight in two Linear products of one backward: the first dW to be made takes the
  // slot, the second its own tensor, and autograd sums the two.
  struct Twice : torch::nn::Module {
    torch::Tensor w;
    Twice() { w = register_parameter("w", torch::randn({32, 32}) / 8); }
    torch::Tensor forward(const torch::Tensor& x, const KernelPolicy& p) {
      return nn::linear(torch::tanh(nn::linear(x, w, {}, p)), w, {}, p);
    }
  };
  Twice one, two;
  copy_parameters(one, two);
  auto opt_two = train::make_flat_adam(two, c);
  opt_two->zero_grad();
  const auto x = torch::randn({48, 32});
  one.forward(x, policy).square().sum().backward();
  two.forward(x, policy).square().sum().backward();
  CHECK(torch::equal(opt_two->gradients()[0], one.w.grad().reshape({-1})));
}

}  // namespace

TEST_CASE("flat Adam: Linear layers' weight gradients written in its buffer, each as autograd's",
          "[train][optim][fused]") {
  check_gradients_in_place(false);
}

TEST_CASE("flat Adam: the reference model's fused loss writes every gradient in its buffer, as autograd's",
          "[train][optim][fused]") {
  torch::manual_seed(6);
  nn::TinyAttentionLM a(nn::TinyAttentionLMOptions(20, 8, 16, 2)), b(nn::TinyAttentionLMOptions(20, 8, 16, 2));
  copy_parameters(*a, *b);
  train::AdamConfig c;
  auto opt = train::make_flat_adam(*b, c);
  const auto flat = b->parameters().front().grad().storage();
  opt->zero_grad();
  const auto ids = torch::randint(20, {3, 8}, torch::kLong), targets = torch::randint(20, {3, 8}, torch::kLong);
  for (int pass = 1; pass <= 2; ++pass) {  // 2: adding into the first
    a->loss(ids, targets).backward();
    b->loss(ids, targets).backward();
    auto pa = a->named_parameters();
    int64_t in_place = 0, count = 0;
    for (const auto& p : b->named_parameters()) {
      INFO("pass " << pass << ": " << p.key());
      REQUIRE(p.value().grad().defined());
      CHECK(torch::equal(p.value().grad(), pa[p.key()].grad()));
      in_place += p.value().grad().storage().is_alias_of(flat) ? 1 : 0;
      ++count;
    }
    CHECK(in_place == count);  // none made elsewhere and copied in
  }
}

TEST_CASE("flat Adam with bfloat16 products: weight gradients written in its buffer, each as autograd's",
          "[train][optim][fused][bf16]") {
  if (!nn::bf16_products_missing().empty()) {  // refused here (the emulated run covers it)
    KernelPolicy policy;
    policy.bf16_products = true;
    CHECK_THAT(error_message([&] { nn::linear(torch::randn({4, 8}), torch::randn({3, 8}), {}, policy); }),
               Catch::Contains(nn::bf16_products_missing()));
    return;
  }
  check_gradients_in_place(true);
}

TEST_CASE("flat Adam rounds the weights bfloat16 products use as it updates them: their copies, bit for bit",
          "[train][optim][fused][bf16]") {
  if (!nn::bf16_products_missing().empty()) return;  // (the case above checks the refusal)
  torch::manual_seed(8);
  KernelPolicy policy;
  policy.bf16_products = true;
  TransformerLM m(TransformerLMOptions(40, 16, 16, 2, 2).kernel_policy(policy));
  train::AdamConfig c;
  c.lr = 1e-2;
  auto opt = train::make_flat_adam(*m, c);
  const auto qkv = m->blocks[0]->as<TransformerBlock>()->attn->qkv_proj->weight;
  const auto norm_gain = m->blocks[0]->as<TransformerBlock>()->ln1->weight;
  for (int step = 0; step < 3; ++step) {
    opt->zero_grad();
    auto ids = torch::randint(40, {2, 16}, torch::kLong);
    m->loss(ids, ids).backward();
    opt->step(c.lr);
    // Every weight a product used has a copy now, the update's: the weight rounded, bit for
    // bit, in one buffer (the update's own), for the weight's new version.
    for (const auto& p : m->named_parameters()) {
      INFO("step " << step << " parameter " << p.key());
      // (the Linear layers' weights and the embedding, the tied head's; not the positions,
      // the gains or the biases, which no product reads)
      if (p.value().dim() != 2 || p.key().find("positions") != std::string::npos) {
        CHECK_FALSE(nn::keeps_rounded_weight(p.value()));
        continue;
      }
      REQUIRE(nn::keeps_rounded_weight(p.value()));
      const auto copy = nn::rounded_weight(p.value());
      CHECK(torch::equal(copy, nn::rounded(p.value())));
      CHECK(copy.is_alias_of(nn::rounded_weight(qkv)));
    }
  }
  CHECK_FALSE(nn::keeps_rounded_weight(norm_gain));
  // A weight changed elsewhere is rounded again, not served the update's stale copy.
  {
    torch::NoGradGuard no_grad;
    qkv.add_(1.0);
  }
  const auto again = nn::rounded_weight(qkv);
  CHECK(torch::equal(again, nn::rounded(qkv)));
  CHECK_FALSE(again.is_alias_of(nn::rounded_weight(m->blocks[0]->as<TransformerBlock>()->attn->out_proj->weight)));
}

TEST_CASE("AdamW decays matrices only, not biases, norms or embeddings", "[train][optim]") {
  // Two runs that differ only in weight decay: parameters outside the decay group end
  // bit-identical, decayed matrices do not.
  auto run = [](double wd, const std::string& name, const std::string& decay_params = "linear",
                bool flat = true) {
    auto c = optimizer_run(name);
    c.model = tinylm::test::small_transformer();
    c.trainer.optimizer().kind(OptimizerKind::adamw);
    c.trainer.optimizer().decayed(decay_params == "matrices" ? DecayedParameters::matrices
                                                             : DecayedParameters::linear_weights);
    c.trainer.optimizer().flat(flat);
    c.trainer.optimizer().weight_decay(wd);
    c.trainer.optimizer().lr(0.05);
    c.trainer.epochs(1);
    c.trainer.steps_per_epoch(1);  // one step: later steps would see different gradients
    Trainer t = tinylm::test::make_core_trainer(c);
    t.fit();
    return t.model()->named_parameters();
  };
  auto decayed = run(0.5, "adamw_decay"), plain = run(0.0, "adamw_plain");
  for (const char* same : {"token_embedding.weight", "learned_positions.weight", "blocks.0.ln1.weight",
                           "blocks.0.attn.qkv_proj.bias", "ln_f.bias"}) {
    INFO(same);
    CHECK(torch::equal(decayed[same], plain[same]));
  }
  for (const char* moved : {"blocks.0.attn.qkv_proj.weight", "blocks.1.mlp.fc.weight"}) {
    INFO(moved);
    CHECK_FALSE(torch::equal(decayed[moved], plain[moved]));
  }
  // decay_params matrices (nanoGPT's rule), in both optimizers: the embedding tables are
  // decayed too; norms and biases still are not.
  for (bool flat : {true, false}) {
    INFO("flat " << flat);
    auto matrices = run(0.5, flat ? "adamw_matrices_flat" : "adamw_matrices", "matrices", flat);
    auto base = flat ? plain : run(0.0, "adamw_plain_torch", "linear", false);
    for (const char* moved : {"token_embedding.weight", "learned_positions.weight", "blocks.0.attn.qkv_proj.weight"}) {
      INFO(moved);
      CHECK_FALSE(torch::equal(matrices[moved], base[moved]));
    }
    for (const char* same : {"blocks.0.ln1.weight", "blocks.0.attn.qkv_proj.bias", "ln_f.bias"}) {
      INFO(same);
      CHECK(torch::equal(matrices[same], base[same]));
    }
  }
}

TEST_CASE("AdamW decays Linear weights only, by module kind", "[train][optim][library]") {
  nn::TransformerLM deep(nn::TransformerLMOptions(20, 8, 16, 2, 1).tie_weights(false));
  const auto decayed = decayed_parameters(*deep);
  CHECK(decayed == std::set<std::string>{"blocks.0.attn.qkv_proj.weight", "blocks.0.attn.out_proj.weight",
                                         "blocks.0.mlp.fc.weight", "blocks.0.mlp.proj.weight",
                                         "lm_head.weight"});
  // nanoGPT's rule: every parameter of two or more dimensions (embeddings too), by shape.
  CHECK(decayed_parameters(*deep, DecayedParameters::matrices) ==
        std::set<std::string>{"token_embedding.weight", "learned_positions.weight",
                              "blocks.0.attn.qkv_proj.weight", "blocks.0.attn.out_proj.weight",
                              "blocks.0.mlp.fc.weight", "blocks.0.mlp.proj.weight", "lm_head.weight"});
  nn::TransformerLM tied(test::with(nn::TransformerLMOptions(20, 8, 16, 2, 1), {{"bias", "false"}, {"layer_norm_bias", "false"}}));
  CHECK(decayed_parameters(*tied, DecayedParameters::matrices).count("token_embedding.weight") == 1);
  CHECK(decayed_parameters(*tied, DecayedParameters::matrices).size() == 6);  // the head is the embedding
  BigramImpl user(5);
  CHECK(decayed_parameters(user) == std::set<std::string>{"table.weight"});
  torch::nn::Linear bare(3, 3);
  CHECK(decayed_parameters(*bare) == std::set<std::string>{"weight"});
}

TEST_CASE("the flat optimizer refuses a model moved or cast, or a gradient that does not fit",
          "[train][optim][library][errors]") {
  AdamConfig c;
  SECTION("cast") {
    nn::TinyAttentionLM model(nn::TinyAttentionLMOptions(20, 8, 16, 2));
    auto opt = make_flat_adam(*model, c);
    model->to(torch::kFloat64);
    CHECK_THAT(error_message([&] { opt->zero_grad(); }),
               Catch::Contains("no longer holds parameter 'token_embedding.weight'") &&
                   Catch::Contains("moved, cast") && Catch::Contains("now Double"));
    CHECK_THAT(error_message([&] { opt->step(1e-3); }), Catch::Contains("no longer holds"));
  }
  SECTION("a gradient of another size") {
    nn::TinyAttentionLM model(nn::TinyAttentionLMOptions(20, 8, 16, 2));
    auto opt = make_flat_adam(*model, c);
    opt->zero_grad();
    model->lm_head->weight.mutable_grad() = torch::zeros({3});
    CHECK_THAT(error_message([&] { opt->step(1e-3); }),
               Catch::Contains("the gradient of parameter 'lm_head.weight' is [3]") && Catch::Contains("own size"));
  }
  SECTION("untouched: steps work") {
    nn::TinyAttentionLM model(nn::TinyAttentionLMOptions(20, 8, 16, 2));
    auto opt = make_flat_adam(*model, c);
    const auto before = model->lm_head->weight.clone();
    opt->zero_grad();
    model->loss(torch::randint(20, {2, 8}, torch::kLong), torch::randint(20, {2, 8}, torch::kLong)).backward();
    opt->step(1e-2);
    CHECK(max_abs_diff(model->lm_head->weight, before) > 0);
  }
}

TEST_CASE("flat Adam's clip_and_step: clip_grad_norm then step, bit for bit, the gradients left as they were",
          "[train][optim][fused]") {
  const auto isa = GENERATE(from_range(tinylm::test::runnable_isas()));  // the update's loops
  tinylm::test::KernelGuard guard(isa);
  const double max_norm = GENERATE(0.05, 1e9, 0.0);  // clipping, a bound never reached, none
  INFO("loops " << tinylm::nn::to_string(isa) << " max_norm " << max_norm);
  auto [a, b] = twin_models(9);
  train::AdamConfig c;
  c.lr = 1e-2;
  c.decoupled = true;
  c.weight_decay = 0.1;
  auto opt_a = train::make_flat_adam(*a, c);
  auto opt_b = train::make_flat_adam(*b, c);
  for (int s = 0; s < 3; ++s) {
    auto ids = torch::randint(40, {4, 8}, torch::kLong);
    for (auto* model : {a.ptr().get(), b.ptr().get()}) {
      auto logits = model->forward(ids).logits;
      torch::nn::functional::cross_entropy(logits.reshape({-1, 40}), ids.reshape({-1})).backward();
    }
    const auto grads_before = opt_b->gradients()[0].clone();
    const double norm_a = max_norm > 0 ? opt_a->clip_grad_norm(max_norm) : 0.0;
    opt_a->step(c.lr);
    const double norm_b = opt_b->clip_and_step(max_norm, c.lr);
    CHECK(norm_a == norm_b);
    if (max_norm == 0.05) CHECK(norm_b > max_norm);  // the factor was applied
    CHECK(torch::equal(opt_a->parameters()[0], opt_b->parameters()[0]));
    CHECK(torch::equal(opt_b->gradients()[0], grads_before));
    opt_a->zero_grad();
    opt_b->zero_grad();
  }
}
