// Nothing lost, nothing hangs: run directories, resource checks, bad numbers.
#include "../test_util.h"

#include <tinylm/run.h>
#include <tinylm/config.h>
#include <tinylm/generate.h>
#include <tinylm/threads.h>
#include <tinylm/train/resources.h>
#include <tinylm/train/run_directory.h>
#include <tinylm/train/trainer.h>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <thread>

using namespace tinylm;
using namespace tinylm::train;
using tinylm::test::error_message;

namespace fs = std::filesystem;

namespace {

fs::path scratch(const std::string& name) { return tinylm::test::scratch_dir("safety_" + name); }

/// Every file in `dir` with its bytes.
std::map<std::string, std::string> snapshot(const fs::path& dir) {
  std::map<std::string, std::string> files;
  for (const auto& e : fs::directory_iterator(dir)) {
    std::ifstream in(e.path(), std::ios::binary);
    files[e.path().filename().string()] = {std::istreambuf_iterator<char>(in), {}};
  }
  return files;
}

RunConfig short_run(const fs::path& dir) {
  RunConfig c;
  c.out_dir = dir.string();
  c.steps_per_epoch = 4;
  c.log_every = 1000;
  c.eval_batches = 1;
  return c;
}

}  // namespace

TEST_CASE("a run directory holding another run is refused and left byte-identical",
          "[run][errors]") {
  const auto dir = scratch("taken");
  make_trainer(short_run(dir)).fit();
  const auto before = snapshot(dir);
  REQUIRE(before.count("metrics.jsonl") == 1);
  CHECK_THAT(error_message([&] { make_trainer(short_run(dir)).fit(); }),
             Catch::Contains("already holds a run") && Catch::Contains("newest step-00000012.ckpt"));
  CHECK(snapshot(dir) == before);
  CHECK_THAT(error_message([&] { RunDirectory(dir.string(), RunDirMode::fresh); }),
             Catch::Contains("already holds a run"));
  CHECK(snapshot(dir) == before);
}

TEST_CASE("a second claim on a run directory fails at once, naming the holder's pid",
          "[run][errors]") {
  const auto dir = scratch("locked");
  RunDirectory first((dir / "run").string(), RunDirMode::fresh);
  CHECK_THAT(error_message([&] { RunDirectory((dir / "run").string(), RunDirMode::fresh); }),
             Catch::Contains("is in use by another training process (pid " + std::to_string(::getpid()) + ")"));
  CHECK_THAT(error_message([&] { RunDirectory((dir / "run").string(), RunDirMode::resume, 10); }),
             Catch::Contains("is in use"));
}

TEST_CASE("resuming never overwrites checkpoints past the resumed step", "[run][errors]") {
  const auto dir = scratch("later");
  std::ofstream(dir / "step-00000020.ckpt") << "x";
  std::ofstream(dir / "step-00000010.ckpt") << "y";
  CHECK_THAT(error_message([&] { RunDirectory(dir.string(), RunDirMode::resume, 10); }),
             Catch::Contains("holds step-00000020.ckpt, past the step 10 being resumed"));
  RunDirectory ok(dir.string(), RunDirMode::resume, 20);
  CHECK(fs::exists(dir / "step-00000020.ckpt"));
}

TEST_CASE("overwrite removes the earlier run's files only", "[run]") {
  const auto dir = scratch("overwrite");
  for (const char* name : {"step-00000004.ckpt", "best.ckpt", "metrics.jsonl", "notes.txt"})
    std::ofstream(dir / name) << name;
  RunDirectory claim(dir.string(), RunDirMode::overwrite);
  CHECK(RunDirectory::run_files(dir.string()).empty());
  CHECK(fs::exists(dir / "notes.txt"));  // not tinylm's: untouched
}

TEST_CASE("partial checkpoints of a killed run are removed when the directory is claimed",
          "[run]") {
  const auto dir = scratch("partial");
  std::ofstream(dir / "step-00000008.ckpt") << "kept";
  std::ofstream(dir / "step-00000012.ckpt.tmp.4242") << "half";
  std::ofstream(dir / "best.ckpt.tmp.17") << "half";
  std::ofstream(dir / "notes.tmp.1") << "not ours";
  RunDirectory claim(dir.string(), RunDirMode::resume, 8);
  CHECK_FALSE(fs::exists(dir / "step-00000012.ckpt.tmp.4242"));
  CHECK_FALSE(fs::exists(dir / "best.ckpt.tmp.17"));
  CHECK(fs::exists(dir / "step-00000008.ckpt"));
  CHECK(fs::exists(dir / "notes.tmp.1"));
}

TEST_CASE("out-dirs that cannot be used are refused before anything is written",
          "[run][errors]") {
  const auto dir = scratch("unusable");
  std::ofstream(dir / "a-file") << "x";
  CHECK_THAT(error_message([&] { RunDirectory((dir / "a-file").string(), RunDirMode::fresh); }),
             Catch::Contains("exists and is not a directory"));
  CHECK_THAT(error_message([&] { RunDirectory((dir / "a-file" / "sub").string(), RunDirMode::fresh); }),
             Catch::Contains("cannot create out-dir"));
  CHECK_THAT(error_message([&] { RunDirectory((dir / std::string(300, 'x')).string(), RunDirMode::fresh); }),
             Catch::Contains("File name too long"));
}

TEST_CASE("memory estimates refuse sizes that cannot fit, naming the setting", "[resources][errors]") {
  const RunConfig reference;
  const auto m = estimate_memory(reference, reference.batch_size, /*training=*/true);
  CHECK(m.parameters == 8384);  // the reference model's own count
  CHECK(m.total() < 64e6);
  check_memory(reference, reference.batch_size, true);  // the reference run fits anywhere

  if (available_memory_bytes() == 0) return;  // nothing to compare against here
  struct Case {
    const char* key;
    RunConfig config;
  };
  RunConfig batch = reference, seq = reference, ctx = reference, layers = reference, vocab = reference;
  batch.batch_size = 1000000000;
  seq.seq_len = 1000000000;
  ctx.context_length = 1000000000;
  layers.model = "transformer";
  layers.n_layers = 1000000000;
  vocab.vocab_size = 1000000000000;
  for (const auto& [key, config] : {Case{"batch-size 1000000000", batch}, Case{"seq-len 1000000000", seq},
                                    Case{"context-length 1000000000", ctx},
                                    Case{"n-layers 1000000000", layers},
                                    Case{"vocab-size 1000000000000", vocab}}) {
    INFO(key);
    CHECK_THAT(error_message([&] { check_memory(config, config.batch_size, true); }),
               Catch::StartsWith(key) && Catch::Contains("is available: lower"));
    CHECK_THAT(error_message([&] { Trainer trainer = make_trainer(config); }), Catch::StartsWith(key));
  }
  // Evaluation with a huge batch: the batch is named.
  CHECK_THAT(error_message([&] { check_memory(reference, 1000000000, false); }),
             Catch::StartsWith("batch-size 1000000000"));
}

TEST_CASE("thread counts beyond the machine's CPUs are refused", "[resources][errors]") {
  CHECK_THAT(error_message([] { set_cpu_threads(100000); }),
             Catch::Contains("threads 100000 is more than the"));
}

TEST_CASE("settings whose products overflow or that are not finite are refused", "[config][errors]") {
  RunConfig c;
  c.epochs = 4611686018427387904;  // 2^62
  c.steps_per_epoch = 4;
  CHECK_THAT(error_message([&] { validate(c); }), Catch::Contains("overflows the step counter"));
  c = RunConfig{};
  c.grad_accum = 1000000000000000000;
  CHECK_THAT(error_message([&] { validate(c); }), Catch::Contains("overflows the token counter"));
  c = RunConfig{};
  c.weight_decay = INFINITY;
  CHECK_THAT(error_message([&] { validate(c); }), Catch::Contains("weight-decay must be a finite number"));
  c = RunConfig{};
  c.grad_clip = NAN;
  CHECK_THAT(error_message([&] { validate(c); }), Catch::Contains("grad-clip must be a finite number"));
}

TEST_CASE("config keys with control characters are shown escaped on one line", "[config][errors]") {
  RunConfig c;
  const std::string msg = error_message([&] { apply_toml(c, "\"a\\nb\\u001b[31m\" = 1\n", "x.toml"); });
  CHECK_THAT(msg, Catch::Contains("unknown key 'a\\x0Ab\\x1B[31m'"));
  CHECK(msg.find('\n') == std::string::npos);
  CHECK(msg.find('\x1b') == std::string::npos);
}

TEST_CASE("a tiny temperature samples the most likely token instead of failing", "[generate]") {
  auto logits = torch::tensor({{1.0f, 3.0f, 2.0f, -50.0f}});
  GenerateOptions o;
  o.temperature = 1e-300;  // valid (> 0), below float's smallest number
  auto p = sampling_probabilities(logits, o);
  CHECK_FALSE(torch::isnan(p).any().item<bool>());
  CHECK(p[0][1].item<float>() == 1.0f);
  CHECK(p.sum().item<float>() == Approx(1.0f));
}
