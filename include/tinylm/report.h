// Human-readable views of attention: the reference demo's causal check and heatmap.
#pragma once

#include <torch/types.h>

#include <string>

namespace tinylm {

struct CausalCheck {
  double future_weight_sum = 0;  // total weight on keys j > i (should be < 1e-5)
  double max_row_error = 0;      // max |sum_j w[i, j] - 1|    (should be < 1e-5)
};

/// weights: (..., T, T) attention weights.
CausalCheck causal_check(const torch::Tensor& weights);

/// An ASCII heatmap of one (T, T) weight matrix with the glyphs " .:-=+*#%@"
/// (dark = 0, '@' = the largest weight), one row per query, with row/column indices.
std::string ascii_heatmap(const torch::Tensor& weights);

}  // namespace tinylm
