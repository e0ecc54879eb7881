// The checks every model's token ids pass (check_token_ids, model.h), in two halves for
// the fused tiny loss, which finds the smallest and largest id in the pass that gathers
// the embeddings: the shape (rank, dtype, non-empty, length), then the range.
#pragma once

#include <c10/util/Exception.h>
#include <torch/types.h>

#include <cstdint>

namespace tinylm::nn {

inline void check_token_shape(const char* who, const torch::Tensor& ids, int64_t context_length) {
  TORCH_CHECK(ids.defined(), who, ": token ids are undefined");
  TORCH_CHECK(ids.dim() == 2, who, ": expected token ids of rank 2 (B, T), got rank ", ids.dim(),
              " with shape ", ids.sizes());
  TORCH_CHECK(ids.scalar_type() == torch::kLong, who, ": token ids must be int64, got ",
              ids.scalar_type());
  TORCH_CHECK(ids.size(0) >= 1 && ids.size(1) >= 1, who, ": token ids must be non-empty, got shape ",
              ids.sizes());
  TORCH_CHECK(ids.size(1) <= context_length, who, ": sequence length ", ids.size(1),
              " exceeds context_length ", context_length);
}

inline void check_token_range(const char* who, int64_t min_id, int64_t max_id, int64_t vocab_size) {
  TORCH_CHECK(min_id >= 0 && max_id < vocab_size, who, ": token ids must be in [0, ", vocab_size,
              "), got ids in [", min_id, ", ", max_id, "]");
}

}  // namespace tinylm::nn
