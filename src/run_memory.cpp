// The memory a run described by a RunConfig needs, checked before anything large is
// allocated; the setting to lower is named in the config's own words.
// B = batch, T = sequence length, C = context, D = d_model, H = heads, L = layers,
// V = vocab size, e = MLP expansion
#include <tinylm/run.h>
#include <tinylm/train/resources.h>

#include "internal/system.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <string>

namespace tinylm {

train::MemoryEstimate estimate_memory(const RunConfig& c, int64_t batch_size, bool training, bool on_cuda) {
  // Everything in double: a mistyped 1e9 must give a huge number, not an overflow.
  // A kind without one of these options counts as not having what it sizes.
  auto option = [&](const char* key, double otherwise) {
    auto it = c.model_options.find(key);
    return it != c.model_options.end() && std::holds_alternative<int64_t>(it->second)
               ? static_cast<double>(std::get<int64_t>(it->second))
               : otherwise;
  };
  const double V = option("vocab_size", 0), D = option("d_model", 0), H = option("n_heads", 1), T = c.seq_len,
               C = c.effective_context(), B = batch_size, e = option("mlp_expansion", 4), L = option("n_layers", 1);
  const bool tiny = c.model == "tiny";
  const double layers = tiny ? 1 : L;
  auto positions = c.model_options.find("positions");
  const bool sinusoidal = tiny || (positions != c.model_options.end() && positions->second == OptionValue(std::string("sinusoidal")));
  train::MemoryEstimate m;
  m.parameters = nn::parameter_elements(model_architecture(c));  // the model's own count
  // Weights; in training also their gradients and Adam's two moments.
  m.parameter_bytes = 4 * m.parameters * (training ? 4 : 1);
  // The causal mask of the step-by-step attention (T x T bool, made per call), and the
  // sinusoidal rows, kept for the longest length run (grown by doubling: under 2T rows).
  m.buffer_bytes = T * T + (sinusoidal ? 4 * std::min(C, 2 * T) * D : 0);
  // Training keeps, per token and layer, at least the block's inputs, q/k/v, the
  // attention context and output and the MLP's hidden activations, per (row, head) the
  // T x T attention weights, and at the top the logits and their gradient. Inference
  // holds one layer's worth at a time, and the logits.
  const double attention = B * H * T * T;
  if (training) {
    const double per_layer = (tiny ? 5 * D : (10 + 2 * e) * D) * B * T + attention;
    m.activation_bytes = 4 * (layers * per_layer + 2 * B * T * V);
  } else {
    const double per_layer = (tiny ? 5 * D : (4 + e) * D) * B * T + attention;
    m.activation_bytes = 4 * (per_layer + B * T * V);
  }
  if (c.task == "text" && !c.data.empty()) {
    try {
      m.data_bytes = 2.0 * internal::check_regular_file(c.data, "data file");  // read, then held
    } catch (const c10::Error&) {
      m.data_bytes = 0;  // the task reports a missing or unusable file itself
    }
  }
  if (on_cuda) {  // the host only builds the model before it moves
    m.parameter_bytes = 4 * m.parameters;
    m.activation_bytes = 0;
    m.buffer_bytes = 0;
  }
  return m;
}

void check_memory(const RunConfig& c, int64_t batch_size, bool training, bool on_cuda) {
  const uint64_t available = train::available_memory_bytes();
  if (available == 0) return;
  const auto m = estimate_memory(c, batch_size, training, on_cuda);
  if (m.total() <= static_cast<double>(available)) return;
  // Blame the setting whose default value would shrink the estimate the most: the batch,
  // the sequence, or one of the model's whole-number options.
  const RunConfig defaults;
  std::string culprit;
  int64_t value = 0;
  double best = m.total();
  for (const auto& f : config_fields()) {
    if (f.type != OptionType::integer || (f.group != "model" && f.name != "batch-size" && f.name != "seq-len") ||
        f.get(c) == f.get(defaults))
      continue;
    RunConfig smaller = c;
    f.set(smaller, f.get(defaults));
    if (smaller.effective_context() < smaller.seq_len) continue;
    const bool is_batch = f.name == "batch-size";
    double t = best;
    try {
      t = estimate_memory(smaller, is_batch ? defaults.batch_size : batch_size, training, on_cuda).total();
    } catch (const c10::Error&) {
      continue;  // that default breaks one of the model's rules with the others (d-model and n-heads)
    }
    if (t < best) best = t, culprit = f.name, value = std::get<int64_t>(f.get(c));
  }
  if (culprit.empty() && batch_size != c.batch_size) culprit = "batch-size", value = batch_size;
  std::string what = !culprit.empty() ? culprit + " " + std::to_string(value) : "this run";
  TORCH_CHECK(false, what, " needs about ", internal::human_bytes(m.total()), " of memory (",
              static_cast<int64_t>(std::min(m.parameters, 9e18)), " parameters: ",
              internal::human_bytes(m.parameter_bytes), "; activations of one batch: ",
              internal::human_bytes(m.activation_bytes), "; masks and tables: ",
              internal::human_bytes(m.buffer_bytes),
              m.data_bytes > 0 ? "; data: " + internal::human_bytes(m.data_bytes) : std::string(),
              "), but ", internal::human_bytes(static_cast<double>(available)),
              " is available: ", !culprit.empty() ? "lower " + culprit : std::string("make the model or batch smaller"));
}

}  // namespace tinylm
