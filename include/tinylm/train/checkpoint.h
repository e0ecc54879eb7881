// Checkpoints: one self-describing file per save.
//
// Layout (little-endian), after llm.c's checked headers:
//   bytes  0..7   magic "TINYLMCK"
//   bytes  8..11  format version (uint32)
//   bytes 12..15  reserved (0)
//   bytes 16..23  payload length in bytes (uint64)
//   bytes 24..27  CRC-32 of the payload (uint32)
//   bytes 28..31  reserved (0)
//   bytes 32..    payload
// Format 3 (written today): the payload is data only, laid out as a safetensors file:
//   an 8-byte header length n, n bytes of JSON naming every tensor's dtype, shape and
//   byte range, then the raw tensor bytes. The JSON's "__metadata__" holds strings:
//     format          "tinylm-checkpoint"
//     tinylm_version  the writer's version
//     model           JSON {"kind", "version", "options": {name: value}}: the model's
//                     own architecture (LanguageModelImpl::architecture())
//     state           JSON {"step", "best_val_loss", "epoch_loss_sum", "world_size",
//                     "epoch_loss_steps" (absent in files before it was stored)}
//     recipe          the application's text (the tinylm tool: its run config, TOML)
//     parameter_names one per line, in the model's order
//     optimizer_kind  Optimizer::kind(), or empty
//     tokenizer       the data's tokenizer kind (ids, byte, sentencepiece); absent in
//                     files written before it was added
//   Tensors: model.<parameter>, optimizer.<key>, rng.data, rng.dropout, tokenizer.model
//   (uint8: Tokenizer::model_bytes(), the SentencePiece model).
//   Reading parses JSON and copies bytes: no code is compiled or run, and every size and
//   offset is checked against the file before anything is allocated. Metadata keys,
//   state fields and tensor entries it does not know are skipped with a warning, so a
//   later tinylm may add them without breaking this one.
// Format 2 (read): the same layout, with the run config (TOML) instead of "model" and
//   "recipe"; the architecture is derived from the config, read leniently.
// Format 1 (read): a LibTorch archive (torch::serialize::OutputArchive, a TorchScript
//   module in a zip), with the run config instead of "model" and "recipe". It is read by
//   tinylm's own checked zip and pickle reader, never LibTorch's loader (which compiles the
//   TorchScript inside and was not written for hostile input): every extent, CRC and
//   storage size is checked, module objects are read as values, the code never.
// Formats 1 and 2 are migrated on reading (a transformer's "positions.*" parameters are
// "learned_positions.*" since format 3); resuming from one writes format 3 from then on.
// Files are written to a temporary name, fsync'ed, then renamed over the target, so a
// crash at any moment leaves either the old file or the new one, never half of one.
// A checkpoint is only written when every weight and optimizer value is finite.
#pragma once

#include <tinylm/data/tokenizer.h>
#include <tinylm/nn/model.h>
#include <tinylm/train/optimizer.h>

#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace tinylm::train {

constexpr uint32_t kCheckpointFormatVersion = 3;

/// Where training stands, besides the weights and the optimizer.
struct TrainingState {
  int64_t step = 0;                   // optimizer steps done
  double best_val_loss = 1e300;       // lowest validation loss so far
  double epoch_loss_sum = 0.0;        // sum of this epoch's step losses so far
  /// How many steps epoch_loss_sum covers; -1 = every step since the epoch began (files
  /// written before it was stored). An import starts at 0: nanoGPT's losses are unknown.
  int64_t epoch_loss_steps = -1;
  int64_t world_size = 1;             // processes that trained it (data-parallel)
  torch::Tensor data_rng_state;       // the data generator (the position in the data)
  torch::Tensor dropout_rng_state;    // the Trainer's dropout generator (CPU runs)
};

/// What a checkpoint holds once it has been read and checked.
struct Checkpoint {
  std::string path;
  uint32_t format_version = 0;
  std::string tinylm_version;         // the writer's (formats 2 and 3)
  nn::ModelArchitecture architecture; // what nn::build_model() rebuilds
  std::string recipe;                 // the application's text (the tool's run config)
  TrainingState state;
  std::vector<std::string> parameter_names;  // in the model's order
  TensorMap model;                    // parameter name -> weights (CPU)
  std::string optimizer_kind;         // Optimizer::kind(); empty when none was saved
  TensorMap optimizer;                // the optimizer's own state (state_dict())
  /// Format 1, LibTorch's optimizers: their state by parameter group, for
  /// Optimizer::state_from_groups() (flat Adam's is in `optimizer`).
  GroupedState optimizer_groups;
  std::string tokenizer_kind;         // empty when the writer saved none
  std::string tokenizer_model;        // Tokenizer::model_bytes()
};

/// Writes atomically (temporary file, fsync, rename, fsync of the directory). Refuses,
/// writing nothing, when a weight or an optimizer value is NaN or infinite.
/// `tokenizer` (optional) is stored so that sampling needs nothing but the checkpoint.
void save_checkpoint(const std::string& path, nn::LanguageModelImpl& model,
                     const Optimizer* optimizer, const TrainingState& state,
                     const std::string& recipe = "", const data::Tokenizer* tokenizer = nullptr);

/// The tokenizer a checkpoint carries; nullptr when it has none (written by an older
/// tinylm, or without one).
std::shared_ptr<const data::Tokenizer> checkpoint_tokenizer(const Checkpoint& checkpoint);

/// Reads and checks a checkpoint: a missing, foreign, truncated, corrupt, damaged or
/// newer-format file, or anything that is not a regular file, is refused with an error
/// naming the file and the problem. Older formats are migrated (see above). The model
/// architecture is checked against the stored weights (its parameter count) here, so a
/// damaged architecture is refused before any model is built from it.
Checkpoint read_checkpoint(const std::string& path);

/// The format version in a checkpoint's header, reading nothing else; 0 when `path`
/// cannot be read or does not start like a tinylm checkpoint (read_checkpoint says why).
uint32_t checkpoint_format_version(const std::string& path);

/// Copies the checkpoint's weights into `model` after checking that every parameter is
/// there with the same shape and dtype, that the checkpoint holds no others (LibTorch's
/// own loader would accept mismatched shapes silently), and that every value is finite.
void load_model_state(const Checkpoint& checkpoint, nn::LanguageModelImpl& model);

/// Restores the optimizer state saved with the checkpoint.
void load_optimizer_state(const Checkpoint& checkpoint, Optimizer& optimizer);

/// A checkpoint file, or the newest "step-*.ckpt" in a run directory.
std::string resolve_checkpoint_path(const std::string& file_or_dir);

}  // namespace tinylm::train
