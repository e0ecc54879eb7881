// Model kinds: what build_model() knows how to build. tinylm registers "tiny" and
// "transformer"; a program registers its own kind the same way, and its checkpoints are
// then rebuilt, checked and sized by the same path as tinylm's.
#pragma once

#include <tinylm/nn/model.h>
#include <tinylm/spec.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace tinylm::nn {

/// What one batch needs besides the weights, in bytes (float32, a lower bound).
struct BatchMemory {
  double activation_bytes = 0;  // kept for the backward pass (training), or held at once
  double buffer_bytes = 0;      // made for the length run: masks, position tables
};

struct ModelKind {
  std::string name;     // the architecture's kind
  int64_t version = 1;  // of its options; a file of a newer version is refused
  std::string help;
  std::vector<OptionInfo> options;
  /// Reads and checks an architecture's options; keys it does not know go to `unknown`.
  std::function<void(const ModelArchitecture&, Spelling, std::vector<std::string>* unknown)> check;
  /// The model (its options already checked), initialised from LibTorch's default generator.
  std::function<LanguageModel(const ModelArchitecture&)> build;
  /// Parameter elements, from the options alone (double: sizes from a file may be absurd);
  /// may be empty, and then nothing is checked before building.
  std::function<double(const ModelArchitecture&)> parameter_elements;
  /// The memory of a batch of `rows` sequences of `seq_len` tokens, from the options
  /// alone; may be empty (batch_memory() then counts the logits only).
  std::function<BatchMemory(const ModelArchitecture&, double rows, double seq_len, bool training)> batch_memory;
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
  auto read = [spec, defaults](const ModelArchitecture& a, Spelling spelling, std::vector<std::string>* unknown) {
    Options o = spec.read(a.options, defaults, "a " + a.kind + " architecture", unknown);
    spec.check(o, spelling);
    return o;
  };
  k.check = [read](const ModelArchitecture& a, Spelling s, std::vector<std::string>* unknown) { read(a, s, unknown); };
  k.build = [read](const ModelArchitecture& a) {
    std::vector<std::string> ignored;
    return LanguageModel(std::make_shared<Impl>(read(a, Spelling::stored, &ignored)));
  };
  if (parameters)
    k.parameter_elements = [read, parameters](const ModelArchitecture& a) {
      std::vector<std::string> ignored;
      return parameters(read(a, Spelling::stored, &ignored));
    };
  if (memory)
    k.batch_memory = [read, memory](const ModelArchitecture& a, double rows, double seq_len, bool training) {
      std::vector<std::string> ignored;
      return memory(read(a, Spelling::stored, &ignored), rows, seq_len, training);
    };
  return k;
}

/// Adds a kind (another of the same name is an error: tinylm's own are taken).
void register_model_kind(ModelKind kind);

/// The kind of that name; an error listing the known kinds when there is none.
const ModelKind& find_model_kind(const std::string& name);

/// The memory of a batch for a model of that architecture (its kind's formula, or the
/// logits alone for a kind without one). Throws as parameter_count() does.
BatchMemory batch_memory(const ModelArchitecture& architecture, double rows, double seq_len, bool training);

/// Every registered kind's name, tinylm's first.
std::vector<std::string> model_kind_names();

}  // namespace tinylm::nn
