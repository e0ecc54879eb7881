// The run configuration: model, task, optimisation and run settings in one flat set of
// keys. Every field has one name, used as the TOML key, the long command-line option
// (--name) and in the config stored inside each checkpoint. The model's keys are those
// its kind declares (nn::ModelKind), the task's those data::TaskOptions declares, the
// optimisation and run keys those train::TrainerOptions declares: this file lists only
// the tool's own.
#pragma once

#include <tinylm/data/task_kind.h>
#include <tinylm/nn/model_kind.h>
#include <tinylm/spec.h>
#include <tinylm/train/trainer.h>

#include <c10/util/Exception.h>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

namespace tinylm {

/// Defaults reproduce the reference training run: repeat task, vocab 64, d_model 32,
/// 4 heads, seq_len 12, batch 16, 3 epochs x 120 steps, Adam lr 5e-3, seed 42.
struct RunConfig {
  RunConfig();

  // ---- model: the options of a registered kind (nn::find_model_kind), as that kind's
  // own struct (nn::ModelOptions: TinyAttentionLMOptions for "tiny", the reference
  // TinyAttentionLM; TransformerLMOptions for "transformer"; a program's for its kind).
  // config_fields() makes a key of each kind's options (d-model, n-layers ...), which
  // read and write it; the key `model` changes the kind, keeping the options both share.
  // Building the model, counting it and sizing its memory all take this value.
  nn::ModelOptions model;
  /// Model keys given (set(), a TOML key) that the chosen kind has no option for, by
  /// stored name (n_layers before `model = "transformer"`): a later `model` key takes up
  /// those its kind has, and check_config() refuses the rest.
  std::map<std::string, OptionValue> other_model_options;
  // ---- task: a registered kind (data::find_task_kind) and the settings any task takes,
  // whose spec (data::TaskOptions::spec()) gives their keys; vocab_size is the model's.
  std::string task = "repeat";
  data::TaskOptions task_options;
  // ---- optimisation and run: the Trainer's own options, whose spec
  // (train::TrainerOptions::spec()) gives their keys (lr, batch-size, out-dir ...), rules
  // and help; the defaults are the reference run's, out-dir runs/default.
  train::TrainerOptions trainer;
  // ---- run: what the tool alone decides
  std::string device = "auto";       // auto | cpu | cuda | cuda:N
  int64_t threads = 1;               // intra-op CPU threads; 0 = LibTorch's default

  /// The keys given on purpose, each with where: "run.toml:3" (apply_toml), "" (set(), a
  /// flag). check_config() refuses one that the chosen model kind or task kind does not take,
  /// naming where. What a stored recipe sets is not given (an older one holds every
  /// kind's keys): config_from_checkpoint() clears this.
  std::map<std::string, std::string> given;

  int64_t total_steps() const { return trainer.total_steps(); }
  /// The task's settings as the task gets them: task_options with the model's vocabulary.
  data::TaskOptions task_settings() const;
  /// The model's context: context-length, or seq-len where that is 0.
  int64_t effective_context() const;
  /// The model's options as the model gets them: `model` with context-length 0 made
  /// seq-len.
  nn::ModelOptions model_settings() const;

  /// Any field by its key (d-model, lr ...): get<T> throws naming the key when it is not
  /// a T; set() takes a value of the field's type (an int for an integer or a real).
  template <typename T>
  T get(const std::string& key) const;
  void set(const std::string& key, OptionValue value);
  template <typename T, typename = std::enable_if_t<std::is_arithmetic_v<T> && !std::is_same_v<T, bool>>>
  void set(const std::string& key, T value) {
    if constexpr (std::is_integral_v<T>) set(key, OptionValue(static_cast<int64_t>(value)));
    else set(key, OptionValue(static_cast<double>(value)));
  }
  void set(const std::string& key, const char* value) { set(key, OptionValue(std::string(value))); }
  void set(const std::string& key, bool value) { set(key, OptionValue(value)); }
};

/// One field of RunConfig: its key (the TOML key, and the long option the CLI makes of
/// it), its group, help, type and choices, and how to read and write it on any instance.
/// The model group is made from the registered model kinds' specs.
struct ConfigField {
  std::string name;   // "d-model"
  std::string group;  // model | task | optim | run
  std::string help;
  OptionType type = OptionType::integer;
  std::vector<std::string> choices;
  std::string rule;     // the values it takes, in words ("must be in [0, 1)"; "" = any)
  bool written = true;  // false: an older key still read (fused-attention), never written
  /// The model or task option it sets, as stored (n_layers; "" = neither): a run uses it
  /// only when its model kind has that option, or its task kind reads it (takes()).
  std::string option;
  std::function<OptionValue(const RunConfig&)> get;
  std::function<void(RunConfig&, const OptionValue&)> set;
};

/// Every field, in the order --print-config writes them (model kinds registered after the
/// first call are not among them).
const std::vector<ConfigField>& config_fields();
const ConfigField* find_config_field(const std::string& name);
/// The field of that name; an error naming the key, and the closest key when one is near
/// ("unknown key 'd_model' (did you mean 'd-model'?)").
const ConfigField& config_field(const std::string& name);

template <typename T>
T RunConfig::get(const std::string& key) const {
  const ConfigField* f = find_config_field(key);
  TORCH_CHECK(f, "the run config has no key '", key, "'");
  const OptionValue v = f->get(*this);
  TORCH_CHECK(std::holds_alternative<T>(v), "'", key, "' is ", to_string(type_of(v)), ", not the type asked for");
  return std::get<T>(v);
}

/// The values a field takes, in words: "one of a, b" or its rule ("must be >= 1"); ""
/// when any value of its type goes (rules between fields are check_config()'s).
std::string accepted_values(const ConfigField& field);

/// Whether the config's model kind and task kind use the field (the model's own options,
/// the settings its task reads, and every key that is neither).
bool takes(const RunConfig& config, const ConfigField& field);

/// Throws with the field's name, its value and the rule when a value is invalid, and at
/// the first given key (RunConfig::given) that the chosen kinds do not take, naming where
/// it was given and the kinds that take it.
void check_config(const RunConfig& config);

/// The config as TOML (flat keys, grouped by comments): the keys the config takes, so a
/// recipe holds its own model's and task's options only; apply_toml() reads it back.
/// `with_accepted`: each key's accepted values in a comment after it, where it has a rule
/// or choices (what --print-config writes for a person).
std::string to_toml(const RunConfig& config, bool with_accepted = false);

/// Applies the keys of a TOML document onto `config`, each recorded as given at
/// origin:line. Unknown keys, nested tables and wrong value types are errors naming
/// `origin` (a file name), the key and the fix; with `unknown` given, unknown keys are
/// collected there instead (a stored config read by a later tinylm). Returns the names of
/// the keys that were set.
std::vector<std::string> apply_toml(RunConfig& config, const std::string& text,
                                    const std::string& origin,
                                    std::vector<std::string>* unknown = nullptr);

/// Reads a TOML file (missing or unreadable file: an error naming it).
std::vector<std::string> apply_toml_file(RunConfig& config, const std::string& path);

/// The field's value as TOML would write it.
std::string field_value_string(const ConfigField& field, const RunConfig& config);

}  // namespace tinylm
