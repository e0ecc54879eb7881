// src/train/checkpoint.cpp: round trips, earlier formats, and damaged files refused.
#include "../test_util.h"

#include "checkpoint_files.h"
#include "core_runs.h"

#include <tinylm/data/task_kind.h>
#include <tinylm/data/tokenizer.h>
#include <tinylm/nn/model.h>
#include <tinylm/train/checkpoint.h>
#include <tinylm/train/resources.h>
#include <tinylm/train/trainer.h>

#include <nlohmann/json.hpp>
#include <sys/stat.h>

#include <array>
#include <regex>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <functional>
#include <random>

using namespace tinylm;
using namespace tinylm::train;
using tinylm::test::CoreRun;
using tinylm::test::error_message;
using tinylm::test::index_length;
using tinylm::test::make_core_trainer;
using tinylm::test::read_file;
using tinylm::test::scratch_dir;
using tinylm::test::write_file;
using tinylm::test::with_header;

namespace fs = std::filesystem;

namespace {

fs::path scratch(const std::string& name) { return tinylm::test::scratch_dir("ckpt_" + name); }

/// A transformer of one block, width 16, 2 heads, on the repeat task, written to `dir`.
/// `dropout` is the stored option's (the embeddings' and both residual branches').
CoreRun one_block_run(const std::filesystem::path& dir, const std::string& dropout = "0") {
  CoreRun c;
  c.model = nn::architecture_of(tinylm::test::with(nn::TransformerLMOptions(64, 12, 16, 2, 1), {{"dropout", dropout}}));
  c.trainer.out_dir(dir.string());
  return c;
}

}  // namespace

TEST_CASE("a checkpoint round-trips recipe, weights, optimizer and state", "[checkpoint]") {
  // The recipe is the caller's text, stored as given (the run layer's, a run config as
  // TOML, is read back in tests/test_run.cpp).
  const auto dir = scratch("roundtrip");
  CoreRun c = one_block_run(dir);
  c.trainer.optimizer().lr(1.25e-3);
  c.trainer.recipe("lr = 1.25e-3\n# and a note\n");
  Trainer trainer = make_core_trainer(c);
  const auto path = (dir / "a.ckpt").string();
  trainer.save(path);
  auto ck = read_checkpoint(path);
  CHECK(ck.format_version == kCheckpointFormatVersion);
  CHECK(ck.recipe == c.trainer.recipe());
  CHECK(ck.architecture.kind == "transformer");
  CHECK(ck.architecture.options.at("d_model") == "16");
  CHECK(ck.state.step == 0);
  CHECK(ck.state.data_rng_state.defined());
  CHECK(ck.optimizer_kind == "flat-adam");
  auto model = nn::build_model(ck.architecture);
  load_model_state(ck, *model);
  auto a = trainer.model()->named_parameters(), b = model->named_parameters();
  for (const auto& p : a) CHECK(torch::equal(p.value(), b[p.key()]));
  // Nothing but the checkpoint is left in the directory: no temporary files.
  int files = 0;
  for (const auto& e : fs::directory_iterator(dir)) files += e.is_regular_file();
  CHECK(files == 1);
}

TEST_CASE("bad checkpoints are refused with the file and the problem", "[checkpoint][errors]") {
  const auto dir = scratch("bad");
  Trainer trainer = make_core_trainer(one_block_run(dir));
  const auto good = dir / "good.ckpt";
  trainer.save(good.string());
  const std::string bytes = read_file(good);

  SECTION("missing") {
    CHECK_THAT(error_message([&] { read_checkpoint((dir / "none.ckpt").string()); }),
               Catch::Contains("does not exist"));
  }
  SECTION("foreign") {
    write_file(dir / "f.ckpt", "PK\x03\x04 not ours");
    CHECK_THAT(error_message([&] { read_checkpoint((dir / "f.ckpt").string()); }),
               Catch::Contains("is not a tinylm checkpoint"));
  }
  SECTION("a bare LibTorch archive is foreign too") {
    torch::save(trainer.model()->parameters(), (dir / "t.pt").string());
    CHECK_THAT(error_message([&] { read_checkpoint((dir / "t.pt").string()); }),
               Catch::Contains("is not a tinylm checkpoint"));
  }
  SECTION("truncated") {
    write_file(dir / "t.ckpt", bytes.substr(0, bytes.size() / 2));
    CHECK_THAT(error_message([&] { read_checkpoint((dir / "t.ckpt").string()); }),
               Catch::Contains("is truncated: its header promises"));
    write_file(dir / "h.ckpt", bytes.substr(0, 20));
    CHECK_THAT(error_message([&] { read_checkpoint((dir / "h.ckpt").string()); }),
               Catch::Contains("shorter than its 32-byte header"));
  }
  SECTION("corrupt") {
    std::string flipped = bytes;
    flipped[flipped.size() / 2] ^= 0x40;
    write_file(dir / "c.ckpt", flipped);
    CHECK_THAT(error_message([&] { read_checkpoint((dir / "c.ckpt").string()); }),
               Catch::Contains("is corrupt: its checksum does not match"));
  }
  SECTION("newer format") {
    std::string newer = bytes;
    newer[8] = static_cast<char>(kCheckpointFormatVersion + 1);
    write_file(dir / "n.ckpt", newer);
    CHECK_THAT(error_message([&] { read_checkpoint((dir / "n.ckpt").string()); }),
               Catch::Contains("upgrade tinylm to read it"));
  }
  SECTION("a model it does not fit") {
    auto ck = read_checkpoint(good.string());
    auto model = nn::build_model(nn::architecture_of(nn::TransformerLMOptions(64, 12, 32, 2, 1)));  // wider
    CHECK_THAT(error_message([&] { load_model_state(ck, *model); }),
               Catch::Contains("does not fit the model: 'token_embedding.weight' has shape [64, 16] "
                               "in the checkpoint but [64, 32] in the model"));
    auto model2 = nn::build_model(nn::architecture_of(nn::TransformerLMOptions(64, 12, 16, 2, 2)));  // deeper
    CHECK_THAT(error_message([&] { load_model_state(ck, *model2); }),
               Catch::Contains("does not fit the model: it holds parameter"));
    auto model3 = nn::build_model(tinylm::test::reference_model());  // other parameter names entirely
    CHECK_THAT(error_message([&] { load_model_state(ck, *model3); }),
               Catch::Contains("does not fit the model"));
  }
}

TEST_CASE("resolve_checkpoint_path picks the newest step in a run directory", "[checkpoint]") {
  const auto dir = scratch("resolve");
  for (const char* name : {"step-00000010.ckpt", "step-00000200.ckpt", "step-00000030.ckpt", "best.ckpt"})
    write_file(dir / name, "x");
  CHECK(fs::path(resolve_checkpoint_path(dir.string())).filename() == "step-00000200.ckpt");
  CHECK(resolve_checkpoint_path("file.ckpt") == "file.ckpt");
  fs::remove_all(dir);
  fs::create_directories(dir);
  CHECK_THAT(error_message([&] { resolve_checkpoint_path(dir.string()); }),
             Catch::Contains("holds no step-*.ckpt checkpoint"));
}

TEST_CASE("a checkpoint carries its tokenizer") {
  const auto dir = scratch_dir("checkpoint_tokenizer");
  auto model = nn::build_model(nn::architecture_of(nn::TinyAttentionLMOptions(256, 8, 16, 2)));
  train::TrainingState state;
  const auto with = (dir / "with.ckpt").string(), without = (dir / "without.ckpt").string();
  train::save_checkpoint(with, *model, nullptr, state, "", data::byte_tokenizer().get());
  train::save_checkpoint(without, *model, nullptr, state, "");
  auto tok = train::checkpoint_tokenizer(train::read_checkpoint(with));
  REQUIRE(tok);
  CHECK(tok->kind() == "byte");
  CHECK(tok->decode(tok->encode("abc")) == "abc");
  CHECK_FALSE(train::checkpoint_tokenizer(train::read_checkpoint(without)));
}

// ---- earlier formats: the fixtures (listed in checkpoint_files.h) ----------------------

TEST_CASE("checkpoints of every earlier format still load, evaluate and resume exactly",
          "[checkpoint][compat]") {
  // Each run is built as the fixture's recipe describes it, from the core's own types; the
  // run layer's reading of those recipes is checked in tests/test_run.cpp.
  const auto f = GENERATE(from_range(tinylm::test::checkpoint_fixtures()));
  INFO(f.file);
  const std::string path = tinylm::test::fixture_file(f.file);
  CHECK(checkpoint_format_version(path) == f.format);
  auto ck = read_checkpoint(path);
  CHECK(ck.format_version == f.format);
  CHECK(ck.state.step == 12);

  auto model = nn::build_model(ck.architecture);
  load_model_state(ck, *model);
  CoreRun c;
  c.model = ck.architecture;
  c.trainer = tinylm::test::fixture_trainer_options(f.file);
  auto task = data::make_task(c.task, c.task_options);
  const auto m = evaluate(*model, *task, 5, c.trainer.batch_size(), 1234, torch::kCPU);
  CHECK(m.loss == Approx(f.eval_loss).epsilon(1e-6));

  const auto dir = scratch(std::string("fixture_") + f.file);
  c.trainer.epochs(4);  // 16 steps: 4 past the checkpoint
  c.trainer.out_dir(dir.string());
  Trainer trainer = make_core_trainer(c);
  trainer.resume(ck);
  for (double expected : f.next_losses) {
    const double loss = trainer.train_step();
    INFO("step " << trainer.step());
    CHECK(loss == Approx(expected).epsilon(1e-5));
  }
  // Saving from here writes today's format, which reads back.
  trainer.save((dir / "now.ckpt").string());
  auto again = read_checkpoint((dir / "now.ckpt").string());
  CHECK(again.format_version == kCheckpointFormatVersion);
  CHECK(again.state.step == 16);
}

// ---- untrusted files -------------------------------------------------------------------

namespace {

/// `good` with its JSON index rewritten by `edit` (header, lengths and CRC recomputed).
std::string with_index(const std::string& good, const std::function<void(nlohmann::json&)>& edit) {
  const std::string payload = good.substr(32);
  const uint64_t n = index_length(payload);
  auto index = nlohmann::json::parse(payload.substr(8, n));
  const std::string data = payload.substr(8 + n);
  edit(index);
  std::string json = index.dump();
  json.append((8 - json.size() % 8) % 8, ' ');
  std::string rebuilt(8, '\0');
  for (int i = 0; i < 8; ++i) rebuilt[i] = static_cast<char>((json.size() >> (8 * i)) & 0xFF);
  return with_header(good, rebuilt + json + data);
}

}  // namespace

TEST_CASE("a format-2 file's model is read from its recipe with the defaults of its time",
          "[checkpoint][compat]") {
  // Formats 1 and 2 stored only the run config; the core reads the model out of it by
  // itself (src/train/legacy_recipe.cpp), not through the run layer's config.
  const auto dir = scratch("legacy_recipe");
  const std::string good = read_file(tinylm::test::fixture_file("v2-transformer-adamw-step12.ckpt"));
  auto with_recipe = [&](const char* name, const std::function<std::string(const std::string&)>& edit) {
    write_file(dir / name, with_index(good, [&](nlohmann::json& index) {
                 auto& recipe = index["__metadata__"]["config"];
                 recipe = edit(recipe.get<std::string>());
               }));
    return (dir / name).string();
  };
  const auto original = read_checkpoint(tinylm::test::fixture_file("v2-transformer-adamw-step12.ckpt"));
  // Keys that are not the model's, known today or not, change nothing.
  const auto extra = read_checkpoint(with_recipe("extra.ckpt", [](const std::string& r) {
    return r + "\nrotary-base = 500000\nretired-option = true\n";
  }));
  CHECK(extra.architecture.options == original.architecture.options);
  // A model key of the wrong type: one line naming it.
  const std::string path = with_recipe("typed.ckpt", [](const std::string& r) {
    return std::regex_replace(r, std::regex("n-layers = [0-9]+"), "n-layers = \"two\"");
  });
  const std::string message = error_message([&] { read_checkpoint(path); });
  CHECK_THAT(message, Catch::Contains("is damaged: its stored config's 'n-layers' is string where an integer belongs"));
  CHECK(message.find('\n') == std::string::npos);
}

TEST_CASE("a damaged architecture or metadata is refused before any model is built",
          "[checkpoint][errors]") {
  const auto dir = scratch("damaged_architecture");
  Trainer trainer = make_core_trainer(one_block_run(dir));
  trainer.save((dir / "good.ckpt").string());
  const std::string good = read_file(dir / "good.ckpt");
  auto refused = [&](const char* name, const std::function<void(nlohmann::json&)>& edit) {
    write_file(dir / name, with_index(good, edit));
    const std::string message = error_message([&] { read_checkpoint((dir / name).string()); });
    CHECK_THAT(message, !Catch::Contains("Exception raised from"));  // no backtrace inside
    CHECK(message.find('\n') == std::string::npos);
    return message;
  };
  auto set_option = [](const char* key, const char* value) {
    return [=](nlohmann::json& index) {
      auto model = nlohmann::json::parse(index["__metadata__"]["model"].get<std::string>());
      model["options"][key] = value;
      index["__metadata__"]["model"] = model.dump();
    };
  };
  // Sizes that would allocate terabytes: refused by the count, before anything is built.
  for (const char* key : {"n_layers", "vocab_size", "d_model", "context_length"}) {
    INFO(key);
    CHECK_THAT(refused("big.ckpt", set_option(key, "40000000")),
               Catch::Contains("is damaged: the transformer model it describes (") &&
                   Catch::Contains(std::string(key) + " 40000000") && Catch::Contains("weights"));
  }
  CHECK_THAT(refused("mlp.ckpt", set_option("mlp_expansion", "5")), Catch::Contains("mlp_expansion 5"));
  // Metadata missing, or JSON of the wrong type.
  CHECK_THAT(refused("no-state.ckpt", [](nlohmann::json& i) { i["__metadata__"].erase("state"); }),
             Catch::Contains("has no 'state' entry"));
  CHECK_THAT(refused("state-array.ckpt", [](nlohmann::json& i) { i["__metadata__"]["state"] = "[1, 2]"; }),
             Catch::Contains("is damaged: its training state ('state') is a JSON array where an object belongs"));
  CHECK_THAT(refused("model-string.ckpt", [](nlohmann::json& i) { i["__metadata__"]["model"] = "\"tiny\""; }),
             Catch::Contains("its model architecture ('model') is a JSON string where an object belongs"));
  CHECK_THAT(refused("model-bad.ckpt", [](nlohmann::json& i) { i["__metadata__"]["model"] = "{\"kind\": 3}"; }),
             Catch::Contains("its model architecture is unreadable"));
  CHECK_THAT(refused("step-text.ckpt", [](nlohmann::json& i) { i["__metadata__"]["state"] = "{\"step\": \"x\"}"; }),
             Catch::Contains("its training state is unreadable"));
  // The parameter count is exact for every option that changes it (checked against
  // built models in test_model.cpp): the file itself still loads.
  CHECK(read_checkpoint((dir / "good.ckpt").string()).state.step == 0);
}

TEST_CASE("a checkpoint from a later tinylm with keys this one does not know still loads",
          "[checkpoint][compat]") {
  // A later version may add metadata, training-state fields, tensors and model options:
  // each is skipped with a warning, and the rest loads, evaluates and resumes.
  const auto dir = scratch("future");
  CoreRun c = one_block_run(dir);
  c.trainer.epochs(1);
  c.trainer.steps_per_epoch(4);
  Trainer trainer = make_core_trainer(c);
  trainer.train_step();
  trainer.save((dir / "now.ckpt").string());
  const std::string good = read_file(dir / "now.ckpt");
  const std::string payload = good.substr(32);
  const uint64_t n = index_length(payload);
  auto index = nlohmann::json::parse(payload.substr(8, n));
  std::string data = payload.substr(8 + n);
  auto& meta = index["__metadata__"];
  meta["sharding"] = "{\"rank\": 0}";
  auto state = nlohmann::json::parse(meta["state"].get<std::string>());
  state["tokens_seen"] = 1234;
  meta["state"] = state.dump();
  auto model = nlohmann::json::parse(meta["model"].get<std::string>());
  model["options"]["rotary_base"] = "10000";
  meta["model"] = model.dump();
  index["ema.token_embedding.weight"] = {{"dtype", "F32"}, {"shape", {2}},
                                         {"data_offsets", {data.size(), data.size() + 8}}};
  data += std::string(8, '\0');
  std::string json = index.dump();
  json.append((8 - json.size() % 8) % 8, ' ');
  std::string rebuilt(8, '\0');
  for (int i = 0; i < 8; ++i) rebuilt[i] = static_cast<char>((json.size() >> (8 * i)) & 0xFF);
  rebuilt += json + data;
  write_file(dir / "future.ckpt", with_header(good, rebuilt));

  auto ck = read_checkpoint((dir / "future.ckpt").string());
  CHECK(ck.state.step == 1);
  CHECK(ck.architecture.options.count("rotary_base") == 1);
  auto rebuilt_model = nn::build_model(ck.architecture);
  load_model_state(ck, *rebuilt_model);
  Trainer resumed = make_core_trainer(c);
  resumed.resume(ck);
  CHECK(std::isfinite(resumed.train_step()));
  CHECK(resumed.step() == 2);
}

TEST_CASE("payload mutants with a valid checksum are refused cleanly or load whole",
          "[checkpoint][errors][fuzz]") {
  // 400 mutants of a real checkpoint: bit flips, byte overwrites, truncations and
  // insertions, half of them aimed at the JSON index. Each is read, checked for fit and
  // resumed; the only acceptable failure is a c10::Error (any other exception, a crash or
  // a sanitizer report fails the suite). The run layer's part of `tinylm train --resume`
  // (the stored config read back, its memory checked) meets the same mutants in
  // tests/test_run.cpp.
  const auto dir = scratch("fuzz");
  CoreRun c = one_block_run(dir, "0.1");
  c.trainer.optimizer().kind(OptimizerKind::adamw);
  Trainer trainer = make_core_trainer(c);
  trainer.train_step();
  trainer.train_step();
  trainer.save((dir / "good.ckpt").string());
  const std::string good = read_file(dir / "good.ckpt");
  tinylm::test::check_payload_mutants(dir, good, [&](const std::string& file) {
    auto ck = read_checkpoint(file);
    auto model = nn::build_model(ck.architecture);
    load_model_state(ck, *model);
    Trainer resumed = make_core_trainer(c);
    resumed.resume(ck);
  });
}

TEST_CASE("non-finite weights or optimizer state are never checkpointed", "[checkpoint][errors]") {
  const auto dir = scratch("nonfinite");
  Trainer trainer = make_core_trainer(one_block_run(dir));
  trainer.train_step();
  {
    torch::NoGradGuard no_grad;
    trainer.model()->named_parameters()["blocks.0.ln1.weight"][3] = std::nan("");
  }
  const auto path = (dir / "bad.ckpt").string();
  CHECK_THAT(error_message([&] { trainer.save(path); }),
             Catch::Contains("not writing checkpoint") && Catch::Contains("'blocks.0.ln1.weight' holds NaN"));
  CHECK_FALSE(fs::exists(path));
  CHECK(fs::is_empty(dir));  // no temporary file either
}

TEST_CASE("a checkpoint holding NaN weights is refused when loaded", "[checkpoint][errors]") {
  const auto dir = scratch("nanload");
  Trainer trainer = make_core_trainer(one_block_run(dir));
  trainer.save((dir / "good.ckpt").string());
  auto ck = read_checkpoint((dir / "good.ckpt").string());
  ck.model["ln_f.bias"][0] = std::numeric_limits<float>::infinity();
  auto model = nn::build_model(ck.architecture);
  CHECK_THAT(error_message([&] { load_model_state(ck, *model); }),
             Catch::Contains("holds NaN or infinite weights in 'ln_f.bias'"));
}

TEST_CASE("only regular files are read as checkpoints", "[checkpoint][errors]") {
  const auto dir = scratch("kinds");
  const auto fifo = dir / "pipe.ckpt";
  REQUIRE(::mkfifo(fifo.c_str(), 0644) == 0);
  CHECK_THAT(error_message([&] { read_checkpoint(fifo.string()); }),
             Catch::Contains("is a FIFO (named pipe), not a regular file"));
  CHECK_THAT(error_message([&] { read_checkpoint("/dev/zero"); }),
             Catch::Contains("is a character device, not a regular file"));
  CHECK_THAT(error_message([&] { read_checkpoint(dir.string()); }),
             Catch::Contains("is a directory, not a regular file"));
}
