// What a run will take from the machine, checked before anything large is allocated.
#pragma once

#include <tinylm/config.h>

#include <cstdint>
#include <string>

namespace tinylm::train {

/// A lower-bound estimate of the memory a run needs (float32), in bytes.
struct MemoryEstimate {
  double parameters = 0;        // trainable values
  double parameter_bytes = 0;   // weights, plus gradients and Adam's two moments in training
  double activation_bytes = 0;  // one micro-batch: what backward keeps, or inference's peak
  double buffer_bytes = 0;      // fixed tables: causal masks, sinusoidal positions
  double data_bytes = 0;        // the text task's file, held in memory
  double total() const {
    return parameter_bytes + activation_bytes + buffer_bytes + data_bytes;
  }
};

/// The estimate for `config` with micro-batches of `batch_size` rows; `training` counts
/// gradients, optimizer state and saved activations. `on_cuda`: weights and activations
/// live on the GPU, so the host holds only the model while it is built and the data.
MemoryEstimate estimate_memory(const RunConfig& config, int64_t batch_size, bool training,
                               bool on_cuda = false);

/// Refuses a run whose estimate exceeds the memory available to this process, naming
/// the setting that makes it so (the one whose default would shrink the estimate most),
/// the estimate and what is available. Does nothing where available memory is unknown.
void check_memory(const RunConfig& config, int64_t batch_size, bool training, bool on_cuda = false);

/// Memory this process can still take, in bytes (0 when unknown).
uint64_t available_memory_bytes();

}  // namespace tinylm::train
