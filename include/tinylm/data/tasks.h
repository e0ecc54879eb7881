// Next-token tasks: the synthetic ones (repeat, copy, reverse, sort) and byte-level text.
// B = batch, T = sequence length, V = vocab size, h = prefix length
#pragma once

#include <tinylm/data/tokenizer.h>

#include <ATen/core/Generator.h>
#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <string>

namespace tinylm::data {

/// One batch: inputs (B, T) and targets (B, T) int64, targets = the row shifted by one;
/// `scored` (B, T) bool marks the targets a perfect model can predict (accuracy and
/// exact match count only those).
struct Batch {
  torch::Tensor inputs;
  torch::Tensor targets;
  torch::Tensor scored;
};

enum class Split { train, validation };

/// A source of batches plus the mapping between prompts and token ids: what a Trainer
/// learns, what evaluate() scores (Batch::scored marks the positions that count for
/// accuracy), and what sampling reads and writes. Implement it for a task of your own.
class Task {
 public:
  virtual ~Task() = default;
  virtual std::string name() const = 0;
  virtual int64_t vocab_size() const = 0;
  virtual int64_t seq_len() const = 0;
  /// Synthetic tasks have a known answer: they are "solved" at 100% accuracy.
  virtual bool synthetic() const { return true; }
  /// A batch of CPU tensors drawn with `gen` (a CPU generator) alone, so a seed (and a
  /// saved generator state) fixes the data exactly; the Trainer moves it to its device.
  /// Synthetic tasks draw fresh rows for either split; text draws windows from the
  /// chosen split of the file.
  virtual Batch sample(int64_t batch_size, Split split, at::Generator& gen) = 0;
  /// What maps text to ids and back: by default integers separated by spaces or commas
  /// (ids_tokenizer); bytes for text; the corpus's own for prepared token files.
  virtual std::shared_ptr<const Tokenizer> tokenizer() const;
  /// UTF-8 bytes of text per token in `split`, for bits per byte; 0 when the task is not
  /// text (synthetic tasks).
  virtual double bytes_per_token(Split) const { return 0; }
  /// A prompt as the user types it -> ids (1, T) through tokenizer(). Throws on an empty
  /// or invalid prompt.
  virtual torch::Tensor encode(const std::string& prompt) const;
  /// ids -> what the user reads, through tokenizer().
  virtual std::string decode(const torch::Tensor& ids) const;
};

/// The reference repeat task: each row is one random id repeated T + 1 times;
/// inputs are the first T ids, targets the last T. All targets are predictable.
Batch repeat_batch(int64_t batch_size, int64_t seq_len, int64_t vocab_size, at::Generator& gen,
                   torch::Device device = torch::kCPU);

/// copy / reverse / sort: each row of T + 1 ids is a random prefix x of h = ceil((T+1)/2)
/// ids followed by x, reverse(x) or sort(x) (cut to fit). The targets from position h - 1
/// on are predictable; the prefix is not.
Batch sequence_transform_batch(const std::string& kind, int64_t batch_size, int64_t seq_len,
                               int64_t vocab_size, at::Generator& gen,
                               torch::Device device = torch::kCPU);

/// The reference task as a Task (see repeat_batch).
class RepeatTask : public Task {
 public:
  RepeatTask(int64_t seq_len, int64_t vocab_size);
  std::string name() const override { return "repeat"; }
  int64_t vocab_size() const override { return V_; }
  int64_t seq_len() const override { return T_; }
  Batch sample(int64_t batch_size, Split split, at::Generator& gen) override;

 private:
  int64_t T_, V_;
};

/// copy, reverse or sort as a Task (see sequence_transform_batch).
class SequenceTransformTask : public Task {
 public:
  SequenceTransformTask(std::string kind, int64_t seq_len, int64_t vocab_size);
  std::string name() const override { return kind_; }
  int64_t vocab_size() const override { return V_; }
  int64_t seq_len() const override { return T_; }
  Batch sample(int64_t batch_size, Split split, at::Generator& gen) override;

 private:
  std::string kind_;
  int64_t T_, V_;
};

/// Byte-level language modelling on a file read whole into memory: V = 256; the last
/// `val_fraction` of the bytes is the validation split; batches are random windows of
/// T + 1 bytes. For corpora larger than memory, prepare token files (TokenFileTask).
class TextTask : public Task {
 public:
  TextTask(const std::string& path, int64_t seq_len, double val_fraction);
  std::string name() const override { return "text"; }
  int64_t vocab_size() const override { return 256; }
  int64_t seq_len() const override { return seq_len_; }
  bool synthetic() const override { return false; }
  Batch sample(int64_t batch_size, Split split, at::Generator& gen) override;
  std::shared_ptr<const Tokenizer> tokenizer() const override { return byte_tokenizer(); }
  double bytes_per_token(Split) const override { return 1.0; }
  int64_t train_bytes() const { return train_.numel(); }
  int64_t validation_bytes() const { return val_.numel(); }

 private:
  int64_t seq_len_;
  torch::Tensor train_, val_;  // uint8 on the CPU
};

}  // namespace tinylm::data
