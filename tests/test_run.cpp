// src/run.cpp: the model, task, trainer options and Trainer of a run config; a checkpoint's config.
#include "test_util.h"
#include "train/checkpoint_files.h"

#include <tinylm/config.h>
#include <tinylm/data/prepare.h>
#include <tinylm/data/tasks.h>
#include <tinylm/nn/attention.h>
#include <tinylm/nn/cpu_kernels.h>
#include <tinylm/nn/model.h>
#include <tinylm/run.h>
#include <tinylm/train/checkpoint.h>
#include <tinylm/train/trainer.h>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>

#include <cmath>
#include <filesystem>
#include <random>
#include <string>

using namespace tinylm;
using tinylm::test::error_message;

namespace {

/// A run config of a transformer of one block, width 16, 2 heads, writing into `dir`.
RunConfig one_block_config(const std::filesystem::path& dir) {
  RunConfig c;
  c.set("model", "transformer");
  c.set("d-model", 16);
  c.set("n-heads", 2);
  c.set("n-layers", 1);
  c.trainer.out_dir(dir.string());
  return c;
}

}  // namespace

TEST_CASE("make_task builds every task of a config", "[data][tasks]") {
  RunConfig c;
  for (const char* name : {"repeat", "copy", "reverse", "sort"}) {
    c.task = name;
    auto task = make_task(c);
    CHECK(task->name() == name);
    CHECK(task->vocab_size() == 64);
    auto gen = at::make_generator<at::CPUGeneratorImpl>(1);
    auto b = task->sample(4, data::Split::train, gen);
    CHECK(b.inputs.sizes() == torch::IntArrayRef({4, 12}));
    CHECK(b.inputs.max().item<int64_t>() < 64);
  }
}

TEST_CASE("model_architecture carries the config's model settings", "[run]") {
  RunConfig c;
  c.set("context-length", 20);
  c.set("fused-attention", false);
  auto tiny = model_architecture(c);
  CHECK(tiny.kind == "tiny");
  CHECK(tiny.options == nn::architecture_of(nn::TinyAttentionLMOptions(64, 20, 32, 4)
                                                .attention_kernel(nn::AttentionKernel::plain)).options);
  CHECK(tiny.options.at("context_length") == "20");
  CHECK(tiny.options.at("attention_kernel") == nn::to_string(nn::AttentionKernel::plain));
  c.set("fused-attention", true);
  CHECK(model_architecture(c).options.at("attention_kernel") == nn::to_string(nn::AttentionKernel::automatic));

  c.set("model", "transformer");
  c.set("context-length", 0);  // = seq-len
  c.task_options.seq_len(10);
  c.set("n-layers", 3);
  c.set("mlp-expansion", 2);
  c.set("dropout", 0.25);
  c.set("attn-dropout", 0.125);
  c.set("bias", false);
  c.set("pre-ln", false);
  c.set("activation", "gelu");
  c.set("tie-weights", false);
  c.set("positions", "sinusoidal");
  auto deep = model_architecture(c);
  CHECK(deep.kind == "transformer");
  CHECK(deep.options == nn::architecture_of(test::with(nn::TransformerLMOptions(64, 10, 32, 4, 3)
                                                          .tie_weights(false)
                                                          .positions(nn::PositionEncoding::sinusoidal),
                                                      {{"mlp_expansion", "2"},
                                                       {"dropout", "0.25"},
                                                       {"attn_dropout", "0.125"},
                                                       {"bias", "false"},
                                                       {"pre_ln", "false"},
                                                       {"activation", "gelu"}}))
                            .options);
  CHECK_THAT(error_message([&] { c.set("model", "mamba"); }),
             Catch::Contains("model must be one of tiny, transformer, got 'mamba'"));
  c.model = nn::ModelOptions();
  CHECK_THAT(error_message([&] { model_architecture(c); }), Catch::Contains("cannot build a model of kind ''"));
}

TEST_CASE("build_model draws the run seed's weights and leaves the global generator alone", "[run]") {
  RunConfig c;
  c.set("model", "transformer");
  c.trainer.seed(7);
  // The reference run seeds LibTorch's generator with the run seed, then builds.
  torch::manual_seed(7);
  const auto reference = nn::build_model(model_architecture(c));
  torch::manual_seed(123);
  const auto expected = torch::rand({4});
  torch::manual_seed(123);
  const auto a = build_model(c), b = build_model(c);
  CHECK(torch::equal(torch::rand({4}), expected));  // the global generator went on as if untouched
  const auto pa = a->named_parameters(), pb = b->named_parameters(), pr = reference->named_parameters();
  REQUIRE(pa.size() == pr.size());
  for (const auto& p : pa) {
    INFO(p.key());
    CHECK(torch::equal(p.value(), pb[p.key()]));
    CHECK(torch::equal(p.value(), pr[p.key()]));
  }
  c.trainer.seed(8);
  CHECK_FALSE(torch::equal(build_model(c)->named_parameters()["token_embedding.weight"],
                           pa["token_embedding.weight"]));
  c.set("n-heads", 5);  // the config is validated first
  CHECK_THAT(error_message([&] { build_model(c); }), Catch::Contains("d-model 32 must be divisible by n-heads 5"));
}

TEST_CASE("trainer_options carry every training setting of the config, and the config as the recipe",
          "[run]") {
  RunConfig c;
  c.set("optimizer", "adamw");
  c.trainer.optimizer().lr(1e-3);
  c.trainer.optimizer().beta1(0.8);
  c.trainer.optimizer().beta2(0.98);
  c.trainer.optimizer().weight_decay(0.1);
  c.trainer.optimizer().flat(false);
  c.set("lr-schedule", "cosine");
  c.trainer.schedule().warmup_steps(5);
  c.trainer.schedule().min_lr_ratio(0.2);
  c.trainer.batch_size(8);
  c.trainer.epochs(2);
  c.trainer.steps_per_epoch(7);
  c.trainer.grad_accum(3);
  c.trainer.grad_clip(0.5);
  c.trainer.seed(9);
  c.device = "cpu";
  c.trainer.log_every(3);
  c.trainer.eval_every(4);
  c.trainer.eval_batches(2);
  c.trainer.out_dir("some/dir");
  c.trainer.save_every(6);
  c.trainer.keep_last(4);
  c.trainer.stop_when_solved(true);
  c.trainer.solve_loss(0.2);
  const auto o = trainer_options(c);
  CHECK(o.optimizer().kind() == train::OptimizerKind::adamw);
  CHECK(o.optimizer().lr() == 1e-3);
  CHECK(o.optimizer().beta1() == 0.8);
  CHECK(o.optimizer().beta2() == 0.98);
  CHECK(o.optimizer().weight_decay() == 0.1);
  CHECK_FALSE(o.optimizer().flat());
  CHECK(o.schedule().kind() == train::LRSchedule::cosine);
  CHECK(o.schedule().warmup_steps() == 5);
  CHECK(o.schedule().min_lr_ratio() == 0.2);
  CHECK(o.batch_size() == 8);
  CHECK(o.epochs() == 2);
  CHECK(o.steps_per_epoch() == 7);
  CHECK(o.grad_accum() == 3);
  CHECK(o.grad_clip() == 0.5);
  CHECK(o.seed() == 9);
  CHECK(o.device().is_cpu());
  CHECK(o.log_every() == 3);
  CHECK(o.eval_every() == 4);
  CHECK(o.eval_batches() == 2);
  CHECK(o.out_dir() == "some/dir");
  CHECK(o.save_every() == 6);
  CHECK(o.keep_last() == 4);
  CHECK(o.stop_when_solved());
  CHECK(o.solve_loss() == 0.2);
  CHECK(o.recipe() == to_toml(c));
  RunConfig back;
  apply_toml(back, o.recipe(), "recipe");
  CHECK(to_toml(back) == to_toml(c));
  // The defaults: Adam on the flat buffer, a constant rate.
  const auto d = trainer_options(RunConfig{});
  CHECK(d.optimizer().kind() == train::OptimizerKind::adam);
  CHECK(d.optimizer().flat());
  CHECK(d.schedule().kind() == train::LRSchedule::constant);
  c.trainer.optimizer().lr(0);
  CHECK_THAT(error_message([&] { trainer_options(c); }), Catch::Contains("lr must be a finite number > 0, got 0"));
}

TEST_CASE("make_trainer builds the config's run and refuses a task of another vocabulary, and bf16 on a CPU without bfloat16 products",
          "[run][errors][bf16]") {
  const auto dir = tinylm::test::scratch_dir("run_make_trainer");
  tinylm::test::write_file(dir / "c.txt", tinylm::test::corpus(400));
  data::PrepareOptions p;
  p.inputs = {(dir / "c.txt").string()};
  p.tokenizer = "byte";
  p.out_dir = (dir / "corpus").string();
  data::prepare(p);

  RunConfig c;
  c.task = "tokens";
  c.task_options.data(p.out_dir);
  c.device = "cpu";
  c.trainer.out_dir((dir / "run").string());
  CHECK_THAT(error_message([&] { make_trainer(c); }),
             Catch::Contains("task tokens has vocab 256 but vocab-size is 64: set vocab-size = 256"));
  c.set("vocab-size", 256);
  auto trainer = make_trainer(c);
  CHECK(trainer.model()->vocab_size() == 256);
  CHECK(trainer.model()->architecture().options == model_architecture(c).options);
  CHECK(std::isfinite(trainer.train_step()));

  c.trainer.bf16(true);
  if (!tinylm::nn::bf16_products_missing().empty()) {
    CHECK_THAT(error_message([&] { make_trainer(c); }),
               Catch::Contains("bf16 on the CPU needs bfloat16 products, and " + tinylm::nn::bf16_products_missing() +
                               ": turn bf16 off or set device to cuda"));
  } else {  // the model's products in bfloat16
    auto bf16 = make_trainer(c);
    CHECK(bf16.model()->kernel_policy()->bf16_products);
    const auto before = tinylm::nn::kernel_counts();
    CHECK(std::isfinite(bf16.train_step()));
    CHECK((tinylm::nn::kernel_counts() - before).gemm_bf16 > 0);
  }
}

TEST_CASE("config_from_checkpoint reads the stored config, skipping keys this tinylm does not know",
          "[run][checkpoint]") {
  RunConfig c;
  c.set("model", "transformer");
  c.set("n-layers", 3);
  c.trainer.optimizer().lr(1e-3);
  train::Checkpoint ck;
  ck.path = "stored.ckpt";
  ck.recipe = to_toml(c) + "\nrotary-base = 10000\n";  // a key from a later tinylm
  CHECK(to_toml(config_from_checkpoint(ck)) == to_toml(c));
  // A recipe from before recipes held their own kinds' keys only: every kind's, read.
  RunConfig tiny;
  ck.recipe = "n-layers = 2\ndropout = 0.0\npre-ln = true\ndata = \"\"\nval-fraction = 0.1\n" + to_toml(tiny);
  const RunConfig read = config_from_checkpoint(ck);
  CHECK(read.given.empty());
  CHECK(to_toml(read) == to_toml(tiny));
  ck.recipe = "lr = 0\n";  // the result is validated
  CHECK_THAT(error_message([&] { config_from_checkpoint(ck); }), Catch::Contains("lr must be a finite number > 0, got 0"));
  ck.recipe = "epochs = \"three\"\n";
  CHECK_THAT(error_message([&] { config_from_checkpoint(ck); }),
             Catch::Contains("stored.ckpt (stored config)") && Catch::Contains("'epochs' must be an integer"));
}

TEST_CASE("make_trainer's checkpoints store the run config as their recipe, and config_from_checkpoint reads it back",
          "[run][checkpoint]") {
  const auto dir = tinylm::test::scratch_dir("run_recipe_roundtrip");
  RunConfig c = one_block_config(dir);
  c.trainer.optimizer().lr(1.25e-3);
  train::Trainer trainer = make_trainer(c);
  const auto path = (dir / "a.ckpt").string();
  trainer.save(path);
  auto ck = train::read_checkpoint(path);
  CHECK(ck.recipe == to_toml(c));
  CHECK(to_toml(config_from_checkpoint(ck)) == to_toml(c));
}

TEST_CASE("the config stored in every earlier format's checkpoint evaluates and resumes it exactly",
          "[run][checkpoint][compat]") {
  // The fixtures of tests/train/checkpoint_files.h, run as `tinylm train --resume` and
  // `tinylm upgrade` run them: from the config read out of the file.
  const auto f = GENERATE(from_range(tinylm::test::checkpoint_fixtures()));
  INFO(f.file);
  auto ck = train::read_checkpoint(tinylm::test::fixture_file(f.file));
  const RunConfig stored = config_from_checkpoint(ck);
  // The core's tests build these runs by hand; the recipe says the same.
  const auto o = trainer_options(stored), by_hand = tinylm::test::fixture_trainer_options(f.file);
  CHECK(o.optimizer().kind() == by_hand.optimizer().kind());
  CHECK(o.optimizer().flat() == by_hand.optimizer().flat());
  CHECK(o.optimizer().lr() == by_hand.optimizer().lr());
  CHECK(o.optimizer().weight_decay() == by_hand.optimizer().weight_decay());
  CHECK(o.batch_size() == by_hand.batch_size());
  CHECK(o.steps_per_epoch() == by_hand.steps_per_epoch());
  CHECK(o.seed() == by_hand.seed());
  CHECK(stored.task == "repeat");

  auto model = nn::build_model(ck.architecture);
  train::load_model_state(ck, *model);
  auto task = make_task(stored);
  const auto m = train::evaluate(*model, *task, 5, stored.trainer.batch_size(), 1234, torch::kCPU);
  CHECK(m.loss == Approx(f.eval_loss).epsilon(1e-6));

  const auto dir = tinylm::test::scratch_dir(std::string("run_fixture_") + f.file);
  RunConfig c = stored;
  c.trainer.epochs(4);  // 16 steps: 4 past the checkpoint
  c.trainer.out_dir(dir.string());
  train::Trainer trainer = make_trainer(c);
  trainer.resume(ck);
  for (double expected : f.next_losses) {
    const double loss = trainer.train_step();
    INFO("step " << trainer.step());
    CHECK(loss == Approx(expected).epsilon(1e-5));
  }
  // Saving from here writes today's format, which reads back.
  trainer.save((dir / "now.ckpt").string());
  auto again = train::read_checkpoint((dir / "now.ckpt").string());
  CHECK(again.format_version == train::kCheckpointFormatVersion);
  CHECK(again.state.step == 16);
}

TEST_CASE("a checkpoint's stored config read from payload mutants is refused cleanly or whole",
          "[run][checkpoint][errors][fuzz]") {
  // tests/train/test_checkpoint.cpp's 400 mutants, taken through the run layer as
  // `tinylm train --resume` takes them: the stored config read back and its memory
  // checked, then the model built and loaded and the run resumed. The only acceptable
  // failure is a c10::Error.
  const auto dir = tinylm::test::scratch_dir("run_fuzz");
  RunConfig c = one_block_config(dir);
  c.set("optimizer", "adamw");
  c.set("dropout", 0.1);
  train::Trainer trainer = make_trainer(c);
  trainer.train_step();
  trainer.train_step();
  trainer.save((dir / "good.ckpt").string());
  const std::string good = tinylm::test::read_file(dir / "good.ckpt");
  tinylm::test::check_payload_mutants(dir, good, [&](const std::string& file) {
    auto ck = train::read_checkpoint(file);
    check_memory(config_from_checkpoint(ck), 1, /*training=*/false);
    auto model = nn::build_model(ck.architecture);
    train::load_model_state(ck, *model);
    train::Trainer resumed = make_trainer(c);
    resumed.resume(ck);
  });
}

TEST_CASE("make_trainer's run leaves the global seed and thread counts alone, whatever its threads setting",
          "[run][library]") {
  tinylm::test::check_leaves_global_state([] {
    const auto dir = tinylm::test::scratch_dir("run_global");
    RunConfig c = one_block_config(dir);
    c.set("dropout", 0.1);  // dropout draws random numbers every step
    c.trainer.epochs(1);
    c.trainer.steps_per_epoch(4);
    c.trainer.log_every(100);
    c.trainer.eval_batches(1);
    c.threads = 2;  // the config's setting is the application's to apply, not the Trainer's
    train::Trainer t = make_trainer(c);
    t.fit();
    t.validation_metrics();
    t.save(c.trainer.out_dir() + "/again.ckpt");
  });
}
