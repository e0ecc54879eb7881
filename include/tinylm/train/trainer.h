// Training and evaluation of a language model on a task, from a RunConfig.
// B = batch, T = sequence length, V = vocab size
#pragma once

#include <tinylm/config.h>
#include <tinylm/data/tasks.h>
#include <tinylm/nn/model.h>
#include <tinylm/train/checkpoint.h>
#include <tinylm/train/optimizer.h>
#include <tinylm/train/run_directory.h>

#include <ATen/core/Generator.h>
#include <torch/types.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace tinylm::train {

/// "auto" (CUDA when present), "cpu", "cuda" or "cuda:N". Asking for CUDA where there
/// is none, or for a device index that does not exist, is an error.
torch::Device resolve_device(const std::string& spec);

/// The model a run config describes (model = tiny | transformer), on the CPU.
nn::LanguageModel build_model(const RunConfig& config);

/// Figures of one evaluation.
struct EvalMetrics {
  double loss = 0;         // mean cross-entropy over all target positions
  double perplexity = 0;   // exp(loss)
  double scored_loss = 0;  // mean cross-entropy over the predictable positions
  double accuracy = 0;     // argmax accuracy over the predictable positions
  double exact_match = 0;  // rows whose predictable positions are all right
  int64_t tokens = 0;      // predictable positions counted
  int64_t rows = 0;
};

/// Evaluates `model` on `batches` batches drawn from the task's validation split with a
/// generator seeded by `seed` (so the same seed sees the same data). No gradients; the
/// model's train/eval mode is restored.
EvalMetrics evaluate(nn::LanguageModelImpl& model, data::Task& task, int64_t batches,
                     int64_t batch_size, uint64_t seed, torch::Device device);

/// The learning rate at `step` (0-based): linear warmup, then constant or cosine decay.
double learning_rate_at(const RunConfig& config, int64_t step);

/// One progress record.
struct StepRecord {
  int64_t step = 0;  // optimizer steps done
  int64_t total_steps = 0;
  int64_t epoch = 0;  // 1-based
  double loss = 0;
  double lr = 0;
  double grad_norm = 0;  // before clipping (0 when clipping is off)
  double tokens_per_second = 0;
  double eta_seconds = 0;
};

/// What a call to fit() did.
struct FitResult {
  int64_t start_step = 0;
  int64_t end_step = 0;
  std::vector<double> losses;        // one per step run by this call
  std::vector<double> epoch_losses;  // mean loss of each epoch that ended in this call
  bool solved = false;               // stopped early: the task was solved
  bool interrupted = false;          // stopped by the stop flag
  EvalMetrics last_eval;
  std::string last_checkpoint;
  std::string best_checkpoint;
};

/// Trains a model as the RunConfig says: data, optimizer (Adam or AdamW with parameter
/// groups), schedule, clipping, accumulation, periodic validation, checkpoints and the
/// metrics file (out-dir/metrics.jsonl). Progress goes to the "tinylm" spdlog logger.
class Trainer {
 public:
  explicit Trainer(RunConfig config);

  /// Continues from a checkpoint: weights, optimizer, step, RNG states, data position.
  /// Called before fit(); the checkpoint must fit the model this config builds.
  void resume(const Checkpoint& checkpoint);

  /// Writes this run's checkpoints and metrics into `dir` (which becomes the config's
  /// out-dir). Without it, fit() claims the config's out-dir itself: fresh for a new
  /// run, resume after resume().
  void set_run_directory(std::shared_ptr<RunDirectory> dir);

  /// Runs until the last step, a solved task (when asked for), or `*stop` turning true
  /// (checked between steps; a checkpoint is written before returning). A NaN or
  /// infinite loss throws before the optimizer step, and non-finite weights are never
  /// checkpointed, so the last checkpoint named in the error is a good one.
  FitResult fit(const std::atomic<bool>* stop = nullptr);

  /// One optimizer step (grad-accum micro-batches): returns the loss; the global gradient
  /// norm before clipping goes to *grad_norm when clipping is on. Throws on a NaN or
  /// infinite loss before touching the weights.
  double train_step(double* grad_norm = nullptr);

  /// Validation figures on the config's eval batches (fixed seed: comparable over time).
  EvalMetrics validate();

  /// Writes a checkpoint of the current state to `path`.
  void save(const std::string& path);

  const RunConfig& config() const { return config_; }
  nn::LanguageModel model() const { return model_; }
  data::Task& task() { return *task_; }
  torch::Device device() const { return device_; }
  int64_t step() const { return state_.step; }
  /// Called for every progress line (also logged); for a C++ user's own display.
  std::function<void(const StepRecord&)> on_progress;

 private:
  std::string checkpoint_path(int64_t step) const;
  void write_step_checkpoint(FitResult& result);
  void append_metrics(const std::string& json_line);
  void sync_rng_state();

  RunConfig config_;
  torch::Device device_;
  nn::LanguageModel model_;
  std::unique_ptr<data::Task> task_;
  std::unique_ptr<Optimizer> optimizer_;
  at::Generator data_gen_;
  TrainingState state_;
  bool resumed_ = false;
  std::shared_ptr<RunDirectory> run_dir_;
  nn::TinyAttentionLMImpl* fused_tiny_ = nullptr;  // set when the fused loss applies
};

}  // namespace tinylm::train
