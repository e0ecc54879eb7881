// The RunConfig layer: model, task, trainer options and Trainer from a run config.
#include <tinylm/data/token_file.h>
#include <tinylm/error.h>
#include <tinylm/data/tokenizer.h>
#include <tinylm/log.h>
#include <tinylm/nn/cpu_kernels.h>
#include <tinylm/nn/model_kind.h>
#include <tinylm/run.h>
#include <tinylm/train/resources.h>

#include "internal/generator_scope.h"
#include "internal/text.h"

#include <torch/types.h>

#include <algorithm>

namespace tinylm {

nn::ModelArchitecture model_architecture(const RunConfig& c) { return nn::architecture_of(c.model_settings()); }

void set_model(RunConfig& c, const nn::ModelArchitecture& a) {
  const int64_t context = c.effective_context();
  const auto before = nn::find_model_kind(c.model.kind()).get(c.model, "context_length");
  c.model = nn::read_model_options(a);
  c.other_model_options.clear();
  // A context the config already gives (0 = seq-len) stays written as it was.
  const auto& kind = nn::find_model_kind(c.model.kind());
  if (before && kind.get(c.model, "context_length") && c.effective_context() == context)
    kind.set(c.model, "context_length", *before);
}

namespace {

// The parts of a config already validated (make_trainer validates once for all of them).
nn::LanguageModel build_checked_model(const RunConfig& c) {
  // The reference run seeds LibTorch's generator with the run seed before building the
  // model; the same stream is lent here, and the global generator is left alone.
  auto state = internal::seeded_generator_state(torch::kCPU, static_cast<uint64_t>(c.trainer.seed()));
  internal::GeneratorScope scope(torch::kCPU, state);
  return nn::build_model(c.model_settings());
}

train::TrainerOptions checked_trainer_options(const RunConfig& c) {
  train::TrainerOptions o = c.trainer;
  o.device(train::resolve_device(c.device)).recipe(to_toml(c));
  return o;
}

}  // namespace

nn::LanguageModel build_model(const RunConfig& c) {
  check_config(c);
  return build_checked_model(c);
}

std::unique_ptr<data::Task> make_task(const RunConfig& c) { return data::make_task(c.task, c.task_settings()); }

train::TrainerOptions trainer_options(const RunConfig& c) {
  check_config(c);
  return checked_trainer_options(c);
}

train::Trainer make_trainer(const RunConfig& c, std::shared_ptr<train::ProcessGroup> group) {
  check_config(c);
  auto options = checked_trainer_options(c);
  // Each process of a job on one host takes its own GPU (LOCAL_RANK).
  if (group) options.device(train::resolve_device(c.device, group->options().local_rank));
  options.process_group(std::move(group));
  TORCH_CHECK(!c.trainer.bf16() || options.device().is_cuda() || nn::bf16_products_missing().empty(),
              "bf16 on the CPU needs bfloat16 products, and ", nn::bf16_products_missing(),
              ": turn bf16 off or set device to cuda");
  // Before anything large is allocated: a run that cannot fit is refused here.
  check_memory(c, c.trainer.batch_size(), /*training=*/true, options.device().is_cuda());
  std::shared_ptr<data::Task> task = make_task(c);
  const auto vocab = c.get<int64_t>("vocab-size");
  TORCH_CHECK(task->vocab_size() == vocab, "task ", task->name(), " has vocab ", task->vocab_size(),
              " but vocab-size is ", vocab, ": set vocab-size = ", task->vocab_size());
  return train::Trainer(build_checked_model(c), std::move(task), std::move(options));
}

RunConfig config_from_checkpoint(const train::Checkpoint& ck) {
  RunConfig c;
  std::vector<std::string> unknown;
  apply_toml(c, ck.recipe, ck.path + " (stored config)", &unknown);
  // tinylm wrote it; one from before recipes held their kind's keys only holds every kind's
  c.given.clear();
  c.other_model_options.clear();
  for (const auto& key : unknown)
    logger()->warn("checkpoint '{}': its stored config sets '{}', which this tinylm does not know: "
                   "ignored", ck.path, internal::printable(key));
  // The model is the one the checkpoint stores; its recipe is how it came about.
  if (!ck.architecture.kind.empty()) set_model(c, ck.architecture);
  check_config(c);
  return c;
}

namespace {

/// The checkpoint's own tokenizer; for one written before tokenizers were stored, the
/// one its task implies (bytes for text, the corpus's for tokens, ids otherwise).
std::shared_ptr<const data::Tokenizer> tokenizer_of(const InferenceRun& run) {
  if (auto stored = train::checkpoint_tokenizer(run.checkpoint)) return stored;
  if (run.task) return run.task->tokenizer();
  if (run.config.task == "text") return data::byte_tokenizer();
  TINYLM_CHECK(run.config.task != "tokens", ErrorKind::data_needed, "checkpoint '", run.checkpoint.path,
               "' carries no tokenizer (written by an older tinylm): give the data path of the prepared "
               "corpus it was trained on");
  return data::ids_tokenizer(run.model->vocab_size());
}

}  // namespace

InferenceRun open_for_inference(train::Checkpoint checkpoint, const InferenceOptions& options) {
  const std::string& data_override = options.data;
  InferenceRun run;
  run.checkpoint = std::move(checkpoint);
  run.config = config_from_checkpoint(run.checkpoint);
  auto& cfg = run.config;
  if (!data_override.empty()) {
    cfg.set("data", data_override);
    check_config(cfg);  // a data path for a task that reads none is refused
  }
  run.device = train::resolve_device(options.device);
  check_memory(cfg, 1, /*training=*/false, run.device.is_cuda());
  run.model = nn::build_model(cfg.model_settings());  // the checkpoint's architecture, read once
  train::load_model_state(run.checkpoint, *run.model);
  run.model->to(run.device);
  run.model->eval();
  if (options.bf16) nn::use_bf16_products(*run.model);
  const bool has_tokenizer = !run.checkpoint.tokenizer_kind.empty();
  if (options.need_data || (cfg.task == "tokens" && !has_tokenizer)) {
    try {
      run.task = make_task(cfg);
    } catch (const c10::Error& e) {
      const auto& reads = data::find_task_kind(cfg.task).reads;
      const bool file_data = std::find(reads.begin(), reads.end(), "data") != reads.end();
      TINYLM_CHECK(!file_data || !data_override.empty(), ErrorKind::data_needed, e.what_without_backtrace(),
                   " (the checkpoint's data; give its path if it moved)");
      throw;
    }
  }
  run.tokenizer = tokenizer_of(run);
  if (run.task && has_tokenizer)
    TINYLM_CHECK(run.task->tokenizer()->kind() == run.tokenizer->kind() &&
                     run.task->tokenizer()->model_bytes() == run.tokenizer->model_bytes(),
                 ErrorKind::data_needed, "checkpoint '", run.checkpoint.path,
                 "' was trained with another tokenizer than the data '", cfg.task_options.data(), "' (",
                 run.tokenizer->describe(), " vs ", run.task->tokenizer()->describe(),
                 "): give the data path of the corpus it was trained on");
  TORCH_CHECK(run.tokenizer->vocab_size() <= run.model->vocab_size(), "checkpoint '", run.checkpoint.path,
              "': its tokenizer has ", run.tokenizer->vocab_size(), " tokens, more than the model's vocabulary ",
              run.model->vocab_size());
  return run;
}

}  // namespace tinylm
