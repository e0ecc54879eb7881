// What the subcommands of the tinylm tool share. Each lives in apps/commands/NAME.cpp:
// add_NAME() adds it to the command line, its options bound to state of its own, and
// returns what runs it once the line is parsed; apps/main.cpp lists them. To add one:
// write commands/NAME.cpp with add_NAME, declare it here, add it to main.cpp's list and
// to apps/CMakeLists.txt.
#pragma once

#include <tinylm/run.h>
#include <tinylm/train/checkpoint.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <functional>
#include <string>
#include <vector>

namespace tinylm::cli {

struct Command {
  CLI::App* app = nullptr;   // the subcommand: chosen when *app is true after parsing
  std::function<int()> run;  // what it does; the exit status
};

/// The command line as given, argv[0] included: what `train --nproc` starts again.
using Invocation = std::vector<std::string>;

Command add_train(CLI::App& app, const Invocation& invocation);
Command add_eval(CLI::App& app);
Command add_sample(CLI::App& app);
Command add_inspect(CLI::App& app);
Command add_upgrade(CLI::App& app);
Command add_prepare(CLI::App& app);
Command add_export(CLI::App& app);
Command add_import(CLI::App& app);
Command add_serve(CLI::App& app);
Command add_bench(CLI::App& app);
Command add_bench_worker(CLI::App& app);  // hidden: started by bench

/// An integer option that also takes exact decimal notation ("1e9", "64.0"), as people
/// write sizes; anything else is left for CLI11 to refuse.
CLI::Option* integer(CLI::Option* option);

/// The checkpoint a command names (a file, or a run directory's newest). Format 1 is
/// refused with the command that converts a file the user trusts.
train::Checkpoint open_checkpoint(const std::string& file_or_dir);

/// eval's and sample's common start: the CPU threads set, the checkpoint opened for
/// inference (open_for_inference), a missing or wrong data path named as --data.
/// What a checkpoint holds, as `inspect --json` prints it (without --verify's checks).
nlohmann::ordered_json checkpoint_json(const train::Checkpoint& checkpoint);

InferenceRun open_run(const std::string& file_or_dir, int64_t threads, const InferenceOptions& options);

}  // namespace tinylm::cli
