// Trainer, evaluation, and the model/device factory.
// B = batch, T = sequence length, V = vocab size
#include <tinylm/log.h>
#include <tinylm/threads.h>
#include <tinylm/nn/fused_tiny_lm.h>
#include <tinylm/train/optimizer.h>
#include <tinylm/train/resources.h>
#include <tinylm/train/trainer.h>

#include "internal/mode_guard.h"
#include "internal/system.h"

#include <ATen/CPUGeneratorImpl.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <ATen/autocast_mode.h>
#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>

namespace fs = std::filesystem;

namespace tinylm {

std::shared_ptr<spdlog::logger> logger() {
  if (auto existing = spdlog::get("tinylm")) return existing;
  static std::mutex mutex;
  std::lock_guard<std::mutex> lock(mutex);
  if (auto existing = spdlog::get("tinylm")) return existing;
  auto made = std::make_shared<spdlog::logger>(
      "tinylm", std::make_shared<spdlog::sinks::stderr_sink_mt>());
  spdlog::register_logger(made);
  return made;
}

}  // namespace tinylm

namespace tinylm::train {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

/// bf16 autocast for the forward pass on CUDA; a no-op when off.
class AutocastGuard {
 public:
  explicit AutocastGuard(bool enabled) : enabled_(enabled) {
    if (!enabled_) return;
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
    at::autocast::set_autocast_dtype(at::kCUDA, at::kBFloat16);
    at::autocast::set_autocast_enabled(at::kCUDA, true);
#else
    at::autocast::set_autocast_gpu_dtype(at::kBFloat16);
    at::autocast::set_enabled(true);
#endif
  }
  ~AutocastGuard() {
    if (!enabled_) return;
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
    at::autocast::set_autocast_enabled(at::kCUDA, false);
#else
    at::autocast::set_enabled(false);
#endif
    at::autocast::clear_cache();
  }
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  bool enabled_;
};

torch::Tensor lm_loss(const torch::Tensor& logits, const torch::Tensor& targets) {
  const int64_t V = logits.size(-1);
  return torch::nn::functional::cross_entropy(logits.to(torch::kFloat32).reshape({-1, V}),
                                              targets.reshape({-1}));
}

std::string json_number(double v) {
  if (!std::isfinite(v)) return "null";
  std::ostringstream os;
  os.precision(17);
  os << v;
  return os.str();
}

/// The "step" of a metrics line, or -1.
int64_t step_of(const std::string& line) {
  const auto at = line.find("\"step\":");
  return at == std::string::npos ? -1 : std::atoll(line.c_str() + at + 7);
}

std::unique_ptr<Optimizer> make_optimizer(const RunConfig& c, nn::LanguageModelImpl& model) {
  AdamConfig a;
  a.lr = c.lr;
  a.beta1 = c.beta1;
  a.beta2 = c.beta2;
  a.weight_decay = c.weight_decay;
  a.decoupled = c.optimizer == "adamw";
  return c.fused_optimizer ? make_flat_adam(model, a) : make_torch_adam(model, a);
}

}  // namespace

// ---- factory -----------------------------------------------------------------------

torch::Device resolve_device(const std::string& spec) {
  if (spec == "auto") return torch::cuda::is_available() ? torch::Device(torch::kCUDA, 0) : torch::kCPU;
  if (spec == "cpu") return torch::kCPU;
  const bool cuda = spec == "cuda" || spec.rfind("cuda:", 0) == 0;
  TORCH_CHECK(cuda, "unknown device '", spec, "': use auto, cpu, cuda or cuda:N");
  TORCH_CHECK(torch::cuda::is_available(), "device '", spec,
              "' asked for, but CUDA is not available here (no GPU, or a CPU-only LibTorch); "
              "set device to cpu or auto");
  int64_t index = 0;
  if (spec != "cuda") {
    const std::string digits = spec.substr(5);
    TORCH_CHECK(!digits.empty() && digits.find_first_not_of("0123456789") == std::string::npos,
                "bad device '", spec, "': use cuda:N with N a GPU index");
    index = std::stoll(digits);
  }
  const int64_t count = static_cast<int64_t>(torch::cuda::device_count());
  TORCH_CHECK(index < count, "device '", spec, "' does not exist: this machine has ", count,
              " CUDA device(s), cuda:0 to cuda:", count - 1);
  return torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(index));
}

nn::LanguageModel build_model(const RunConfig& c) {
  validate(c);
  if (c.model == "tiny") {
    return std::make_shared<nn::TinyAttentionLMImpl>(
        nn::TinyAttentionLMOptions(c.vocab_size, c.d_model, c.n_heads, c.effective_context())
            .fused_attention(c.fused_attention));
  }
  return std::make_shared<nn::TransformerLMImpl>(
      nn::TransformerLMOptions(c.vocab_size, c.effective_context(), c.d_model, c.n_heads, c.n_layers)
          .mlp_expansion(c.mlp_expansion)
          .dropout(c.dropout)
          .attn_dropout(c.attn_dropout)
          .bias(c.bias)
          .pre_ln(c.pre_ln)
          .tie_weights(c.tie_weights)
          .positions(nn::position_encoding_from_string(c.positions))
          .fused_attention(c.fused_attention));
}

double learning_rate_at(const RunConfig& c, int64_t step) {
  if (step < c.warmup_steps) return c.lr * static_cast<double>(step + 1) / c.warmup_steps;
  if (c.lr_schedule == "constant") return c.lr;
  const double span = std::max<int64_t>(1, c.total_steps() - c.warmup_steps);
  const double progress = std::min(1.0, (step - c.warmup_steps) / span);
  const double floor = c.lr * c.min_lr_ratio;
  return floor + 0.5 * (c.lr - floor) * (1.0 + std::cos(M_PI * progress));
}

// ---- evaluation --------------------------------------------------------------------

EvalMetrics evaluate(nn::LanguageModelImpl& model, data::Task& task, int64_t batches,
                     int64_t batch_size, uint64_t seed, torch::Device device) {
  TORCH_CHECK(batches >= 1 && batch_size >= 1, "evaluate: batches and batch_size must be >= 1");
  internal::TrainingModeGuard restore_mode(model);
  model.eval();
  torch::NoGradGuard no_grad;
  // Batches are drawn on the CPU from a seeded generator: the same data on any device.
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  double loss_sum = 0, scored_loss_sum = 0, correct = 0, exact = 0;
  int64_t positions = 0, scored = 0, rows = 0;
  for (int64_t i = 0; i < batches; ++i) {
    auto b = task.sample(batch_size, data::Split::validation, gen, torch::kCPU);
    auto inputs = b.inputs.to(device), targets = b.targets.to(device), mask = b.scored.to(device);
    auto logits = model.forward(inputs).logits.to(torch::kFloat32);  // (B, T, V)
    const int64_t B = logits.size(0), T = logits.size(1), V = logits.size(2);
    auto ce = torch::nn::functional::cross_entropy(
                  logits.reshape({-1, V}), targets.reshape({-1}),
                  torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kNone))
                  .view({B, T});                                       // (B, T)
    auto right = logits.argmax(-1).eq(targets);                        // (B, T)
    loss_sum += ce.sum().item<double>();
    scored_loss_sum += ce.masked_select(mask).sum().item<double>();
    correct += right.logical_and(mask).sum().item<double>();
    exact += right.logical_or(mask.logical_not()).all(1).sum().item<double>();
    positions += B * T;
    scored += mask.sum().item<int64_t>();
    rows += B;
  }
  EvalMetrics m;
  m.loss = loss_sum / positions;
  m.perplexity = std::exp(m.loss);
  m.scored_loss = scored > 0 ? scored_loss_sum / scored : 0.0;
  m.accuracy = scored > 0 ? correct / scored : 0.0;
  m.exact_match = exact / rows;
  m.tokens = scored;
  m.rows = rows;
  return m;
}

// ---- Trainer -----------------------------------------------------------------------

Trainer::Trainer(RunConfig config) : config_(std::move(config)), device_(torch::kCPU) {
  tinylm::validate(config_);
  internal::check_thread_count(config_.threads);
  device_ = resolve_device(config_.device);
  TORCH_CHECK(!config_.bf16 || device_.is_cuda(),
              "bf16 autocast needs a CUDA device: turn bf16 off or set device to cuda");
  // Before anything large is allocated: a run that cannot fit is refused here.
  check_memory(config_, config_.batch_size, /*training=*/true, device_.is_cuda());
  set_cpu_threads(static_cast<int>(config_.threads));
  torch::manual_seed(static_cast<uint64_t>(config_.seed));  // weights, dropout, CUDA data
  task_ = data::make_task(config_);
  TORCH_CHECK(task_->vocab_size() == config_.vocab_size, "task ", task_->name(), " has vocab ",
              task_->vocab_size(), " but vocab-size is ", config_.vocab_size);
  model_ = build_model(config_);
  model_->to(device_);
  data_gen_ = at::make_generator<at::CPUGeneratorImpl>(static_cast<uint64_t>(config_.seed) + 1);
  optimizer_ = make_optimizer(config_, *model_);
  // The reference model's whole loss as one op, where it applies (see fused_tiny_lm.h).
  auto* tiny = dynamic_cast<nn::TinyAttentionLMImpl*>(model_.get());
  if (config_.fused_attention && tiny && nn::fused_tiny_lm_supported(*tiny)) fused_tiny_ = tiny;
}

void Trainer::resume(const Checkpoint& ck) {
  load_model_state(ck, *model_);
  TORCH_CHECK(ck.config.optimizer == config_.optimizer, "checkpoint '", ck.path,
              "' was trained with optimizer '", ck.config.optimizer, "', not '", config_.optimizer,
              "': resume with optimizer ", ck.config.optimizer);
  load_optimizer_state(ck, *optimizer_);
  TORCH_CHECK(ck.state.step <= config_.total_steps(), "checkpoint '", ck.path, "' is at step ",
              ck.state.step, ", past this run's last step ", config_.total_steps(),
              ": raise epochs or steps-per-epoch to train further");
  state_ = ck.state;
  resumed_ = true;
  if (state_.data_rng_state.defined()) data_gen_.set_state(state_.data_rng_state);
  if (state_.torch_rng_state.defined()) {
    auto gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(state_.torch_rng_state);
  }
}

void Trainer::set_run_directory(std::shared_ptr<RunDirectory> dir) {
  TORCH_CHECK(dir, "Trainer::set_run_directory: no directory given");
  run_dir_ = std::move(dir);
  config_.out_dir = run_dir_->path();
}

void Trainer::sync_rng_state() {
  state_.data_rng_state = data_gen_.get_state();
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  state_.torch_rng_state = gen.get_state();
}

void Trainer::save(const std::string& path) {
  sync_rng_state();
  save_checkpoint(path, config_, *model_, optimizer_.get(), state_);
}

std::string Trainer::checkpoint_path(int64_t step) const {
  return (fs::path(config_.out_dir) / fmt::format("step-{:08d}.ckpt", step)).string();
}

void Trainer::write_step_checkpoint(FitResult& result) {
  const std::string path = checkpoint_path(state_.step);
  save(path);
  result.last_checkpoint = path;
  std::vector<fs::path> steps;
  for (const auto& e : fs::directory_iterator(config_.out_dir)) {
    const auto name = e.path().filename().string();
    if (name.rfind("step-", 0) == 0 && e.path().extension() == ".ckpt") steps.push_back(e.path());
  }
  std::sort(steps.begin(), steps.end());
  for (size_t i = 0; i + config_.keep_last < steps.size(); ++i) fs::remove(steps[i]);
}

void Trainer::append_metrics(const std::string& json_line) {
  std::ofstream out(fs::path(config_.out_dir) / "metrics.jsonl", std::ios::app);
  TORCH_CHECK(out, "cannot write ", (fs::path(config_.out_dir) / "metrics.jsonl").string());
  out << json_line << "\n";
}

EvalMetrics Trainer::validate() {
  return evaluate(*model_, *task_, config_.eval_batches, config_.batch_size,
                  static_cast<uint64_t>(config_.seed) + 1000003, device_);
}

double Trainer::train_step(double* grad_norm) {
  const double lr = learning_rate_at(config_, state_.step);
  optimizer_->zero_grad();
  double loss_value = 0;
  for (int64_t micro = 0; micro < config_.grad_accum; ++micro) {
    auto batch = task_->sample(config_.batch_size, data::Split::train, data_gen_, device_);
    torch::Tensor loss;
    if (fused_tiny_) {
      loss = nn::fused_tiny_lm_loss(*fused_tiny_, batch.inputs, batch.targets);
    } else {
      torch::Tensor logits;
      {
        AutocastGuard autocast(config_.bf16);
        logits = model_->forward(batch.inputs).logits;  // (B, T, V)
      }
      loss = lm_loss(logits, batch.targets);
    }
    if (config_.grad_accum > 1) loss = loss / static_cast<double>(config_.grad_accum);
    loss.backward();
    loss_value += loss.item<double>();
  }
  // Checked before the update, so the weights (and any checkpoint) stay good.
  TORCH_CHECK(std::isfinite(loss_value), "the loss became ", loss_value, " at step ",
              state_.step + 1, " (lr ", lr, "): training stopped. Try a lower lr, "
              "grad-clip 1.0, or warmup-steps");
  const double norm = config_.grad_clip > 0 ? optimizer_->clip_grad_norm(config_.grad_clip) : 0.0;
  if (grad_norm) *grad_norm = norm;
  optimizer_->step(lr);
  ++state_.step;
  return loss_value;
}

FitResult Trainer::fit(const std::atomic<bool>* stop) {
  const auto log = logger();
  const int64_t total = config_.total_steps();
  FitResult r;
  r.start_step = state_.step;

  // Claimed here unless the caller gave one; a claim made here is released on return.
  struct Release {
    std::shared_ptr<RunDirectory>* dir = nullptr;
    ~Release() {
      if (dir) dir->reset();
    }
  } release;
  if (!run_dir_) {
    const bool continuing = resumed_ || state_.step > 0;
    set_run_directory(std::make_shared<RunDirectory>(
        config_.out_dir, continuing ? RunDirMode::resume : RunDirMode::fresh, state_.step));
    release.dir = &run_dir_;
  }
  const fs::path metrics = fs::path(config_.out_dir) / "metrics.jsonl";
  {
    // A fresh run starts a fresh file; a resumed one keeps the records up to its step,
    // dropping any written after the checkpoint by a run that then died.
    std::vector<std::string> kept;
    if (state_.step > 0) {
      std::ifstream in(metrics);
      for (std::string line; std::getline(in, line);)
        if (step_of(line) <= state_.step) kept.push_back(line);
    }
    std::ofstream out(metrics, std::ios::trunc);
    TORCH_CHECK(out, "cannot write ", metrics.string());
    for (const auto& line : kept) out << line << "\n";
  }
  const fs::path best_path = fs::path(config_.out_dir) / "best.ckpt";

  const int64_t tokens_per_step = config_.batch_size * config_.seq_len * config_.grad_accum;
  const auto t_start = Clock::now();
  auto t_log = t_start;
  double interval_loss = 0;
  int64_t interval_steps = 0;
  model_->train();

  try {
    while (state_.step < total) {
      if (stop && stop->load()) {
        r.interrupted = true;
        write_step_checkpoint(r);
        log->info("interrupted at step {}: saved {}", state_.step, r.last_checkpoint);
        break;
      }
      const double lr = learning_rate_at(config_, state_.step);
      double loss_value = 0, grad_norm = 0;
      loss_value = train_step(&grad_norm);
      r.losses.push_back(loss_value);
      state_.epoch_loss_sum += loss_value;
      interval_loss += loss_value;
      ++interval_steps;

      const int64_t step = state_.step;
      const int64_t epoch = (step - 1) / config_.steps_per_epoch + 1;
      const bool epoch_end = step % config_.steps_per_epoch == 0;
      const bool last = step == total;

      if (step % config_.log_every == 0 || last) {
        StepRecord rec;
        rec.step = step;
        rec.total_steps = total;
        rec.epoch = epoch;
        rec.loss = interval_loss / interval_steps;
        rec.lr = lr;
        rec.grad_norm = grad_norm;
        rec.tokens_per_second = interval_steps * tokens_per_step / std::max(1e-9, seconds_since(t_log));
        rec.eta_seconds = (total - step) * seconds_since(t_start) / (step - r.start_step);
        log->info("step {:>6}/{} | epoch {}/{} | loss {:.6f} | lr {:.2e} | {:.0f} tok/s | ETA {:.0f}s",
                  step, total, epoch, config_.epochs, rec.loss, lr, rec.tokens_per_second,
                  rec.eta_seconds);
        append_metrics("{\"type\":\"train\",\"step\":" + std::to_string(step) +
                       ",\"epoch\":" + std::to_string(epoch) + ",\"loss\":" + json_number(loss_value) +
                       ",\"mean_loss\":" + json_number(rec.loss) + ",\"lr\":" + json_number(lr) +
                       ",\"grad_norm\":" + json_number(grad_norm) +
                       ",\"tokens_per_s\":" + json_number(rec.tokens_per_second) + "}");
        if (on_progress) on_progress(rec);
        t_log = Clock::now();
        interval_loss = 0;
        interval_steps = 0;
      }
      if (epoch_end) {
        const double mean = state_.epoch_loss_sum / config_.steps_per_epoch;
        r.epoch_losses.push_back(mean);
        log->info("epoch {}/{}: mean loss {:.6f}", epoch, config_.epochs, mean);
        append_metrics("{\"type\":\"epoch\",\"step\":" + std::to_string(step) + ",\"epoch\":" +
                       std::to_string(epoch) + ",\"loss\":" + json_number(mean) + "}");
        state_.epoch_loss_sum = 0;
      }
      const bool eval_due = (config_.eval_every > 0 ? step % config_.eval_every == 0 : epoch_end) || last;
      if (eval_due) {
        r.last_eval = validate();
        const auto& m = r.last_eval;
        log->info("validation at step {}: loss {:.6f} | ppl {:.4f} | accuracy {:.2f}% | exact match {:.2f}%",
                  step, m.loss, m.perplexity, 100 * m.accuracy, 100 * m.exact_match);
        append_metrics("{\"type\":\"eval\",\"step\":" + std::to_string(step) + ",\"loss\":" +
                       json_number(m.loss) + ",\"perplexity\":" + json_number(m.perplexity) +
                       ",\"scored_loss\":" + json_number(m.scored_loss) + ",\"accuracy\":" +
                       json_number(m.accuracy) + ",\"exact_match\":" + json_number(m.exact_match) + "}");
        if (m.loss < state_.best_val_loss) {
          state_.best_val_loss = m.loss;
          save(best_path.string());
          r.best_checkpoint = best_path.string();
        }
        r.solved = config_.stop_when_solved && task_->synthetic() && m.accuracy >= 1.0 &&
                   m.scored_loss < config_.solve_loss;
      }
      const bool save_due =
          (config_.save_every > 0 ? step % config_.save_every == 0 : epoch_end) || last || r.solved;
      if (save_due) write_step_checkpoint(r);
      if (r.solved) {
        log->info("solved at step {}: validation accuracy 100% and loss on predictable positions "
                  "{:.2e} < solve-loss {}", step, r.last_eval.scored_loss, config_.solve_loss);
        break;
      }
    }
  } catch (const c10::Error& e) {
    // Divergence, a full disk, a failed save: say which checkpoint is still good.
    const std::string& kept = r.last_checkpoint.empty() ? r.best_checkpoint : r.last_checkpoint;
    TORCH_CHECK(false, e.what_without_backtrace(), "; ",
                kept.empty() ? std::string("no checkpoint was written in this run")
                             : "the last good checkpoint is " + kept);
  }
  r.end_step = state_.step;
  if (r.best_checkpoint.empty() && fs::exists(best_path)) r.best_checkpoint = best_path.string();
  return r;
}

}  // namespace tinylm::train
