// Trainer, evaluation, and the device factory.
// B = batch, T = sequence length, V = vocab size
// Over 400 lines on purpose: the Trainer is one class; its loop, checkpoints, resume and
// data-parallel checks share its private state.
#include <tinylm/log.h>
#include <tinylm/nn/cpu_kernels.h>
#include <tinylm/train/optimizer.h>
#include <tinylm/train/trainer.h>

#include "internal/generator_scope.h"
#include "internal/crc32.h"
#include "internal/mode_guard.h"

#include <nlohmann/json.hpp>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/autocast_mode.h>
#include <ATen/record_function.h>
#include <torch/types.h>
#include <torch/utils.h>
#include <torch/version.h>
#include <torch/cuda.h>

#include <chrono>
#include <cmath>
#include <limits>
#include <filesystem>
#include <fstream>

namespace fs = std::filesystem;

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

/// The "step" of a metrics line, or -1 when the line is not a JSON object with one.
int64_t step_of(const std::string& line) {
  const auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return -1;
  const auto it = j.find("step");
  return it != j.end() && it->is_number_integer() ? it->get<int64_t>() : -1;
}

/// A JSON number, or null where it is NaN or infinite (JSON has neither).
nlohmann::json number(double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(); }

std::unique_ptr<Optimizer> make_optimizer(const OptimizerOptions& o, nn::LanguageModelImpl& model) {
  AdamConfig a;
  a.lr = o.lr();
  a.beta1 = o.beta1();
  a.beta2 = o.beta2();
  a.eps = o.eps();
  a.weight_decay = o.weight_decay();
  a.decoupled = o.kind() == OptimizerKind::adamw;
  a.decayed = o.decayed();
  return o.flat() ? make_flat_adam(model, a) : make_torch_adam(model, a);
}

}  // namespace

// ---- factory -----------------------------------------------------------------------

torch::Device resolve_device(const std::string& spec, int64_t local_rank) {
  if ((spec == "auto" || spec == "cuda") && local_rank >= 0 && torch::cuda::is_available()) {
    const int64_t count = static_cast<int64_t>(torch::cuda::device_count());
    return torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(local_rank % count));
  }
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

const OptionSpec<TrainerOptions>& TrainerOptions::spec() {
  using O = TrainerOptions;
  static const auto spec = [] {
    OptionSpec<O> s("TrainerOptions");
    s.group("optim");
    s.choice("optimizer", [](O& o) -> auto& { return o.optimizer().kind(); },
             {{"adam", OptimizerKind::adam}, {"adamw", OptimizerKind::adamw}},
             "adam or adamw (adamw: decay on what decay_params says, never biases or norms)");
    s.add("lr", [](O& o) -> auto& { return o.optimizer().lr(); }, "peak learning rate", positive());
    s.add("weight_decay", [](O& o) -> auto& { return o.optimizer().weight_decay(); }, "AdamW weight decay",
          non_negative());
    s.choice("decay_params", [](O& o) -> auto& { return o.optimizer().decayed(); },
             {{"linear", DecayedParameters::linear_weights}, {"matrices", DecayedParameters::matrices}},
             "what AdamW decays: linear (Linear weights) or matrices (every 2-D parameter, embeddings too: "
             "nanoGPT's)");
    s.add("beta1", [](O& o) -> auto& { return o.optimizer().beta1(); }, "Adam beta1", fraction());
    s.add("beta2", [](O& o) -> auto& { return o.optimizer().beta2(); }, "Adam beta2", fraction());
    s.add("eps", [](O& o) -> auto& { return o.optimizer().eps(); }, "Adam epsilon", positive());
    s.choice("lr_schedule", [](O& o) -> auto& { return o.schedule().kind(); },
             {{"constant", LRSchedule::constant}, {"cosine", LRSchedule::cosine}}, "constant or cosine (after warmup)");
    s.add("warmup_steps", [](O& o) -> auto& { return o.schedule().warmup_steps(); }, "linear warmup steps",
          at_least(0));
    s.add("min_lr_ratio", [](O& o) -> auto& { return o.schedule().min_lr_ratio(); },
          "cosine floor as a fraction of lr", unit_interval());
    s.add(TINYLM_OPTION(O, grad_clip), "max global gradient norm; 0 = off", non_negative());
    s.add(TINYLM_OPTION(O, grad_accum), "micro-batches per optimizer step", at_least(1));
    s.add("fused_optimizer", [](O& o) -> auto& { return o.optimizer().flat(); },
          "Adam/AdamW fused over one flat parameter buffer");
    s.add(TINYLM_OPTION(O, batch_size), "sequences per micro-batch", at_least(1));
    s.add(TINYLM_OPTION(O, epochs), "epochs", at_least(1));
    s.add(TINYLM_OPTION(O, steps_per_epoch), "optimizer steps per epoch", at_least(1));
    s.group("run");
    // Held unsigned; a config file's integers are signed, so its own rule asks for >= 0.
    s.field<int64_t>(
        "seed", [](const O& o) { return static_cast<int64_t>(o.seed()); },
        [](O& o, const int64_t& v) { o.seed(static_cast<uint64_t>(v)); }, "seed for weights, data and dropout");
    s.add(TINYLM_OPTION(O, bf16),
          "bfloat16: autocast on CUDA; on the CPU, products in bfloat16 with float32 weights and sums "
          "(needs AVX512-BF16 or AMX)");
    s.add(TINYLM_OPTION(O, log_every), "steps between progress lines", at_least(1));
    s.add(TINYLM_OPTION(O, eval_every), "steps between validations; 0 = once per epoch", at_least(0));
    s.add(TINYLM_OPTION(O, eval_batches), "batches per validation", at_least(1));
    s.add(TINYLM_OPTION(O, out_dir), "directory for checkpoints and metrics.jsonl");
    s.add(TINYLM_OPTION(O, save_every), "steps between checkpoints; 0 = once per epoch", at_least(0));
    s.add(TINYLM_OPTION(O, keep_last), "step checkpoints to keep (best.ckpt is extra)", at_least(1));
    s.add(TINYLM_OPTION(O, stop_when_solved), "stop once validation accuracy is 100% and loss < solve-loss");
    s.add(TINYLM_OPTION(O, solve_loss), "validation loss below which a solved task may stop", positive());
    s.rule([](const O& o, Spelling sp) {
      int64_t product = 0;
      if (!__builtin_mul_overflow(o.epochs(), o.steps_per_epoch(), &product)) return std::string();
      return c10::str(spell("epochs", sp), " ", o.epochs(), " x ", spell("steps_per_epoch", sp), " ",
                      o.steps_per_epoch(), " overflows the step counter (max ", std::numeric_limits<int64_t>::max(), ")");
    });
    return s;
  }();
  return spec;
}

void check_trainer_options(const TrainerOptions& o) {
  TrainerOptions::spec().check(o);
  TORCH_CHECK(!o.bf16() || o.device().is_cuda() || nn::bf16_products_missing().empty(),
              "TrainerOptions: bf16 on the CPU needs bfloat16 products, and ", nn::bf16_products_missing(),
              ": turn bf16 off (float32) or train on CUDA");
}

double learning_rate_at(const TrainerOptions& o, int64_t step) {
  const double lr = o.optimizer().lr();
  const auto& s = o.schedule();
  if (step < s.warmup_steps()) return lr * static_cast<double>(step + 1) / s.warmup_steps();
  if (s.kind() == LRSchedule::constant) return lr;
  const double span = std::max<int64_t>(1, o.total_steps() - s.warmup_steps());
  const double progress = std::min(1.0, (step - s.warmup_steps()) / span);
  const double floor = lr * s.min_lr_ratio();
  return floor + 0.5 * (lr - floor) * (1.0 + std::cos(M_PI * progress));
}

// ---- evaluation --------------------------------------------------------------------

EvalMetrics evaluate(nn::LanguageModelImpl& model, data::Task& task, int64_t batches,
                     int64_t batch_size, uint64_t seed, torch::Device device, ProcessGroup* group) {
  TORCH_CHECK(batches >= 1 && batch_size >= 1, "evaluate: batches and batch_size must be >= 1");
  const int64_t world = group ? group->world_size() : 1, rank = group ? group->rank() : 0;
  TORCH_CHECK(batch_size % world == 0, "evaluate: batch_size ", batch_size,
              " must be a multiple of the world size ", world);
  const int64_t rows_per_rank = batch_size / world;
  internal::TrainingModeGuard eval_mode(model, /*training=*/false);
  torch::NoGradGuard no_grad;
  // Batches are drawn on the CPU from a seeded generator: the same data on any device.
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  double loss_sum = 0, scored_loss_sum = 0, correct = 0, exact = 0;
  int64_t positions = 0, scored = 0, rows = 0;
  for (int64_t i = 0; i < batches; ++i) {
    auto b = task.sample(batch_size, data::Split::validation, gen);
    auto inputs = b.inputs.narrow(0, rank * rows_per_rank, rows_per_rank).to(device);  // this rank's rows
    auto targets = b.targets.narrow(0, rank * rows_per_rank, rows_per_rank).to(device);
    auto mask = b.scored.narrow(0, rank * rows_per_rank, rows_per_rank).to(device);
    const int64_t B = inputs.size(0), T = inputs.size(1), n_scored = mask.sum().item<int64_t>();
    // The losses come from the model's own loss(), the function training uses.
    loss_sum += model.loss(inputs, targets).item<double>() * static_cast<double>(B * T);
    if (n_scored > 0) {
      auto scored_targets = targets.masked_fill(mask.logical_not(), nn::kIgnoreTarget);
      scored_loss_sum += model.loss(inputs, scored_targets).item<double>() * static_cast<double>(n_scored);
    }
    auto right = model.forward(inputs).logits.argmax(-1).eq(targets);  // (B, T)
    correct += right.logical_and(mask).sum().item<double>();
    exact += right.logical_or(mask.logical_not()).all(1).sum().item<double>();
    positions += B * T;
    scored += n_scored;
    rows += B;
  }
  if (group && world > 1) {
    auto sums = torch::tensor({loss_sum, scored_loss_sum, correct, exact, static_cast<double>(positions),
                               static_cast<double>(scored), static_cast<double>(rows)},
                              torch::kFloat64);
    group->all_reduce_sum({sums});
    loss_sum = sums[0].item<double>();
    scored_loss_sum = sums[1].item<double>();
    correct = sums[2].item<double>();
    exact = sums[3].item<double>();
    positions = std::llround(sums[4].item<double>());
    scored = std::llround(sums[5].item<double>());
    rows = std::llround(sums[6].item<double>());
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

Trainer::Trainer(nn::LanguageModel model, std::shared_ptr<data::Task> task, TrainerOptions options)
    : options_(std::move(options)), model_(std::move(model)), task_(std::move(task)) {
  TORCH_CHECK(model_, "Trainer: no model given");
  TORCH_CHECK(task_, "Trainer: no task given");
  check_trainer_options(options_);
  TORCH_CHECK(task_->vocab_size() == model_->vocab_size(), "Trainer: task ", task_->name(),
              " has vocabulary ", task_->vocab_size(), " but the model's is ", model_->vocab_size());
  TORCH_CHECK(task_->seq_len() <= model_->context_length(), "Trainer: task ", task_->name(),
              " has sequences of ", task_->seq_len(), " tokens, longer than the model's context ",
              model_->context_length());
  if (const auto& group = options_.process_group()) {
    TORCH_CHECK(group->backend() != DistBackend::nccl || group->options().device == options_.device(),
                "Trainer: the process group moves tensors on ", group->options().device,
                " (NCCL) but the model trains on ", options_.device(), ": give both the same device");
    rank_ = group->rank();
    world_size_ = group->world_size();
    // Before the first collective: ranks built with different models or settings would
    // crash in it (different sizes) or train apart silently (different seeds or rates).
    const auto arch = model_->architecture();
    std::string model = arch.kind + " v" + std::to_string(arch.version);
    for (const auto& [k, v] : arch.options) model += " " + k + "=" + v;
    const auto& opt = options_.optimizer();
    const auto& schedule = options_.schedule();
    auto text = [](auto v) { return fmt::format("{}", v); };
    group->agree({
        {"the model", model},
        {"the task", task_->name() + ", vocabulary " + text(task_->vocab_size()) + ", sequences of " +
                         text(task_->seq_len())},
        {"seed", text(options_.seed())},
        {"batch-size", text(options_.batch_size())},
        {"grad-accum", text(options_.grad_accum())},
        {"epochs", text(options_.epochs())},
        {"steps-per-epoch", text(options_.steps_per_epoch())},
        {"the optimizer", fmt::format("{} lr={} betas=({}, {}) eps={} weight_decay={} decay_params={} flat={}",
                                      opt.kind() == OptimizerKind::adam ? "adam" : "adamw", opt.lr(), opt.beta1(),
                                      opt.beta2(), opt.eps(), opt.weight_decay(),
                                      opt.decayed() == DecayedParameters::matrices ? "matrices" : "linear",
                                      opt.flat())},
        {"the schedule", fmt::format("{} warmup={} min_lr_ratio={}",
                                     schedule.kind() == LRSchedule::constant ? "constant" : "cosine",
                                     schedule.warmup_steps(), schedule.min_lr_ratio())},
        {"grad-clip", text(options_.grad_clip())},
        {"bf16", text(options_.bf16())},
        {"the device type", c10::DeviceTypeName(options_.device().type())},
        {"eval-every", text(options_.eval_every())},
        {"eval-batches", text(options_.eval_batches())},
        {"save-every", text(options_.save_every())},
    });
  }
  model_->to(options_.device());
  if (options_.bf16() && !options_.device().is_cuda()) {
    // On the CPU: the model's products in bfloat16 (its kernel policy), nothing else.
    nn::use_bf16_products(*model_);
  }
  const uint64_t seed = options_.seed();
  // Every rank draws the same global batches and trains on its own rows of them.
  data_gen_ = at::make_generator<at::CPUGeneratorImpl>(seed + 1);
  dropout_rng_ = internal::seeded_generator_state(
      options_.device(), seed + 2 + 1000003 * static_cast<uint64_t>(rank_));
  optimizer_ = make_optimizer(options_.optimizer(), *model_);
  state_.world_size = world_size_;
  if (options_.process_group()) options_.process_group()->broadcast(optimizer_->parameters());
}

void Trainer::resume(const Checkpoint& ck) {
  load_model_state(ck, *model_);
  if (ck.optimizer_kind.empty()) {  // weights only (an import): the optimizer starts fresh
    if (lead())
      logger()->warn("checkpoint '{}' holds weights but no optimizer state (an import): the "
                     "optimizer starts fresh", ck.path);
  } else {
    load_optimizer_state(ck, *optimizer_);
  }
  TORCH_CHECK(ck.state.step <= options_.total_steps(), "checkpoint '", ck.path, "' is at step ",
              ck.state.step, ", past this run's last step ", options_.total_steps(),
              ": raise epochs or steps_per_epoch to train further");
  if (const auto& group = options_.process_group())
    group->agree({{"the checkpoint's step", std::to_string(ck.state.step)},
                  {"the checkpoint's world size", std::to_string(ck.state.world_size)}});
  const int64_t trained_by = ck.state.world_size;
  state_ = ck.state;
  state_.world_size = world_size_;
  resumed_ = true;
  if (trained_by != world_size_ && lead())
    logger()->warn("checkpoint '{}' was trained by {} process(es), this run has {}: training goes on "
                   "with a global batch of {} rows per micro-step (was {}), and its data order and "
                   "dropout masks differ from a {}-process continuation",
                   ck.path, trained_by, world_size_, options_.batch_size() * world_size_,
                   options_.batch_size() * trained_by, trained_by);
  if (options_.process_group()) options_.process_group()->broadcast(optimizer_->parameters());
  try {
    if (state_.data_rng_state.defined()) data_gen_.set_state(state_.data_rng_state);
    // Dropout states are saved from CPU runs only; a CUDA run continues with its own.
    if (state_.dropout_rng_state.defined() && options_.device().is_cpu()) {
      // One state per rank that trained it (a 1-D tensor: one process). A rank that did
      // not exist then starts a fresh stream, seeded from the seed, its rank and the step.
      auto saved = state_.dropout_rng_state.dim() == 2 ? state_.dropout_rng_state
                                                       : state_.dropout_rng_state.unsqueeze(0);
      if (rank_ < saved.size(0)) {
        auto candidate = saved[rank_].clone();
        { internal::GeneratorScope check(torch::kCPU, candidate); }  // throws if malformed
        dropout_rng_ = saved[rank_].clone();
      } else {
        dropout_rng_ = internal::seeded_generator_state(
            options_.device(), options_.seed() + 2 + 1000003 * static_cast<uint64_t>(rank_) +
                                   0x9E3779B97F4A7C15ull * static_cast<uint64_t>(state_.step));
      }
    }
  } catch (const c10::Error& e) {
    TORCH_CHECK(false, "checkpoint '", ck.path, "' holds a damaged generator state (",
                e.what_without_backtrace(), ")");
  }
}

void Trainer::set_run_directory(std::shared_ptr<RunDirectory> dir) {
  TORCH_CHECK(dir, "Trainer::set_run_directory: no directory given");
  run_dir_ = std::move(dir);
  options_.out_dir(run_dir_->path());
}

void Trainer::sync_rng_state() {
  state_.data_rng_state = data_gen_.get_state();
  state_.dropout_rng_state = torch::Tensor();
  if (!options_.device().is_cpu()) return;
  // Every rank draws its own dropout masks: a data-parallel checkpoint keeps them all,
  // one row per rank (a collective, so every rank comes here).
  const auto& group = options_.process_group();
  state_.dropout_rng_state = group && world_size_ > 1 ? group->all_gather(dropout_rng_) : dropout_rng_;
  if (group && world_size_ > 1) {
    // The ranks' weights must still be one model's: a checksum of each rank's, compared.
    uint32_t crc = 0;
    for (const auto& p : model_->parameters()) {
      const auto t = p.detach().to(torch::kCPU).contiguous();
      crc = internal::crc32(t.data_ptr(), static_cast<size_t>(t.nbytes())) ^ (crc * 16777619u);
    }
    const auto all = group->all_gather(torch::tensor({static_cast<int64_t>(crc)}));
    for (int64_t r = 1; r < world_size_; ++r)
      TORCH_CHECK(all[r].item<int64_t>() == all[0].item<int64_t>(), "rank ", rank_, " of ", world_size_,
                  ": at step ", state_.step, " the weights of rank ", r, " differ from rank 0's, so no checkpoint "
                  "is written: the ranks no longer train one model (a rank was changed or disturbed)");
  }
}

void Trainer::save(const std::string& path) {
  sync_rng_state();
  if (lead()) save_checkpoint(path, *model_, optimizer_.get(), state_, options_.recipe(), task_->tokenizer().get());
}

std::string Trainer::checkpoint_path(int64_t step) const {
  return (fs::path(options_.out_dir()) / RunDirectory::step_checkpoint_name(step)).string();
}

void Trainer::write_step_checkpoint(FitResult& result) {
  if (options_.out_dir().empty()) return;  // the same on every rank
  const std::string path = checkpoint_path(state_.step);
  sync_rng_state();  // on every rank: a collective in a data-parallel job
  result.last_checkpoint = path;
  if (!writes_files()) return;
  save_checkpoint(path, *model_, optimizer_.get(), state_, options_.recipe(), task_->tokenizer().get());
  const auto steps = RunDirectory::step_checkpoints(options_.out_dir());  // oldest first
  for (size_t i = 0; i + options_.keep_last() < steps.size(); ++i) fs::remove(steps[i]);
}

void Trainer::append_metrics(const std::string& json_line) {
  if (!writes_files()) return;
  const auto path = fs::path(options_.out_dir()) / "metrics.jsonl";
  std::ofstream out(path, std::ios::app);
  TORCH_CHECK(out, "cannot write ", path.string());
  out << json_line << "\n";
}

EvalMetrics Trainer::validation_metrics() {
  // The global batch (every rank's rows), so the figures do not depend on the number of
  // processes; each rank evaluates its own rows and the sums are reduced.
  return evaluate(*model_, *task_, options_.eval_batches(), options_.batch_size() * world_size_,
                  options_.seed() + 1000003, options_.device(), options_.process_group().get());
}

double Trainer::train_step(double* grad_norm) {
  const double lr = learning_rate_at(options_, state_.step);
  const int64_t accum = options_.grad_accum();
  const torch::Device device = options_.device();
  optimizer_->zero_grad();
  double loss_value = 0;
  for (int64_t micro = 0; micro < accum; ++micro) {
    const int64_t B = options_.batch_size();
    data::Batch batch;
    {
      RECORD_USER_SCOPE("tinylm::data");  // named for op profiles (tinylm bench)
      batch = task_->sample(B * world_size_, data::Split::train, data_gen_);
    }
    auto inputs = batch.inputs.narrow(0, B * rank_, B).to(device);  // this rank's rows
    auto targets = batch.targets.narrow(0, B * rank_, B).to(device);
    torch::Tensor loss;
    {
      // Dropout draws from the Trainer's generator, not the user's global one.
      internal::GeneratorScope dropout(device, dropout_rng_);
      {
        AutocastGuard autocast(options_.bf16());
        loss = model_->loss(inputs, targets);
      }
      if (accum > 1) loss = loss / static_cast<double>(accum);
      loss.backward();
    }
    loss_value += loss.item<double>();
  }
  if (const auto& group = options_.process_group()) {
    // Once per optimizer step: the mean gradient and the mean loss over all ranks.
    const auto start = Clock::now();
    group->all_reduce_mean(optimizer_->gradients());
    auto loss_mean = torch::full({1}, loss_value, torch::kFloat64);
    group->all_reduce_mean({loss_mean});
    loss_value = loss_mean.item<double>();
    communication_seconds_ += seconds_since(start);
  }
  // Checked before the update, so the weights (and any checkpoint) stay good.
  TORCH_CHECK(std::isfinite(loss_value), "the loss became ", loss_value, " at step ",
              state_.step + 1, " (lr ", lr, "): training stopped. Try a lower learning rate, "
              "gradient clipping (grad_clip 1.0) or warmup (warmup_steps)");
  {
    RECORD_USER_SCOPE("tinylm::optimizer");  // named for op profiles (tinylm bench)
    const double norm = optimizer_->clip_and_step(options_.grad_clip(), lr);
    if (grad_norm) *grad_norm = norm;
  }
  ++state_.step;
  return loss_value;
}

FitResult Trainer::fit(const std::atomic<bool>* stop) {
  const auto log = logger();
  const int64_t total = options_.total_steps();
  FitResult r;
  r.start_step = state_.step;

  // Claimed here unless the caller gave one; a claim made here is released on return.
  struct Release {
    std::shared_ptr<RunDirectory>* dir = nullptr;
    ~Release() {
      if (dir) dir->reset();
    }
  } release;
  if (!run_dir_ && writes_files()) {
    const bool continuing = resumed_ || state_.step > 0;
    set_run_directory(std::make_shared<RunDirectory>(
        options_.out_dir(), continuing ? RunDirMode::resume : RunDirMode::fresh, state_.step));
    release.dir = &run_dir_;
  }
  const fs::path metrics = fs::path(options_.out_dir()) / "metrics.jsonl";
  if (writes_files()) {
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
  const fs::path best_path = fs::path(options_.out_dir()) / "best.ckpt";

  // Tokens of the global batch: every rank's rows.
  const int64_t tokens_per_step =
      options_.batch_size() * task_->seq_len() * options_.grad_accum() * world_size_;
  const int64_t steps_per_epoch = options_.steps_per_epoch();
  // The steps the epoch's loss sum covers: those since the epoch began, unless the
  // checkpoint said otherwise (an import: none of nanoGPT's).
  if (state_.epoch_loss_steps < 0) state_.epoch_loss_steps = state_.step % steps_per_epoch;
  const auto t_start = Clock::now();
  auto t_log = t_start;
  double interval_loss = 0;
  int64_t interval_steps = 0;
  model_->train();

  try {
    while (state_.step < total) {
      bool stop_now = stop && stop->load();
      if (options_.process_group()) stop_now = options_.process_group()->any(stop_now);
      if (stop_now) {
        r.interrupted = true;
        write_step_checkpoint(r);
        if (lead()) log->info("interrupted at step {}: saved {}", state_.step, r.last_checkpoint);
        break;
      }
      const double lr = learning_rate_at(options_, state_.step);
      double loss_value = 0, grad_norm = 0;
      loss_value = train_step(&grad_norm);
      r.losses.push_back(loss_value);
      state_.epoch_loss_sum += loss_value;
      ++state_.epoch_loss_steps;
      interval_loss += loss_value;
      ++interval_steps;

      const int64_t step = state_.step;
      const int64_t epoch = (step - 1) / steps_per_epoch + 1;
      const bool epoch_end = step % steps_per_epoch == 0;
      const bool last = step == total;

      if (step % options_.log_every() == 0 || last) {
        StepRecord rec;
        rec.step = step;
        rec.total_steps = total;
        rec.epoch = epoch;
        rec.loss = interval_loss / interval_steps;
        rec.lr = lr;
        rec.grad_norm = grad_norm;
        rec.tokens_per_second = interval_steps * tokens_per_step / std::max(1e-9, seconds_since(t_log));
        rec.eta_seconds = (total - step) * seconds_since(t_start) / (step - r.start_step);
        if (lead()) log->info("step {:>6}/{} | epoch {}/{} | loss {:.6f} | lr {:.2e} | {:.0f} tok/s | ETA {:.0f}s",
                  step, total, epoch, options_.epochs(), rec.loss, lr, rec.tokens_per_second,
                  rec.eta_seconds);
        append_metrics(nlohmann::ordered_json{{"type", "train"}, {"step", step}, {"epoch", epoch},
                                              {"loss", number(loss_value)}, {"mean_loss", number(rec.loss)},
                                              {"lr", number(lr)}, {"grad_norm", number(grad_norm)},
                                              {"tokens_per_s", number(rec.tokens_per_second)}}
                           .dump());
        if (on_progress) on_progress(rec);
        t_log = Clock::now();
        interval_loss = 0;
        interval_steps = 0;
      }
      if (epoch_end) {
        const int64_t counted = std::max<int64_t>(1, state_.epoch_loss_steps);
        const double mean = state_.epoch_loss_sum / counted;
        r.epoch_losses.push_back(mean);
        if (lead()) {
          if (counted == steps_per_epoch) log->info("epoch {}/{}: mean loss {:.6f}", epoch, options_.epochs(), mean);
          else log->info("epoch {}/{}: mean loss {:.6f} (over its last {} steps: the earlier ones were not trained "
                         "here)", epoch, options_.epochs(), mean, counted);
        }
        append_metrics(nlohmann::ordered_json{{"type", "epoch"}, {"step", step}, {"epoch", epoch},
                                              {"loss", number(mean)}, {"steps", counted}}.dump());
        state_.epoch_loss_sum = 0;
        state_.epoch_loss_steps = 0;
      }
      const bool eval_due = (options_.eval_every() > 0 ? step % options_.eval_every() == 0 : epoch_end) || last;
      if (eval_due) {
        r.last_eval = validation_metrics();
        const auto& m = r.last_eval;
        if (lead()) log->info("validation at step {}: loss {:.6f} | ppl {:.4f} | accuracy {:.2f}% | exact match {:.2f}%",
                  step, m.loss, m.perplexity, 100 * m.accuracy, 100 * m.exact_match);
        append_metrics(nlohmann::ordered_json{{"type", "eval"}, {"step", step}, {"loss", number(m.loss)},
                                              {"perplexity", number(m.perplexity)},
                                              {"scored_loss", number(m.scored_loss)},
                                              {"accuracy", number(m.accuracy)},
                                              {"exact_match", number(m.exact_match)}}
                           .dump());
        if (m.loss < state_.best_val_loss) {
          state_.best_val_loss = m.loss;
          if (!options_.out_dir().empty()) sync_rng_state();  // on every rank
          if (writes_files()) {
            save_checkpoint(best_path.string(), *model_, optimizer_.get(), state_, options_.recipe(),
                            task_->tokenizer().get());
            r.best_checkpoint = best_path.string();
          }
        }
        r.solved = options_.stop_when_solved() && task_->synthetic() && m.accuracy >= 1.0 &&
                   m.scored_loss < options_.solve_loss();
      }
      const bool save_due =
          (options_.save_every() > 0 ? step % options_.save_every() == 0 : epoch_end) || last || r.solved;
      if (save_due) write_step_checkpoint(r);
      if (r.solved) {
        if (lead()) log->info("solved at step {}: validation accuracy 100% and loss on predictable positions "
                  "{:.2e} < solve_loss {}", step, r.last_eval.scored_loss, options_.solve_loss());
        break;
      }
    }
  } catch (const std::exception& e) {
    // Divergence, a full disk, a failed save, a lost peer: say which checkpoint is good.
    std::string why = e.what();
    if (auto* c10_error = dynamic_cast<const c10::Error*>(&e)) why = c10_error->what_without_backtrace();
    const std::string& kept = r.last_checkpoint.empty() ? r.best_checkpoint : r.last_checkpoint;
    TORCH_CHECK(false, why, "; ",
                kept.empty() ? std::string("no checkpoint was written in this run")
                             : "the last good checkpoint is " + kept);
  }
  r.end_step = state_.step;
  if (r.best_checkpoint.empty() && writes_files() && fs::exists(best_path))
    r.best_checkpoint = best_path.string();
  return r;
}

}  // namespace tinylm::train
