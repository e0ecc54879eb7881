// tinylm export CKPT --out FILE.pt: a checkpoint's model as nanoGPT's ckpt.pt.
#include "../command.h"

#include <tinylm/interop.h>
#include <tinylm/log.h>

#include <memory>
#include <string>

namespace tinylm::cli {

namespace {

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

}  // namespace

Command add_export(CLI::App& app) {
  auto args = std::make_shared<ExportArgs>();
  ExportArgs& export_args = *args;
  auto* export_cmd = app.add_subcommand("export", "write a checkpoint's model for PyTorch (nanoGPT's GPT)");
  export_cmd->add_option("checkpoint", export_args.checkpoint, "checkpoint file or run directory")->required();
  export_cmd->add_option("--out", export_args.out, "the file to write (.pt)")->required();
  export_cmd->add_option("--format", export_args.format,
                         "pytorch: nanoGPT's ckpt.pt (state dict with its names, model_args)")
      ->capture_default_str();
  export_cmd->add_flag("--overwrite", export_args.overwrite, "replace --out if it exists");

  return {export_cmd, [args] { return run_export(*args); }};
}

}  // namespace tinylm::cli
