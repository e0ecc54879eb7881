// Autoregressive sampling from any tinylm language model.
// B = batch, T = prompt length, N = max_new_tokens, V = vocab size
#pragma once

#include <tinylm/nn/model.h>

#include <ATen/core/Generator.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

namespace tinylm {

struct GenerateOptions {
  /// How many tokens to append. Must be >= 0.
  int64_t max_new_tokens = 16;
  /// Logits are divided by this before softmax. Must be > 0.
  double temperature = 1.0;
  /// Keep only the k most likely tokens; k <= 0 means off; k is capped at V.
  int64_t top_k = 0;
  /// Nucleus sampling: keep the smallest set whose probability reaches top_p; 1 = off.
  double top_p = 1.0;
  /// Always take the most likely token (temperature, top-k and top-p are then unused).
  bool greedy = false;
  /// Decode with a KV cache: each new token costs one position, not a whole window.
  /// Once the sequence outgrows the context, each step re-reads the last context_length
  /// tokens (absolute positions shift), as without a cache. Same tokens either way.
  bool use_kv_cache = true;
  /// Seeds a private generator: the same seed gives the same tokens, and the global
  /// RNG is left untouched. Without a seed, the global CPU generator is used.
  std::optional<uint64_t> seed;
};

/// Throws at the first option out of its range, naming it and its value.
void check_generate_options(const GenerateOptions& options);

/// prompt: (B, T) int64, T >= 1. Returns (B, T + N): the prompt followed by N new
/// tokens. When the running sequence is longer than the model's context, only the
/// last context_length tokens are fed (sliding window). Runs without gradients in
/// eval mode and restores the model's train/eval mode afterwards. Sampling happens
/// on the CPU from a private generator, so a seed gives the same tokens on any device.
torch::Tensor generate(nn::LanguageModelImpl& model, const torch::Tensor& prompt,
                       const GenerateOptions& options);

/// Told each new column of tokens (B, 1, on the model's device) as soon as it is sampled;
/// returns false to stop there (a stop sequence met, a client gone, a deadline passed).
using TokenCallback = std::function<bool(const torch::Tensor& next)>;

/// generate(), streaming: on_token sees every new column as it is made, and generation
/// ends early when it returns false. Returns the prompt and the tokens made, (B, T + n)
/// with n <= N; the same tokens as generate() for the same options.
torch::Tensor generate(nn::LanguageModelImpl& model, const torch::Tensor& prompt,
                       const GenerateOptions& options, const TokenCallback& on_token);

/// Applies temperature, top-k and top-p to logits (B, V) and returns the
/// probabilities (B, V) that sampling draws from: for a caller that samples in a loop
/// of its own.
torch::Tensor sampling_probabilities(const torch::Tensor& logits, const GenerateOptions& options);

/// Draws one token per row of probs (R, V) (sampling_probabilities()' output, float32 on
/// the CPU), row r with generators[r] (none: LibTorch's global one), and returns the R
/// ids. A row gets what torch::multinomial(row, 1) draws with that generator, so rows
/// drawn together, with one generator or one each, get the tokens they get one at a time
/// (how the server's batch matches `tinylm sample`). Throws on a row that is not a
/// distribution (negative, inf or NaN entries, or all zero).
std::vector<int64_t> sample_tokens(const torch::Tensor& probs,
                                   const std::vector<c10::optional<at::Generator>>& generators);

}  // namespace tinylm
