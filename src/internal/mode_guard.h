// Internal: puts a module in train or eval mode for a scope and back in the mode it had,
// however the scope is left. A module already in that mode is not written to at all, so
// threads sharing an eval-mode model (a server's workers) can each hold a guard.
#pragma once

#include <torch/nn/module.h>

namespace tinylm::internal {

class TrainingModeGuard {
 public:
  TrainingModeGuard(torch::nn::Module& m, bool training) : module_(m), was_training_(m.is_training()) {
    if (was_training_ != training) module_.train(training);
  }
  ~TrainingModeGuard() {
    if (module_.is_training() != was_training_) module_.train(was_training_);
  }
  TrainingModeGuard(const TrainingModeGuard&) = delete;
  TrainingModeGuard& operator=(const TrainingModeGuard&) = delete;

 private:
  torch::nn::Module& module_;
  bool was_training_;
};

}  // namespace tinylm::internal
