// Checkpoints: one self-describing file per save.
//
// Layout (little-endian), after llm.c's checked headers:
//   bytes  0..7   magic "TINYLMCK"
//   bytes  8..11  format version (uint32)
//   bytes 12..15  reserved (0)
//   bytes 16..23  payload length in bytes (uint64)
//   bytes 24..27  CRC-32 of the payload (uint32)
//   bytes 28..31  reserved (0)
//   bytes 32..    payload: a LibTorch archive holding the run config (TOML), the model's
//                 parameters, the optimizer state, the step, RNG states and counters.
// Files are written to a temporary name, fsync'ed, then renamed over the target, so a
// crash at any moment leaves either the old file or the new one, never half of one.
#pragma once

#include <tinylm/config.h>
#include <tinylm/nn/model.h>

#include <torch/serialize/input-archive.h>
#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <string>

namespace tinylm::train {

class Optimizer;

constexpr uint32_t kCheckpointFormatVersion = 1;

/// Where training stands, besides the weights and the optimizer.
struct TrainingState {
  int64_t step = 0;                   // optimizer steps done
  double best_val_loss = 1e300;       // lowest validation loss so far
  double epoch_loss_sum = 0.0;        // sum of this epoch's step losses so far
  torch::Tensor data_rng_state;       // the data generator (the position in the data)
  torch::Tensor torch_rng_state;      // LibTorch's default CPU generator (dropout)
};

/// What a checkpoint holds once its header has been checked.
struct Checkpoint {
  std::string path;
  uint32_t format_version = 0;
  RunConfig config;                   // the full run config it was trained with
  TrainingState state;
  std::shared_ptr<torch::serialize::InputArchive> archive;  // weights and optimizer
};

/// Writes atomically (temporary file, fsync, rename, fsync of the directory).
void save_checkpoint(const std::string& path, const RunConfig& config, nn::LanguageModelImpl& model,
                     const Optimizer* optimizer, const TrainingState& state);

/// Reads and checks a checkpoint: a missing, foreign, truncated, corrupt or newer-format
/// file is refused with an error naming the file and the problem.
Checkpoint read_checkpoint(const std::string& path);

/// Copies the checkpoint's weights into `model` after checking that every parameter is
/// there with the same shape and that the checkpoint holds no others (LibTorch's own
/// loader would accept mismatched shapes silently).
void load_model_state(const Checkpoint& checkpoint, nn::LanguageModelImpl& model);

/// Restores the optimizer state saved with the checkpoint.
void load_optimizer_state(const Checkpoint& checkpoint, Optimizer& optimizer);

/// A checkpoint file, or the newest "step-*.ckpt" in a run directory.
std::string resolve_checkpoint_path(const std::string& file_or_dir);

/// CRC-32 (IEEE 802.3), as zlib computes it.
uint32_t crc32(const void* data, size_t size);

}  // namespace tinylm::train
