// Internal: lend LibTorch's default generator of a device a private state for a scope.
// Modules such as dropout and LibTorch's initialisers draw from the default generator;
// running them inside a GeneratorScope makes them draw from the caller's own stream,
// and leaves the global generator exactly as the user had it.
#pragma once

#include <ATen/Context.h>
#include <ATen/core/Generator.h>
#include <torch/types.h>

#include <mutex>

namespace tinylm::internal {

/// The state a default generator of `device`'s type has right after seeding with `seed`,
/// computed without disturbing that generator.
inline torch::Tensor seeded_generator_state(torch::Device device, uint64_t seed) {
  auto gen = at::globalContext().defaultGenerator(device);
  std::lock_guard<std::mutex> lock(gen.mutex());
  const auto saved = gen.get_state();
  gen.set_current_seed(seed);
  auto state = gen.get_state();
  gen.set_state(saved);
  return state;
}

class GeneratorScope {
 public:
  /// Swaps `state` into the default generator of `device`'s type; on leaving the scope,
  /// writes the advanced state back to `state` and restores the generator.
  GeneratorScope(torch::Device device, torch::Tensor& state)
      : gen_(at::globalContext().defaultGenerator(device)), state_(state) {
    std::lock_guard<std::mutex> lock(gen_.mutex());
    saved_ = gen_.get_state();
    gen_.set_state(state_);
  }
  ~GeneratorScope() {
    std::lock_guard<std::mutex> lock(gen_.mutex());
    state_ = gen_.get_state();
    gen_.set_state(saved_);
  }
  GeneratorScope(const GeneratorScope&) = delete;
  GeneratorScope& operator=(const GeneratorScope&) = delete;

 private:
  at::Generator gen_;
  torch::Tensor& state_;
  torch::Tensor saved_;
};

}  // namespace tinylm::internal
