// What a run will take from the machine: the parts of a memory estimate, and what the
// process has (the estimate of a run config is in tinylm/run.h).
#pragma once

#include <cstdint>
#include <string>

namespace tinylm::train {

/// A lower-bound estimate of the memory a run needs (float32), in bytes.
struct MemoryEstimate {
  double parameters = 0;        // trainable values
  double parameter_bytes = 0;   // weights, plus gradients and Adam's two moments in training
  double activation_bytes = 0;  // one micro-batch: what backward keeps, or inference's peak
  double buffer_bytes = 0;      // masks and sinusoidal rows of the lengths run
  double data_bytes = 0;        // the text task's file, held in memory
  double total() const {
    return parameter_bytes + activation_bytes + buffer_bytes + data_bytes;
  }
};

/// Memory this process can still take, in bytes (0 when unknown).
uint64_t available_memory_bytes();

}  // namespace tinylm::train
