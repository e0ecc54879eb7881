// tinylm serve CKPT|DIR: the explorer page and an OpenAI-compatible completions API for
// one checkpoint (apps/serve/). SIGTERM or SIGINT stops accepting, lets running requests
// finish (cancelling them after --shutdown-seconds) and exits 0.
#include "../command.h"
#include "../serve/server.h"

#include <tinylm/log.h>
#include <tinylm/train/checkpoint.h>

#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstring>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>

namespace tinylm::cli {

namespace {

int signal_pipe[2] = {-1, -1};

struct ServeArgs {
  std::string checkpoint, device = "auto", data, metrics;
  serve::ServeOptions options;
  int64_t threads = 1;
  bool insecure = false, bf16 = false;
};

int run_serve(ServeArgs& a) {
  auto& o = a.options;
  TORCH_CHECK(!o.host.empty(), "--host is empty: give an address such as 127.0.0.1");
  if (!serve::is_loopback(o.host)) {
    TORCH_CHECK(!o.api_key.empty() || a.insecure, "--host ", o.host,
                " listens beyond this machine: give --api-key KEY (clients then send 'Authorization: Bearer KEY'), "
                "or --insecure to serve anyone who can reach it");
    if (o.api_key.empty()) spdlog::warn("serving {} without an API key (--insecure): anyone who can reach it may use it", o.host);
  }
  TORCH_CHECK(o.api_key.empty() || o.api_key.size() >= 8, "--api-key must be at least 8 characters");
  InferenceOptions io;
  io.device = a.device;
  io.data = a.data;
  io.bf16 = a.bf16;
  auto run = open_run(a.checkpoint, a.threads, io);
  serve::ModelCard card;
  const std::filesystem::path path = run.checkpoint.path;
  card.id = o.model_id.empty() ? path.stem().string() : o.model_id;
  o.model_id = card.id;
  std::error_code ec;
  const auto written = std::filesystem::last_write_time(path, ec);
  if (!ec)
    card.created = std::chrono::duration_cast<std::chrono::seconds>(
                       written - std::filesystem::file_time_type::clock::now() + std::chrono::system_clock::now() -
                       std::chrono::system_clock::from_time_t(0))
                       .count();
  card.card = checkpoint_json(run.checkpoint);
  card.card["tokenizer_description"] = run.tokenizer->describe();
  card.card["context_length"] = run.model->context_length();
  card.card["vocab_size"] = run.model->vocab_size();
  card.card["device"] = run.device.str();
  card.card["products"] = a.bf16 ? "bfloat16" : "float32";
  // The run's metrics: --metrics, else metrics.jsonl beside the checkpoint.
  o.metrics_path = a.metrics;
  if (o.metrics_path.empty()) {
    const auto beside = path.parent_path() / "metrics.jsonl";
    if (std::filesystem::is_regular_file(beside, ec)) o.metrics_path = beside.string();
  }
  serve::Server server(std::move(run), std::move(card), o);
  server.bind();
  // SIGTERM and SIGINT (whichever thread they land on) write their number to a pipe; a
  // thread of ours reads it and stops the server, outside the signal handler.
  TORCH_CHECK(::pipe2(signal_pipe, O_CLOEXEC) == 0, "cannot create a pipe: ", std::strerror(errno));
  struct sigaction action {};
  action.sa_handler = [](int sig) {
    const unsigned char byte = static_cast<unsigned char>(sig);
    [[maybe_unused]] auto n = ::write(signal_pipe[1], &byte, 1);
  };
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &action, nullptr);
  sigaction(SIGINT, &action, nullptr);
  std::thread([&server, grace = o.shutdown_seconds] {
    unsigned char sig = 0;
    while (::read(signal_pipe[0], &sig, 1) < 0 && errno == EINTR) {}
    spdlog::info("{}: finishing running requests (cancelled after {} s), then exiting",
                 sig == SIGTERM ? "SIGTERM" : "SIGINT", grace);
    server.stop();
  }).detach();
  std::printf("serving %s on http://%s:%d/ (explorer page at /, OpenAI API at /v1/)\n", o.model_id.c_str(),
              o.host.find(':') != std::string::npos ? ("[" + o.host + "]").c_str() : o.host.c_str(), server.port());
  std::fflush(stdout);
  server.run();
  spdlog::info("stopped");
  return 0;
}

}  // namespace

Command add_serve(CLI::App& app) {
  auto args = std::make_shared<ServeArgs>();
  ServeArgs& s = *args;
  auto& o = s.options;
  auto* cmd = app.add_subcommand("serve", "serve a checkpoint: the explorer page and an OpenAI-compatible API");
  cmd->add_option("checkpoint", s.checkpoint, "checkpoint file or run directory")->required();
  cmd->add_option("--host", o.host, "address to listen on; beyond loopback needs --api-key or --insecure")
      ->capture_default_str();
  cmd->add_option("--port", o.port, "port; 0 = any free one (printed)")->capture_default_str()->check(CLI::Range(0, 65535));
  cmd->add_option("--api-key", o.api_key, "require 'Authorization: Bearer KEY' on /v1/ (8+ characters)");
  cmd->add_flag("--insecure", s.insecure, "allow a non-loopback --host without --api-key");
  cmd->add_option("--cors-origin", o.cors_origin, "send CORS headers allowing this origin (default: none)");
  cmd->add_option("--model-id", o.model_id, "the model's name in the API (default: the checkpoint's file name)");
  integer(cmd->add_option("--workers", o.workers, "attention requests using the model at once; 0 = the CPUs"))
      ->capture_default_str();
  integer(cmd->add_option("--max-batch", o.max_batch,
                          "completions decoded together by one decode loop, one forward pass per token"))
      ->capture_default_str();
  integer(cmd->add_option("--decoders", o.decoders,
                          "decode loops, a thread each, a completion in the least loaded; 0 = the CPUs (1 on a GPU)"))
      ->capture_default_str();
  integer(cmd->add_option("--prefill-chunk", o.prefill_chunk,
                          "prompt tokens prefilled between two decode steps (bounds everyone's wait)"))
      ->capture_default_str();
  integer(cmd->add_option("--queue", o.queue, "requests waiting for a worker or a decode row; beyond, 503"))
      ->capture_default_str();
  integer(cmd->add_option("--max-connections", o.http.max_connections, "open connections; beyond, 503"))
      ->capture_default_str();
  integer(cmd->add_option("--max-tokens", o.max_tokens, "the largest max_tokens a request may ask"))
      ->capture_default_str();
  integer(cmd->add_option("--max-prompt-bytes", o.max_prompt_bytes, "the longest prompt, in bytes"))
      ->capture_default_str();
  cmd->add_option("--max-body-bytes", o.http.max_body_bytes, "the largest request body")->capture_default_str();
  cmd->add_option("--request-seconds", o.http.request_seconds,
                  "a request's head and body must arrive within this, and each response (each event of a stream) "
                  "must be taken by the client within it")
      ->capture_default_str()->check(CLI::Range(0.1, 3600.0));
  cmd->add_option("--shutdown-seconds", o.shutdown_seconds, "on SIGTERM, cancel what still runs after this")
      ->capture_default_str()->check(CLI::Range(0.0, 3600.0));
  cmd->add_option("--metrics", s.metrics, "the run's metrics.jsonl (default: the one beside the checkpoint)");
  cmd->add_flag("--bf16", s.bf16, "the model's products in bfloat16 (CUDA, or a CPU with AVX512-BF16 or AMX)");
  cmd->add_option("--device", s.device, "auto, cpu, cuda or cuda:N")->capture_default_str();
  integer(cmd->add_option("--threads", s.threads, "intra-op CPU threads per request; 0 = default"))->capture_default_str();
  cmd->add_option("--data", s.data, "tokens task, checkpoint without a tokenizer: the prepared corpus");
  return {cmd, [args] { return run_serve(*args); }};
}

}  // namespace tinylm::cli
