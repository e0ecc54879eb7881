// Continuous batching: the batch's rows, their shared KV cache, and who joins and leaves.
// B = sequences in the batch, C = context length, V = vocab size
#include <tinylm/batch_decoder.h>

#include "internal/mode_guard.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <algorithm>
#include <utility>

namespace tinylm {

namespace {

torch::Device device_of(nn::LanguageModelImpl& model) {
  const auto params = model.parameters();
  return params.empty() ? torch::Device(torch::kCPU) : params.front().device();
}

torch::Tensor ids_tensor(const int64_t* ids, int64_t n, const torch::Device& device) {
  return torch::from_blob(const_cast<int64_t*>(ids), {1, n}, torch::kLong).to(device, /*non_blocking=*/false,
                                                                               /*copy=*/true);
}

}  // namespace

BatchDecoder::BatchDecoder(nn::LanguageModelImpl& model, BatchDecoderOptions options)
    : model_(model), options_(options), device_(device_of(model)), context_(model.context_length()) {
  TORCH_CHECK(options_.max_batch >= 1, "BatchDecoder: max_batch must be >= 1, got ", options_.max_batch);
  TORCH_CHECK(options_.prefill_chunk >= 1, "BatchDecoder: prefill_chunk must be >= 1, got ",
              options_.prefill_chunk);
}

int64_t BatchDecoder::add(const std::vector<int64_t>& prompt, const GenerateOptions& options) {
  check_generate_options(options);
  TORCH_CHECK(options.max_new_tokens >= 1, "BatchDecoder: max_new_tokens must be >= 1, got ",
              options.max_new_tokens, " (a sequence that makes no token needs no decoding)");
  TORCH_CHECK(!prompt.empty(), "BatchDecoder: a prompt needs at least one token");
  const int64_t V = model_.vocab_size();
  for (int64_t id : prompt)
    TORCH_CHECK(id >= 0 && id < V, "BatchDecoder: token id ", id, " is outside the vocabulary [0, ", V, ")");
  Sequence s;
  s.id = next_id_++;
  s.options = options;
  if (options.seed) s.generator = at::make_generator<at::CPUGeneratorImpl>(*options.seed);
  // The window generate() reads first: the prompt's last C tokens.
  const auto window = std::min<size_t>(prompt.size(), static_cast<size_t>(context_));
  s.tokens.assign(prompt.end() - static_cast<std::ptrdiff_t>(window), prompt.end());
  joining_.push_back(std::move(s));
  return joining_.back().id;
}

bool BatchDecoder::remove(int64_t id) {
  auto is = [id](const Sequence& s) { return s.id == id; };
  if (auto it = std::find_if(joining_.begin(), joining_.end(), is); it != joining_.end()) {
    joining_.erase(it);
    return true;
  }
  if (auto it = std::find_if(alone_.begin(), alone_.end(), is); it != alone_.end()) {
    alone_.erase(it);
    return true;
  }
  if (auto it = std::find_if(rows_.begin(), rows_.end(), is); it != rows_.end()) {
    leave(static_cast<size_t>(it - rows_.begin()));
    return true;
  }
  return false;
}

std::vector<int64_t> BatchDecoder::sample(const std::vector<Sequence*>& rows, const torch::Tensor& logits) {
  // Rows that sample alike share the work: one argmax for the greedy ones, one set of
  // probabilities for each group of equal settings (row by row the same numbers), then
  // each row's draw from its own generator, as generate() draws it.
  const auto R = static_cast<int64_t>(rows.size());
  std::vector<int64_t> out(R, -1);
  std::vector<bool> done(R, false);
  for (int64_t r = 0; r < R; ++r) {
    if (done[r]) continue;
    const GenerateOptions& o = rows[r]->options;
    std::vector<int64_t> group;
    for (int64_t g = r; g < R; ++g) {
      const GenerateOptions& p = rows[g]->options;
      if (!done[g] && p.greedy == o.greedy &&
          (o.greedy || (p.temperature == o.temperature && p.top_k == o.top_k && p.top_p == o.top_p)))
        group.push_back(g), done[g] = true;
    }
    const auto part = static_cast<int64_t>(group.size()) == R
                          ? logits
                          : logits.index_select(0, torch::tensor(group, torch::kLong).to(logits.device()));
    if (o.greedy) {
      const auto best = part.argmax(-1).to(torch::kCPU).contiguous();
      for (size_t i = 0; i < group.size(); ++i) out[group[i]] = best.data_ptr<int64_t>()[i];
      continue;
    }
    std::vector<c10::optional<at::Generator>> generators;
    for (int64_t g : group) generators.push_back(rows[g]->generator);
    const auto tokens = sample_tokens(sampling_probabilities(part.to(torch::kCPU), o), generators);
    for (size_t i = 0; i < group.size(); ++i) out[group[i]] = tokens[i];
  }
  return out;
}

bool BatchDecoder::emit(Sequence& s, int64_t token, std::vector<Token>& out) {
  s.tokens.push_back(token);
  ++s.made;
  const bool last = s.made >= s.options.max_new_tokens;
  out.push_back({s.id, token, last});
  return last;
}

std::vector<BatchDecoder::Token> BatchDecoder::step() {
  std::vector<Token> out;
  last_batch_ = 0;
  if (idle()) return out;
  internal::TrainingModeGuard eval_mode(model_, /*training=*/false);
  torch::NoGradGuard no_grad;
  // Those decoding first (a row that reaches the context now is decoded alone from the
  // next step); a sequence that joins now has its first token already.
  decode_alone(out);
  decode_rows(out);
  prefill(out);
  return out;
}

void BatchDecoder::prefill(std::vector<Token>& out) {
  int64_t budget = options_.prefill_chunk;
  while (budget > 0 && !joining_.empty() && decoding() < options_.max_batch) {
    Sequence& s = joining_.front();
    const auto window = static_cast<int64_t>(s.tokens.size());
    if (s.prefilled > 0 || window > budget) {  // a prompt longer than what is left: a chunk of it
      const int64_t n = std::min(budget, window - s.prefilled);
      auto logits = model_.next_logits(ids_tensor(s.tokens.data() + s.prefilled, n, device_), &s.cache);  // (1, V)
      s.prefilled += n;
      budget -= n;
      if (s.prefilled < window) break;  // the rest next step
      Sequence joined = std::move(s);
      joining_.pop_front();
      if (!emit(joined, sample({&joined}, logits).front(), out)) join(std::move(joined));
      continue;
    }
    // Whole prompts of this length, in the order they came, in one pass while the budget
    // and the batch's rows allow.
    std::vector<size_t> group = {0};
    const int64_t rows_free = options_.max_batch - decoding();
    for (size_t j = 1; j < joining_.size() && static_cast<int64_t>(group.size()) < rows_free &&
                       static_cast<int64_t>(group.size() + 1) * window <= budget;
         ++j)
      if (joining_[j].prefilled == 0 && static_cast<int64_t>(joining_[j].tokens.size()) == window) group.push_back(j);
    const auto G = static_cast<int64_t>(group.size());
    std::vector<int64_t> prompts;
    for (size_t j : group) prompts.insert(prompts.end(), joining_[j].tokens.begin(), joining_[j].tokens.end());
    nn::KVCache shared;
    const auto ids = torch::from_blob(prompts.data(), {G, window}, torch::kLong).to(device_, false, /*copy=*/true);
    const auto logits = model_.next_logits(ids, &shared);  // (G, V)
    budget -= G * window;
    std::vector<Sequence> joined;
    for (size_t j : group) joined.push_back(std::move(joining_[j]));
    for (auto it = group.rbegin(); it != group.rend(); ++it) joining_.erase(joining_.begin() + static_cast<std::ptrdiff_t>(*it));
    std::vector<Sequence*> seqs;
    for (int64_t g = 0; g < G; ++g) {
      Sequence& q = joined[g];
      q.prefilled = window;
      q.cache.length = window;
      // Its row of the pass's cache, a view: join() copies it into the batch (a sequence
      // decoded apart replaces it at its first step).
      for (size_t l = 0; l < shared.keys.size(); ++l) {
        q.cache.keys.push_back(shared.keys[l].narrow(0, g, 1));
        q.cache.values.push_back(shared.values[l].narrow(0, g, 1));
      }
      seqs.push_back(&q);
    }
    const auto tokens = sample(seqs, logits);
    for (int64_t g = 0; g < G; ++g)
      if (!emit(joined[g], tokens[g], out)) join(std::move(joined[g]));
  }
}

void BatchDecoder::decode_rows(std::vector<Token>& out) {
  if (rows_.empty()) return;
  const auto B = static_cast<int64_t>(rows_.size());
  std::vector<int64_t> next(B);
  for (int64_t b = 0; b < B; ++b) next[b] = rows_[b].tokens.back();
  reserve(*std::max_element(batch_.lengths.begin(), batch_.lengths.end()) + 1);
  nn::KVCache view;  // the batch's first B rows, written in place
  for (size_t l = 0; l < batch_.keys.size(); ++l) {
    view.keys.push_back(batch_.keys[l].narrow(0, 0, B));
    view.values.push_back(batch_.values[l].narrow(0, 0, B));
  }
  view.lengths = batch_.lengths;
  auto ids = torch::from_blob(next.data(), {B, 1}, torch::kLong).to(device_, false, /*copy=*/true);
  const auto logits = model_.forward_rows(ids, view).select(1, 0);  // (B, V)
  batch_.lengths = view.lengths;
  last_batch_ += B;
  std::vector<Sequence*> all;
  for (auto& s : rows_) all.push_back(&s);
  const auto tokens = sample(all, logits);
  std::vector<size_t> leaving;
  for (int64_t b = 0; b < B; ++b) {
    Sequence& s = rows_[b];
    const bool done = emit(s, tokens[b], out);
    if (!done && batch_.lengths[b] < context_) continue;
    if (!done) {  // the context is full: from now on the last C tokens are read afresh, alone
      s.cache.length = context_;
      alone_.push_back(std::move(s));
    }
    leaving.push_back(static_cast<size_t>(b));
  }
  // Highest first: leave() moves the last row into the one that leaves.
  for (auto it = leaving.rbegin(); it != leaving.rend(); ++it) leave(*it);
}

void BatchDecoder::decode_alone(std::vector<Token>& out) {
  if (alone_.empty()) return;
  std::vector<bool> done(alone_.size(), false);
  // Past the context: each reads its last C tokens afresh, as generate() does; all of
  // them in one pass (every window is C long).
  std::vector<size_t> windowed;
  std::vector<int64_t> windows;
  for (size_t i = 0; i < alone_.size(); ++i) {
    const Sequence& s = alone_[i];
    if (s.cache.length < context_) continue;
    windowed.push_back(i);
    windows.insert(windows.end(), s.tokens.end() - context_, s.tokens.end());
  }
  if (!windowed.empty()) {
    const auto R = static_cast<int64_t>(windowed.size());
    const auto ids = torch::from_blob(windows.data(), {R, context_}, torch::kLong).to(device_, false, /*copy=*/true);
    const auto logits = model_.next_logits(ids);  // (R, V)
    std::vector<Sequence*> seqs;
    for (size_t i : windowed) seqs.push_back(&alone_[i]);
    const auto tokens = sample(seqs, logits);
    for (int64_t r = 0; r < R; ++r) done[windowed[r]] = emit(alone_[windowed[r]], tokens[r], out);
    last_batch_ += R;
  }
  // A model without forward_rows: the next position on each one's own cache.
  for (size_t i = 0; i < alone_.size(); ++i) {
    Sequence& s = alone_[i];
    if (s.cache.length >= context_) continue;
    const auto logits = model_.next_logits(ids_tensor(&s.tokens.back(), 1, device_), &s.cache);  // (1, V)
    done[i] = emit(s, sample({&s}, logits).front(), out);
  }
  for (size_t i = alone_.size(); i-- > 0;)
    if (done[i]) alone_.erase(alone_.begin() + static_cast<std::ptrdiff_t>(i));
}

void BatchDecoder::join(Sequence s) {
  const int64_t length = s.cache.length;
  if (!model_.supports_rows() || length >= context_) {  // decoded alone
    alone_.push_back(std::move(s));
    return;
  }
  const size_t row = rows_.size();
  if (batch_.keys.empty()) {  // the first: the cache's layers and shapes are the model's
    for (size_t l = 0; l < s.cache.keys.size(); ++l) {
      auto shape = s.cache.keys[l].sizes().vec();  // (1, Hkv, length, Dh)
      shape[0] = options_.max_batch;
      shape[2] = 0;
      batch_.keys.push_back(torch::zeros(shape, s.cache.keys[l].options()));
      batch_.values.push_back(torch::zeros(shape, s.cache.values[l].options()));
    }
  }
  reserve(length + 1);
  for (size_t l = 0; l < batch_.keys.size(); ++l) {
    batch_.keys[l].select(0, static_cast<int64_t>(row)).narrow(1, 0, length).copy_(s.cache.keys[l].select(0, 0));
    batch_.values[l].select(0, static_cast<int64_t>(row)).narrow(1, 0, length).copy_(s.cache.values[l].select(0, 0));
  }
  batch_.lengths.push_back(length);
  s.cache = nn::KVCache{};
  rows_.push_back(std::move(s));
}

void BatchDecoder::leave(size_t row) {
  const size_t last = rows_.size() - 1;
  if (row != last) {
    const int64_t length = batch_.lengths[last];
    for (size_t l = 0; l < batch_.keys.size(); ++l) {
      batch_.keys[l].select(0, static_cast<int64_t>(row)).narrow(1, 0, length)
          .copy_(batch_.keys[l].select(0, static_cast<int64_t>(last)).narrow(1, 0, length));
      batch_.values[l].select(0, static_cast<int64_t>(row)).narrow(1, 0, length)
          .copy_(batch_.values[l].select(0, static_cast<int64_t>(last)).narrow(1, 0, length));
    }
    batch_.lengths[row] = length;
    rows_[row] = std::move(rows_[last]);
  }
  batch_.lengths.pop_back();
  rows_.pop_back();
}

void BatchDecoder::reserve(int64_t columns) {
  const int64_t room = batch_.keys.empty() ? 0 : batch_.keys.front().size(2);
  if (columns <= room) return;
  // Doubling, up to the context: a copy now and then, not one per step.
  const int64_t grown = std::min(context_, std::max({columns, 2 * room, int64_t{16}}));
  for (auto* part : {&batch_.keys, &batch_.values})
    for (auto& t : *part) {
      auto shape = t.sizes().vec();
      shape[2] = grown;
      auto bigger = torch::zeros(shape, t.options());
      bigger.narrow(2, 0, room).copy_(t);
      t = bigger;
    }
}

}  // namespace tinylm
