// tinylm's own model kinds, which the registry holds from the start.
#pragma once

#include <tinylm/nn/model_kind.h>

#include <vector>

namespace tinylm::nn {

/// "tiny" and "transformer" (model.cpp).
std::vector<ModelKind> builtin_model_kinds();

}  // namespace tinylm::nn
