// Shared by the fuzz targets: a scratch file for the readers that take a path, and the
// size of model a target may build from a checkpoint it read.
#pragma once

#include <tinylm/nn/model.h>
#include <tinylm/train/checkpoint.h>

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace tinylm::fuzz {

/// Writes the input to a file of this process's own (in $TMPDIR, reused for every input)
/// and returns its path.
inline const std::string& input_file(const uint8_t* data, size_t size, const char* suffix) {
  static const std::string path = [&] {
    const char* dir = std::getenv("TMPDIR");
    return std::string(dir && *dir ? dir : "/tmp") + "/tinylm-fuzz-" + std::to_string(::getpid()) + suffix;
  }();
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) std::abort();
  if (size && std::fwrite(data, 1, size, f) != size) std::abort();
  std::fclose(f);
  return path;
}

/// Whether the checkpoint's model is small enough to build (up to a few MB): the
/// fuzzer's memory limit is not the reader's business (the reader has refused every
/// architecture its weights do not match).
inline bool small_model(const train::Checkpoint& ck) {
  const auto& o = ck.architecture.options;
  auto small = [&](const char* key, int64_t limit) {
    auto it = o.find(key);
    return it == o.end() || (it->second.size() < 7 && std::atoll(it->second.c_str()) <= limit);
  };
  return nn::parameter_count(ck.architecture) < 1'000'000 && small("context_length", 512) && small("n_layers", 8);
}

}  // namespace tinylm::fuzz
