// A float32 tensor's storage for tinylm's loops (the fused ops' and products' operands).
#pragma once

#include <torch/types.h>

namespace tinylm::nn {

/// `t`'s floats, or nullptr where `t` is undefined (a layer without bias or gain).
inline float* floats(const torch::Tensor& t) { return t.defined() ? t.data_ptr<float>() : nullptr; }

}  // namespace tinylm::nn
