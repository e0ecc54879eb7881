// Runs described by a RunConfig: the layer that turns the tinylm tool's flat settings
// (a TOML file and flags) into the library's parts — a model, a task, trainer options —
// and a Trainer made of them. A C++ user can skip it and build the parts directly.
#pragma once

#include <tinylm/config.h>
#include <tinylm/data/tasks.h>
#include <tinylm/nn/model.h>
#include <tinylm/train/checkpoint.h>
#include <tinylm/train/resources.h>
#include <tinylm/train/trainer.h>

#include <memory>
#include <string>

namespace tinylm {

/// The model a run config describes, as an architecture: config.model_settings() as its
/// kind writes them. Not checked (check_config() checks it).
nn::ModelArchitecture model_architecture(const RunConfig& config);

/// model_architecture()'s inverse: the config's model becomes that architecture's options,
/// read once and checked by its kind (nn::read_model_options).
void set_model(RunConfig& config, const nn::ModelArchitecture& architecture);

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

/// The run config a checkpoint was trained with: its recipe (keys this tinylm does not
/// know, an option renamed or removed since, are skipped with a warning), with the model
/// set to the architecture it stores (set_model: the recipe is provenance, the
/// architecture the truth). The result is validated.
RunConfig config_from_checkpoint(const train::Checkpoint& checkpoint);

/// The memory a run of `config` needs with micro-batches of `batch_size` rows (float32, a
/// lower bound); `training` counts gradients, optimizer state and saved activations.
/// `on_cuda`: weights and activations live on the GPU, so the host holds only the model
/// while it is built and the data.
train::MemoryEstimate estimate_memory(const RunConfig& config, int64_t batch_size, bool training,
                                      bool on_cuda = false);

/// Refuses a run whose estimate exceeds the memory available to this process, naming
/// the setting that makes it so (the one whose default would shrink the estimate most),
/// the estimate and what is available. Does nothing where available memory is unknown.
void check_memory(const RunConfig& config, int64_t batch_size, bool training, bool on_cuda = false);

/// A checkpoint made ready to evaluate or sample: the model it describes with its weights
/// (eval mode, on `device`), the run config it was trained with, its tokenizer, and its
/// task when the data was asked for.
struct InferenceRun {
  train::Checkpoint checkpoint;
  RunConfig config;  // the one it was trained with, `data` replaced when given
  nn::LanguageModel model;
  std::unique_ptr<data::Task> task;  // only when the data is needed (or the tokenizer is in it)
  std::shared_ptr<const data::Tokenizer> tokenizer;
  torch::Device device = torch::kCPU;
};

struct InferenceOptions {
  std::string device = "auto";  // auto, cpu, cuda or cuda:N
  std::string data;             // the data file or corpus, if it moved ("" = the recipe's)
  bool need_data = false;       // build the task (evaluation)
  /// The model's products in bfloat16 (nn::use_bf16_products): on CUDA, or on a CPU that
  /// has them.
  bool bf16 = false;
};

/// Builds the run a checkpoint holds for inference, after checking that it fits in memory.
/// The tokenizer is the checkpoint's own; for one written before tokenizers were stored,
/// the one its task implies (bytes for text, the corpus's for tokens, ids otherwise). A
/// tokenizer that disagrees with the data or outnumbers the model's vocabulary is refused.
InferenceRun open_for_inference(train::Checkpoint checkpoint, const InferenceOptions& options = {});

}  // namespace tinylm
