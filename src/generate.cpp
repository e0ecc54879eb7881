// Autoregressive sampling.
// B = batch, T = running length, C = context length, V = vocab size
#include <tinylm/generate.h>

#include "internal/mode_guard.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <algorithm>
#include <limits>
#include <vector>

namespace tinylm {

void check_generate_options(const GenerateOptions& o) {
  TORCH_CHECK(o.max_new_tokens >= 0, "generate: max_new_tokens must be >= 0, got ",
              o.max_new_tokens);
  TORCH_CHECK(o.temperature > 0, "generate: temperature must be > 0, got ", o.temperature,
              " (use greedy decoding for deterministic output)");
  TORCH_CHECK(o.top_p > 0 && o.top_p <= 1, "generate: top_p must be in (0, 1], got ", o.top_p);
}

torch::Tensor sampling_probabilities(const torch::Tensor& logits, const GenerateOptions& options) {
  check_generate_options(options);
  TORCH_CHECK(logits.dim() == 2, "sampling_probabilities: expected logits (B, V), got shape ",
              logits.sizes());
  const int64_t V = logits.size(1);
  // Shift by the row maximum before scaling: the best token's scaled logit is 0, so a
  // tiny temperature sharpens towards greedy instead of overflowing to inf - inf = NaN.
  // In double: a temperature below float's smallest value would round to 0.
  auto shifted = logits.to(torch::kFloat64);
  shifted = shifted - std::get<0>(shifted.max(/*dim=*/-1, /*keepdim=*/true));
  auto l = shifted / options.temperature;  // (B, V), every row's maximum is 0
  if (options.top_k > 0 && options.top_k < V) {
    auto kth = std::get<0>(l.topk(options.top_k, /*dim=*/-1)).narrow(1, options.top_k - 1, 1);
    l = l.masked_fill(l < kth, -std::numeric_limits<float>::infinity());  // keep >= k-th
  }
  auto probs = torch::softmax(l, /*dim=*/-1);  // (B, V), float64
  if (options.top_p < 1.0) {
    auto [sorted, order] = probs.sort(/*dim=*/-1, /*descending=*/true);  // (B, V) each
    // Drop a token when the tokens ranked above it already reach top_p; the first stays.
    auto before = sorted.cumsum(-1) - sorted;
    auto drop_sorted = before >= options.top_p;
    auto drop = torch::zeros_like(drop_sorted).scatter(-1, order, drop_sorted);
    probs = probs.masked_fill(drop, 0.0);
    probs = probs / probs.sum(-1, /*keepdim=*/true);
  }
  return probs.to(torch::kFloat32);
}

std::vector<int64_t> sample_tokens(const torch::Tensor& probs,
                                   const std::vector<c10::optional<at::Generator>>& generators) {
  TORCH_CHECK(probs.dim() == 2 && probs.device().is_cpu() && probs.scalar_type() == torch::kFloat32,
              "sample_tokens: expected float32 probabilities (R, V) on the CPU, got ", probs.scalar_type(), " ",
              probs.sizes(), " on ", probs.device());
  const int64_t R = probs.size(0);
  TORCH_CHECK(static_cast<int64_t>(generators.size()) == R, "sample_tokens: ", R, " rows but ", generators.size(),
              " generators");
  if (R == 0) return {};
  // torch::multinomial's checks, once for every row: no NaN (it fails both comparisons),
  // inf or negative entry, and no row without mass.
  const bool valid = ((probs.min() >= 0) & (probs.max() < std::numeric_limits<float>::infinity()) &
                      (probs.sum(/*dim=*/1) > 0).all())
                         .item<bool>();
  TORCH_CHECK(valid, "sample_tokens: the probabilities hold inf, NaN, a negative entry or a row of zeros "
              "(the model's logits are not finite: check the checkpoint)");
  // torch::multinomial's draw for one sample: q ~ Exp(1) per entry, the token is
  // argmax(p / q). Each row's q from its own generator, in the order multinomial reads
  // them (a row's entries in turn); the division and argmax once for all rows.
  auto q = torch::empty_like(probs, torch::MemoryFormat::Contiguous);
  for (int64_t r = 0; r < R; ++r) q.select(0, r).exponential_(1.0, generators[r]);
  const auto best = (probs / q).argmax(/*dim=*/-1).contiguous();
  return {best.data_ptr<int64_t>(), best.data_ptr<int64_t>() + R};
}

namespace {

/// The next tokens (B, 1), on logits' device: the most likely with greedy, else drawn on
/// the CPU from sampling_probabilities() with `generator` (none: LibTorch's global one).
torch::Tensor next_tokens(const torch::Tensor& logits, const GenerateOptions& options,
                          c10::optional<at::Generator> generator) {
  if (options.greedy) return logits.argmax(-1, /*keepdim=*/true);
  const auto probs = sampling_probabilities(logits.to(torch::kCPU), options);
  const auto tokens = sample_tokens(probs, std::vector<c10::optional<at::Generator>>(probs.size(0), generator));
  return torch::tensor(tokens, torch::kLong).unsqueeze(1).to(logits.device());
}

}  // namespace

torch::Tensor generate(nn::LanguageModelImpl& model, const torch::Tensor& prompt,
                       const GenerateOptions& options) {
  return generate(model, prompt, options, TokenCallback{});
}

torch::Tensor generate(nn::LanguageModelImpl& model, const torch::Tensor& prompt,
                       const GenerateOptions& options, const TokenCallback& on_token) {
  check_generate_options(options);
  TORCH_CHECK(prompt.defined() && prompt.dim() == 2 && prompt.size(0) >= 1 && prompt.size(1) >= 1,
              "generate: prompt must be (B, T) with B, T >= 1, got shape ",
              prompt.defined() ? prompt.sizes() : torch::IntArrayRef{});
  TORCH_CHECK(prompt.scalar_type() == torch::kLong, "generate: prompt must be int64, got ",
              prompt.scalar_type());

  internal::TrainingModeGuard eval_mode(model, /*training=*/false);
  torch::NoGradGuard no_grad;

  const auto params = model.parameters();
  const auto device = params.empty() ? torch::Device(torch::kCPU) : params.front().device();
  c10::optional<at::Generator> gen;
  if (options.seed) gen = at::make_generator<at::CPUGeneratorImpl>(*options.seed);

  const int64_t C = model.context_length();
  auto seq = prompt.to(device);  // (B, T)
  nn::KVCache cache;
  torch::Tensor next;  // (B, 1): the token sampled last
  for (int64_t i = 0; i < options.max_new_tokens; ++i) {
    const int64_t T = seq.size(1);
    torch::Tensor logits;  // (B, V) for the next position
    if (options.use_kv_cache && cache.length > 0 && cache.length < C) {  // a cache with room
      logits = model.next_logits(next, &cache);  // one new position
    } else {
      auto window = seq.narrow(1, std::max<int64_t>(0, T - C), std::min(T, C));  // (B, <= C)
      // A cache is kept while the context has room: a full window's would be read again
      // at the next token's positions, so from there each window is read afresh.
      if (options.use_kv_cache && window.size(1) < C) {
        cache = nn::KVCache{};
        logits = model.next_logits(window, &cache);
      } else {
        logits = model.next_logits(window);
      }
    }
    next = next_tokens(logits, options, gen);
    seq = torch::cat({seq, next}, /*dim=*/1);  // (B, T + 1)
    if (on_token && !on_token(next)) break;
  }
  return seq;
}

}  // namespace tinylm
