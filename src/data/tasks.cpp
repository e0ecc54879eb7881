// Synthetic tasks. B = batch, T = sequence length, V = vocab size
#include <tinylm/data/tasks.h>

#include <torch/torch.h>

namespace tinylm::data {

Batch repeat_batch(int64_t batch_size, int64_t seq_len, int64_t vocab_size, at::Generator& gen,
                   torch::Device device) {
  TORCH_CHECK(batch_size >= 1, "repeat task: batch_size must be >= 1, got ", batch_size);
  TORCH_CHECK(seq_len >= 1, "repeat task: seq_len must be >= 1, got ", seq_len);
  TORCH_CHECK(vocab_size >= 1, "repeat task: vocab_size must be >= 1, got ", vocab_size);
  auto ids = torch::randint(vocab_size, {batch_size, 1}, gen, torch::kLong);  // (B, 1)
  auto rows = ids.expand({batch_size, seq_len + 1}).to(device);               // (B, T + 1)
  Batch b;
  b.inputs = rows.narrow(1, 0, seq_len).contiguous();   // (B, T)
  b.targets = rows.narrow(1, 1, seq_len).contiguous();  // (B, T)
  b.scored = torch::ones({batch_size, seq_len}, torch::TensorOptions().dtype(torch::kBool).device(device));
  return b;
}

}  // namespace tinylm::data
