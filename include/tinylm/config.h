// The run configuration: model, task, optimisation and run settings in one flat struct.
// Every field has one name, used as the TOML key, the long command-line option
// (--name) and in the config stored inside each checkpoint.
#pragma once

#include <cstdint>
#include <string>
#include <variant>
#include <vector>

namespace tinylm {

/// Defaults reproduce the reference training run: repeat task, vocab 64, d_model 32,
/// 4 heads, seq_len 12, batch 16, 3 epochs x 120 steps, Adam lr 5e-3, seed 42.
struct RunConfig {
  // ---- model
  std::string model = "tiny";        // tiny (the reference TinyAttentionLM) | transformer
  int64_t vocab_size = 64;
  int64_t d_model = 32;
  int64_t n_heads = 4;
  int64_t n_layers = 2;              // transformer only
  int64_t context_length = 0;        // 0 = seq_len
  std::string positions = "learned"; // transformer only: learned | sinusoidal | none
  bool pre_ln = true;                // transformer only
  std::string activation = "gelu-tanh";  // transformer only: gelu-tanh | gelu (exact, nanoGPT's)
  bool tie_weights = true;           // transformer only
  double dropout = 0.0;              // transformer only: embeddings and residual branches
  double attn_dropout = 0.0;         // transformer only
  bool bias = true;                  // transformer only
  int64_t mlp_expansion = 4;         // transformer only
  bool fused_attention = true;       // fused CPU attention kernel where it applies
  // ---- task
  std::string task = "repeat";       // repeat | copy | reverse | sort | text | tokens
  int64_t seq_len = 12;
  std::string data;                  // text: the training file; tokens: a prepared corpus (directory)
  double val_fraction = 0.1;         // text task: the tail of the file held out
  // ---- optimisation
  std::string optimizer = "adam";    // adam | adamw (no decay on biases, norms, embeddings)
  double lr = 5e-3;
  double weight_decay = 0.0;         // adamw only
  double beta1 = 0.9;
  double beta2 = 0.999;
  std::string lr_schedule = "constant";  // constant | cosine (after warmup)
  int64_t warmup_steps = 0;
  double min_lr_ratio = 0.1;         // cosine decays to lr * min_lr_ratio
  double grad_clip = 0.0;            // max global grad norm; 0 = off
  int64_t grad_accum = 1;            // micro-batches per optimizer step
  bool fused_optimizer = true;       // Adam/AdamW over one flat buffer (else LibTorch's)
  int64_t batch_size = 16;
  int64_t epochs = 3;
  int64_t steps_per_epoch = 120;
  // ---- run
  int64_t seed = 42;
  std::string device = "auto";       // auto | cpu | cuda | cuda:N
  bool bf16 = false;                 // CUDA only: bf16 autocast
  int64_t threads = 1;               // intra-op CPU threads; 0 = LibTorch's default
  int64_t log_every = 40;            // steps between progress lines
  int64_t eval_every = 0;            // steps between validations; 0 = once per epoch
  int64_t eval_batches = 8;
  std::string out_dir = "runs/default";
  int64_t save_every = 0;            // steps between checkpoints; 0 = once per epoch
  int64_t keep_last = 3;             // step checkpoints kept (best.ckpt is kept apart)
  bool stop_when_solved = false;     // synthetic tasks: stop once validation is solved
  double solve_loss = 0.01;          // solved = 100% validation accuracy and loss below this

  int64_t total_steps() const { return epochs * steps_per_epoch; }
  int64_t effective_context() const { return context_length > 0 ? context_length : seq_len; }
};

/// One field of RunConfig, reachable on any instance through a member pointer.
struct ConfigField {
  using Member = std::variant<int64_t RunConfig::*, double RunConfig::*, bool RunConfig::*,
                              std::string RunConfig::*>;
  const char* name;   // "d-model": the TOML key, and the long option the CLI makes of it
  const char* group;  // model | task | optim | run
  const char* help;
  Member member;
};

/// Every field, in the order --print-config writes them.
const std::vector<ConfigField>& config_fields();
const ConfigField* find_config_field(const std::string& name);

/// Throws with the field's name, its value and the rule when a value is invalid.
void validate(const RunConfig& config);

/// The config as TOML (flat keys, grouped by comments); apply_toml() reads it back.
std::string to_toml(const RunConfig& config);

/// Applies the keys of a TOML document onto `config`. Unknown keys, nested tables and
/// wrong value types are errors naming `origin` (a file name), the key and the fix;
/// with `unknown` given, unknown keys are collected there instead (a stored config read
/// by a later tinylm). Returns the names of the keys that were set.
std::vector<std::string> apply_toml(RunConfig& config, const std::string& text,
                                    const std::string& origin,
                                    std::vector<std::string>* unknown = nullptr);

/// Reads a TOML file (missing or unreadable file: an error naming it).
std::vector<std::string> apply_toml_file(RunConfig& config, const std::string& path);

/// Copies one field's value from `from` into `to`.
void copy_field(const ConfigField& field, const RunConfig& from, RunConfig& to);

/// The field's value as TOML would write it.
std::string field_value_string(const ConfigField& field, const RunConfig& config);

}  // namespace tinylm
