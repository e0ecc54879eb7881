// src/train/trainer.cpp: training, resuming, schedules, and a Trainer of a user's parts.
#include "../test_util.h"
#include "core_runs.h"

#include <tinylm/nn/model.h>
#include <tinylm/train/checkpoint.h>
#include <tinylm/train/trainer.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <filesystem>
#include <fstream>

using namespace tinylm;
using namespace tinylm::train;
using tinylm::test::BigramImpl;
using tinylm::test::CoreRun;
using tinylm::test::error_message;
using tinylm::test::make_core_trainer;

namespace fs = std::filesystem;

namespace {

/// The reference run, logging nothing, in its own (emptied) directory.
CoreRun quiet(const std::string& name) {
  CoreRun c;
  c.trainer.out_dir(tinylm::test::scratch_dir("trainer_" + name).string());
  c.trainer.log_every(1000);
  c.trainer.eval_batches(2);
  return c;
}

/// The small transformer (two blocks of width 32) with dropout 0.1 in its embeddings and
/// residual branches: dropout draws from the seeded generator too.
nn::ModelArchitecture dropout_transformer() {
  return nn::architecture_of(tinylm::test::with(nn::TransformerLMOptions(64, 12, 32, 4, 2), {{"dropout", "0.1"}}));
}

CoreRun small_dropout_run(const std::string& name) {
  CoreRun c;
  // One block of width 16; dropout draws random numbers every step.
  c.model = nn::architecture_of(tinylm::test::with(nn::TransformerLMOptions(64, 12, 16, 2, 1), {{"dropout", "0.1"}}));
  c.trainer.epochs(1);
  c.trainer.steps_per_epoch(4);
  c.trainer.log_every(100);
  c.trainer.eval_batches(1);
  c.trainer.out_dir(tinylm::test::scratch_dir("library_" + name).string());
  return c;
}

}  // namespace

TEST_CASE("the reference run trains the repeat task to < 0.01 and 100% accuracy", "[train][slow]") {
  CoreRun c = quiet("reference");
  Trainer trainer = make_core_trainer(c);
  auto r = trainer.fit();
  REQUIRE(r.epoch_losses.size() == 3);
  INFO("epoch means " << r.epoch_losses[0] << " " << r.epoch_losses[1] << " " << r.epoch_losses[2]);
  CHECK(r.epoch_losses[0] > r.epoch_losses[1]);
  CHECK(r.epoch_losses[1] > r.epoch_losses[2]);
  CHECK(r.epoch_losses[2] < 0.01);
  CHECK(r.last_eval.accuracy == 1.0);
  CHECK(fs::exists(r.last_checkpoint));
  CHECK(fs::exists(r.best_checkpoint));
}

TEST_CASE("the same config and seed give the same losses", "[train][reproducible]") {
  CoreRun c = quiet("repro");
  c.model = dropout_transformer();
  c.trainer.epochs(1);
  c.trainer.steps_per_epoch(15);
  auto a = make_core_trainer(c).fit().losses;
  c.trainer.out_dir(quiet("repro_b").trainer.out_dir());  // a run directory holds one run
  auto b = make_core_trainer(c).fit().losses;
  CHECK(a == b);
  c.trainer.seed(43);
  c.trainer.out_dir(quiet("repro_c").trainer.out_dir());
  CHECK(make_core_trainer(c).fit().losses != a);
}

TEST_CASE("resume continues exactly where a run stopped", "[train][resume]") {
  CoreRun c = quiet("resume");
  c.model = dropout_transformer();
  c.trainer.optimizer().kind(OptimizerKind::adamw);
  c.trainer.optimizer().weight_decay(0.1);
  c.trainer.schedule().kind(LRSchedule::cosine);
  c.trainer.schedule().warmup_steps(4);
  c.trainer.grad_clip(1.0);
  c.trainer.epochs(2);
  c.trainer.steps_per_epoch(10);
  c.trainer.save_every(7);
  const auto full = make_core_trainer(c).fit();

  std::atomic<bool> stop{false};
  // Stop after step 7 has been checkpointed: the stop flag is read between steps.
  CoreRun c7 = c;
  c7.trainer.log_every(7);
  c7.trainer.out_dir() += "_part";  // its own directory: the full run's checkpoints are elsewhere
  fs::remove_all(c7.trainer.out_dir());
  Trainer part = make_core_trainer(c7);
  part.on_progress = [&](const StepRecord& rec) { if (rec.step == 7) stop = true; };
  auto r1 = part.fit(&stop);
  REQUIRE(r1.interrupted);
  REQUIRE(r1.end_step == 7);

  Trainer resumed = make_core_trainer(c7);
  resumed.resume(read_checkpoint(resolve_checkpoint_path(c7.trainer.out_dir())));
  auto r2 = resumed.fit();
  REQUIRE(r2.start_step == 7);
  REQUIRE(r2.losses.size() == 13);
  for (size_t i = 0; i < r2.losses.size(); ++i) {
    INFO("step " << 8 + i);
    CHECK(r2.losses[i] == full.losses[7 + i]);  // bit-identical
  }
  CHECK(r2.epoch_losses.back() == full.epoch_losses.back());
}

TEST_CASE("learning rate: linear warmup then cosine to the floor", "[train][schedule]") {
  TrainerOptions o;
  o.optimizer().lr(1.0);
  o.schedule().warmup_steps(10);
  o.epochs(1);
  o.steps_per_epoch(110);
  o.schedule().kind(LRSchedule::cosine);
  o.schedule().min_lr_ratio(0.1);
  CHECK(learning_rate_at(o, 0) == Approx(0.1));
  CHECK(learning_rate_at(o, 9) == Approx(1.0));
  CHECK(learning_rate_at(o, 10) == Approx(1.0));
  CHECK(learning_rate_at(o, 60) == Approx(0.55));
  CHECK(learning_rate_at(o, 110) == Approx(0.1));
  o.schedule().kind(LRSchedule::constant);
  CHECK(learning_rate_at(o, 60) == 1.0);
}

TEST_CASE("gradient accumulation of 2 x 8 equals one batch of 16", "[train][accum]") {
  // The data generator yields the same 16 rows either way, so the two runs see the
  // same data and must follow the same trajectory up to float rounding.
  auto run = [](int64_t batch, int64_t accum, const std::string& name) {
    CoreRun c = quiet(name);
    c.trainer.epochs(1);
    c.trainer.steps_per_epoch(10);
    c.trainer.batch_size(batch);
    c.trainer.grad_accum(accum);
    return make_core_trainer(c).fit().losses;
  };
  auto one = run(16, 1, "accum1"), two = run(8, 2, "accum2");
  REQUIRE(one.size() == two.size());
  for (size_t i = 0; i < one.size(); ++i) {
    INFO("step " << i + 1);
    CHECK(two[i] == Approx(one[i]).epsilon(1e-4));
  }
  CHECK(one.back() < one.front());
}

TEST_CASE("a NaN loss stops training with a clear error and keeps the last checkpoint",
          "[train][errors]") {
  CoreRun c = quiet("nan");
  c.trainer.epochs(1);
  c.trainer.steps_per_epoch(20);
  c.trainer.save_every(5);
  c.trainer.log_every(6);
  Trainer t = make_core_trainer(c);
  // After step 6 (step 5 is checkpointed), poison a weight: step 7's loss is NaN.
  t.on_progress = [&](const StepRecord& rec) {
    if (rec.step == 6) {
      torch::NoGradGuard g;
      t.model()->parameters().front().fill_(std::nan(""));
    }
  };
  const auto msg = error_message([&] { t.fit(); });
  CHECK_THAT(msg, Catch::Contains("the loss became nan at step 7"));
  CHECK_THAT(msg, Catch::Contains("the last good checkpoint is"));
  CHECK_THAT(msg, Catch::Contains("step-00000005.ckpt"));
  auto ck = read_checkpoint((fs::path(c.trainer.out_dir()) / "step-00000005.ckpt").string());
  auto model = nn::build_model(ck.architecture);
  load_model_state(ck, *model);
  CHECK_FALSE(model->parameters().front().isnan().any().item<bool>());
  CHECK_FALSE(fs::exists(fs::path(c.trainer.out_dir()) / "step-00000007.ckpt"));
}

TEST_CASE("a solved task stops early when asked", "[train][solve]") {
  CoreRun c = quiet("solve");
  c.trainer.epochs(20);
  c.trainer.eval_every(20);
  c.trainer.stop_when_solved(true);
  c.trainer.solve_loss(0.05);
  auto r = make_core_trainer(c).fit();
  CHECK(r.solved);
  CHECK(r.end_step < c.trainer.total_steps());
  CHECK(r.last_eval.accuracy == 1.0);
  CHECK(r.last_eval.scored_loss < 0.05);
}

TEST_CASE("keep-last prunes old step checkpoints", "[train][checkpoint]") {
  CoreRun c = quiet("prune");
  c.trainer.epochs(1);
  c.trainer.steps_per_epoch(10);
  c.trainer.save_every(2);
  c.trainer.keep_last(2);
  make_core_trainer(c).fit();
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(c.trainer.out_dir())) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  CHECK(names == std::vector<std::string>{".tinylm.lock", "best.ckpt", "metrics.jsonl",
                                          "step-00000008.ckpt", "step-00000010.ckpt"});
}

TEST_CASE("devices: auto and cpu resolve, bad specs are refused", "[train][device][errors]") {
  CHECK(resolve_device("cpu").is_cpu());
  CHECK(resolve_device("auto").is_cuda() == torch::cuda::is_available());
  CHECK_THAT(error_message([] { resolve_device("tpu"); }),
             Catch::Contains("unknown device 'tpu': use auto, cpu, cuda or cuda:N"));
  if (!torch::cuda::is_available()) {
    CHECK_THAT(error_message([] { resolve_device("cuda:0"); }),
               Catch::Contains("CUDA is not available here"));
  }
}

TEST_CASE("building and using a Trainer leaves the global seed and thread counts alone",
          "[train][library]") {
  // (make_trainer, and a run config's threads setting, are checked likewise in
  // tests/test_run.cpp.)
  tinylm::test::check_leaves_global_state([] {
    CoreRun c = small_dropout_run("global");
    Trainer t = make_core_trainer(c);
    t.fit();
    t.validation_metrics();
    t.save(c.trainer.out_dir() + "/again.ckpt");
  });
}

TEST_CASE("a Trainer's randomness is its own: the global seed does not change its losses",
          "[train][library][reproducible]") {
  auto losses_after_seeding = [](uint64_t global_seed) {
    torch::manual_seed(global_seed);
    Trainer t = make_core_trainer(small_dropout_run("own_" + std::to_string(global_seed)));
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
             Catch::Contains("register yours with register_model_kind"));
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
