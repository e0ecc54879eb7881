// src/train/run_directory.cpp: one run per directory, and nothing in it lost.
#include "../test_util.h"
#include "core_runs.h"

#include <tinylm/error.h>
#include <tinylm/train/checkpoint.h>
#include <tinylm/train/run_directory.h>
#include <tinylm/train/trainer.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <optional>
#include <string>

using namespace tinylm;
using namespace tinylm::train;
using tinylm::test::error_message;

namespace fs = std::filesystem;

namespace {

fs::path run_dir_scratch(const std::string& name) { return tinylm::test::scratch_dir("safety_" + name); }

/// Every file in `dir` with its bytes.
std::map<std::string, std::string> run_dir_snapshot(const fs::path& dir) {
  std::map<std::string, std::string> files;
  for (const auto& e : fs::directory_iterator(dir)) files[e.path().filename().string()] = tinylm::test::read_file(e.path());
  return files;
}

/// A short run (4 steps an epoch) writing into `dir`.
tinylm::test::CoreRun run_dir_config(const fs::path& dir) {
  tinylm::test::CoreRun c;
  c.trainer.out_dir(dir.string());
  c.trainer.steps_per_epoch(4);
  c.trainer.log_every(1000);
  c.trainer.eval_batches(1);
  return c;
}

}  // namespace

TEST_CASE("a run directory holding another run is refused and left byte-identical",
          "[run][errors]") {
  const auto dir = run_dir_scratch("taken");
  tinylm::test::make_core_trainer(run_dir_config(dir)).fit();
  const auto before = run_dir_snapshot(dir);
  REQUIRE(before.count("metrics.jsonl") == 1);
  CHECK_THAT(error_message([&] { tinylm::test::make_core_trainer(run_dir_config(dir)).fit(); }),
             Catch::Contains("already holds a run") && Catch::Contains("newest step-00000012.ckpt"));
  CHECK(run_dir_snapshot(dir) == before);
  CHECK_THAT(error_message([&] { RunDirectory(dir.string(), RunDirMode::fresh); }),
             Catch::Contains("already holds a run"));
  CHECK(run_dir_snapshot(dir) == before);
  // A program tells this refusal from others by its kind, not its text.
  std::optional<tinylm::ErrorKind> kind;
  try {
    RunDirectory(dir.string(), RunDirMode::fresh);
  } catch (const tinylm::Error& e) {
    kind = e.kind();
  }
  CHECK(kind == tinylm::ErrorKind::run_directory_taken);
  // Another refusal of the same constructor is not of that kind.
  std::ofstream(dir / "not-a-dir");
  try {
    RunDirectory((dir / "not-a-dir").string(), RunDirMode::fresh);
    FAIL("a file given as out-dir was accepted");
  } catch (const tinylm::Error& e) {
    FAIL("a file given as out-dir was reported as an error of a kind: " << e.what_without_backtrace());
  } catch (const c10::Error&) {
  }
}

TEST_CASE("a second claim on a run directory fails at once, naming the holder's pid",
          "[run][errors]") {
  const auto dir = run_dir_scratch("locked");
  RunDirectory first((dir / "run").string(), RunDirMode::fresh);
  CHECK_THAT(error_message([&] { RunDirectory((dir / "run").string(), RunDirMode::fresh); }),
             Catch::Contains("is in use by another training process (pid " + std::to_string(::getpid()) + ")"));
  CHECK_THAT(error_message([&] { RunDirectory((dir / "run").string(), RunDirMode::resume, 10); }),
             Catch::Contains("is in use"));
}

TEST_CASE("resuming never overwrites checkpoints past the resumed step", "[run][errors]") {
  const auto dir = run_dir_scratch("later");
  std::ofstream(dir / "step-00000020.ckpt") << "x";
  std::ofstream(dir / "step-00000010.ckpt") << "y";
  CHECK_THAT(error_message([&] { RunDirectory(dir.string(), RunDirMode::resume, 10); }),
             Catch::Contains("holds step-00000020.ckpt, past the step 10 being resumed"));
  RunDirectory ok(dir.string(), RunDirMode::resume, 20);
  CHECK(fs::exists(dir / "step-00000020.ckpt"));
}

TEST_CASE("overwrite removes the earlier run's files only", "[run]") {
  const auto dir = run_dir_scratch("overwrite");
  for (const char* name : {"step-00000004.ckpt", "best.ckpt", "metrics.jsonl", "notes.txt"})
    std::ofstream(dir / name) << name;
  RunDirectory claim(dir.string(), RunDirMode::overwrite);
  CHECK(RunDirectory::run_files(dir.string()).empty());
  CHECK(fs::exists(dir / "notes.txt"));  // not tinylm's: untouched
}

TEST_CASE("partial checkpoints of a killed run are removed when the directory is claimed",
          "[run]") {
  const auto dir = run_dir_scratch("partial");
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
  const auto dir = run_dir_scratch("unusable");
  std::ofstream(dir / "a-file") << "x";
  CHECK_THAT(error_message([&] { RunDirectory((dir / "a-file").string(), RunDirMode::fresh); }),
             Catch::Contains("exists and is not a directory"));
  CHECK_THAT(error_message([&] { RunDirectory((dir / "a-file" / "sub").string(), RunDirMode::fresh); }),
             Catch::Contains("cannot create out-dir"));
  CHECK_THAT(error_message([&] { RunDirectory((dir / std::string(300, 'x')).string(), RunDirMode::fresh); }),
             Catch::Contains("File name too long"));
}

TEST_CASE("step checkpoints have one naming rule, and the newest is the highest step", "[run]") {
  CHECK(RunDirectory::step_checkpoint_name(360) == "step-00000360.ckpt");
  CHECK(RunDirectory::step_checkpoint_name(123456789) == "step-123456789.ckpt");
  for (int64_t step : {int64_t{0}, int64_t{7}, int64_t{360}, int64_t{99999999}, int64_t{100000000}, int64_t{123456789012}})
    CHECK(RunDirectory::step_of_checkpoint_name(RunDirectory::step_checkpoint_name(step)) == step);
  CHECK(RunDirectory::step_of_checkpoint_name("step-12x.ckpt") == -1);
  CHECK(RunDirectory::step_of_checkpoint_name("best.ckpt") == -1);
  // Past 10^8 steps the names grow a digit: ordered by step, not by text.
  const auto dir = run_dir_scratch("naming");
  for (int64_t step : {int64_t{99999999}, int64_t{100000000}, int64_t{5}})
    std::ofstream(dir / RunDirectory::step_checkpoint_name(step)) << "x";
  std::ofstream(dir / "step-notes.ckpt") << "x";  // not a step checkpoint
  const auto steps = RunDirectory::step_checkpoints(dir.string());
  REQUIRE(steps.size() == 3);
  CHECK(std::filesystem::path(steps.front()).filename() == "step-00000005.ckpt");
  CHECK(std::filesystem::path(steps.back()).filename() == "step-100000000.ckpt");
  CHECK(std::filesystem::path(resolve_checkpoint_path(dir.string())).filename() == "step-100000000.ckpt");
}
