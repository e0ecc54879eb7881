// Token and learned positional embeddings.
// B = batch, T = sequence length, D = d_model, V = vocab size, C = max context length
#pragma once

#include <torch/nn/cloneable.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <ostream>

namespace tinylm::nn {

struct TokenEmbeddingOptions {
  TokenEmbeddingOptions(int64_t vocab_size, int64_t d_model)
      : vocab_size_(vocab_size), d_model_(d_model) {}
  TORCH_ARG(int64_t, vocab_size);
  TORCH_ARG(int64_t, d_model);
  /// Standard deviation of the N(0, std) initialisation.
  TORCH_ARG(double, init_std) = 0.02;
};

/// A lookup table: ids (B, T) int64 -> (B, T, D).
class TokenEmbeddingImpl : public torch::nn::Cloneable<TokenEmbeddingImpl> {
 public:
  explicit TokenEmbeddingImpl(const TokenEmbeddingOptions& options);
  void reset() override;
  void reset_parameters();
  void pretty_print(std::ostream& os) const override;
  torch::Tensor forward(const torch::Tensor& ids);

  TokenEmbeddingOptions options;
  torch::Tensor weight;  // (V, D)
};
TORCH_MODULE(TokenEmbedding);

struct LearnedPositionalEmbeddingOptions {
  LearnedPositionalEmbeddingOptions(int64_t context_length, int64_t d_model)
      : context_length_(context_length), d_model_(d_model) {}
  TORCH_ARG(int64_t, context_length);
  TORCH_ARG(int64_t, d_model);
  TORCH_ARG(double, init_std) = 0.02;
};

/// A trained table of position vectors; forward(T) returns rows [0, T): (T, D).
class LearnedPositionalEmbeddingImpl
    : public torch::nn::Cloneable<LearnedPositionalEmbeddingImpl> {
 public:
  explicit LearnedPositionalEmbeddingImpl(const LearnedPositionalEmbeddingOptions& options);
  void reset() override;
  void reset_parameters();
  void pretty_print(std::ostream& os) const override;
  torch::Tensor forward(int64_t seq_len);
  /// Rows [start, start + length): the positions of tokens appended to a cache.
  torch::Tensor rows(int64_t start, int64_t length);

  LearnedPositionalEmbeddingOptions options;
  torch::Tensor weight;  // (C, D)
};
TORCH_MODULE(LearnedPositionalEmbedding);

struct SinusoidalPositionalEmbeddingOptions {
  SinusoidalPositionalEmbeddingOptions(int64_t context_length, int64_t d_model)
      : context_length_(context_length), d_model_(d_model) {}
  TORCH_ARG(int64_t, context_length);
  TORCH_ARG(int64_t, d_model);
  /// angle = p / base^(2i / D)
  TORCH_ARG(double, base) = 10000.0;
};

/// Fixed sin/cos positions: row p is pe[p, 2i] = sin(p / base^(2i/D)),
/// pe[p, 2i+1] = cos(same). No parameters, nothing in checkpoints. The rows are computed
/// when first asked for and kept for the longest length asked so far (never more than
/// context_length): nothing is allocated for a context the model is never run at,
/// so a large context_length read from a file costs no memory by itself.
class SinusoidalPositionalEmbeddingImpl
    : public torch::nn::Cloneable<SinusoidalPositionalEmbeddingImpl> {
 public:
  explicit SinusoidalPositionalEmbeddingImpl(const SinusoidalPositionalEmbeddingOptions& options);
  void reset() override;
  void pretty_print(std::ostream& os) const override;
  /// The first seq_len rows of the table: (T, D).
  torch::Tensor forward(int64_t seq_len);
  /// Rows [start, start + length): the positions of tokens appended to a cache.
  torch::Tensor rows(int64_t start, int64_t length);

  SinusoidalPositionalEmbeddingOptions options;
  /// An empty (0, D) buffer: .to() moves and converts it, and the rows are made on its
  /// device, in its dtype.
  torch::Tensor anchor;

 private:
  torch::Tensor make_rows(int64_t start, int64_t length) const;  // (length, D)
  struct Table;                  // the rows computed so far, behind a mutex
  std::shared_ptr<Table> table_;  // made anew by reset()
};
TORCH_MODULE(SinusoidalPositionalEmbedding);

}  // namespace tinylm::nn
