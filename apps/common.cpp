// Helpers more than one subcommand needs.
#include "command.h"

#include <tinylm/error.h>
#include <tinylm/run.h>
#include <tinylm/threads.h>
#include <tinylm/train/checkpoint.h>

#include <cmath>
#include <cstdlib>
#include <string>

namespace tinylm::cli {

namespace {

/// Integer options also take exact decimal notation ("1e9", "64.0"), as people write
/// sizes; anything else is left for CLI11 to refuse.
const CLI::Validator kIntegerNotation(
    [](std::string& text) -> std::string {
      if (text.find_first_of("eE.") == std::string::npos) return {};
      char* end = nullptr;
      const double v = std::strtod(text.c_str(), &end);
      if (end == text.c_str() || *end != '\0' || !std::isfinite(v) || v != std::floor(v) ||
          std::abs(v) >= 9.2e18)
        return {};
      text = std::to_string(static_cast<long long>(v));
      return {};
    },
    "", "integer notation");

}  // namespace

CLI::Option* integer(CLI::Option* option) { return option->transform(kIntegerNotation); }

/// The checkpoint a command names (a file, or a run directory's newest).
train::Checkpoint open_checkpoint(const std::string& file_or_dir) {
  return train::read_checkpoint(train::resolve_checkpoint_path(file_or_dir));
}

InferenceRun open_run(const std::string& file_or_dir, int64_t threads, const InferenceOptions& options) {
  TORCH_CHECK(threads >= 0, "--threads must be >= 0 (0 = LibTorch's default), got ", threads);
  set_cpu_threads(threads);
  try {
    return open_for_inference(open_checkpoint(file_or_dir), options);
  } catch (const Error& e) {
    TORCH_CHECK(e.kind() != ErrorKind::data_needed, e.what_without_backtrace(), " (--data PATH)");
    throw;
  }
}

}  // namespace tinylm::cli
