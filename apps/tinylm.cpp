// tinylm: the command-line tool. Thin front ends over the library:
//   tinylm train  [--config F] [--flags...] [--resume CKPT|DIR] [--print-config]
//   tinylm eval   CKPT|DIR [--json]
//   tinylm sample CKPT|DIR --prompt "..." [--heatmap]
//   tinylm prepare --data TEXT... --out DIR [--tokenizer bpe|unigram|byte] [--vocab-size N]
//   tinylm inspect | export | import | bench
#include "bench.h"

#include <tinylm/tinylm.h>
#include <tinylm/nn/cpu_kernels.h>
#include <tinylm/version.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <spdlog/fmt/fmt.h>
#include <spdlog/sinks/stdout_sinks.h>

#include <malloc.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

using namespace tinylm;

namespace {

std::atomic<bool> g_stop{false};

std::string shape(const torch::Tensor& t) {
  std::ostringstream os;
  os << t.sizes();
  return os.str();
}

/// Integer options also take exact decimal notation ("1e9", "64.0"), as people write
/// sizes; anything else is left for CLI11 to refuse.
const CLI::Validator kIntegerNotation(
    [](std::string& text) -> std::string {
      if (text.find_first_of("eE.") == std::string::npos) return {};
      char* end = nullptr;
      const double v = std::strtod(text.c_str(), &end);
      if (end == text.c_str() || *end != '\0' || !std::isfinite(v) || v != std::floor(v) ||
          std::abs(v) >= 9.2e18)
        return {};
      text = std::to_string(static_cast<long long>(v));
      return {};
    },
    "", "integer notation");

CLI::Option* integer(CLI::Option* opt) { return opt->transform(kIntegerNotation); }

void on_signal(int sig) {
  g_stop.store(true);
  std::signal(sig, SIG_DFL);  // a second Ctrl-C ends the process at once
}

// ---- train ---------------------------------------------------------------------------

struct TrainArgs {
  RunConfig flags;  // values bound to --name options (only those given are used)
  std::map<std::string, CLI::Option*> given;
  std::string config_path;
  std::string resume;
  bool print_config = false;
  bool overwrite = false;
  int64_t nproc = 1;           // > 1: start that many data-parallel workers on this host
  double dist_timeout = 60.0;  // seconds a rank waits for the others
  std::string dist_backend = "auto";  // auto, gloo or nccl
  std::vector<std::string> argv;  // the command line, for the workers --nproc starts
};

void add_config_options(CLI::App& cmd, TrainArgs& args) {
  for (const auto& f : config_fields()) {
    const std::string name = std::string("--") + f.name;
    const std::string help = std::string(f.help) + " [" + field_value_string(f, RunConfig{}) + "]";
    CLI::Option* opt = std::visit(
        [&](auto member) -> CLI::Option* {
          auto& v = args.flags.*member;
          using T = std::decay_t<decltype(v)>;
          if constexpr (std::is_same_v<T, bool>) {
            return cmd.add_flag(name + ",!--no-" + f.name, v, help);
          } else if constexpr (std::is_same_v<T, int64_t>) {
            return integer(cmd.add_option(name, v, help));
          } else {
            return cmd.add_option(name, v, help);
          }
        },
        f.member);
    opt->group(std::string("Run config (") + f.group + ")");
    args.given[f.name] = opt;
  }
}

/// defaults <- config file <- flags given on the command line. `out_dir_chosen`: whether
/// the config file or a flag named the out-dir.
RunConfig effective_config(const TrainArgs& args, RunConfig base, bool* out_dir_chosen = nullptr) {
  std::vector<std::string> from_file;
  if (!args.config_path.empty()) from_file = apply_toml_file(base, args.config_path);
  for (const auto& f : config_fields()) {
    if (args.given.at(f.name)->count() > 0) copy_field(f, args.flags, base);
  }
  if (out_dir_chosen) {
    *out_dir_chosen = args.given.at("out-dir")->count() > 0 ||
                      std::find(from_file.begin(), from_file.end(), "out-dir") != from_file.end();
  }
  validate(base);
  return base;
}

/// The first of runs/default, runs/default-2, ... that holds no run: `tinylm train`
/// with no out-dir never lands on an earlier run.
std::string fresh_default_out_dir(const std::string& base) {
  for (int i = 1; i < 10000; ++i) {
    const std::string dir = i == 1 ? base : base + "-" + std::to_string(i);
    if (train::RunDirectory::run_files(dir).empty()) return dir;
  }
  TORCH_CHECK(false, "runs/default-2 to -9999 all hold runs: choose an out-dir with --out-dir");
}

/// Claims the run's out-dir: an earlier run there is refused unless it is the one being
/// resumed or --overwrite was given.
std::shared_ptr<train::RunDirectory> claim_out_dir(const TrainArgs& args, const RunConfig& cfg,
                                                   const train::Checkpoint* resumed) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const bool same_dir = resumed && fs::exists(cfg.out_dir, ec) &&
                        fs::equivalent(fs::path(resumed->path).parent_path().empty()
                                           ? fs::path(".")
                                           : fs::path(resumed->path).parent_path(),
                                       cfg.out_dir, ec);
  if (args.overwrite) {
    TORCH_CHECK(!same_dir, "--overwrite would delete the run being resumed from (", resumed->path,
                "): resume into another --out-dir, or drop --overwrite");
    return std::make_shared<train::RunDirectory>(cfg.out_dir, train::RunDirMode::overwrite);
  }
  if (same_dir) {
    return std::make_shared<train::RunDirectory>(cfg.out_dir, train::RunDirMode::resume,
                                                 resumed->state.step);
  }
  try {
    return std::make_shared<train::RunDirectory>(cfg.out_dir, train::RunDirMode::fresh);
  } catch (const c10::Error& e) {
    const std::string what = e.what_without_backtrace();
    if (what.find("already holds a run") == std::string::npos) throw;
    TORCH_CHECK(false, "--out-dir ", cfg.out_dir, " already holds a run: continue it with --resume ",
                cfg.out_dir, ", choose another --out-dir, or pass --overwrite to replace it");
  }
}

void print_model_facts(const RunConfig& cfg, nn::LanguageModelImpl& model, torch::Device device) {
  auto log = logger();
  std::ostringstream name;
  model.pretty_print(name);
  log->info("model: {} | {} parameters | device {} | {} intra-op thread(s)", name.str(),
            nn::count_parameters(model), device.str(), at::get_num_threads());
  if (device.is_cpu()) log->info("cpu kernels: {}", nn::cpu_kernels_description());
  log->info("task: {} | vocab {} | seq_len {} | batch {} x {} accum | {} epochs x {} steps | {} lr {}",
            cfg.task, cfg.vocab_size, cfg.seq_len, cfg.batch_size, cfg.grad_accum, cfg.epochs,
            cfg.steps_per_epoch, cfg.optimizer, cfg.lr);
}

/// A seeded validation batch of `rows` rows and the model's output on it, with attention
/// weights, in eval mode without gradients (the model's mode is restored).
std::pair<data::Batch, nn::LMOutput> look_at_batch(train::Trainer& trainer, int64_t rows,
                                                   uint64_t seed) {
  auto& model = *trainer.model();
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  auto batch = trainer.task().sample(rows, data::Split::validation, gen);
  torch::NoGradGuard no_grad;
  const bool was_training = model.is_training();
  model.eval();
  auto out = model.forward(batch.inputs.to(trainer.device()), /*return_weights=*/true);
  model.train(was_training);
  return {batch, out};
}

/// The reference demo's checks on one batch: shape contract and causal check.
void print_contracts(train::Trainer& trainer) {
  auto log = logger();
  auto [batch, out] = look_at_batch(trainer, trainer.options().batch_size(), 0);
  log->info("shape contract: ids {} -> logits {}, attention {} x {}", shape(batch.inputs),
            shape(out.logits), out.attention.size(), shape(out.attention.front()));
  CausalCheck worst;
  for (const auto& w : out.attention) {
    auto c = causal_check(w);
    worst.future_weight_sum = std::max(worst.future_weight_sum, c.future_weight_sum);
    worst.max_row_error = std::max(worst.max_row_error, c.max_row_error);
  }
  const bool ok = worst.future_weight_sum < 1e-5 && worst.max_row_error < 1e-5;
  log->info("causal check: future weight sum {:.3e} (< 1e-5), max |row sum - 1| {:.3e} (< 1e-5): {}",
            worst.future_weight_sum, worst.max_row_error, ok ? "ok" : "FAILED");
}

void print_heatmap(train::Trainer& trainer) {
  auto [batch, out] = look_at_batch(trainer, 1, 1);
  logger()->info("attention of head 0 (layer {}) on one sample: {}\n{}", out.attention.size() - 1,
                 trainer.task().decode(batch.inputs), ascii_heatmap(out.attention.back()[0][0]));
}

// ---- data-parallel launch -------------------------------------------------------------

std::atomic<int> g_forward_signal{0};
void on_launcher_signal(int sig) { g_forward_signal.store(sig); }

/// `tinylm train --nproc N ...`: N copies of this command (without --nproc) as ranks
/// 0..N-1 of one job on this host, torchrun's variables set. Signals are forwarded; when
/// a worker fails, the others are stopped; the status is the first failure's.
int launch_workers(const TrainArgs& args) {
  TORCH_CHECK(!std::getenv("WORLD_SIZE"), "--nproc and a WORLD_SIZE environment variable "
              "together: use one (--nproc starts the workers itself)");
  TORCH_CHECK(args.nproc <= 1024, "--nproc ", args.nproc, " is more than 1024 workers");
  std::vector<std::string> worker_args;
  for (size_t i = 0; i < args.argv.size(); ++i) {
    if (args.argv[i] == "--nproc") { ++i; continue; }
    if (args.argv[i].rfind("--nproc=", 0) == 0) continue;
    worker_args.push_back(args.argv[i]);
  }
  std::vector<char*> cargv;
  for (auto& a : worker_args) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  const std::string port = std::to_string(train::free_loopback_port());
  // The workers meet through a file in a directory of this user's (FileStore): nothing
  // listens on the network but Gloo, on 127.0.0.1.
  std::string store_dir = (std::filesystem::temp_directory_path() / "tinylm-job-XXXXXX").string();
  TORCH_CHECK(::mkdtemp(store_dir.data()), "--nproc: cannot make a directory in ",
              std::filesystem::temp_directory_path().string(), ": ", std::strerror(errno));
  struct RemoveDir {
    std::string dir;
    ~RemoveDir() {
      std::error_code ec;
      std::filesystem::remove_all(dir, ec);
    }
  } remove_store_dir{store_dir};
  const std::string store_file = store_dir + "/store";
  std::signal(SIGINT, on_launcher_signal);
  std::signal(SIGTERM, on_launcher_signal);
  std::vector<pid_t> workers;
  for (int64_t rank = 0; rank < args.nproc; ++rank) {
    const pid_t pid = ::fork();
    TORCH_CHECK(pid >= 0, "--nproc: cannot start worker ", rank, ": ", std::strerror(errno));
    if (pid == 0) {
      std::signal(SIGINT, SIG_DFL);
      std::signal(SIGTERM, SIG_DFL);
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // no orphaned workers if the launcher is killed
      if (::getppid() == 1) ::_exit(137);  // it died before that was set
      ::setenv("RANK", std::to_string(rank).c_str(), 1);
      ::setenv("LOCAL_RANK", std::to_string(rank).c_str(), 1);
      ::setenv("WORLD_SIZE", std::to_string(args.nproc).c_str(), 1);
      ::setenv("MASTER_ADDR", "127.0.0.1", 1);
      ::setenv("MASTER_PORT", port.c_str(), 1);
      ::setenv("TINYLM_STORE_FILE", store_file.c_str(), 1);
      ::execv("/proc/self/exe", cargv.data());
      std::fprintf(stderr, "error: --nproc: cannot start worker %lld: %s\n",
                   static_cast<long long>(rank), std::strerror(errno));
      ::_exit(127);
    }
    workers.push_back(pid);
  }
  int status_out = 0;
  size_t running = workers.size();
  auto stop_all = [&](int sig) {
    for (pid_t pid : workers)
      if (pid > 0) ::kill(pid, sig);
  };
  // After a failure the others get SIGTERM (and SIGCONT, should one be stopped); those
  // still running after the collective timeout and a margin are killed, and named.
  using Clock = std::chrono::steady_clock;
  std::optional<Clock::time_point> kill_at;
  while (running > 0) {
    if (const int sig = g_forward_signal.exchange(0)) stop_all(sig);
    if (kill_at && Clock::now() >= *kill_at) {
      for (size_t i = 0; i < workers.size(); ++i)
        if (workers[i] > 0) {
          std::fprintf(stderr, "error: worker rank %zu did not stop within %.0f s; killing it\n", i,
                       args.dist_timeout + 10);
          ::kill(workers[i], SIGKILL);
        }
      kill_at.reset();
    }
    int status = 0;
    const pid_t done = ::waitpid(-1, &status, WNOHANG);
    if (done <= 0) {
      ::usleep(20000);
      continue;
    }
    for (size_t i = 0; i < workers.size(); ++i) {
      if (workers[i] != done) continue;
      workers[i] = -1;
      --running;
      const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      if (code != 0 && status_out == 0) {
        status_out = code;
        std::fprintf(stderr, "error: worker rank %zu %s %d; stopping the other workers\n", i,
                     WIFEXITED(status) ? "exited with status" : "was killed by signal",
                     WIFEXITED(status) ? code : WTERMSIG(status));
        stop_all(SIGTERM);
        stop_all(SIGCONT);
        kill_at = Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(
                                     (args.dist_timeout + 10) * 1000));
      }
    }
  }
  return status_out;
}

/// The checkpoint a command names (a file, or a run directory's newest). Format 1 is
/// refused here with the command that converts a trusted file.
train::Checkpoint open_checkpoint(const std::string& file_or_dir) {
  const auto path = train::resolve_checkpoint_path(file_or_dir);
  TORCH_CHECK(train::checkpoint_format_version(path) != 1, "checkpoint '", path,
              "' is in format 1, a LibTorch archive: LibTorch's loader for those is safe for trusted files only, "
              "so tinylm does not read them by default. If you trust this file, convert it once: tinylm upgrade ",
              path, " --out NEW.ckpt");
  return train::read_checkpoint(path);
}

/// The run a `tinylm train` command line describes: its config file or the checkpoint it
/// resumes (read into `ck`), with the flags given on top.
RunConfig run_config_of(const TrainArgs& args, std::optional<train::Checkpoint>& ck, bool& out_dir_chosen) {
  RunConfig cfg;
  if (!args.resume.empty()) {
    TORCH_CHECK(args.config_path.empty(), "--config and --resume together: a checkpoint carries "
                "its own config; override single keys with flags instead");
    ck = open_checkpoint(args.resume);
    const RunConfig stored = config_from_checkpoint(*ck);
    cfg = effective_config(args, stored, &out_dir_chosen);
    // A checkpoint without optimizer state (an import) may continue with any optimizer.
    TORCH_CHECK(ck->optimizer_kind.empty() || cfg.optimizer == stored.optimizer, "checkpoint '", ck->path,
                "' was trained with optimizer '", stored.optimizer, "', not '", cfg.optimizer,
                "': resume with optimizer ", stored.optimizer);
    // A resumed run writes next to the checkpoint it resumes (a copied run directory
    // stays the copy), never into the directory stored in the checkpoint.
    if (!out_dir_chosen) {
      const auto dir = std::filesystem::path(ck->path).parent_path();
      cfg.out_dir = dir.empty() ? "." : dir.string();
    }
  } else {
    cfg = effective_config(args, RunConfig{}, &out_dir_chosen);
    if (!out_dir_chosen && !args.overwrite) cfg.out_dir = fresh_default_out_dir(cfg.out_dir);
  }
  return cfg;
}

int run_train(const TrainArgs& args) {
  TORCH_CHECK(args.nproc >= 1, "--nproc must be >= 1, got ", args.nproc);
  TORCH_CHECK(std::isfinite(args.dist_timeout) && args.dist_timeout > 0,
              "--dist-timeout must be > 0 seconds, got ", args.dist_timeout);
  TORCH_CHECK(args.dist_backend == "auto" || args.dist_backend == "gloo" || args.dist_backend == "nccl",
              "--dist-backend must be auto, gloo or nccl, got '", args.dist_backend, "'");
  if (args.dist_backend == "nccl" && !args.print_config) {
    // NCCL needs a build that has it and a model on CUDA: refused here, once, rather than
    // by every worker after the workers started.
    std::optional<train::Checkpoint> ck;
    bool out_dir_chosen = false;
    train::DistributedOptions probe;
    probe.backend = train::DistBackend::nccl;
    probe.device = train::resolve_device(run_config_of(args, ck, out_dir_chosen).device, 0);
    train::resolve_backend(probe);
  }
  if (args.nproc > 1 && !args.print_config) return launch_workers(args);
  std::optional<train::DistributedOptions> dist = train::distributed_from_environment();
  const bool lead = !dist || dist->rank == 0;
  if (!lead) logger()->set_level(spdlog::level::warn);  // rank 0 speaks for the job
  std::optional<train::Checkpoint> ck;
  bool out_dir_chosen = false;
  RunConfig cfg = run_config_of(args, ck, out_dir_chosen);
  if (args.print_config) {
    std::cout << to_toml(cfg);
    return 0;
  }
  // Every check before any output: settings, memory, data, threads, checkpoint fit, out-dir.
  std::shared_ptr<train::ProcessGroup> group;
  if (dist) {
    // c10d logs connection retries and timeouts through LibTorch's own logger, several
    // lines each; the error tinylm reports says it in one. Keep them unless asked for.
    if (!std::getenv("TORCH_CPP_LOG_LEVEL")) {
      ::setenv("TORCH_CPP_LOG_LEVEL", "FATAL", 1);
      c10::initLogging();
    }
    dist->timeout_seconds = args.dist_timeout;
    dist->backend = train::parse_dist_backend(args.dist_backend);
    dist->device = train::resolve_device(cfg.device, dist->local_rank);
    group = train::ProcessGroup::connect(*dist);
  }
  train::Trainer trainer = make_trainer(cfg, group);
  set_cpu_threads(cfg.threads);
  if (ck) trainer.resume(*ck);
  if (lead) trainer.set_run_directory(claim_out_dir(args, cfg, ck ? &*ck : nullptr));
  if (group) group->barrier();  // no rank trains before rank 0 has claimed the out-dir
  print_model_facts(cfg, *trainer.model(), trainer.device());
  if (group) {
    const bool nccl = group->backend() == train::DistBackend::nccl;
    logger()->info("data-parallel: {} processes (c10d {}{}) | global batch {} = {} x {} processes x {} accumulation",
                   group->world_size(), nccl ? "NCCL" : "Gloo",
                   nccl || !trainer.device().is_cuda() ? ""
                   : train::nccl_available()          ? ", CUDA tensors through host memory"
                                                      : ", CUDA tensors through host memory: this build has no NCCL",
                   cfg.batch_size * group->world_size() * cfg.grad_accum,
                   cfg.batch_size, group->world_size(), cfg.grad_accum);
  }
  if (ck) logger()->info("resumed from {} at step {}", ck->path, ck->state.step);
  if (lead) print_contracts(trainer);

  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  auto result = trainer.fit(&g_stop);
  std::signal(SIGINT, SIG_DFL);
  std::signal(SIGTERM, SIG_DFL);

  auto log = logger();
  if (result.interrupted) {
    log->info("stopped by signal at step {}; resume with: tinylm train --resume {}",
              result.end_step, result.last_checkpoint);
    return 130;
  }
  const auto& m = result.last_eval;
  log->info("final: train loss {:.6f} | validation loss {:.6f} | accuracy {:.2f}% | exact match {:.2f}%",
            result.losses.empty() ? 0.0 : result.losses.back(), m.loss, 100 * m.accuracy,
            100 * m.exact_match);
  if (lead && cfg.seq_len <= 32) print_heatmap(trainer);  // wider ones do not fit a terminal
  log->info("checkpoints: last {} | best {} | metrics {}/metrics.jsonl", result.last_checkpoint,
            result.best_checkpoint, cfg.out_dir);
  return 0;
}

// ---- eval and sample -----------------------------------------------------------------

struct LoadedRun {
  train::Checkpoint checkpoint;
  RunConfig config;  // the one it was trained with
  nn::LanguageModel model;
  std::unique_ptr<data::Task> task;  // only when the data is needed (eval)
  std::shared_ptr<const data::Tokenizer> tokenizer;
  torch::Device device = torch::kCPU;
};

/// The checkpoint's own tokenizer; for one written before tokenizers were stored, the
/// one its task implies (bytes for text, the corpus's for tokens, ids otherwise).
std::shared_ptr<const data::Tokenizer> tokenizer_of(const LoadedRun& run) {
  if (auto stored = train::checkpoint_tokenizer(run.checkpoint)) return stored;
  if (run.task) return run.task->tokenizer();
  if (run.config.task == "text") return data::byte_tokenizer();
  TORCH_CHECK(run.config.task != "tokens", "checkpoint '", run.checkpoint.path,
              "' carries no tokenizer (written by an older tinylm): pass --data DIR, the prepared corpus"
              " it was trained on");
  return data::ids_tokenizer(run.model->vocab_size());
}

LoadedRun load_run(const std::string& path, const std::string& device, int64_t threads,
                   const std::string& data_override, bool need_data) {
  TORCH_CHECK(threads >= 0, "--threads must be >= 0 (0 = LibTorch's default), got ", threads);
  set_cpu_threads(threads);
  LoadedRun run;
  run.checkpoint = open_checkpoint(path);
  run.config = config_from_checkpoint(run.checkpoint);
  auto& cfg = run.config;
  if (!data_override.empty()) cfg.data = data_override;
  run.device = train::resolve_device(device);
  train::check_memory(cfg, 1, /*training=*/false, run.device.is_cuda());
  run.model = nn::build_model(run.checkpoint.architecture);
  train::load_model_state(run.checkpoint, *run.model);
  run.model->to(run.device);
  run.model->eval();
  const bool has_tokenizer = !run.checkpoint.tokenizer_kind.empty();
  if (need_data || (cfg.task == "tokens" && !has_tokenizer)) {
    try {
      run.task = make_task(cfg);
    } catch (const c10::Error& e) {
      const bool file_data = cfg.task == "text" || cfg.task == "tokens";
      TORCH_CHECK(false, e.what_without_backtrace(),
                  file_data && data_override.empty() ? " (the checkpoint's data; pass --data PATH if it moved)" : "");
    }
  }
  run.tokenizer = tokenizer_of(run);
  if (run.task && has_tokenizer)
    TORCH_CHECK(run.task->tokenizer()->kind() == run.tokenizer->kind() &&
                    run.task->tokenizer()->model_bytes() == run.tokenizer->model_bytes(),
                "checkpoint '", run.checkpoint.path, "' was trained with another tokenizer than the data '",
                cfg.data, "' (", run.tokenizer->describe(), " vs ", run.task->tokenizer()->describe(),
                "): pass --data with the corpus it was trained on");
  TORCH_CHECK(run.tokenizer->vocab_size() <= run.model->vocab_size(), "checkpoint '", run.checkpoint.path,
              "': its tokenizer has ", run.tokenizer->vocab_size(), " tokens, more than the model's vocabulary ",
              run.model->vocab_size());
  return run;
}

struct EvalArgs {
  std::string checkpoint, device = "auto", data;
  int64_t batches = 50, batch_size = 0, seed = 1234, threads = 1;
  bool json = false;
};

int run_eval(const EvalArgs& a) {
  TORCH_CHECK(a.batches >= 1, "--batches must be >= 1, got ", a.batches);
  TORCH_CHECK(a.batch_size >= 0, "--batch-size must be >= 1 (0 = the checkpoint's), got ", a.batch_size);
  TORCH_CHECK(a.seed >= 0, "--seed must be >= 0, got ", a.seed);
  auto run = load_run(a.checkpoint, a.device, a.threads, a.data, /*need_data=*/true);
  const auto& cfg = run.config;
  const int64_t bs = a.batch_size > 0 ? a.batch_size : cfg.batch_size;
  train::check_memory(cfg, bs, /*training=*/false, run.device.is_cuda());
  auto m = train::evaluate(*run.model, *run.task, a.batches, bs, static_cast<uint64_t>(a.seed), run.device);
  // Bits per byte of text: comparable across tokenizers (a byte model's is loss / ln 2).
  const double bytes_per_token = run.task->bytes_per_token(data::Split::validation);
  const double bits_per_byte = bytes_per_token > 0 ? m.loss / std::log(2.0) / bytes_per_token : 0;
  if (a.json) {
    nlohmann::ordered_json line = {
        {"checkpoint", run.checkpoint.path}, {"step", run.checkpoint.state.step},
        {"task", cfg.task}, {"model", cfg.model}, {"loss", m.loss}, {"perplexity", m.perplexity},
        {"accuracy", m.accuracy}, {"exact_match", m.exact_match}, {"tokens", m.tokens},
        {"rows", m.rows}};
    if (bytes_per_token > 0) line["bits_per_byte"] = bits_per_byte;
    std::printf("%s\n", line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    return 0;
  }
  std::printf("checkpoint %s: step %lld, task %s, model %s, %lld parameters\n",
              run.checkpoint.path.c_str(), static_cast<long long>(run.checkpoint.state.step),
              cfg.task.c_str(), cfg.model.c_str(), static_cast<long long>(nn::count_parameters(*run.model)));
  std::printf("loss %.6f | perplexity %.4f | accuracy %.2f%% (%lld tokens) | exact match %.2f%% (%lld rows)\n",
              m.loss, m.perplexity, 100 * m.accuracy, static_cast<long long>(m.tokens),
              100 * m.exact_match, static_cast<long long>(m.rows));
  if (bytes_per_token > 0)
    std::printf("%.4f bits per byte (%.4f nats per token, %.3f bytes of text per token; %s)\n", bits_per_byte,
                m.loss, bytes_per_token, run.tokenizer->describe().c_str());
  return 0;
}

// ---- inspect ---------------------------------------------------------------------------

struct InspectArgs {
  std::string checkpoint;
  bool verify = false, json = false;
};

/// "[64, 32]"
std::string shape_text(const torch::Tensor& t) {
  std::string out = "[";
  for (int64_t i = 0; i < t.dim(); ++i) out += (i ? ", " : "") + std::to_string(t.size(i));
  return out + "]";
}

/// PyTorch's spelling: float32, int64, ...
std::string dtype_name(torch::ScalarType t) {
  switch (t) {
    case torch::kFloat: return "float32";
    case torch::kDouble: return "float64";
    case torch::kHalf: return "float16";
    case torch::kBFloat16: return "bfloat16";
    case torch::kLong: return "int64";
    case torch::kInt: return "int32";
    case torch::kByte: return "uint8";
    default: return c10::toString(t);
  }
}

/// 1234567 -> "1,234,567"
std::string grouped(int64_t n) {
  std::string digits = std::to_string(n), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

/// Reading the file checks its header, size, checksum and every entry; --verify also
/// rebuilds the model from its architecture, loads the weights (names, shapes, dtypes,
/// finite values) and runs one forward pass.
int run_inspect(const InspectArgs& a) {
  const auto ck = open_checkpoint(a.checkpoint);
  const auto bytes = static_cast<int64_t>(std::filesystem::file_size(ck.path));
  std::string verified;
  if (a.verify) {
    auto model = nn::build_model(ck.architecture);
    train::load_model_state(ck, *model);
    model->eval();
    torch::NoGradGuard no_grad;
    const int64_t T = std::max<int64_t>(1, std::min<int64_t>(8, model->context_length()));
    auto logits = model->forward(torch::zeros({1, T}, torch::kLong)).logits;
    TORCH_CHECK(logits.isfinite().all().item<bool>(), "checkpoint '", ck.path,
                "': the rebuilt model gives non-finite logits");
    verified = "model rebuilt from its architecture, " + std::to_string(ck.parameter_names.size()) +
               " weights fit, logits of a 1 x " + std::to_string(T) + " batch finite";
  }
  const auto& st = ck.state;
  int64_t total = 0;
  nlohmann::ordered_json params = nlohmann::ordered_json::array();
  for (const auto& name : ck.parameter_names) {
    const auto& t = ck.model.at(name);
    total += t.numel();
    params.push_back({{"name", name}, {"shape", t.sizes().vec()},
                      {"dtype", dtype_name(t.scalar_type())}, {"count", t.numel()},
                      {"norm", t.to(torch::kFloat64).norm().item<double>()}});
  }
  nlohmann::ordered_json options = nlohmann::ordered_json::object();
  for (const auto& [k, v] : ck.architecture.options) options[k] = v;
  auto generator_bytes = [](const torch::Tensor& t) { return t.defined() ? t.numel() : int64_t{0}; };
  // One dropout stream per rank that trained it.
  const int64_t dropout_streams =
      st.dropout_rng_state.defined() ? (st.dropout_rng_state.dim() == 2 ? st.dropout_rng_state.size(0) : 1) : 0;
  // Built (and so checked) only for what it says; a SentencePiece model needs its module.
  std::string tokenizer =
      "none stored (an import without --tokenizer, or written before tinylm stored tokenizers): the task's own symbols";
  nlohmann::ordered_json tokenizer_json = nullptr;
  if (!ck.tokenizer_kind.empty()) {
    tokenizer = ck.tokenizer_kind + " (" + std::to_string(ck.tokenizer_model.size()) + " bytes of model)";
    tokenizer_json = {{"kind", ck.tokenizer_kind}, {"model_bytes", ck.tokenizer_model.size()}};
    if (a.verify) {
      const auto t = train::checkpoint_tokenizer(ck);
      tokenizer = t->describe();
      tokenizer_json["vocab_size"] = t->vocab_size();
    }
  }
  if (a.json) {
    nlohmann::ordered_json j = {
        {"path", ck.path}, {"bytes", bytes}, {"format_version", ck.format_version},
        {"tinylm_version", ck.tinylm_version}, {"checksum", "ok"},
        {"step", st.step}, {"world_size", st.world_size},
        {"best_val_loss", st.best_val_loss < 1e299 ? nlohmann::ordered_json(st.best_val_loss) : nullptr},
        {"model", {{"kind", ck.architecture.kind}, {"version", ck.architecture.version}, {"options", options}}},
        {"tokenizer", tokenizer_json}, {"parameter_count", total}, {"parameters", params},
        {"optimizer", {{"kind", ck.optimizer_kind}, {"tensors", ck.optimizer.size()}}},
        {"generators", {{"data_bytes", generator_bytes(st.data_rng_state)},
                        {"dropout_streams", dropout_streams},
                        {"dropout_bytes", generator_bytes(st.dropout_rng_state)}}},
        {"recipe", ck.recipe}};
    if (a.verify) j["verified"] = verified;
    std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    return 0;
  }
  std::printf("checkpoint %s: %s bytes, format %u (tinylm %s), checksum ok\n", ck.path.c_str(),
              grouped(bytes).c_str(), ck.format_version,
              ck.tinylm_version.empty() ? "before 0.1" : printable(ck.tinylm_version).c_str());
  const std::string optimizer_state = ck.legacy_archive ? std::string("in a LibTorch archive")
                                                        : std::to_string(ck.optimizer.size()) + " tensors";
  std::printf("step %lld | world size %lld | best validation loss %s | optimizer %s (%s)\n",
              static_cast<long long>(st.step), static_cast<long long>(st.world_size),
              st.best_val_loss < 1e299 ? fmt::format("{:.6f}", st.best_val_loss).c_str() : "none yet",
              ck.optimizer_kind.empty() ? "none" : printable(ck.optimizer_kind).c_str(), optimizer_state.c_str());
  std::string opts;
  for (const auto& [k, v] : ck.architecture.options) opts += " " + printable(k) + "=" + printable(v);
  std::printf("model %s (version %lld):%s\n", printable(ck.architecture.kind).c_str(),
              static_cast<long long>(ck.architecture.version), opts.c_str());
  std::printf("tokenizer: %s\n", printable(tokenizer).c_str());
  std::printf("generators: data %lld bytes, dropout %lld stream(s) of %lld bytes\n",
              static_cast<long long>(generator_bytes(st.data_rng_state)),
              static_cast<long long>(dropout_streams),
              static_cast<long long>(dropout_streams ? generator_bytes(st.dropout_rng_state) / dropout_streams : 0));
  size_t width = 9;
  for (const auto& name : ck.parameter_names) width = std::max(width, printable(name).size());
  std::printf("\n%-*s  %-14s %-8s %12s %12s\n", static_cast<int>(width), "parameter", "shape", "dtype", "count", "norm");
  for (const auto& p : params)
    std::printf("%-*s  %-14s %-8s %12s %12.6g\n", static_cast<int>(width), printable(p["name"].get<std::string>()).c_str(),
                shape_text(ck.model.at(p["name"].get<std::string>())).c_str(),
                p["dtype"].get<std::string>().c_str(), grouped(p["count"].get<int64_t>()).c_str(),
                p["norm"].get<double>());
  std::printf("%-*s  %-14s %-8s %12s\n", static_cast<int>(width), "total", "", "", grouped(total).c_str());
  if (!ck.recipe.empty()) {
    std::printf("\nrecipe (the run config it was trained with):\n");
    std::istringstream lines(ck.recipe);
    for (std::string line; std::getline(lines, line);)
      if (!line.empty()) std::printf("  %s\n", printable(line).c_str());
  }
  if (a.verify) std::printf("\nverify: %s: ok\n", verified.c_str());
  return 0;
}

// ---- prepare ---------------------------------------------------------------------------

struct PrepareArgs {
  std::vector<std::string> data;
  std::string tokenizer = "bpe", tokenizer_model, out;
  int64_t vocab_size = 4096, threads = 0;
  double val_fraction = 0.1;
};

/// A progress bar on a terminal; elsewhere a line every 10 s.
class ProgressBar {
 public:
  ProgressBar() : tty_(::isatty(STDERR_FILENO) == 1) {}
  void operator()(const data::PrepareProgress& p) {
    const double mb = p.bytes_done / 1e6, rate = p.seconds > 0 ? mb / p.seconds : 0;
    const bool done = p.bytes_total > 0 && p.bytes_done >= p.bytes_total;
    std::string line = p.phase == "tokenizer" ? "reading for the tokenizer" : "encoding";
    if (p.bytes_total > 0) {
      const double f = std::min(1.0, static_cast<double>(p.bytes_done) / p.bytes_total);
      const int filled = static_cast<int>(f * 24);
      const double eta = rate > 0 ? (p.bytes_total - p.bytes_done) / 1e6 / rate : 0;
      line += fmt::format(" [{}{}] {:3.0f}% {:.1f}/{:.1f} MB, {:.2f} MB/s, ETA {:.0f} s", std::string(filled, '#'),
                          std::string(24 - filled, '.'), 100 * f, mb, p.bytes_total / 1e6, rate, eta);
    } else {
      line += fmt::format(" {:.1f} MB, {:.2f} MB/s", mb, rate);
    }
    if (p.phase == "encode") line += fmt::format(", {} tokens", p.tokens);
    if (tty_) {
      std::fprintf(stderr, "\r%-100s%s", line.c_str(), done ? "\n" : "");
    } else if (done || p.seconds - last_ >= 10) {
      last_ = p.seconds;
      logger()->info("{}", line);
    }
  }

 private:
  bool tty_;
  double last_ = 0;
};

int run_prepare(const PrepareArgs& a) {
  data::PrepareOptions o;
  o.inputs = a.data;
  o.tokenizer = a.tokenizer;
  o.tokenizer_model = a.tokenizer_model;
  o.vocab_size = a.vocab_size;
  o.val_fraction = a.val_fraction;
  o.out_dir = a.out;
  o.sentencepiece.threads = a.threads;
  ProgressBar bar;
  o.progress = [&bar](const data::PrepareProgress& p) { bar(p); };
  const auto sum = data::prepare(o);
  auto log = logger();
  if (!sum.skipped.empty())
    log->warn("skipped {} binary file(s) in the directories given, e.g. {}", sum.skipped.size(), sum.skipped.front());
  const double total_mb = (sum.train_bytes + sum.val_bytes) / 1e6;
  log->info("read {} file(s), {:.2f} MB of text; tokenizer: {}{}", sum.files.size(), total_mb, sum.tokenizer,
            sum.tokenizer_seconds > 0 ? fmt::format(" (trained in {:.1f} s)", sum.tokenizer_seconds) : "");
  log->info("train.bin: {} tokens ({} bytes of text) | val.bin: {} tokens ({} bytes) | {:.3f} bytes per token, "
            "uint{} tokens", sum.train_tokens, sum.train_bytes, sum.val_tokens, sum.val_bytes,
            sum.bytes_per_token(), 8 * sum.token_bytes);
  log->info("encoded at {:.2f} MB/s; wrote {}/{{train.bin, val.bin{}, prepare.json}}; train on it with "
            "--task tokens --data {} --vocab-size {}", sum.encode_seconds > 0 ? total_mb / sum.encode_seconds : 0,
            a.out, sum.tokenizer.rfind("SentencePiece", 0) == 0 ? ", tokenizer.model" : "", a.out, sum.vocab_size);
  return 0;
}

// ---- upgrade ---------------------------------------------------------------------------

struct UpgradeArgs {
  std::string checkpoint, out;
};

/// An older checkpoint (formats 1 and 2) rewritten in today's format: the same weights,
/// optimizer state, step and generators, so training resumes from the copy exactly as from
/// the original. Reading format 1 runs LibTorch's loader: for files the user trusts.
int run_upgrade(const UpgradeArgs& a) {
  const auto path = train::resolve_checkpoint_path(a.checkpoint);
  std::error_code ec;
  TORCH_CHECK(!std::filesystem::exists(a.out, ec), "--out '", a.out,
              "' already exists: tinylm never overwrites a file; name a new one");
  train::ReadOptions trusted;
  trusted.trust_legacy_archive = true;
  const auto ck = train::read_checkpoint(path, trusted);
  TORCH_CHECK(ck.format_version < train::kCheckpointFormatVersion, "checkpoint '", path, "' is already in format ",
              ck.format_version, ", today's: there is nothing to upgrade");
  RunConfig c = config_from_checkpoint(ck);
  const auto dir = std::filesystem::path(a.out).parent_path();
  c.out_dir = dir.empty() ? "." : dir.string();  // nothing is written there but --out
  train::Trainer trainer = make_trainer(c);
  trainer.resume(ck);
  trainer.save(a.out);
  std::printf("upgraded %s (format %u, step %lld) to %s (format %u)\n", path.c_str(), ck.format_version,
              static_cast<long long>(ck.state.step), a.out.c_str(), train::kCheckpointFormatVersion);
  return 0;
}

// ---- export ----------------------------------------------------------------------------

struct ExportArgs {
  std::string checkpoint, out, format = "pytorch";
  bool overwrite = false;
};

int run_export(const ExportArgs& a) {
  TORCH_CHECK(a.format == "pytorch", "--format must be pytorch (nanoGPT's checkpoint layout), got '",
              a.format, "'");
  TORCH_CHECK(!a.out.empty(), "--out must name a file");
  const auto ck = open_checkpoint(a.checkpoint);
  const auto notes = interop::export_nanogpt(ck, a.out, a.overwrite);
  for (const auto& note : notes) logger()->warn("note: {}", note);
  logger()->info("wrote {}: step {}, {} parameters with nanoGPT's names; in Python: "
                 "GPT(GPTConfig(**ck['model_args'])).load_state_dict(ck['model'])",
                 a.out, ck.state.step, ck.parameter_names.size());
  return 0;
}

// ---- import ----------------------------------------------------------------------------

struct ImportArgs {
  std::string file, out, tokenizer;
  int64_t n_heads = 0;
};

int run_import(const ImportArgs& a) {
  TORCH_CHECK(a.n_heads >= 0, "--n-heads must be >= 1 (0 = the checkpoint's model_args), got ", a.n_heads);
  std::error_code ec;
  TORCH_CHECK(!std::filesystem::exists(std::filesystem::symlink_status(a.out, ec)), "'", a.out,
              "' already exists: choose another --out (tinylm does not overwrite checkpoints)");
  std::shared_ptr<const data::Tokenizer> tokenizer;
  if (!a.tokenizer.empty()) tokenizer = data::load_sentencepiece(a.tokenizer);
  interop::NanoGPTImport imported;
  try {
    imported = interop::import_nanogpt(a.file, a.n_heads);
  } catch (const c10::Error& e) {
    const std::string why = e.what_without_backtrace();
    TORCH_CHECK(why.find("give the number of heads") == std::string::npos, why, " (--n-heads N)");
    throw;
  }
  const auto* model = dynamic_cast<const nn::TransformerLMImpl*>(imported.model.get());
  TORCH_CHECK(model, "import: not a TransformerLM");
  const auto& o = model->options;
  TORCH_CHECK(!tokenizer || tokenizer->vocab_size() <= o.vocab_size(), "--tokenizer '", a.tokenizer, "' has ",
              tokenizer->vocab_size(), " pieces, more than the model's vocabulary ", o.vocab_size());
  // The recipe a resumed run starts from: the model as imported, the repeat task (give
  // --task and --data when resuming to train on text).
  RunConfig cfg;
  cfg.model = "transformer";
  cfg.vocab_size = o.vocab_size();
  cfg.d_model = o.d_model();
  cfg.n_heads = o.n_heads();
  cfg.n_layers = o.n_layers();
  cfg.context_length = o.context_length();
  cfg.activation = "gelu";
  cfg.bias = o.bias();
  cfg.tie_weights = o.tie_weights();
  cfg.seq_len = o.context_length();  // fine-tuning trains on the model's whole context
  cfg.dropout = o.dropout();
  cfg.optimizer = "adamw";           // nanoGPT's (any optimizer may be chosen: no state is stored)
  cfg.out_dir = std::filesystem::path(a.out).has_parent_path()
                    ? std::filesystem::path(a.out).parent_path().string() : ".";
  validate(cfg);
  train::TrainingState state;
  state.step = imported.iter_num;
  state.epoch_loss_steps = 0;  // nanoGPT's losses are not known: epoch means count tinylm's steps only
  train::save_checkpoint(a.out, *imported.model, nullptr, state, to_toml(cfg), tokenizer.get());
  for (const auto& note : imported.notes) logger()->warn("note: {}", note);
  logger()->info("wrote {}: a transformer ({} layers, d_model {}, {} heads, vocab {}, context {}, exact "
                 "GELU) at step {}, {} parameters; no optimizer state: training from it starts a fresh one",
                 a.out, o.n_layers(), o.d_model(), o.n_heads(), o.vocab_size(), o.context_length(),
                 imported.iter_num, nn::count_parameters(*imported.model));
  return 0;
}

struct SampleArgs {
  std::string checkpoint, prompt, device = "auto", data, attention_json;
  int64_t max_new_tokens = 20, top_k = 0, seed = -1, layer = -1, head = 0, threads = 1;
  double temperature = 1.0, top_p = 1.0;
  bool greedy = false, heatmap = false;
};

int run_sample(const SampleArgs& a) {
  TORCH_CHECK(a.top_k >= 0, "--top-k must be >= 0 (0 = off), got ", a.top_k);
  TORCH_CHECK(a.max_new_tokens >= 0, "--max-new-tokens must be >= 0, got ", a.max_new_tokens);
  // The running sequence is int64 and copied once per new token.
  const double sequence_bytes = 16.0 * (static_cast<double>(a.max_new_tokens) + a.prompt.size());
  const auto available = train::available_memory_bytes();
  TORCH_CHECK(available == 0 || sequence_bytes < static_cast<double>(available), "--max-new-tokens ",
              a.max_new_tokens, " needs more memory than the ", available >> 20,
              " MiB available: ask for fewer tokens");
  auto run = load_run(a.checkpoint, a.device, a.threads, a.data, /*need_data=*/false);
  GenerateOptions o;
  o.max_new_tokens = a.max_new_tokens;
  o.temperature = a.temperature;
  o.top_k = a.top_k;
  o.top_p = a.top_p;
  o.greedy = a.greedy;
  if (a.seed >= 0) o.seed = static_cast<uint64_t>(a.seed);
  const auto prompt_ids = run.tokenizer->encode(a.prompt);
  TORCH_CHECK(!prompt_ids.empty(), "--prompt is empty: give ",
              run.tokenizer->kind() == "ids" ? "at least one token id, e.g. --prompt \"3 3 3\""
                                             : "some text, e.g. --prompt \"Once upon\"");
  auto prompt = torch::tensor(prompt_ids, torch::kLong).unsqueeze(0);  // (1, T)
  auto out = generate(*run.model, prompt, o).to(torch::kCPU).contiguous();  // (1, T + N)
  std::printf("%s\n", run.tokenizer->decode(std::vector<int64_t>(out.data_ptr<int64_t>(),
                                                                 out.data_ptr<int64_t>() + out.numel())).c_str());
  if (a.heatmap || !a.attention_json.empty()) {
    const int64_t C = run.model->context_length(), T = out.size(1);
    auto window = out.narrow(1, std::max<int64_t>(0, T - C), std::min(T, C));
    torch::NoGradGuard no_grad;
    auto att = run.model->forward(window.to(run.device), true).attention;
    const int64_t L = static_cast<int64_t>(att.size());
    const int64_t layer = a.layer < 0 ? L + a.layer : a.layer;
    TORCH_CHECK(layer >= 0 && layer < L, "--layer ", a.layer, " is out of range: the model has ", L,
                " attention layer(s)");
    const int64_t H = att[layer].size(1);
    TORCH_CHECK(a.head >= 0 && a.head < H, "--head ", a.head, " is out of range [0, ", H, ")");
    auto w = att[layer][0][a.head].to(torch::kCPU);  // (T, T)
    if (a.heatmap) {
      std::printf("attention, layer %lld head %lld, over the last %lld tokens:\n%s",
                  static_cast<long long>(layer), static_cast<long long>(a.head),
                  static_cast<long long>(window.size(1)), ascii_heatmap(w).c_str());
    }
    if (!a.attention_json.empty()) {
      auto ids = window.to(torch::kCPU).reshape({-1});
      const nlohmann::ordered_json doc = {
          {"layer", layer},
          {"head", a.head},
          {"tokens", std::vector<int64_t>(ids.data_ptr<int64_t>(), ids.data_ptr<int64_t>() + ids.numel())},
          {"weights", [&] {
             auto rows = nlohmann::json::array();
             auto wc = w.contiguous();
             for (int64_t i = 0; i < wc.size(0); ++i)
               rows.push_back(std::vector<float>(wc[i].data_ptr<float>(), wc[i].data_ptr<float>() + wc.size(1)));
             return rows;
           }()}};
      std::ofstream f(a.attention_json);
      TORCH_CHECK(f, "cannot write '", a.attention_json, "'");
      f << doc.dump() << "\n";
      TORCH_CHECK(f.flush(), "cannot write '", a.attention_json, "'");
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // Training allocates and frees the same large activation buffers every step. glibc
  // would hand them back to the kernel (mmap/trim) and page-fault them in again on the
  // next step; keeping freed memory in the process avoids that. Peak memory is unchanged.
  mallopt(M_MMAP_THRESHOLD, 1 << 30);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);

  CLI::App app{"tinylm: train, evaluate and sample tiny transformer language models"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("tinylm ") + TINYLM_VERSION_STRING + ": " +
                                        TINYLM_BUILD_DESCRIPTION);
  app.fallthrough();  // --log-level works after the subcommand too
  std::string log_level = "info";
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error or off")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error", "off"}));

  TrainArgs train_args;
  auto* train_cmd = app.add_subcommand("train", "train a model (no flags: the reference run)");
  add_config_options(*train_cmd, train_args);
  train_cmd->add_option("--config", train_args.config_path, "TOML run config; flags override it");
  train_cmd->add_option("--resume", train_args.resume,
                        "continue from a checkpoint file or a run directory (its newest step)");
  train_cmd->add_flag("--print-config", train_args.print_config,
                      "print the effective config as TOML and exit");
  integer(train_cmd->add_option("--nproc", train_args.nproc,
                                "data-parallel workers to start on this host (c10d)"))
      ->capture_default_str();
  train_cmd->add_option("--dist-backend", train_args.dist_backend,
                        "data-parallel engine: auto (NCCL on CUDA where LibTorch has it, else Gloo), gloo, nccl")
      ->capture_default_str();
  train_cmd->add_option("--dist-timeout", train_args.dist_timeout,
                        "seconds a data-parallel rank waits for the others before failing")
      ->capture_default_str();
  train_cmd->add_flag("--overwrite", train_args.overwrite,
                      "replace the run already in --out-dir (its checkpoints and metrics are deleted)");

  EvalArgs eval_args;
  auto* eval_cmd = app.add_subcommand("eval", "evaluate a checkpoint (no model flags needed)");
  eval_cmd->add_option("checkpoint", eval_args.checkpoint, "checkpoint file or run directory")->required();
  integer(eval_cmd->add_option("--batches", eval_args.batches, "batches to evaluate"))->capture_default_str();
  integer(eval_cmd->add_option("--batch-size", eval_args.batch_size, "0 = the checkpoint's batch size"))->capture_default_str();
  integer(eval_cmd->add_option("--seed", eval_args.seed, "seed of the evaluation batches"))->capture_default_str();
  eval_cmd->add_option("--device", eval_args.device, "auto, cpu, cuda or cuda:N")->capture_default_str();
  integer(eval_cmd->add_option("--threads", eval_args.threads, "intra-op CPU threads; 0 = default"))->capture_default_str();
  eval_cmd->add_option("--data", eval_args.data, "text or tokens task: the data file or corpus, if it moved");
  eval_cmd->add_flag("--json", eval_args.json, "one JSON line instead of text");

  SampleArgs s;
  auto* sample_cmd = app.add_subcommand("sample", "generate tokens from a checkpoint");
  sample_cmd->add_option("checkpoint", s.checkpoint, "checkpoint file or run directory")->required();
  sample_cmd->add_option("--prompt", s.prompt,
                         "token ids (\"3 3 3\") for synthetic tasks, text for text and tokens")->required();
  integer(sample_cmd->add_option("--max-new-tokens", s.max_new_tokens, "tokens to generate"))->capture_default_str();
  sample_cmd->add_option("--temperature", s.temperature, "> 0; lower is more deterministic")->capture_default_str();
  integer(sample_cmd->add_option("--top-k", s.top_k, "keep the k most likely tokens; 0 = off"))->capture_default_str();
  sample_cmd->add_option("--top-p", s.top_p, "nucleus sampling threshold in (0, 1]; 1 = off")->capture_default_str();
  integer(sample_cmd->add_option("--seed", s.seed, "sampling seed; -1 = unseeded"))->capture_default_str();
  sample_cmd->add_flag("--greedy", s.greedy, "always take the most likely token");
  sample_cmd->add_flag("--heatmap", s.heatmap, "print the attention heatmap of the result");
  integer(sample_cmd->add_option("--layer", s.layer, "heatmap layer; -1 = last"))->capture_default_str();
  integer(sample_cmd->add_option("--head", s.head, "heatmap head"))->capture_default_str();
  sample_cmd->add_option("--attention-json", s.attention_json,
                         "write that head's weights as JSON (for scripts/plot.py)");
  sample_cmd->add_option("--device", s.device, "auto, cpu, cuda or cuda:N")->capture_default_str();
  integer(sample_cmd->add_option("--threads", s.threads, "intra-op CPU threads; 0 = default"))->capture_default_str();
  sample_cmd->add_option("--data", s.data, "tokens task, checkpoint without a tokenizer: the prepared corpus");

  InspectArgs inspect_args;
  auto* inspect_cmd = app.add_subcommand("inspect", "what a checkpoint holds: header, model, parameters");
  inspect_cmd->add_option("checkpoint", inspect_args.checkpoint, "checkpoint file or run directory")->required();
  inspect_cmd->add_flag("--verify", inspect_args.verify,
                        "also rebuild the model, load the weights and run it once");
  inspect_cmd->add_flag("--json", inspect_args.json, "one JSON object instead of text");

  UpgradeArgs upgrade_args;
  auto* upgrade_cmd = app.add_subcommand(
      "upgrade", "rewrite an older checkpoint (format 1 or 2) in today's format; format 1 only if you trust it");
  upgrade_cmd->add_option("checkpoint", upgrade_args.checkpoint, "checkpoint file or run directory")->required();
  upgrade_cmd->add_option("--out", upgrade_args.out, "the new file (never overwritten)")->required();

  PrepareArgs prepare_args;
  auto* prepare_cmd = app.add_subcommand("prepare", "text -> tokenizer + token files (train with --task tokens)");
  prepare_cmd->add_option("--data", prepare_args.data,
                          "UTF-8 text: files, directories (their text files) or - (standard input); repeatable")
      ->required();
  prepare_cmd->add_option("--tokenizer", prepare_args.tokenizer,
                          "bpe or unigram (SentencePiece, trained here) or byte")
      ->capture_default_str();
  prepare_cmd->add_option("--tokenizer-model", prepare_args.tokenizer_model,
                          "reuse this SentencePiece .model instead of training one");
  integer(prepare_cmd->add_option("--vocab-size", prepare_args.vocab_size,
                                  "pieces of a trained tokenizer (256 byte pieces included)"))
      ->capture_default_str();
  prepare_cmd->add_option("--val-fraction", prepare_args.val_fraction,
                          "share of the text held out, in blocks spread over the corpus")
      ->capture_default_str();
  integer(prepare_cmd->add_option("--threads", prepare_args.threads, "tokenizer training threads; 0 = all CPUs"))
      ->capture_default_str();
  prepare_cmd->add_option("--out", prepare_args.out, "the directory to write (new, or empty)")->required();

  ExportArgs export_args;
  auto* export_cmd = app.add_subcommand("export", "write a checkpoint's model for PyTorch (nanoGPT's GPT)");
  export_cmd->add_option("checkpoint", export_args.checkpoint, "checkpoint file or run directory")->required();
  export_cmd->add_option("--out", export_args.out, "the file to write (.pt)")->required();
  export_cmd->add_option("--format", export_args.format,
                         "pytorch: nanoGPT's ckpt.pt (state dict with its names, model_args)")
      ->capture_default_str();
  export_cmd->add_flag("--overwrite", export_args.overwrite, "replace --out if it exists");

  ImportArgs import_args;
  auto* import_cmd = app.add_subcommand("import", "make a tinylm checkpoint from a nanoGPT (PyTorch) one");
  import_cmd->add_option("file", import_args.file, "nanoGPT's ckpt.pt, or a bare state dict (.pt)")->required();
  import_cmd->add_option("--out", import_args.out, "the checkpoint to write (must not exist)")->required();
  import_cmd->add_option("--tokenizer", import_args.tokenizer,
                         "a SentencePiece .model to store with it (sample then takes text prompts)");
  integer(import_cmd->add_option("--n-heads", import_args.n_heads,
                                 "attention heads, for a state dict without model_args (0 = model_args')"))
      ->capture_default_str();

  BenchArgs bench_args;
  auto* bench_cmd = app.add_subcommand("bench", "benchmarks: JSON lines with medians over repetitions");
  bench_cmd->add_option("--cases", bench_args.cases, "comma-separated: peak, p1, p2, p3, attention, gemm, dp, data")
      ->capture_default_str();
  bench_cmd->add_flag("--quick", bench_args.quick, "tiny repetition counts: checks the harness, not speed");
  bench_cmd->add_option("--threads", bench_args.threads, "intra-op CPU threads; 0 = default")
      ->capture_default_str();
  bench_cmd->add_option("--memory-steps", bench_args.memory_steps,
                        "also train P2 this many more steps and report resident-memory growth")
      ->capture_default_str();

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    // One line, like every other error: what is wrong, and where the options are listed.
    std::fprintf(stderr, "error: %s (tinylm --help, or tinylm SUBCOMMAND --help, lists the options)\n",
                 e.what());
    return e.get_exit_code();
  }

  train_args.argv.assign(argv, argv + argc);
  auto log = std::make_shared<spdlog::logger>("tinylm", std::make_shared<spdlog::sinks::stdout_sink_mt>());
  log->set_pattern("%v");
  log->set_level(spdlog::level::from_str(log_level));
  spdlog::register_logger(log);

  try {
    if (*train_cmd) return run_train(train_args);
    if (*eval_cmd) return run_eval(eval_args);
    if (*sample_cmd) return run_sample(s);
    if (*bench_cmd) return run_bench(bench_args);
    if (*inspect_cmd) return run_inspect(inspect_args);
    if (*upgrade_cmd) return run_upgrade(upgrade_args);
    if (*export_cmd) return run_export(export_args);
    if (*import_cmd) return run_import(import_args);
    if (*prepare_cmd) return run_prepare(prepare_args);
  } catch (const c10::Error& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "error: %s\n", e.what_without_backtrace());
    return 1;
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 1;
}
