// tinylm train: a run from flags, a TOML config or a checkpoint to resume; with --nproc N,
// N data-parallel workers of one job on this host.
// Over 400 lines on purpose: the train command and its --nproc supervisor.
#include "../command.h"
#include "../spawn.h"

#include <tinylm/config.h>
#include <tinylm/error.h>
#include <tinylm/log.h>
#include <tinylm/nn/cpu_kernels.h>
#include <tinylm/report.h>
#include <tinylm/run.h>
#include <tinylm/threads.h>
#include <tinylm/train/distributed.h>
#include <tinylm/train/run_directory.h>
#include <tinylm/train/trainer.h>

#include <c10/util/Logging.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <variant>
#include <vector>

namespace tinylm::cli {

namespace {

std::atomic<bool> g_stop{false};

void on_signal(int sig) {
  g_stop.store(true);
  std::signal(sig, SIG_DFL);  // a second Ctrl-C ends the process at once
}

std::string shape(const torch::Tensor& t) {
  std::ostringstream os;
  os << t.sizes();
  return os.str();
}

struct TrainArgs {
  std::map<std::string, OptionValue> flags;  // values bound to --name options (only those given are used)
  std::map<std::string, CLI::Option*> given;
  std::string config_path;
  std::string resume;
  bool print_config = false;
  bool overwrite = false;
  int64_t nproc = 1;           // > 1: start that many data-parallel workers on this host
  double dist_timeout = 60.0;  // seconds a rank waits for the others
  std::string dist_backend = "auto";  // auto, gloo or nccl
  Invocation argv;  // the command line, for the workers --nproc starts
};

void add_config_options(CLI::App& cmd, TrainArgs& args) {
  const RunConfig defaults;
  for (const auto& f : config_fields()) {
    const std::string name = "--" + f.name;
    std::string help = f.help;
    if (f.written) help += " [" + field_value_string(f, defaults) + "]";
    if (!f.rule.empty()) help += "; " + f.rule;
    // Each option binds a value of its field's type; only those given are copied over.
    OptionValue& v = args.flags[f.name] = f.get(defaults);
    CLI::Option* opt = nullptr;
    switch (f.type) {
      case OptionType::boolean: opt = cmd.add_flag(name + ",!--no-" + f.name, std::get<bool>(v), help); break;
      case OptionType::integer: opt = integer(cmd.add_option(name, std::get<int64_t>(v), help)); break;
      case OptionType::real: opt = cmd.add_option(name, std::get<double>(v), help); break;
      case OptionType::text: opt = cmd.add_option(name, std::get<std::string>(v), help); break;
    }
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
    if (args.given.at(f.name)->count() > 0) base.set(f.name, args.flags.at(f.name));
  }
  if (out_dir_chosen) {
    *out_dir_chosen = args.given.at("out-dir")->count() > 0 ||
                      std::find(from_file.begin(), from_file.end(), "out-dir") != from_file.end();
  }
  check_config(base);
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
  const bool same_dir = resumed && fs::exists(cfg.trainer.out_dir(), ec) &&
                        fs::equivalent(fs::path(resumed->path).parent_path().empty()
                                           ? fs::path(".")
                                           : fs::path(resumed->path).parent_path(),
                                       cfg.trainer.out_dir(), ec);
  if (args.overwrite) {
    TORCH_CHECK(!same_dir, "--overwrite would delete the run being resumed from (", resumed->path,
                "): resume into another --out-dir, or drop --overwrite");
    return std::make_shared<train::RunDirectory>(cfg.trainer.out_dir(), train::RunDirMode::overwrite);
  }
  if (same_dir) {
    return std::make_shared<train::RunDirectory>(cfg.trainer.out_dir(), train::RunDirMode::resume,
                                                 resumed->state.step);
  }
  try {
    return std::make_shared<train::RunDirectory>(cfg.trainer.out_dir(), train::RunDirMode::fresh);
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::run_directory_taken) throw;
    TORCH_CHECK(false, "--out-dir ", cfg.trainer.out_dir(), " already holds a run: continue it with --resume ",
                cfg.trainer.out_dir(), ", choose another --out-dir, or pass --overwrite to replace it");
  }
}

void print_model_facts(const RunConfig& cfg, nn::LanguageModelImpl& model, torch::Device device) {
  auto log = logger();
  std::ostringstream name;
  model.pretty_print(name);
  log->info("model: {} | {} parameters | device {} | {} intra-op thread(s)", name.str(),
            nn::count_parameters(model), device.str(), at::get_num_threads());
  if (device.is_cpu()) log->info("cpu kernels: {}", nn::cpu_kernels_description());
  if (device.is_cpu() && cfg.trainer.bf16()) log->info("bf16 on the CPU: {}", nn::bf16_products_description());
  log->info("task: {} | vocab {} | seq_len {} | batch {} x {} accum | {} epochs x {} steps | {} lr {}",
            cfg.task, cfg.get<int64_t>("vocab-size"), cfg.task_options.seq_len(), cfg.trainer.batch_size(), cfg.trainer.grad_accum(), cfg.trainer.epochs(),
            cfg.trainer.steps_per_epoch(), cfg.get<std::string>("optimizer"), cfg.trainer.optimizer().lr());
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
                 terminal_text(trainer.task().decode(batch.inputs)), ascii_heatmap(out.attention.back()[0][0]));
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
  std::signal(SIGINT, on_launcher_signal);
  std::signal(SIGTERM, on_launcher_signal);
  std::vector<pid_t> workers;
  for (int64_t rank = 0; rank < args.nproc; ++rank) {
    SpawnOptions worker;
    worker.args = worker_args;
    worker.die_with_parent = true;
    worker.env = {{"RANK", std::to_string(rank)},           {"LOCAL_RANK", std::to_string(rank)},
                  {"WORLD_SIZE", std::to_string(args.nproc)}, {"MASTER_ADDR", "127.0.0.1"},
                  {"MASTER_PORT", port},                      {"TINYLM_STORE_FILE", store_dir + "/store"}};
    workers.push_back(spawn_self(worker));
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
      const int code = exit_code(status);
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
    TORCH_CHECK(ck->optimizer_kind.empty() || cfg.get<std::string>("optimizer") == stored.get<std::string>("optimizer"), "checkpoint '", ck->path,
                "' was trained with optimizer '", stored.get<std::string>("optimizer"), "', not '", cfg.get<std::string>("optimizer"),
                "': resume with optimizer ", stored.get<std::string>("optimizer"));
    // A resumed run writes next to the checkpoint it resumes (a copied run directory
    // stays the copy), never into the directory stored in the checkpoint.
    if (!out_dir_chosen) {
      const auto dir = std::filesystem::path(ck->path).parent_path();
      cfg.trainer.out_dir(dir.empty() ? "." : dir.string());
    }
  } else {
    cfg = effective_config(args, RunConfig{}, &out_dir_chosen);
    if (!out_dir_chosen && !args.overwrite) cfg.trainer.out_dir(fresh_default_out_dir(cfg.trainer.out_dir()));
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
    std::cout << to_toml(cfg, /*with_accepted=*/true);
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
                   cfg.trainer.batch_size() * group->world_size() * cfg.trainer.grad_accum(),
                   cfg.trainer.batch_size(), group->world_size(), cfg.trainer.grad_accum());
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
  if (lead && cfg.task_options.seq_len() <= 32) print_heatmap(trainer);  // wider ones do not fit a terminal
  log->info("checkpoints: last {} | best {} | metrics {}/metrics.jsonl", result.last_checkpoint,
            result.best_checkpoint, cfg.trainer.out_dir());
  return 0;
}

}  // namespace

Command add_train(CLI::App& app, const Invocation& invocation) {
  auto args = std::make_shared<TrainArgs>();
  TrainArgs& train_args = *args;
  train_args.argv = invocation;
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

  return {train_cmd, [args] { return run_train(*args); }};
}

}  // namespace tinylm::cli
