// The model kinds build_model() knows (tinylm's own, with what counting one takes, and a
// program's), and what it checks before building one.
#include <tinylm/log.h>
#include <tinylm/nn/model.h>
#include <tinylm/nn/model_kind.h>

#include "internal/kind_registry.h"
#include "internal/machine.h"
#include "internal/text.h"

#include <algorithm>
#include <functional>
#include <string>
#include <variant>
#include <vector>

namespace tinylm::nn {

namespace {

/// Parameter elements, in double (sizes read from a file may be absurd): what the
/// modules below register, matrix by matrix.
double tiny_parameter_elements(const TinyAttentionLMOptions& o) {
  const double v = static_cast<double>(o.vocab_size()), d = static_cast<double>(o.d_model());
  return v * d                  // token embedding
         + 4 * d * d + 4 * d    // qkv and output projections, with biases
         + d * v + v;           // lm_head, with bias
}
double transformer_parameter_elements(const TransformerLMOptions& o) {
  const auto& attention = o.block().attention();
  const auto& mlp = o.block().mlp();
  const auto& norm = o.block().norm();
  const double v = static_cast<double>(o.vocab_size()), d = static_cast<double>(o.d_model()),
               c = static_cast<double>(o.context_length()), l = static_cast<double>(o.n_layers());
  const double heads = static_cast<double>(o.n_heads());
  const double kv_heads = attention.n_kv_heads() > 0 ? static_cast<double>(attention.n_kv_heads()) : heads;
  const double kv = kv_heads * d / heads;  // keys (and values) per token
  const double f = static_cast<double>(mlp.hidden() > 0 ? mlp.hidden() : mlp.expansion() * o.d_model());
  const double f_in = mlp.activation() == Activation::swiglu ? 2 * f : f;  // fc's outputs
  const double qkv = d * (d + 2 * kv) + (attention.bias() ? d + 2 * kv : 0);
  const double out = d * d + (attention.bias() ? d : 0);
  const double mlp_weights = d * f_in + f * d + (mlp.bias() ? f_in + d : 0);  // fc and proj
  const double one_norm = (norm.gain() ? d : 0) + (norm.bias() ? d : 0);
  const double per_layer = qkv + out + mlp_weights + 2 * one_norm;
  return v * d + (o.positions() == PositionEncoding::learned ? c * d : 0) + l * per_layer +
         one_norm                               // ln_f
         + (o.tie_weights() ? 0 : v * d);       // lm_head (no bias)
}

/// The memory of a batch (B rows of T tokens) for a stack of `layers` attention layers
/// of width D and H heads: training keeps, per token and layer, `train_widths` x D values
/// (the block's inputs, q/k/v, the attention context and output, the MLP's hidden
/// activations) and per (row, head) the T x T attention weights, and at the top the
/// logits and their gradient; inference holds one layer's worth (`infer_widths` x D) and
/// the logits. Buffers: the causal mask (T x T bool, made per call) and, with sinusoidal
/// positions, the rows kept for the longest length run (grown by doubling: under 2T).
BatchMemory stack_memory(double V, double C, double D, double H, double layers, double train_widths,
                         double infer_widths, bool sinusoidal, double B, double T, bool training) {
  BatchMemory m;
  const double attention = B * H * T * T;
  m.activation_bytes = training ? 4 * (layers * (train_widths * D * B * T + attention) + 2 * B * T * V)
                                : 4 * (infer_widths * D * B * T + attention + B * T * V);
  m.buffer_bytes = T * T + (sinusoidal ? 4 * std::min(C, 2 * T) * D : 0);
  return m;
}
BatchMemory tiny_memory(const TinyAttentionLMOptions& o, double B, double T, bool training) {
  return stack_memory(o.vocab_size(), o.context_length(), o.d_model(), o.n_heads(), 1, 5, 5, true, B, T, training);
}
BatchMemory transformer_memory(const TransformerLMOptions& o, double B, double T, bool training) {
  // The MLP's hidden widths in units of D: GELU keeps its input and output, SwiGLU its
  // gate, up, silu(gate) and product; rotary positions keep rotated queries and keys.
  const auto& mlp = o.block().mlp();
  const double e = static_cast<double>(mlp.hidden() > 0 ? mlp.hidden() : mlp.expansion() * o.d_model()) /
                   static_cast<double>(std::max<int64_t>(1, o.d_model()));
  const bool swiglu = mlp.activation() == Activation::swiglu, rotary = o.positions() == PositionEncoding::rotary;
  return stack_memory(o.vocab_size(), o.context_length(), o.d_model(), o.n_heads(), o.n_layers(),
                      10 + (swiglu ? 4 : 2) * e + (rotary ? 2 : 0), 4 + (swiglu ? 2 : 1) * e,
                      o.positions() == PositionEncoding::sinusoidal, B, T, training);
}

/// "tiny" and "transformer", which the registry holds from the start.
std::vector<ModelKind> builtin_model_kinds() {
  return {model_kind<TinyAttentionLMImpl>("tiny", 1,
                                          "the reference TinyAttentionLM: embedding, sinusoidal positions, "
                                          "one attention layer, LM head",
                                          TinyAttentionLMOptions::spec(), TinyAttentionLMOptions(0, 0, 0, 0),
                                          std::function<double(const TinyAttentionLMOptions&)>(tiny_parameter_elements),
                                          std::function<BatchMemory(const TinyAttentionLMOptions&, double, double, bool)>(
                                              tiny_memory)),
          model_kind<TransformerLMImpl>("transformer", 1, "a GPT-2 style block stack",
                                        TransformerLMOptions::spec(), TransformerLMOptions(0, 0, 0, 0, 0),
                                        std::function<double(const TransformerLMOptions&)>(
                                            transformer_parameter_elements),
                                        std::function<BatchMemory(const TransformerLMOptions&, double, double, bool)>(
                                            transformer_memory))};
}

internal::KindRegistry<ModelKind>& registry() {
  // Outlives static destruction: kinds may be looked up until the process exits.
  static auto* r = new internal::KindRegistry<ModelKind>("model", builtin_model_kinds());
  return *r;
}

/// The architecture's kind after checking its option version, and its options read
/// once and checked; unknown options are logged when `warn`.
ModelOptions read_checked(const ModelArchitecture& a, bool warn) {
  const ModelKind& kind = find_model_kind(a.kind);
  TORCH_CHECK(a.version >= 1 && a.version <= kind.version, "a ", printable(a.kind), " model of option version ",
              a.version, " is newer than this build understands (version ", kind.version,
              "): upgrade tinylm, or the program that defines this kind");
  std::vector<std::string> unknown;
  ModelOptions o = kind.read(a.options, "a " + kind.name + " architecture", &unknown);
  kind.check(o, Spelling::stored);
  if (warn)
    for (const auto& key : unknown)
      logger()->warn("model option '{}' = '{}' of a {} model (version {}) is unknown to this tinylm (written by a "
                     "newer one?): ignored",
                     printable(key), printable(a.options.at(key)), printable(a.kind), a.version);
  return o;
}

/// The kind of options that pass its rules.
const ModelKind& checked_kind(const ModelOptions& o) {
  TORCH_CHECK(!o.empty(), "model options of no kind: read them from an architecture, or start from a kind's defaults");
  const ModelKind& kind = find_model_kind(o.kind());
  kind.check(o, Spelling::stored);
  return kind;
}

/// Refuses, before anything is allocated, a model whose weights (float32) cannot fit in
/// the memory this process has: an architecture read from a file must not exhaust it.
/// Nothing else a model holds grows with its options: masks and sinusoidal rows are made
/// for the lengths it is run at.
void check_fits(const std::string& kind, double parameters) {
  const double bytes = 4.0 * parameters;
  const uint64_t available = internal::available_memory_bytes();
  TORCH_CHECK(available == 0 || bytes < 0.9 * static_cast<double>(available), "a ", printable(kind),
              " model with these options needs about ", internal::human_bytes(bytes), " for its weights, but ",
              internal::human_bytes(static_cast<double>(available)),
              " is available: lower vocab_size, context_length, d_model or n_layers");
}

}  // namespace

void register_model_kind(ModelKind kind) {
  TORCH_CHECK(!kind.name.empty() && kind.read && kind.write && kind.get && kind.set && kind.check && kind.build &&
                  kind.defaults.kind() == kind.name,
              "register_model_kind: a kind needs a name, defaults of that kind, read, write, get, set, check and "
              "build (model_kind() makes them)");
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

ModelOptions read_model_options(const ModelArchitecture& a) { return read_checked(a, /*warn=*/true); }

ModelArchitecture architecture_of(const ModelOptions& o) {
  TORCH_CHECK(!o.empty(), "model options of no kind have no architecture");
  const ModelKind& kind = find_model_kind(o.kind());
  return {kind.name, kind.version, kind.write(o)};
}

double parameter_elements(const ModelOptions& o) {
  const ModelKind& kind = checked_kind(o);
  TORCH_CHECK(kind.parameter_elements, "model kind '", printable(o.kind()), "' does not count its parameters");
  return kind.parameter_elements(o);
}

int64_t parameter_count(const ModelOptions& o) {
  const double elements = parameter_elements(o);
  // Exact below 2^53.
  TORCH_CHECK(elements >= 0 && elements < 9e18, "a ", printable(o.kind()), " model with these options would have ",
              elements, " parameters, more than any model can");
  return static_cast<int64_t>(elements);
}

double parameter_elements(const ModelArchitecture& a) { return parameter_elements(read_checked(a, /*warn=*/false)); }

int64_t parameter_count(const ModelArchitecture& a) { return parameter_count(read_checked(a, /*warn=*/false)); }

BatchMemory batch_memory(const ModelOptions& o, double rows, double seq_len, bool training) {
  const ModelKind& kind = checked_kind(o);
  if (kind.batch_memory) return kind.batch_memory(o, rows, seq_len, training);
  BatchMemory m;  // the logits (and their gradient) at least
  const auto v = kind.get(o, "vocab_size");
  const double vocab = v && std::holds_alternative<int64_t>(*v) ? static_cast<double>(std::get<int64_t>(*v)) : 0;
  m.activation_bytes = 4 * (training ? 2 : 1) * rows * seq_len * vocab;
  return m;
}

BatchMemory batch_memory(const ModelArchitecture& a, double rows, double seq_len, bool training) {
  return batch_memory(read_checked(a, /*warn=*/false), rows, seq_len, training);
}

LanguageModel build_model(const ModelOptions& o) {
  const ModelKind& kind = checked_kind(o);
  if (kind.parameter_elements) check_fits(kind.name, kind.parameter_elements(o));
  return kind.build(o);
}

LanguageModel build_model(const ModelArchitecture& a) { return build_model(read_model_options(a)); }

TransformerLMOptions transformer_options(const ModelArchitecture& a) {
  TORCH_CHECK(a.kind == "transformer", "a ", printable(a.kind), " model has no transformer options");
  return read_checked(a, /*warn=*/false).options<TransformerLMOptions>();
}

}  // namespace tinylm::nn
