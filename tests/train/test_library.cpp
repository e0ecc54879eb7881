// The library as a C++ user meets it: a Trainer built from parts, process-wide state left
// alone, models that clone and plug into LibTorch's containers, and optimizers that
// refuse what they cannot do.
#include "../test_util.h"

#include <tinylm/run.h>
#include <tinylm/train/optimizer.h>
#include <tinylm/train/trainer.h>

#include <ATen/Parallel.h>
#include <torch/nn/modules/container/any.h>

using namespace tinylm;
using namespace tinylm::train;
using tinylm::test::error_message;
using tinylm::test::max_abs_diff;

namespace {

RunConfig small_dropout_run(const std::string& name) {
  RunConfig c;
  c.model = "transformer";
  c.d_model = 16;
  c.n_heads = 2;
  c.n_layers = 1;
  c.dropout = 0.1;  // dropout draws random numbers every step
  c.epochs = 1;
  c.steps_per_epoch = 4;
  c.log_every = 100;
  c.eval_batches = 1;
  c.out_dir = tinylm::test::scratch_dir("library_" + name).string();
  return c;
}

/// A model of the user's own: a bigram table (each token predicts the next from itself).
class BigramImpl : public nn::LanguageModelImpl {
 public:
  explicit BigramImpl(int64_t vocab) : vocab_(vocab) {
    table = register_module("table", torch::nn::Linear(vocab, vocab));
  }
  nn::LMOutput forward(const torch::Tensor& ids, bool, const torch::Tensor&) override {
    return {table(torch::one_hot(ids, vocab_).to(torch::kFloat32)), {}};
  }
  int64_t vocab_size() const override { return vocab_; }
  int64_t context_length() const override { return 1 << 20; }
  torch::Tensor forward_cached(const torch::Tensor& ids, nn::KVCache&) override {
    return forward(ids, false, {}).logits;
  }
  torch::nn::Linear table{nullptr};

 private:
  int64_t vocab_;
};

}  // namespace

TEST_CASE("building and using a Trainer leaves the global seed and thread counts alone",
          "[train][library]") {
  const int threads_before = at::get_num_threads();
  at::set_num_threads(1);
  // What the user's generator gives after seeding 123, with no Trainer in between.
  torch::manual_seed(123);
  const auto expected = torch::rand({8});
  torch::manual_seed(123);
  {
    RunConfig c = small_dropout_run("global");
    c.threads = 2;  // the config's setting is the application's to apply, not the Trainer's
    Trainer t = make_trainer(c);
    t.fit();
    t.validate();
    t.save(c.out_dir + "/again.ckpt");
  }
  CHECK(torch::equal(torch::rand({8}), expected));
  CHECK(at::get_num_threads() == 1);
  at::set_num_threads(threads_before);
}

TEST_CASE("a Trainer's randomness is its own: the global seed does not change its losses",
          "[train][library][reproducible]") {
  auto losses_after_seeding = [](uint64_t global_seed) {
    torch::manual_seed(global_seed);
    Trainer t = make_trainer(small_dropout_run("own_" + std::to_string(global_seed)));
    std::vector<double> out;
    for (int i = 0; i < 3; ++i) out.push_back(t.train_step());
    return out;
  };
  const auto a = losses_after_seeding(1), b = losses_after_seeding(999);
  CHECK(a == b);  // bit-identical
}

TEST_CASE("a user's model and task train through the Trainer and its checkpoints",
          "[train][library]") {
  // Task: every row counts up by one modulo V, so each token fixes the next.
  struct CountUp : data::Task {
    std::string name() const override { return "count-up"; }
    int64_t vocab_size() const override { return 10; }
    int64_t seq_len() const override { return 8; }
    data::Batch sample(int64_t B, data::Split, at::Generator& gen) override {
      auto start = torch::randint(10, {B, 1}, gen, torch::kLong);
      auto rows = (start + torch::arange(9, torch::kLong)).remainder(10);  // (B, T + 1)
      return {rows.narrow(1, 0, 8), rows.narrow(1, 1, 8), torch::ones({B, 8}, torch::kBool)};
    }
  };
  torch::manual_seed(0);
  auto model = std::make_shared<BigramImpl>(10);
  const auto dir = tinylm::test::scratch_dir("library_user");
  TrainerOptions o;
  o.epochs(1).steps_per_epoch(150).log_every(1000).out_dir(dir.string()).recipe("my notes");
  o.optimizer().lr(0.05);
  Trainer trainer(model, std::make_shared<CountUp>(), o);
  const auto result = trainer.fit();
  CHECK(result.last_eval.accuracy == 1.0);
  CHECK(result.last_eval.loss < 0.1);

  auto ck = read_checkpoint(result.last_checkpoint);
  CHECK(ck.recipe == "my notes");
  CHECK_THAT(ck.architecture.kind, Catch::Contains("BigramImpl"));
  CHECK_THAT(error_message([&] { nn::build_model(ck.architecture); }),
             Catch::Contains("build yours in your own code and load the checkpoint's weights"));
  auto again = std::make_shared<BigramImpl>(10);
  load_model_state(ck, *again);
  CountUp task;
  const auto m = evaluate(*again, task, 2, 16, 7, torch::kCPU);
  CHECK(m.accuracy == 1.0);

  // Options are checked with the library's own names.
  TrainerOptions bad;
  bad.batch_size(0);
  CHECK_THAT(error_message([&] { Trainer(model, std::make_shared<CountUp>(), bad); }),
             Catch::Contains("TrainerOptions: batch_size must be >= 1, got 0"));
  CHECK_THAT(error_message([&] { Trainer(std::make_shared<BigramImpl>(11), std::make_shared<CountUp>(), o); }),
             Catch::Contains("has vocabulary 10 but the model's is 11"));
}

TEST_CASE("both models clone deeply and draw fresh weights on reset_parameters()", "[nn][model][library]") {
  torch::manual_seed(3);
  std::vector<nn::LanguageModel> models = {
      std::make_shared<nn::TinyAttentionLMImpl>(nn::TinyAttentionLMOptions(20, 8, 16, 2)),
      std::make_shared<nn::TransformerLMImpl>(nn::TransformerLMOptions(20, 8, 16, 2, 2))};
  auto ids = torch::randint(20, {2, 8}, torch::kLong);
  for (auto& model : models) {
    model->eval();
    auto copy = std::dynamic_pointer_cast<nn::LanguageModelImpl>(model->clone());
    REQUIRE(copy);
    CHECK(torch::equal(copy->forward(ids).logits, model->forward(ids).logits));
    auto original = model->named_parameters();
    for (auto& p : copy->named_parameters()) {
      INFO(p.key());
      CHECK(p.value().data_ptr() != original[p.key()].data_ptr());
    }
    {
      torch::NoGradGuard g;
      copy->parameters().front().add_(1.0);
    }
    CHECK_FALSE(torch::equal(copy->forward(ids).logits, model->forward(ids).logits));
  }
  nn::TinyAttentionLM tiny(nn::TinyAttentionLMOptions(20, 8, 16, 2));
  const auto before = tiny->lm_head->weight.clone();
  tiny->reset_parameters();
  CHECK(tiny->named_parameters().size() == 7);
  CHECK_FALSE(torch::equal(tiny->lm_head->weight, before));
}

TEST_CASE("models plug into AnyModule with their default forward arguments", "[nn][model][library]") {
  torch::nn::AnyModule tiny(nn::TinyAttentionLM(nn::TinyAttentionLMOptions(20, 8, 16, 2)));
  torch::nn::AnyModule deep(nn::TransformerLM(nn::TransformerLMOptions(20, 8, 16, 2, 1)));
  auto ids = torch::randint(20, {2, 8}, torch::kLong);
  CHECK(tiny.forward<nn::LMOutput>(ids).logits.sizes() == torch::IntArrayRef({2, 8, 20}));
  CHECK(deep.forward<nn::LMOutput>(ids).attention.empty());
  CHECK(deep.forward<nn::LMOutput>(ids, true).attention.size() == 1);
}

TEST_CASE("AdamW decays Linear weights only, by module kind", "[train][optim][library]") {
  nn::TransformerLM deep(nn::TransformerLMOptions(20, 8, 16, 2, 1).tie_weights(false));
  const auto decayed = decayed_parameters(*deep);
  CHECK(decayed == std::set<std::string>{"blocks.0.attn.qkv_proj.weight", "blocks.0.attn.out_proj.weight",
                                         "blocks.0.mlp.fc.weight", "blocks.0.mlp.proj.weight",
                                         "lm_head.weight"});
  BigramImpl user(5);
  CHECK(decayed_parameters(user) == std::set<std::string>{"table.weight"});
  torch::nn::Linear bare(3, 3);
  CHECK(decayed_parameters(*bare) == std::set<std::string>{"weight"});
}

TEST_CASE("the flat optimizer refuses a model moved, cast or given new gradients",
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
  SECTION("gradients set to None") {
    nn::TinyAttentionLM model(nn::TinyAttentionLMOptions(20, 8, 16, 2));
    auto opt = make_flat_adam(*model, c);
    for (auto& p : model->parameters()) p.mutable_grad() = torch::Tensor();
    CHECK_THAT(error_message([&] { opt->step(1e-3); }), Catch::Contains("gradients replaced"));
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
