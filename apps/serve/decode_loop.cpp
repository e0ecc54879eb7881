// The decode loop: requests in, one BatchDecoder step at a time, tokens out.
#include "decode_loop.h"

#include <tinylm/log.h>

#include <c10/util/Exception.h>

#include <algorithm>
#include <exception>
#include <utility>

namespace tinylm::serve {

bool TokenStream::take(std::vector<int64_t>& out, std::chrono::milliseconds wait,
                       std::chrono::microseconds spacing) {
  std::unique_lock<std::mutex> lock(mutex_);
  ready_.wait_for(lock, wait, [this] { return (every_token_ && !tokens_.empty()) || over_; });
  if (spacing.count() > 0 && tokens_.size() > 1 && last_take_ == std::chrono::steady_clock::time_point{}) {
    out.push_back(tokens_.front());  // the first token alone; the rest with the next call
    tokens_.erase(tokens_.begin());
    last_take_ = std::chrono::steady_clock::now();
    return true;
  }
  if (spacing.count() > 0 && !tokens_.empty() && !over_) {
    const auto due = last_take_ + spacing;
    if (std::chrono::steady_clock::now() < due) {
      lock.unlock();
      std::this_thread::sleep_until(due);
      lock.lock();
    }
  }
  if (!tokens_.empty()) last_take_ = std::chrono::steady_clock::now();
  out.insert(out.end(), tokens_.begin(), tokens_.end());
  tokens_.clear();
  return !over_;
}

std::string TokenStream::error() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return error_;
}

void TokenStream::push(int64_t token, bool last) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    tokens_.push_back(token);
    over_ = over_ || last;
  }
  if (every_token_ || last) ready_.notify_all();
}

void TokenStream::fail(const std::string& why) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    error_ = why;
    over_ = true;
  }
  ready_.notify_all();
}

DecodeLoop::DecodeLoop(nn::LanguageModelImpl& model, BatchDecoderOptions options)
    : decoder_(model, options), thread_([this] { run(); }) {}

DecodeLoop::~DecodeLoop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  thread_.join();
  for (auto& p : incoming_) p.stream->fail("the server is shutting down");
  for (auto& [id, stream] : streams_) stream->fail("the server is shutting down");
}

std::shared_ptr<TokenStream> DecodeLoop::submit(std::vector<int64_t> prompt, const GenerateOptions& options,
                                                bool every_token) {
  auto stream = std::make_shared<TokenStream>();
  stream->every_token_ = every_token;
  load_.fetch_add(1, std::memory_order_relaxed);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    incoming_.push_back({std::move(prompt), options, stream});
  }
  wake_.notify_all();
  return stream;
}

DecodeLoop::Stats DecodeLoop::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

void DecodeLoop::run() {
  int64_t logged_batch = -1;
  for (;;) {
    std::deque<Pending> arrived;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [this] { return stopping_ || !incoming_.empty() || !decoder_.idle(); });
      if (stopping_) return;
      arrived.swap(incoming_);
    }
    for (auto& p : arrived) {
      try {
        streams_[decoder_.add(p.prompt, p.options)] = p.stream;
      } catch (const c10::Error& e) {
        p.stream->fail(e.what_without_backtrace());
        load_.fetch_sub(1, std::memory_order_relaxed);
      }
    }
    for (auto it = streams_.begin(); it != streams_.end();) {  // readers that left
      if (!it->second->cancelled()) {
        ++it;
        continue;
      }
      decoder_.remove(it->first);
      it->second->fail("cancelled");
      it = streams_.erase(it);
      load_.fetch_sub(1, std::memory_order_relaxed);
    }
    try {
      for (const auto& t : decoder_.step()) {
        auto it = streams_.find(t.sequence);
        if (it == streams_.end()) continue;
        it->second->push(t.token, t.last);
        if (t.last) streams_.erase(it), load_.fetch_sub(1, std::memory_order_relaxed);
      }
    } catch (const std::exception& e) {  // the model failed (memory, a device): every reader hears why
      const std::string why = e.what();
      logger()->error("decoding failed: {}", why.substr(0, why.find('\n')));
      for (auto& [id, stream] : streams_) {
        decoder_.remove(id);
        stream->fail("decoding failed: " + why.substr(0, why.find('\n')));
      }
      load_.fetch_sub(static_cast<int64_t>(streams_.size()), std::memory_order_relaxed);
      streams_.clear();
    }
    std::lock_guard<std::mutex> lock(mutex_);
    stats_.decoding = decoder_.decoding();
    stats_.joining = decoder_.joining();
    stats_.last_batch = decoder_.last_batch();
    if (stats_.last_batch > 0) ++stats_.steps, stats_.batched_tokens += stats_.last_batch;
    stats_.widest = std::max(stats_.widest, stats_.last_batch);
    if (stats_.last_batch != logged_batch) {
      logger()->debug("decode batch: {} sequences in one pass, {} decoding, {} joining", stats_.last_batch,
                      stats_.decoding, stats_.joining);
      logged_batch = stats_.last_batch;
    }
  }
}

}  // namespace tinylm::serve
