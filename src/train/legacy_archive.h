// Format-1 checkpoints: a LibTorch archive (torch::serialize::OutputArchive), read with
// tinylm's own checked reader (internal/torch_file.h), never LibTorch's loader.
#pragma once

#include <tinylm/train/checkpoint.h>

#include <string>

namespace tinylm::internal {

/// Fills `ck` (recipe, state, parameter names, weights, optimizer kind and state) from a
/// format-1 payload; ck.path names the file in errors. Every value is checked for its
/// type, every tensor against its storage, before anything is kept.
void read_legacy_archive(train::Checkpoint& ck, const std::string& payload);

}  // namespace tinylm::internal
