// tinylm upgrade CKPT --out NEW: an older checkpoint (format 1 or 2) in today's format.
#include "../command.h"

#include <tinylm/run.h>
#include <tinylm/train/checkpoint.h>
#include <tinylm/train/trainer.h>

#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>

namespace tinylm::cli {

namespace {

struct UpgradeArgs {
  std::string checkpoint, out;
};

/// An older checkpoint (formats 1 and 2) rewritten in today's format: the same weights,
/// optimizer state, step and generators, so training resumes from the copy exactly as from
/// the original. Every format is read by tinylm's own checked readers.
int run_upgrade(const UpgradeArgs& a) {
  const auto path = train::resolve_checkpoint_path(a.checkpoint);
  std::error_code ec;
  TORCH_CHECK(!std::filesystem::exists(a.out, ec), "--out '", a.out,
              "' already exists: tinylm never overwrites a file; name a new one");
  const auto ck = train::read_checkpoint(path);
  TORCH_CHECK(ck.format_version < train::kCheckpointFormatVersion, "checkpoint '", path, "' is already in format ",
              ck.format_version, ", today's: there is nothing to upgrade");
  RunConfig c = config_from_checkpoint(ck);
  const auto dir = std::filesystem::path(a.out).parent_path();
  c.trainer.out_dir(dir.empty() ? "." : dir.string());  // nothing is written there but --out
  train::Trainer trainer = make_trainer(c);
  trainer.resume(ck);
  trainer.save(a.out);
  std::printf("upgraded %s (format %u, step %lld) to %s (format %u)\n", path.c_str(), ck.format_version,
              static_cast<long long>(ck.state.step), a.out.c_str(), train::kCheckpointFormatVersion);
  return 0;
}

}  // namespace

Command add_upgrade(CLI::App& app) {
  auto args = std::make_shared<UpgradeArgs>();
  UpgradeArgs& upgrade_args = *args;
  auto* upgrade_cmd = app.add_subcommand(
      "upgrade", "rewrite an older checkpoint (format 1 or 2) in today's format");
  upgrade_cmd->add_option("checkpoint", upgrade_args.checkpoint, "checkpoint file or run directory")->required();
  upgrade_cmd->add_option("--out", upgrade_args.out, "the new file (never overwritten)")->required();

  return {upgrade_cmd, [args] { return run_upgrade(*args); }};
}

}  // namespace tinylm::cli
