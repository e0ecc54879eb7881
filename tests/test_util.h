// Helpers shared by the tests. The test files are compiled in combined translation units
// (TINYLM_UNITY_BUILD), so a helper two files need lives here, never in both.
#pragma once

#include "catch_compat.h"
#include <torch/cuda.h>
#include <torch/nn/functional/linear.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/container/any.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/optim/adam.h>
#include <torch/optim/sgd.h>
#include <torch/serialize.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <tinylm/data/token_file.h>
#include <tinylm/nn/cpu_kernels.h>
#include <tinylm/nn/model.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <unistd.h>

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

/// `o` with stored options set by name, from their text, as an architecture or a config
/// sets them (`bias` sets the attention's and the MLP's): with(o, {{"bias", "false"}}).
inline nn::TransformerLMOptions with(nn::TransformerLMOptions o, const std::map<std::string, std::string>& options) {
  for (const auto& [name, text] : options) nn::TransformerLMOptions::spec().set(o, name, OptionValue(text));
  return o;
}

/// Runs `f` with LibTorch's global generator seeded and one intra-op thread, and checks
/// that it leaves both alone: the generator then gives what it would have without `f`.
template <typename F>
void check_leaves_global_state(F&& f) {
  const int threads_before = at::get_num_threads();
  at::set_num_threads(1);
  torch::manual_seed(123);
  const auto expected = torch::rand({8});
  torch::manual_seed(123);
  f();
  CHECK(torch::equal(torch::rand({8}), expected));
  CHECK(at::get_num_threads() == 1);
  at::set_num_threads(threads_before);
}

/// This process's scratch root, $TMPDIR/tinylm_test_<pid>. ctest runs the test executables
/// in parallel, the same executable under several filters at once (unit.tinylm and the
/// [bf16] runs share test_run.cpp's cases), so no two processes may share a directory: one
/// would empty it while the other writes (CI's debian12 leg of 2026-12-05 lost a rename so).
/// Removed when the process ends normally; an aborted run's stays for a look.
inline const std::filesystem::path& scratch_root() {
  struct Root {
    std::filesystem::path path;
    Root() : path(std::filesystem::temp_directory_path() / ("tinylm_test_" + std::to_string(::getpid()))) {
      std::filesystem::remove_all(path);  // a dead process's of the same pid
      std::filesystem::create_directories(path);
    }
    ~Root() {
      std::error_code ignored;
      std::filesystem::remove_all(path, ignored);
    }
  };
  static const Root root;
  return root.path;
}

/// An empty scratch directory for one test: scratch_root()/<name>, emptied first.
/// Within one process every test gives its own name.
inline std::filesystem::path scratch_dir(const std::string& name) {
  auto dir = scratch_root() / name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

/// Largest absolute difference between two tensors.
inline double max_abs_diff(const torch::Tensor& a, const torch::Tensor& b) {
  return (a - b).abs().max().item<double>();
}

/// x rounded to bfloat16, as float64: the exact value of an operand bfloat16 products use.
inline torch::Tensor bf16_value(const torch::Tensor& x) { return x.to(torch::kBFloat16).to(torch::kFloat64); }

// ---- files ---------------------------------------------------------------------------

/// A file's bytes ("" when it cannot be opened).
inline std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

/// Writes `bytes` to `path`, replacing what was there.
inline void write_file(const std::filesystem::path& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

// ---- corpora and token files -----------------------------------------------------------

/// A small English-like corpus: lines of words, some blank lines, some non-ASCII.
inline std::string corpus(int lines) {
  const char* words[] = {"the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran", "to",
                         "café", "naïve", "über", "fish", "swam", "in", "sea", "sun", "rose", "—"};
  std::string out;
  uint64_t x = 12345;
  for (int i = 0; i < lines; ++i) {
    const int n = 3 + static_cast<int>(i % 9);
    for (int k = 0; k < n; ++k) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      out += (k ? " " : "") + std::string(words[(x >> 33) % 20]);
    }
    out += i % 7 == 6 ? "\n\n" : "\n";
  }
  return out;
}

/// Every token of a token file, in order.
inline std::vector<int64_t> all_tokens(const data::TokenFile& f) {
  std::vector<int64_t> ids(static_cast<size_t>(f.size()));
  f.read(0, f.size(), ids.data());
  return ids;
}

/// Every line of `part` is a line of `whole` (the held-out blocks are cut at lines).
inline bool lines_of(const std::string& part, const std::string& whole) {
  std::istringstream in(part);
  std::string line;
  while (std::getline(in, line))
    if (whole.find(line) == std::string::npos) return false;
  return true;
}

// ---- models ----------------------------------------------------------------------------

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

// ---- CPU kernels -------------------------------------------------------------------------

/// The instruction sets of tinylm's loops that run here (generic always; avx2 and avx512
/// where the CPU and the build have them), each set for the life of a KernelGuard.
inline std::vector<nn::CpuIsa> runnable_isas() {
  std::vector<nn::CpuIsa> v = {nn::CpuIsa::generic};
  for (auto isa : {nn::CpuIsa::avx2, nn::CpuIsa::avx512})
    if (nn::cpu_isa_available(isa)) v.push_back(isa);
  return v;
}

/// The product backends that run here.
inline std::vector<nn::GemmBackend> runnable_backends() {
  std::vector<nn::GemmBackend> v = {nn::GemmBackend::blas, nn::GemmBackend::hand};
  if (nn::gemm_backend_available(nn::GemmBackend::libxsmm)) v.push_back(nn::GemmBackend::libxsmm);
  return v;
}

/// Sets the loops' instruction set; back to automatic on exit.
struct KernelGuard {
  explicit KernelGuard(nn::CpuIsa isa) { nn::set_cpu_isa(isa); }
  ~KernelGuard() { nn::set_cpu_isa(nn::CpuIsa::automatic); }
  KernelGuard(const KernelGuard&) = delete;
  KernelGuard& operator=(const KernelGuard&) = delete;
};

}  // namespace tinylm::test
