// Internal: puts a module back in the train/eval mode it had, however a scope is left.
#pragma once

#include <torch/nn/module.h>

namespace tinylm::internal {

class TrainingModeGuard {
 public:
  explicit TrainingModeGuard(torch::nn::Module& m) : module_(m), was_training_(m.is_training()) {}
  ~TrainingModeGuard() { module_.train(was_training_); }
  TrainingModeGuard(const TrainingModeGuard&) = delete;
  TrainingModeGuard& operator=(const TrainingModeGuard&) = delete;

 private:
  torch::nn::Module& module_;
  bool was_training_;
};

}  // namespace tinylm::internal
