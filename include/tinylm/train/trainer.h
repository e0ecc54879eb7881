// Training and evaluation of any language model on any task.
// B = batch, T = sequence length, V = vocab size
#pragma once

#include <tinylm/data/tasks.h>
#include <tinylm/nn/model.h>
#include <tinylm/spec.h>
#include <tinylm/train/checkpoint.h>
#include <tinylm/train/distributed.h>
#include <tinylm/train/optimizer.h>
#include <tinylm/train/run_directory.h>

#include <ATen/core/Generator.h>
#include <torch/arg.h>
#include <torch/types.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace tinylm::train {

/// "auto" (CUDA when present), "cpu", "cuda" or "cuda:N". Asking for CUDA where there
/// is none, or for a device index that does not exist, is an error. With a local rank
/// (a data-parallel process's index on its host), "auto" and "cuda" mean that process's
/// own GPU: cuda:(local_rank mod the number of GPUs).
torch::Device resolve_device(const std::string& spec, int64_t local_rank = -1);

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
///
/// In a data-parallel job, pass the group and call it on every rank: each batch of
/// `batch_size` rows (a multiple of the world size) is split into equal row blocks, rank r
/// evaluates block r, and the sums are reduced, so every rank returns the whole batch's
/// figures in 1/world_size of the time.
EvalMetrics evaluate(nn::LanguageModelImpl& model, data::Task& task, int64_t batches,
                     int64_t batch_size, uint64_t seed, torch::Device device,
                     ProcessGroup* group = nullptr);

enum class OptimizerKind { adam, adamw };

/// Adam, or AdamW with decoupled weight decay on decayed_parameters() only.
struct OptimizerOptions {
  TORCH_ARG(OptimizerKind, kind) = OptimizerKind::adam;
  TORCH_ARG(double, lr) = 5e-3;
  TORCH_ARG(double, beta1) = 0.9;
  TORCH_ARG(double, beta2) = 0.999;
  TORCH_ARG(double, eps) = 1e-8;
  /// AdamW only.
  TORCH_ARG(double, weight_decay) = 0.0;
  /// What AdamW decays (see DecayedParameters).
  TORCH_ARG(DecayedParameters, decayed) = DecayedParameters::linear_weights;
  /// The update over one flat buffer (make_flat_adam) instead of LibTorch's optimizer.
  TORCH_ARG(bool, flat) = true;
};

enum class LRSchedule { constant, cosine };

/// Linear warmup over warmup_steps, then constant, or cosine decay to lr * min_lr_ratio
/// at the last step.
struct ScheduleOptions {
  TORCH_ARG(LRSchedule, kind) = LRSchedule::constant;
  TORCH_ARG(int64_t, warmup_steps) = 0;
  TORCH_ARG(double, min_lr_ratio) = 0.1;
};

/// How a Trainer trains. The defaults are the reference run's (the model and the task
/// are the Trainer's other two parts).
struct TrainerOptions {
  TORCH_ARG(OptimizerOptions, optimizer);
  TORCH_ARG(ScheduleOptions, schedule);
  TORCH_ARG(int64_t, batch_size) = 16;
  TORCH_ARG(int64_t, epochs) = 3;
  TORCH_ARG(int64_t, steps_per_epoch) = 120;
  /// Micro-batches per optimizer step.
  TORCH_ARG(int64_t, grad_accum) = 1;
  /// Max global gradient norm; 0 = no clipping.
  TORCH_ARG(double, grad_clip) = 0.0;
  /// Seeds the Trainer's own generators: the data (seed + 1) and dropout (seed + 2).
  TORCH_ARG(uint64_t, seed) = 42;
  TORCH_ARG(torch::Device, device) = torch::kCPU;
  /// bfloat16: on CUDA, autocast for the forward pass; on the CPU, every product of the
  /// model's own kernels in bfloat16 (KernelPolicy::bf16_products: float32 weights,
  /// optimizer state, sums and reductions), where nn::bf16_products_missing() is empty.
  TORCH_ARG(bool, bf16) = false;
  /// Steps between progress records.
  TORCH_ARG(int64_t, log_every) = 40;
  /// Steps between validations; 0 = at the end of every epoch.
  TORCH_ARG(int64_t, eval_every) = 0;
  TORCH_ARG(int64_t, eval_batches) = 8;
  /// Where fit() writes step-N.ckpt, best.ckpt and metrics.jsonl; empty = fit() writes
  /// nothing (call save() yourself).
  TORCH_ARG(std::string, out_dir) = "";
  /// Steps between checkpoints; 0 = at the end of every epoch.
  TORCH_ARG(int64_t, save_every) = 0;
  /// Step checkpoints kept (best.ckpt is kept apart).
  TORCH_ARG(int64_t, keep_last) = 3;
  /// Stop once validation accuracy is 100% and the loss on predictable positions is below
  /// solve_loss (tasks with a known answer only).
  TORCH_ARG(bool, stop_when_solved) = false;
  TORCH_ARG(double, solve_loss) = 0.01;
  /// Text stored verbatim in every checkpoint for the application (the tinylm tool keeps
  /// its run config there, to resume with the same settings).
  TORCH_ARG(std::string, recipe) = "";
  /// Data-parallel training: this process's group (ProcessGroup::connect). Each rank
  /// trains on its own batch_size rows of every global batch (batch_size x world size),
  /// gradients are averaged once per optimizer step, rank 0's weights are broadcast at
  /// the start and after resume, validation is split among the ranks and reduced, and
  /// rank 0 alone logs and writes files. Give every rank the same options (out_dir too:
  /// checkpoints are collective steps, though only rank 0 writes). Null: one process.
  TORCH_ARG(std::shared_ptr<ProcessGroup>, process_group) = nullptr;

 public:
  int64_t total_steps() const { return epochs_ * steps_per_epoch_; }

  /// Every option a run sets (all but device, recipe and process_group), declared once
  /// with its rule and help, in two groups (optim, run): check_trainer_options() checks them, and the
  /// tinylm tool makes its config keys and flags of them.
  static const OptionSpec<TrainerOptions>& spec();
};

/// Throws, naming the option, its value and the rule, when an option is invalid: each
/// rule of TrainerOptions::spec(), and bf16 only on a CUDA device or where the CPU has
/// bfloat16 products (nn::bf16_products_missing()).
void check_trainer_options(const TrainerOptions& options);

/// The learning rate at `step` (0-based): linear warmup, then constant or cosine decay.
double learning_rate_at(const TrainerOptions& options, int64_t step);

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

/// Trains a model on a task: batches from the task, the model's own loss(), the optimizer
/// and schedule of the options, clipping, accumulation, periodic validation, checkpoints
/// and the metrics file (out_dir/metrics.jsonl). Progress goes to the "tinylm" spdlog
/// logger. Its randomness (data, dropout) comes from its own generators seeded by
/// options.seed: it changes neither LibTorch's global generator nor thread settings.
class Trainer {
 public:
  /// Moves the model to options.device and builds the optimizer over it. The task's
  /// vocabulary must match the model's and its sequences fit the model's context.
  Trainer(nn::LanguageModel model, std::shared_ptr<data::Task> task, TrainerOptions options);

  /// Continues from a checkpoint: weights, optimizer, step, RNG states, data position.
  /// Called before fit(); the checkpoint must fit the model.
  void resume(const Checkpoint& checkpoint);

  /// Writes this run's checkpoints and metrics into `dir` (which becomes out_dir).
  /// Without it, fit() claims out_dir itself (when set): fresh for a new run, resume
  /// after resume().
  void set_run_directory(std::shared_ptr<RunDirectory> dir);

  /// Runs until the last step, a solved task (when asked for), or `*stop` turning true
  /// (checked between steps; a checkpoint is written before returning). A NaN or
  /// infinite loss throws before the optimizer step, and non-finite weights are never
  /// checkpointed, so the last checkpoint named in the error is a good one.
  FitResult fit(const std::atomic<bool>* stop = nullptr);

  /// One optimizer step (grad_accum micro-batches): returns the loss; the global gradient
  /// norm before clipping goes to *grad_norm when clipping is on. Throws on a NaN or
  /// infinite loss before touching the weights.
  double train_step(double* grad_norm = nullptr);

  /// Validation figures on eval_batches batches (fixed seed: comparable over time).
  EvalMetrics validation_metrics();

  /// Writes a checkpoint of the current state to `path` (see save_checkpoint). In a
  /// data-parallel job call it on every rank (it gathers every rank's dropout generator,
  /// so each resumes its own); rank 0 writes the file.
  void save(const std::string& path);

  const TrainerOptions& options() const { return options_; }
  nn::LanguageModel model() const { return model_; }
  data::Task& task() { return *task_; }
  torch::Device device() const { return options_.device(); }
  int64_t step() const { return state_.step; }
  /// Seconds this Trainer has spent in the per-step gradient all-reduce (data-parallel
  /// runs; 0 in one process): communication's share of training time.
  double communication_seconds() const { return communication_seconds_; }
  /// Called for every progress record (also logged); for a C++ user's own display.
  std::function<void(const StepRecord&)> on_progress;

 private:
  std::string checkpoint_path(int64_t step) const;
  void write_step_checkpoint(FitResult& result);
  void append_metrics(const std::string& json_line);
  void sync_rng_state();
  bool lead() const { return rank_ == 0; }  // logs and writes files
  bool writes_files() const { return lead() && !options_.out_dir().empty(); }

  TrainerOptions options_;
  int64_t rank_ = 0, world_size_ = 1;
  nn::LanguageModel model_;
  std::shared_ptr<data::Task> task_;
  std::unique_ptr<Optimizer> optimizer_;
  at::Generator data_gen_;
  torch::Tensor dropout_rng_;  // the state of the Trainer's dropout generator
  TrainingState state_;
  bool resumed_ = false;
  double communication_seconds_ = 0;
  std::shared_ptr<RunDirectory> run_dir_;
};

}  // namespace tinylm::train
