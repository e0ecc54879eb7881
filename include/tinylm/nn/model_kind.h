// Model kinds: what build_model() knows how to build. tinylm registers "tiny" and
// "transformer"; a program registers its own kind the same way, and its checkpoints are
// then rebuilt, checked and sized by the same path as tinylm's.
//
// A kind reads an architecture's text once into its own options struct, held as a
// ModelOptions; building the model, counting its parameters and sizing a batch all take
// that value (and a run config holds one: tinylm/config.h).
#pragma once

#include <tinylm/nn/model.h>
#include <tinylm/spec.h>

#include <c10/util/Exception.h>

#include <any>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace tinylm::nn {

/// What one batch needs besides the weights, in bytes (float32, a lower bound).
struct BatchMemory {
  double activation_bytes = 0;  // kept for the backward pass (training), or held at once
  double buffer_bytes = 0;      // made for the length run: masks, position tables
};

/// A model kind's options as its own typed value (TinyAttentionLMOptions for "tiny",
/// TransformerLMOptions for "transformer", a program's struct for its kind), with the
/// kind's name. read_model_options() makes one from an architecture; a kind's `defaults`
/// is one; `options<T>()` gives the struct.
class ModelOptions {
 public:
  ModelOptions() = default;
  template <typename Options>
  ModelOptions(std::string kind, Options options) : kind_(std::move(kind)), value_(std::move(options)) {}

  const std::string& kind() const { return kind_; }
  bool empty() const { return kind_.empty(); }
  /// The struct; an error when the value holds another type (a kind registered with
  /// another options struct).
  template <typename Options>
  const Options& options() const {
    const Options* o = std::any_cast<Options>(&value_);
    TORCH_CHECK(o, "the options of a '", kind_, "' model are not of the type asked for");
    return *o;
  }
  template <typename Options>
  Options& options() {
    return const_cast<Options&>(static_cast<const ModelOptions*>(this)->options<Options>());
  }

 private:
  std::string kind_;
  std::any value_;
};

struct ModelKind {
  std::string name;     // the architecture's kind
  int64_t version = 1;  // of its options; a file of a newer version is refused
  std::string help;
  std::vector<OptionInfo> options;
  ModelOptions defaults;  // what an option an architecture leaves out takes
  // What model_kind() makes from the options' spec:
  /// An architecture's option text over the defaults, not checked; keys it does not know
  /// go to `unknown`. `where` names the source in errors.
  std::function<ModelOptions(const std::map<std::string, std::string>& text, const std::string& where,
                             std::vector<std::string>* unknown)>
      read;
  /// read()'s inverse: the options as an architecture stores them.
  std::function<std::map<std::string, std::string>(const ModelOptions&)> write;
  /// One option by its stored name (nullopt: the kind has none of that name), and its setter.
  std::function<std::optional<OptionValue>(const ModelOptions&, const std::string& name)> get;
  std::function<void(ModelOptions&, const std::string& name, const OptionValue&)> set;
  /// Throws at the first rule the options break, in that spelling.
  std::function<void(const ModelOptions&, Spelling)> check;
  /// The model (its options already checked), initialised from LibTorch's default generator.
  std::function<LanguageModel(const ModelOptions&)> build;
  /// Parameter elements, from the options alone (double: sizes from a file may be absurd);
  /// may be empty, and then nothing is checked before building.
  std::function<double(const ModelOptions&)> parameter_elements;
  /// The memory of a batch of `rows` sequences of `seq_len` tokens, from the options
  /// alone; may be empty (batch_memory() then counts the logits only).
  std::function<BatchMemory(const ModelOptions&, double rows, double seq_len, bool training)> batch_memory;
};

/// A kind whose options are Options (declared once in `spec`, defaults from `defaults`)
/// and whose model is std::make_shared<Impl>(options).
template <typename Impl, typename Options>
ModelKind model_kind(std::string name, int64_t version, std::string help, const OptionSpec<Options>& spec,
                     const Options& defaults, std::function<double(const Options&)> parameters = {},
                     std::function<BatchMemory(const Options&, double, double, bool)> memory = {}) {
  ModelKind k;
  k.name = std::move(name);
  k.version = version;
  k.help = std::move(help);
  k.options = spec.describe(defaults);
  k.defaults = ModelOptions(k.name, defaults);
  k.read = [spec, defaults, kind = k.name](const std::map<std::string, std::string>& text, const std::string& where,
                                           std::vector<std::string>* unknown) {
    return ModelOptions(kind, spec.read(text, defaults, where, unknown));
  };
  k.write = [spec](const ModelOptions& o) { return spec.write(o.options<Options>()); };
  k.get = [spec](const ModelOptions& o, const std::string& key) { return spec.get(o.options<Options>(), key); };
  k.set = [spec](ModelOptions& o, const std::string& key, const OptionValue& v) {
    spec.set(o.options<Options>(), key, v);
  };
  k.check = [spec](const ModelOptions& o, Spelling spelling) { spec.check(o.options<Options>(), spelling); };
  k.build = [](const ModelOptions& o) { return LanguageModel(std::make_shared<Impl>(o.options<Options>())); };
  if (parameters) k.parameter_elements = [parameters](const ModelOptions& o) { return parameters(o.options<Options>()); };
  if (memory)
    k.batch_memory = [memory](const ModelOptions& o, double rows, double seq_len, bool training) {
      return memory(o.options<Options>(), rows, seq_len, training);
    };
  return k;
}

/// Adds a kind (another of the same name is an error: tinylm's own are taken).
void register_model_kind(ModelKind kind);

/// The kind of that name; an error listing the known kinds when there is none.
const ModelKind& find_model_kind(const std::string& name);

/// An architecture's options, read once by its kind and checked: what build_model(),
/// parameter_count() and batch_memory() take. Throws on an unknown kind, a newer option
/// version, unreadable text or a broken rule; options the kind does not know are skipped
/// with a warning (a file written by a newer tinylm).
ModelOptions read_model_options(const ModelArchitecture& architecture);

/// read_model_options()'s inverse: the architecture a model of these options reports.
ModelArchitecture architecture_of(const ModelOptions& options);

/// The model of these options (build_model(const ModelArchitecture&) reads them first):
/// checked, and its weights found to fit in memory before they are allocated.
LanguageModel build_model(const ModelOptions& options);

/// parameter_count() and parameter_elements() of options already read.
int64_t parameter_count(const ModelOptions& options);
double parameter_elements(const ModelOptions& options);

/// The memory of a batch for a model of these options (its kind's formula, or the
/// logits alone for a kind without one). Throws as parameter_count() does.
BatchMemory batch_memory(const ModelOptions& options, double rows, double seq_len, bool training);
BatchMemory batch_memory(const ModelArchitecture& architecture, double rows, double seq_len, bool training);

/// Every registered kind's name, tinylm's first.
std::vector<std::string> model_kind_names();

}  // namespace tinylm::nn
