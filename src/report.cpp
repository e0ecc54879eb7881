// Causal check and ASCII heatmap of attention weights; model text made safe for a terminal.
#include <tinylm/report.h>

#include "internal/text.h"

#include <torch/types.h>

#include <iomanip>
#include <sstream>

namespace tinylm {

CausalCheck causal_check(const torch::Tensor& weights) {
  TORCH_CHECK(weights.dim() >= 2 && weights.size(-1) == weights.size(-2),
              "causal_check: expected weights (..., T, T), got shape ", weights.sizes());
  const int64_t T = weights.size(-1);
  auto w = weights.to(torch::kCPU, torch::kFloat64);
  auto future = torch::ones({T, T}, torch::kBool).triu(1);
  CausalCheck c;
  c.future_weight_sum = w.masked_select(future.expand(w.sizes())).sum().item<double>();
  c.max_row_error = (w.sum(-1) - 1.0).abs().max().item<double>();
  return c;
}

std::string ascii_heatmap(const torch::Tensor& weights) {
  TORCH_CHECK(weights.dim() == 2 && weights.size(0) == weights.size(1),
              "ascii_heatmap: expected one (T, T) matrix, got shape ", weights.sizes());
  static const char kGlyphs[] = " .:-=+*#%@";
  constexpr int kLevels = sizeof(kGlyphs) - 2;  // index of '@'
  auto w = weights.to(torch::kCPU, torch::kFloat64);
  const int64_t T = w.size(0);
  const double top = std::max(w.max().item<double>(), 1e-12);
  std::ostringstream out;
  out << "     ";
  for (int64_t j = 0; j < T; ++j) out << std::setw(2) << j % 10;  // key index, last digit
  out << "   (keys)\n";
  for (int64_t i = 0; i < T; ++i) {
    out << std::setw(4) << i << ' ';
    for (int64_t j = 0; j < T; ++j) {
      const double v = w[i][j].item<double>() / top;
      const int level = static_cast<int>(std::lround(std::clamp(v, 0.0, 1.0) * kLevels));
      out << ' ' << kGlyphs[level];
    }
    out << '\n';
  }
  return out.str();
}

std::string terminal_text(std::string_view text) { return internal::for_terminal(text); }

}  // namespace tinylm
