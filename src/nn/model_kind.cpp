// The model kinds build_model() knows, and what it checks before building one.
#include <tinylm/log.h>
#include <tinylm/nn/model_kind.h>

#include "internal/kind_registry.h"
#include "internal/machine.h"
#include "internal/text.h"
#include "nn/builtin_kinds.h"

#include <cstdlib>

namespace tinylm::nn {

namespace {

internal::KindRegistry<ModelKind>& registry() {
  // Outlives static destruction: kinds may be looked up until the process exits.
  static auto* r = new internal::KindRegistry<ModelKind>("model", builtin_model_kinds());
  return *r;
}

/// The kind, after checking the architecture's version and options.
const ModelKind& checked_kind(const ModelArchitecture& a, bool warn) {
  const ModelKind& kind = find_model_kind(a.kind);
  TORCH_CHECK(a.version >= 1 && a.version <= kind.version, "a ", printable(a.kind), " model of option version ",
              a.version, " is newer than this build understands (version ", kind.version,
              "): upgrade tinylm, or the program that defines this kind");
  std::vector<std::string> unknown;
  kind.check(a, Spelling::stored, &unknown);
  if (warn)
    for (const auto& key : unknown)
      logger()->warn("model option '{}' = '{}' of a {} model (version {}) is unknown to this tinylm (written by a "
                     "newer one?): ignored",
                     printable(key), printable(a.options.at(key)), printable(a.kind), a.version);
  return kind;
}

/// Refuses, before anything is allocated, a model whose weights (float32) cannot fit in
/// the memory this process has: an architecture read from a file must not exhaust it.
/// Nothing else a model holds grows with its options: masks and sinusoidal rows are made
/// for the lengths it is run at.
void check_fits(const ModelArchitecture& a, double parameters) {
  const double bytes = 4.0 * parameters;
  const uint64_t available = internal::available_memory_bytes();
  TORCH_CHECK(available == 0 || bytes < 0.9 * static_cast<double>(available), "a ", printable(a.kind),
              " model with these options needs about ", internal::human_bytes(bytes), " for its weights, but ",
              internal::human_bytes(static_cast<double>(available)),
              " is available: lower vocab_size, context_length, d_model or n_layers");
}

}  // namespace

void register_model_kind(ModelKind kind) {
  TORCH_CHECK(!kind.name.empty() && kind.check && kind.build,
              "register_model_kind: a kind needs a name, check and build (model_kind() makes them)");
  registry().add(std::move(kind));
}

const ModelKind& find_model_kind(const std::string& name) {
  const ModelKind* kind = registry().find(name);
  TORCH_CHECK(kind, "cannot build a model of kind '", printable(name), "': the kinds known are ", registry().list(),
              "; register yours with register_model_kind (tinylm/nn/model_kind.h), or build it in your own code and "
              "load the checkpoint's weights with load_model_state");
  return *kind;
}

std::vector<std::string> model_kind_names() { return registry().names(); }

double parameter_elements(const ModelArchitecture& a) {
  const ModelKind& kind = checked_kind(a, /*warn=*/false);
  TORCH_CHECK(kind.parameter_elements, "model kind '", printable(a.kind), "' does not count its parameters");
  return kind.parameter_elements(a);
}

int64_t parameter_count(const ModelArchitecture& a) {
  const double elements = parameter_elements(a);
  // Exact below 2^53.
  TORCH_CHECK(elements >= 0 && elements < 9e18, "a ", printable(a.kind), " model with these options would have ",
              elements, " parameters, more than any model can");
  return static_cast<int64_t>(elements);
}

BatchMemory batch_memory(const ModelArchitecture& a, double rows, double seq_len, bool training) {
  const ModelKind& kind = checked_kind(a, /*warn=*/false);
  if (kind.batch_memory) return kind.batch_memory(a, rows, seq_len, training);
  BatchMemory m;  // the logits (and their gradient) at least
  auto v = a.options.find("vocab_size");
  const double vocab = v != a.options.end() ? std::strtod(v->second.c_str(), nullptr) : 0;
  m.activation_bytes = 4 * (training ? 2 : 1) * rows * seq_len * vocab;
  return m;
}

LanguageModel build_model(const ModelArchitecture& a) {
  const ModelKind& kind = checked_kind(a, /*warn=*/true);
  if (kind.parameter_elements) check_fits(a, kind.parameter_elements(a));
  return kind.build(a);
}

}  // namespace tinylm::nn
