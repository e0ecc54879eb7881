// Token, learned and sinusoidal positional embeddings.
// B = batch, T = sequence length, D = d_model, V = vocab size, C = max context length
#include <tinylm/nn/embedding.h>

#include <c10/core/InferenceMode.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <algorithm>
#include <cmath>
#include <mutex>

namespace tinylm::nn {

namespace {

/// Checks rows [start, start + length) of a positional table of C rows.
void check_rows(const char* who, int64_t C, int64_t start, int64_t length) {
  TORCH_CHECK(length >= 1, who, ": seq_len must be >= 1, got ", length);
  TORCH_CHECK(start != 0 || length <= C, who, ": seq_len ", length, " exceeds context_length ", C);
  TORCH_CHECK(start >= 0 && start + length <= C, who, ": positions [", start, ", ", start + length,
              ") exceed context_length ", C);
}

/// Rows [start, start + length) of a positional table (C, D), checked against C.
torch::Tensor table_rows(const char* who, const torch::Tensor& table, int64_t start, int64_t length) {
  check_rows(who, table.size(0), start, length);
  return table.narrow(0, start, length);  // (length, D)
}

}  // namespace

// ---- TokenEmbedding ------------------------------------------------------------

TokenEmbeddingImpl::TokenEmbeddingImpl(const TokenEmbeddingOptions& options_)
    : options(options_) {
  reset();
}

void TokenEmbeddingImpl::reset() {
  TORCH_CHECK(options.vocab_size() >= 1, "TokenEmbedding: vocab_size must be >= 1, got ",
              options.vocab_size());
  TORCH_CHECK(options.d_model() >= 1, "TokenEmbedding: d_model must be >= 1, got ",
              options.d_model());
  weight = register_parameter("weight",
                              torch::empty({options.vocab_size(), options.d_model()}));
  reset_parameters();
}

void TokenEmbeddingImpl::reset_parameters() {
  torch::NoGradGuard no_grad;
  weight.normal_(0.0, options.init_std());
}

void TokenEmbeddingImpl::pretty_print(std::ostream& os) const {
  os << "tinylm::nn::TokenEmbedding(vocab_size=" << options.vocab_size()
     << ", d_model=" << options.d_model() << ")";
}

torch::Tensor TokenEmbeddingImpl::forward(const torch::Tensor& ids) {
  TORCH_CHECK(ids.scalar_type() == torch::kLong, "TokenEmbedding: ids must be int64, got ",
              ids.scalar_type());
  return torch::embedding(weight, ids);  // (B, T) -> (B, T, D)
}

// ---- LearnedPositionalEmbedding ------------------------------------------------

LearnedPositionalEmbeddingImpl::LearnedPositionalEmbeddingImpl(
    const LearnedPositionalEmbeddingOptions& options_)
    : options(options_) {
  reset();
}

void LearnedPositionalEmbeddingImpl::reset() {
  TORCH_CHECK(options.context_length() >= 1,
              "LearnedPositionalEmbedding: context_length must be >= 1, got ",
              options.context_length());
  TORCH_CHECK(options.d_model() >= 1, "LearnedPositionalEmbedding: d_model must be >= 1, got ",
              options.d_model());
  weight = register_parameter(
      "weight", torch::empty({options.context_length(), options.d_model()}));
  reset_parameters();
}

void LearnedPositionalEmbeddingImpl::reset_parameters() {
  torch::NoGradGuard no_grad;
  weight.normal_(0.0, options.init_std());
}

void LearnedPositionalEmbeddingImpl::pretty_print(std::ostream& os) const {
  os << "tinylm::nn::LearnedPositionalEmbedding(context_length="
     << options.context_length() << ", d_model=" << options.d_model() << ")";
}

torch::Tensor LearnedPositionalEmbeddingImpl::forward(int64_t seq_len) {
  return table_rows("LearnedPositionalEmbedding", weight, 0, seq_len);  // (T, D)
}

torch::Tensor LearnedPositionalEmbeddingImpl::rows(int64_t start, int64_t length) {
  return table_rows("LearnedPositionalEmbedding", weight, start, length);
}

// ---- SinusoidalPositionalEmbedding ---------------------------------------------

SinusoidalPositionalEmbeddingImpl::SinusoidalPositionalEmbeddingImpl(
    const SinusoidalPositionalEmbeddingOptions& options_)
    : options(options_) {
  reset();
}

struct SinusoidalPositionalEmbeddingImpl::Table {
  std::mutex mutex;
  torch::Tensor rows;  // (n, D): rows [0, n), on the anchor's device, in its dtype
};

void SinusoidalPositionalEmbeddingImpl::reset() {
  const int64_t C = options.context_length(), D = options.d_model();
  TORCH_CHECK(C >= 1, "SinusoidalPositionalEmbedding: context_length must be >= 1, got ", C);
  TORCH_CHECK(D >= 1, "SinusoidalPositionalEmbedding: d_model must be >= 1, got ", D);
  TORCH_CHECK(D % 2 == 0, "SinusoidalPositionalEmbedding: d_model must be even, got ", D);
  TORCH_CHECK(options.base() > 0, "SinusoidalPositionalEmbedding: base must be > 0, got ",
              options.base());
  anchor = register_buffer("anchor", torch::empty({0, D}));
  table_ = std::make_shared<Table>();
}

void SinusoidalPositionalEmbeddingImpl::pretty_print(std::ostream& os) const {
  os << "tinylm::nn::SinusoidalPositionalEmbedding(context_length="
     << options.context_length() << ", d_model=" << options.d_model()
     << ", base=" << options.base() << ")";
}

torch::Tensor SinusoidalPositionalEmbeddingImpl::forward(int64_t seq_len) { return rows(0, seq_len); }

torch::Tensor SinusoidalPositionalEmbeddingImpl::rows(int64_t start, int64_t length) {
  const int64_t C = options.context_length();
  check_rows("SinusoidalPositionalEmbedding", C, start, length);
  std::lock_guard<std::mutex> lock(table_->mutex);
  auto& table = table_->rows;
  const bool usable = table.defined() && table.device() == anchor.device() &&
                      table.scalar_type() == anchor.scalar_type();
  const int64_t held = usable ? table.size(0) : 0;
  if (start + length <= held) return table.narrow(0, start, length);  // (length, D)
  // Rows past a gap are made alone: only the lengths a model is run at are kept.
  if (start > held) return make_rows(start, length);
  // Grown by doubling, so that a sampler asking one row further each token remakes the
  // table a logarithmic number of times.
  table = make_rows(0, std::min(C, std::max({start + length, 2 * held, int64_t{64}})));
  return table.narrow(0, start, length);  // (length, D)
}

torch::Tensor SinusoidalPositionalEmbeddingImpl::make_rows(int64_t start, int64_t length) const {
  const int64_t D = options.d_model();
  // A table made under inference mode could not be used by a later training step.
  c10::InferenceMode not_inference(false);
  // Computed in double (positions are exact below 2^53), rounded to float: exact to float
  // precision, and the same values whichever rows are asked for.
  auto opts = torch::TensorOptions().dtype(torch::kFloat64);
  auto position = torch::arange(start, start + length, opts).unsqueeze(1);  // (n, 1)
  auto two_i = torch::arange(0, D, 2, opts);                                // (D/2)
  auto angle = position / torch::pow(options.base(), two_i / double(D));    // (n, D/2)
  auto rows = torch::empty({length, D}, opts);
  rows.index_put_({torch::indexing::Slice(), torch::indexing::Slice(0, D, 2)}, torch::sin(angle));
  rows.index_put_({torch::indexing::Slice(), torch::indexing::Slice(1, D, 2)}, torch::cos(angle));
  return rows.to(torch::kFloat32).to(anchor.options());
}

}  // namespace tinylm::nn
