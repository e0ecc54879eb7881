// tinylm eval CKPT|DIR: a checkpoint's loss, perplexity, accuracy and bits per byte on
// its task's validation split.
#include "../command.h"

#include <tinylm/run.h>
#include <tinylm/train/resources.h>
#include <tinylm/train/trainer.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>
#include <memory>
#include <string>

namespace tinylm::cli {

namespace {

struct EvalArgs {
  std::string checkpoint, device = "auto", data;
  int64_t batches = 50, batch_size = 0, seed = 1234, threads = 1;
  bool json = false;
};

int run_eval(const EvalArgs& a) {
  TORCH_CHECK(a.batches >= 1, "--batches must be >= 1, got ", a.batches);
  TORCH_CHECK(a.batch_size >= 0, "--batch-size must be >= 1 (0 = the checkpoint's), got ", a.batch_size);
  TORCH_CHECK(a.seed >= 0, "--seed must be >= 0, got ", a.seed);
  InferenceOptions o;
  o.device = a.device;
  o.data = a.data;
  o.need_data = true;
  auto run = open_run(a.checkpoint, a.threads, o);
  const auto& cfg = run.config;
  const int64_t bs = a.batch_size > 0 ? a.batch_size : cfg.trainer.batch_size();
  check_memory(cfg, bs, /*training=*/false, run.device.is_cuda());
  auto m = train::evaluate(*run.model, *run.task, a.batches, bs, static_cast<uint64_t>(a.seed), run.device);
  // Bits per byte of text: comparable across tokenizers (a byte model's is loss / ln 2).
  const double bytes_per_token = run.task->bytes_per_token(data::Split::validation);
  const double bits_per_byte = bytes_per_token > 0 ? m.loss / std::log(2.0) / bytes_per_token : 0;
  if (a.json) {
    nlohmann::ordered_json line = {
        {"checkpoint", run.checkpoint.path}, {"step", run.checkpoint.state.step},
        {"task", cfg.task}, {"model", cfg.model.kind()}, {"loss", m.loss}, {"perplexity", m.perplexity},
        {"accuracy", m.accuracy}, {"exact_match", m.exact_match}, {"tokens", m.tokens},
        {"rows", m.rows}};
    if (bytes_per_token > 0) line["bits_per_byte"] = bits_per_byte;
    std::printf("%s\n", line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    return 0;
  }
  std::printf("checkpoint %s: step %lld, task %s, model %s, %lld parameters\n",
              run.checkpoint.path.c_str(), static_cast<long long>(run.checkpoint.state.step),
              cfg.task.c_str(), cfg.model.kind().c_str(), static_cast<long long>(nn::count_parameters(*run.model)));
  std::printf("loss %.6f | perplexity %.4f | accuracy %.2f%% (%lld tokens) | exact match %.2f%% (%lld rows)\n",
              m.loss, m.perplexity, 100 * m.accuracy, static_cast<long long>(m.tokens),
              100 * m.exact_match, static_cast<long long>(m.rows));
  if (bytes_per_token > 0)
    std::printf("%.4f bits per byte (%.4f nats per token, %.3f bytes of text per token; %s)\n", bits_per_byte,
                m.loss, bytes_per_token, run.tokenizer->describe().c_str());
  return 0;
}

}  // namespace

Command add_eval(CLI::App& app) {
  auto args = std::make_shared<EvalArgs>();
  EvalArgs& eval_args = *args;
  auto* eval_cmd = app.add_subcommand("eval", "evaluate a checkpoint (no model flags needed)");
  eval_cmd->add_option("checkpoint", eval_args.checkpoint, "checkpoint file or run directory")->required();
  integer(eval_cmd->add_option("--batches", eval_args.batches, "batches to evaluate"))->capture_default_str();
  integer(eval_cmd->add_option("--batch-size", eval_args.batch_size, "0 = the checkpoint's batch size"))->capture_default_str();
  integer(eval_cmd->add_option("--seed", eval_args.seed, "seed of the evaluation batches"))->capture_default_str();
  eval_cmd->add_option("--device", eval_args.device, "auto, cpu, cuda or cuda:N")->capture_default_str();
  integer(eval_cmd->add_option("--threads", eval_args.threads, "intra-op CPU threads; 0 = default"))->capture_default_str();
  eval_cmd->add_option("--data", eval_args.data, "text or tokens task: the data file or corpus, if it moved");
  eval_cmd->add_flag("--json", eval_args.json, "one JSON line instead of text");

  return {eval_cmd, [args] { return run_eval(*args); }};
}

}  // namespace tinylm::cli
