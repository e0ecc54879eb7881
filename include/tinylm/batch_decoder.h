// Continuous batching: many sequences decoded together, one forward pass per step for all
// of them, each joining (its prompt prefilled in chunks between steps) and leaving
// (finished, or removed) between steps. What `tinylm serve` decodes with; any program that
// serves many users at once can drive it the same way.
// B = sequences in the batch, C = context length, V = vocab size
#pragma once

#include <tinylm/generate.h>
#include <tinylm/nn/model.h>

#include <c10/util/Optional.h>
#include <ATen/core/Generator.h>

#include <cstdint>
#include <deque>
#include <vector>

namespace tinylm {

struct BatchDecoderOptions {
  /// Sequences decoded at once (the batch's rows); more wait their turn. Must be >= 1.
  int64_t max_batch = 16;
  /// Prompt tokens prefilled per step, across the sequences joining: how long those
  /// already decoding can wait for their next token. Must be >= 1.
  int64_t prefill_chunk = 64;
};

/// Decodes sequences together. Each gets the tokens generate() gives its prompt alone
/// with the same options and seed (to float rounding: a batched product may round its
/// last bit differently, which changes a token only at a near-exact tie), including the
/// sliding window past the context. A model whose supports_rows() is false is decoded
/// row by row, with the same results. Not thread-safe: one thread drives it.
class BatchDecoder {
 public:
  explicit BatchDecoder(nn::LanguageModelImpl& model, BatchDecoderOptions options = {});

  /// Queues a sequence: its prompt (at least one id; only the last C are read, as by
  /// generate()) and how to sample it (max_new_tokens >= 1; the KV cache is always used).
  /// Returns its id, counting from 0.
  int64_t add(const std::vector<int64_t>& prompt, const GenerateOptions& options);

  /// Drops a sequence wherever it is (its client left); false when there is none by that id.
  bool remove(int64_t id);

  struct Token {
    int64_t sequence;  // add()'s id
    int64_t token;
    bool last;  // its max_new_tokens-th: the sequence has left
  };

  /// One step: up to prefill_chunk prompt tokens of the sequences joining, while the
  /// batch has a free row (a sequence whose prompt is done samples its first token and
  /// joins), then one new token for every other sequence in the batch, in one forward
  /// pass. Nothing when idle().
  std::vector<Token> step();

  bool idle() const { return joining_.empty() && rows_.empty() && alone_.empty(); }
  /// Sequences decoding (in the batch, or apart: past the context, or a model without
  /// rows), and queued or being prefilled.
  int64_t decoding() const { return static_cast<int64_t>(rows_.size() + alone_.size()); }
  int64_t joining() const { return static_cast<int64_t>(joining_.size()); }
  /// Sequences in the last step's batched forward passes: those in the batch, and those
  /// past the context, whose windows are read together (0: it made none).
  int64_t last_batch() const { return last_batch_; }

 private:
  struct Sequence {
    int64_t id = 0;
    GenerateOptions options;
    c10::optional<at::Generator> generator;  // seeded; none: LibTorch's global one
    std::vector<int64_t> tokens;             // the prompt's window, then every token made
    int64_t prefilled = 0;                   // of the prompt's window
    int64_t made = 0;
    nn::KVCache cache;  // its own: while prefilled, and when decoded alone
  };
  /// Each row's next token from its logits (rows, V), as generate() draws it.
  std::vector<int64_t> sample(const std::vector<Sequence*>& rows, const torch::Tensor& logits);
  /// Appends s's next token and reports it; true when s is done.
  bool emit(Sequence& s, int64_t token, std::vector<Token>& out);
  void prefill(std::vector<Token>& out);
  void decode_rows(std::vector<Token>& out);
  void decode_alone(std::vector<Token>& out);
  void join(Sequence s);
  void leave(size_t row);
  void reserve(int64_t columns);

  nn::LanguageModelImpl& model_;
  BatchDecoderOptions options_;
  torch::Device device_;
  int64_t context_;
  int64_t next_id_ = 0;
  int64_t last_batch_ = 0;
  std::deque<Sequence> joining_;
  std::vector<Sequence> rows_;   // the batch: row b is rows_[b]
  std::vector<Sequence> alone_;  // past the context (their windows read together), or without rows
  /// The batch's keys and values (max_batch, Hkv, room, Dh) per layer, row b's tokens in
  /// columns [0, lengths[b]) (supports_rows() models).
  nn::KVCache batch_;
};

}  // namespace tinylm
