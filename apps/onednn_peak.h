// The bench's oneDNN matrix products (issue 40): float32 and bfloat16 (float32 out), the
// kernels oneDNN picks for this CPU (AVX-512, AVX512-BF16, AMX), timed.
#pragma once

#include <cstdint>
#include <string>

namespace tinylm {

struct OnednnProduct {
  double seconds = 0;  // one n x n x n product, the median of `reps`
  std::string impl;    // oneDNN's kernel, e.g. "brg:avx512_core_amx_bf16"
};

/// Whether oneDNN can make an n x n x n product with float32 or bfloat16 inputs here ("" if
/// so, else why not: a build without oneDNN, or no kernel for this CPU, e.g. bfloat16 on
/// oneDNN 2.x without AVX-512).
std::string onednn_missing(bool bf16);

/// oneDNN's version, "2.6.3".
std::string onednn_version();

/// An n x n x n product through oneDNN's matmul, inputs float32 or bfloat16 (the output
/// float32 either way), on `threads` threads; after a warm-up, the median of `reps` runs.
OnednnProduct onednn_matmul(int64_t n, bool bf16, int reps);

}  // namespace tinylm
