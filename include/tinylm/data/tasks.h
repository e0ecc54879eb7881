// Synthetic next-token tasks. B = batch, T = sequence length, V = vocab size
#pragma once

#include <ATen/core/Generator.h>
#include <torch/types.h>

#include <cstdint>

namespace tinylm::data {

/// One training batch: inputs (B, T) and targets (B, T) int64, where targets are the
/// inputs shifted by one; `scored` (B, T) bool marks the targets a perfect model can
/// predict (accuracy counts only those).
struct Batch {
  torch::Tensor inputs;
  torch::Tensor targets;
  torch::Tensor scored;
};

/// The reference repeat task: each row is one random id repeated T + 1 times;
/// inputs are the first T ids, targets the last T. All targets are predictable.
/// Ids come from `gen` (a CPU generator) so a seed fixes the data exactly.
Batch repeat_batch(int64_t batch_size, int64_t seq_len, int64_t vocab_size, at::Generator& gen,
                   torch::Device device = torch::kCPU);

}  // namespace tinylm::data
