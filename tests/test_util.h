// Helpers shared by the tests.
#pragma once

#include "catch_compat.h"
#include <torch/torch.h>

#include <filesystem>
#include <string>

namespace tinylm::test {

/// Runs `f`, requires that it throws a c10::Error, and returns the message (without
/// LibTorch's source-location suffix) so a test can check what it names.
template <typename F>
std::string error_message(F&& f) {
  try {
    f();
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  }
  FAIL("expected a c10::Error, nothing was thrown");
  return {};
}

/// An empty scratch directory for one test: $TMPDIR/tinylm_test_<name>, emptied first.
inline std::filesystem::path scratch_dir(const std::string& name) {
  auto dir = std::filesystem::temp_directory_path() / ("tinylm_test_" + name);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

/// Largest absolute difference between two tensors.
inline double max_abs_diff(const torch::Tensor& a, const torch::Tensor& b) {
  return (a - b).abs().max().item<double>();
}

}  // namespace tinylm::test
