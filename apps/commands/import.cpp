// tinylm import ckpt.pt --out NEW.ckpt: a tinylm checkpoint from a nanoGPT one.
#include "../command.h"

#include <tinylm/config.h>
#include <tinylm/data/tokenizer.h>
#include <tinylm/error.h>
#include <tinylm/interop.h>
#include <tinylm/log.h>
#include <tinylm/nn/model.h>
#include <tinylm/train/checkpoint.h>

#include <filesystem>
#include <memory>
#include <string>

namespace tinylm::cli {

namespace {

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
  } catch (const Error& e) {
    TORCH_CHECK(e.kind() != ErrorKind::heads_unknown, e.what_without_backtrace(), " (--n-heads N)");
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
  set_model(cfg, model->architecture());  // every option as imported
  cfg.task_options.seq_len(o.context_length());  // fine-tuning trains on the model's whole context
  cfg.set("optimizer", "adamw");           // nanoGPT's (any optimizer may be chosen: no state is stored)
  cfg.trainer.out_dir(std::filesystem::path(a.out).has_parent_path()
                    ? std::filesystem::path(a.out).parent_path().string() : ".");
  check_config(cfg);
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

}  // namespace

Command add_import(CLI::App& app) {
  auto args = std::make_shared<ImportArgs>();
  ImportArgs& import_args = *args;
  auto* import_cmd = app.add_subcommand("import", "make a tinylm checkpoint from a nanoGPT (PyTorch) one");
  import_cmd->add_option("file", import_args.file, "nanoGPT's ckpt.pt, or a bare state dict (.pt)")->required();
  import_cmd->add_option("--out", import_args.out, "the checkpoint to write (must not exist)")->required();
  import_cmd->add_option("--tokenizer", import_args.tokenizer,
                         "a SentencePiece .model to store with it (sample then takes text prompts)");
  integer(import_cmd->add_option("--n-heads", import_args.n_heads,
                                 "attention heads, for a state dict without model_args (0 = model_args')"))
      ->capture_default_str();

  return {import_cmd, [args] { return run_import(*args); }};
}

}  // namespace tinylm::cli
