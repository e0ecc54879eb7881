// Tasks. B = batch, T = sequence length, V = vocab size, h = prefix length
#include <tinylm/data/tasks.h>

#include "internal/files.h"
#include "internal/text.h"

#include <torch/types.h>

#include <string>
#include <string_view>

namespace tinylm::data {

namespace {

torch::TensorOptions long_on(torch::Device device) {
  return torch::TensorOptions().dtype(torch::kLong).device(device);
}

/// Uniform ids in [0, high) of `shape`, made on `device` (see Task::sample).
torch::Tensor random_ids(int64_t high, torch::IntArrayRef shape, at::Generator& gen,
                         torch::Device device) {
  if (device.is_cpu()) return torch::randint(high, shape, gen, long_on(device));
  return torch::randint(high, shape, long_on(device));
}

/// rows (B, T + 1) -> inputs, targets; scored from position `first_scored` on.
Batch shift(const torch::Tensor& rows, int64_t first_scored) {
  const int64_t B = rows.size(0), T = rows.size(1) - 1;
  Batch b;
  b.inputs = rows.narrow(1, 0, T).contiguous();   // (B, T)
  b.targets = rows.narrow(1, 1, T).contiguous();  // (B, T)
  b.scored = (torch::arange(T, long_on(rows.device())) >= first_scored)
                 .unsqueeze(0)
                 .expand({B, T})
                 .contiguous();  // (B, T)
  return b;
}

}  // namespace

// ---- the synthetic tasks ---------------------------------------------------------

RepeatTask::RepeatTask(int64_t seq_len, int64_t vocab_size) : T_(seq_len), V_(vocab_size) {
  TORCH_CHECK(seq_len >= 1, "repeat task: seq_len must be >= 1, got ", seq_len);
  TORCH_CHECK(vocab_size >= 2, "repeat task: vocab_size must be >= 2 (one symbol leaves nothing to learn), got ",
              vocab_size);
}

Batch RepeatTask::sample(int64_t batch_size, Split, at::Generator& gen) {
  return repeat_batch(batch_size, T_, V_, gen);
}

SequenceTransformTask::SequenceTransformTask(std::string kind, int64_t seq_len, int64_t vocab_size)
    : kind_(std::move(kind)), T_(seq_len), V_(vocab_size) {
  TORCH_CHECK(kind_ == "copy" || kind_ == "reverse" || kind_ == "sort",
              "unknown sequence task '", kind_, "': use copy, reverse or sort");
  TORCH_CHECK(seq_len >= 3, kind_, " task: seq_len must be >= 3, got ", seq_len);
  TORCH_CHECK(vocab_size >= 2, kind_, " task: vocab_size must be >= 2, got ", vocab_size);
}

Batch SequenceTransformTask::sample(int64_t batch_size, Split, at::Generator& gen) {
  return sequence_transform_batch(kind_, batch_size, T_, V_, gen);
}

Batch repeat_batch(int64_t batch_size, int64_t seq_len, int64_t vocab_size, at::Generator& gen,
                   torch::Device device) {
  TORCH_CHECK(batch_size >= 1, "repeat task: batch_size must be >= 1, got ", batch_size);
  TORCH_CHECK(seq_len >= 1, "repeat task: seq_len must be >= 1, got ", seq_len);
  TORCH_CHECK(vocab_size >= 2, "repeat task: vocab_size must be >= 2 (one symbol leaves nothing to learn), got ",
              vocab_size);
  auto ids = random_ids(vocab_size, {batch_size, 1}, gen, device);  // (B, 1)
  return shift(ids.expand({batch_size, seq_len + 1}), 0);          // rows (B, T + 1)
}

Batch sequence_transform_batch(const std::string& kind, int64_t batch_size, int64_t seq_len,
                               int64_t vocab_size, at::Generator& gen, torch::Device device) {
  TORCH_CHECK(kind == "copy" || kind == "reverse" || kind == "sort",
              "unknown sequence task '", kind, "': use copy, reverse or sort");
  TORCH_CHECK(batch_size >= 1, kind, " task: batch_size must be >= 1, got ", batch_size);
  TORCH_CHECK(seq_len >= 3, kind, " task: seq_len must be >= 3, got ", seq_len);
  TORCH_CHECK(vocab_size >= 2, kind, " task: vocab_size must be >= 2, got ", vocab_size);
  const int64_t h = (seq_len + 2) / 2;  // ceil((T + 1) / 2)
  auto x = random_ids(vocab_size, {batch_size, h}, gen, device);  // (B, h)
  torch::Tensor y;                                                // (B, h)
  if (kind == "copy") y = x;
  else if (kind == "reverse") y = x.flip(1);
  else y = std::get<0>(x.sort(1));
  auto rows = torch::cat({x, y.narrow(1, 0, seq_len + 1 - h)}, 1);  // (B, T + 1)
  return shift(rows, h - 1);
}

// ---- prompts ---------------------------------------------------------------------

std::shared_ptr<const Tokenizer> Task::tokenizer() const { return ids_tokenizer(vocab_size()); }

torch::Tensor Task::encode(const std::string& prompt) const {
  const auto ids = tokenizer()->encode(prompt);
  TORCH_CHECK(!ids.empty(), "prompt is empty: give ",
              tokenizer()->kind() == "ids" ? "at least one token id, e.g. the prompt \"3 3 3\""
                                           : "some text, e.g. the prompt \"Once upon\"");
  return torch::tensor(ids, torch::kLong).unsqueeze(0);  // (1, T)
}

std::string Task::decode(const torch::Tensor& ids) const {
  auto flat = ids.to(torch::kCPU, torch::kLong).contiguous().reshape({-1});
  const auto* p = flat.data_ptr<int64_t>();
  return tokenizer()->decode(std::vector<int64_t>(p, p + flat.numel()));
}

// ---- text ------------------------------------------------------------------------

TextTask::TextTask(const std::string& path, int64_t seq_len, double val_fraction)
    : seq_len_(seq_len) {
  TORCH_CHECK(seq_len >= 1, "text task: seq-len must be >= 1, got ", seq_len);
  TORCH_CHECK(val_fraction > 0 && val_fraction < 1, "text task: val-fraction must be in (0, 1), got ",
              val_fraction);
  // A UTF-8 byte-order mark at the start (an editor's, not the text's) is not trained on.
  const std::string file = internal::read_regular_file(path, "data file");
  const std::string_view bytes = std::string_view(file).substr(internal::utf8_bom_length(file));
  const int64_t n = static_cast<int64_t>(bytes.size());
  const int64_t n_val = static_cast<int64_t>(static_cast<double>(n) * val_fraction);
  const int64_t n_train = n - n_val;
  const int64_t need = seq_len + 1;
  TORCH_CHECK(n_train >= need && n_val >= need, "data file '", path, "' is too small: ", n,
              " bytes give ", n_train, " training and ", n_val,
              " validation bytes, but each split needs at least seq-len + 1 = ", need,
              " (use a larger file or a smaller seq-len)");
  auto all = torch::from_blob(const_cast<char*>(bytes.data()), {n}, torch::kUInt8).clone();
  train_ = all.narrow(0, 0, n_train);
  val_ = all.narrow(0, n_train, n_val);
}

Batch TextTask::sample(int64_t batch_size, Split split, at::Generator& gen) {
  const auto& data = split == Split::train ? train_ : val_;
  const int64_t T = seq_len_, n_windows = data.numel() - T;  // start offsets with T + 1 bytes after them
  const auto starts = torch::randint(n_windows, {batch_size, 1}, gen, torch::kLong);  // (B, 1)
  // Each window's bytes copied by one loop: a training step's batch, where the tensor ops
  // (index, take, cast, two shifted copies) were a dozen dispatches for a few KB.
  Batch b;
  b.inputs = torch::empty({batch_size, T}, torch::kLong);
  b.targets = torch::empty({batch_size, T}, torch::kLong);
  b.scored = torch::ones({batch_size, T}, torch::kBool);
  const uint8_t* bytes = data.data_ptr<uint8_t>();  // a piece of one contiguous buffer
  const int64_t* start = starts.data_ptr<int64_t>();
  int64_t* inputs = b.inputs.data_ptr<int64_t>();
  int64_t* targets = b.targets.data_ptr<int64_t>();
  for (int64_t r = 0; r < batch_size; ++r) {
    const uint8_t* window = bytes + start[r];
    for (int64_t t = 0; t < T; ++t) {
      inputs[r * T + t] = window[t];
      targets[r * T + t] = window[t + 1];
    }
  }
  return b;
}

}  // namespace tinylm::data
