// The memory a run described by a RunConfig needs, checked before anything large is
// allocated; the setting to lower is named in the config's own words.
#include <tinylm/nn/model_kind.h>
#include <tinylm/run.h>
#include <tinylm/train/resources.h>

#include "internal/files.h"
#include "internal/text.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <string>

namespace tinylm {

train::MemoryEstimate estimate_memory(const RunConfig& c, int64_t batch_size, bool training, bool on_cuda) {
  // Everything in double: a mistyped 1e9 must give a huge number, not an overflow. The
  // model's own formulas (its kind's) give its parameters, activations and buffers.
  const auto architecture = model_architecture(c);
  train::MemoryEstimate m;
  m.parameters = nn::parameter_elements(architecture);
  // Weights; in training also their gradients and Adam's two moments.
  m.parameter_bytes = 4 * m.parameters * (training ? 4 : 1);
  const auto batch = nn::batch_memory(architecture, static_cast<double>(batch_size), static_cast<double>(c.task_options.seq_len()),
                                      training);
  m.activation_bytes = batch.activation_bytes;
  m.buffer_bytes = batch.buffer_bytes;
  if (c.task == "text" && !c.task_options.data().empty()) {
    try {
      m.data_bytes = 2.0 * internal::check_regular_file(c.task_options.data(), "data file");  // read, then held
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
    if (smaller.effective_context() < smaller.task_options.seq_len()) continue;
    const bool is_batch = f.name == "batch-size";
    double t = best;
    try {
      t = estimate_memory(smaller, is_batch ? defaults.trainer.batch_size() : batch_size, training, on_cuda).total();
    } catch (const c10::Error&) {
      continue;  // that default breaks one of the model's rules with the others (d-model and n-heads)
    }
    if (t < best) best = t, culprit = f.name, value = std::get<int64_t>(f.get(c));
  }
  if (culprit.empty() && batch_size != c.trainer.batch_size()) culprit = "batch-size", value = batch_size;
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
