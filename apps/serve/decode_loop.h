// The decode loop of `tinylm serve`: one thread that owns a BatchDecoder (continuous
// batching) and decodes every completion request together, one batched forward pass per
// step; the HTTP threads hand it requests and read their tokens back as they come.
#pragma once

#include <tinylm/batch_decoder.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace tinylm::serve {

/// One request's tokens, from the loop to the thread that answers it.
class TokenStream {
 public:
  /// Appends the tokens made since the last call to `out`, waiting up to `wait` for one.
  /// `spacing`: a token that comes sooner than that after the previous call's return
  /// waits out the rest of it, with those that follow (at most one event per spacing
  /// where tokens come faster; a slow model's go out at once). With a spacing, the first
  /// call that finds tokens returns the first alone, at once, even where the loop made
  /// more before this thread looked (a fast model, a busy machine): a stream's first event
  /// is its first token.
  /// False once the sequence is over and every token was taken (or it failed: error()).
  bool take(std::vector<int64_t>& out, std::chrono::milliseconds wait,
            std::chrono::microseconds spacing = std::chrono::microseconds(0));
  /// The reader needs no more (a stop sequence, a client gone): the loop drops it.
  void cancel() { cancelled_ = true; }
  bool cancelled() const { return cancelled_; }
  /// Why decoding failed ("" when it did not).
  std::string error() const;

 private:
  friend class DecodeLoop;
  void push(int64_t token, bool last);
  void fail(const std::string& why);
  mutable std::mutex mutex_;
  std::condition_variable ready_;
  std::vector<int64_t> tokens_;
  bool over_ = false;
  std::string error_;
  std::atomic<bool> cancelled_{false};
  bool every_token_ = true;
  std::chrono::steady_clock::time_point last_take_{};  // when take() last returned tokens
};

class DecodeLoop {
 public:
  DecodeLoop(nn::LanguageModelImpl& model, BatchDecoderOptions options);
  ~DecodeLoop();  // stops the thread; streams still open end with an error
  DecodeLoop(const DecodeLoop&) = delete;
  DecodeLoop& operator=(const DecodeLoop&) = delete;

  /// Queues a sequence (checked as BatchDecoder::add() checks it, on the loop's thread:
  /// a refusal arrives as the stream's error). `every_token`: the reader is woken for each
  /// token (a stream, stop sequences); else only at the end (its take() waits time out
  /// meanwhile, for it to look at its client).
  std::shared_ptr<TokenStream> submit(std::vector<int64_t> prompt, const GenerateOptions& options,
                                      bool every_token = true);

  struct Stats {
    int64_t decoding = 0, joining = 0;  // as the last step left them
    int64_t last_batch = 0;             // sequences in the last batched pass
    int64_t widest = 0;                 // the most in any one pass so far
    int64_t steps = 0;                  // batched passes so far
    int64_t batched_tokens = 0;         // tokens those passes made
  };
  Stats stats() const;
  /// Sequences submitted and not yet over: what the server weighs to choose a loop.
  int64_t load() const { return load_.load(std::memory_order_relaxed); }

 private:
  void run();
  BatchDecoder decoder_;
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  struct Pending {
    std::vector<int64_t> prompt;
    GenerateOptions options;
    std::shared_ptr<TokenStream> stream;
  };
  std::deque<Pending> incoming_;
  bool stopping_ = false;
  std::atomic<int64_t> load_{0};
  Stats stats_;
  std::map<int64_t, std::shared_ptr<TokenStream>> streams_;  // the loop thread's own
  std::thread thread_;
};

}  // namespace tinylm::serve
