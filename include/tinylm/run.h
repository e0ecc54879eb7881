// Runs described by a RunConfig: the layer that turns the tinylm tool's flat settings
// (a TOML file and flags) into the library's parts — a model, a task, trainer options —
// and a Trainer made of them. A C++ user can skip it and build the parts directly.
#pragma once

#include <tinylm/config.h>
#include <tinylm/data/tasks.h>
#include <tinylm/nn/model.h>
#include <tinylm/train/checkpoint.h>
#include <tinylm/train/trainer.h>

#include <memory>
#include <string>

namespace tinylm {

/// The model a run config describes (model = tiny | transformer), as an architecture.
nn::ModelArchitecture model_architecture(const RunConfig& config);

/// That model, on the CPU, its weights drawn from a generator seeded by config.seed.
/// LibTorch's global generator is left as it was.
nn::LanguageModel build_model(const RunConfig& config);

/// The task a run config names (task, seq-len, vocab-size, data, val-fraction).
std::unique_ptr<data::Task> make_task(const RunConfig& config);

/// The trainer options a run config sets; its recipe is the config itself (TOML).
train::TrainerOptions trainer_options(const RunConfig& config);

/// Checks the config and the memory it needs, then builds its model, task and Trainer
/// (one rank of a data-parallel job when `group` is given).
train::Trainer make_trainer(const RunConfig& config,
                            std::shared_ptr<train::ProcessGroup> group = nullptr);

/// The run config a checkpoint was trained with (its recipe). Keys this tinylm does not
/// know (an option renamed or removed since) are skipped with a warning; the result is
/// validated.
RunConfig config_from_checkpoint(const train::Checkpoint& checkpoint);

}  // namespace tinylm
