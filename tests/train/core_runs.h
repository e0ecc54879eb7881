// Runs built from the core's own types, as a C++ program builds them: a model from its
// architecture, a task kind with its options, TrainerOptions. (The run layer's config is
// tested at the top of tests/; the core's tests do not reach up to it, and
// tests/cli/test_layers.sh checks that they do not.)
#pragma once

#include <tinylm/data/task_kind.h>
#include <tinylm/nn/model.h>
#include <tinylm/train/trainer.h>

#include "internal/generator_scope.h"

#include <memory>
#include <string>

namespace tinylm::test {

/// The reference model: TinyAttentionLM, vocabulary 64, context 12, width 32, 4 heads.
inline nn::ModelArchitecture reference_model() { return nn::architecture_of(nn::TinyAttentionLMOptions(64, 12, 32, 4)); }

/// A small transformer of the reference run's shape with two blocks.
inline nn::ModelArchitecture small_transformer() {
  return nn::architecture_of(nn::TransformerLMOptions(64, 12, 32, 4, 2));
}

struct CoreRun {
  nn::ModelArchitecture model = reference_model();
  std::string task = "repeat";
  data::TaskOptions task_options;  // sequences of 12 ids below 64
  train::TrainerOptions trainer;   // the reference run's: Adam 5e-3, 3 x 120 steps of 16, seed 42
};

/// Its Trainer, the weights drawn from a generator seeded with the run's seed (LibTorch's
/// global generator left alone), as the run layer draws them.
inline train::Trainer make_core_trainer(const CoreRun& run) {
  auto state = internal::seeded_generator_state(torch::kCPU, static_cast<uint64_t>(run.trainer.seed()));
  nn::LanguageModel model;
  {
    internal::GeneratorScope scope(torch::kCPU, state);
    model = nn::build_model(run.model);
  }
  return train::Trainer(model, data::make_task(run.task, run.task_options), run.trainer);
}

}  // namespace tinylm::test
