// The state `tinylm serve`'s handlers share (server.cpp, completions.cpp): the model, the
// options, and the admission of requests to the workers.
#pragma once

#include "decode_loop.h"
#include "request.h"
#include "server.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace tinylm::serve {

struct Server::State {
  InferenceRun run;
  ModelCard model;
  ServeOptions options;
  std::unique_ptr<HttpServer> http;
  /// Every completion is decoded in one of these, with the others there (continuous
  /// batching): the least loaded when it comes.
  std::vector<std::unique_ptr<DecodeLoop>> decoders;
  std::shared_ptr<TokenStream> submit(std::vector<int64_t> prompt, const GenerateOptions& options, bool every_token) {
    DecodeLoop* least = decoders.front().get();
    for (const auto& d : decoders)
      if (d->load() < least->load()) least = d.get();
    return least->submit(std::move(prompt), options, every_token);
  }
  // Admission: `active` attention requests hold a worker, `waiting` wait for one;
  // `completing` completions are decoding or waiting for a row.
  std::mutex mutex;
  std::condition_variable freed;
  int64_t active = 0, waiting = 0, completing = 0;
  std::atomic<uint64_t> served{0}, next_id{1};
  std::atomic<bool> stopping{false};
  std::atomic<int64_t> cancel_at_ns{INT64_MAX};

  /// A worker for this request, or a 503 when `queue` requests already wait.
  std::shared_ptr<void> admit() {
    std::unique_lock<std::mutex> lock(mutex);
    if (stopping.load()) throw Reject{503, "the server is shutting down", "server_busy", {"Retry-After: 5"}};
    if (active >= options.workers) {
      if (waiting >= options.queue)
        throw Reject{503,
                     "the server is busy: " + std::to_string(active) + " requests running and " +
                         std::to_string(waiting) + " waiting (--workers, --queue); retry shortly",
                     "server_busy", {"Retry-After: 1"}};
      ++waiting;
      freed.wait(lock, [this] { return active < options.workers || stopping.load(); });
      --waiting;
      if (stopping.load() && active >= options.workers)
        throw Reject{503, "the server is shutting down", "server_busy", {"Retry-After: 5"}};
    }
    ++active;
    return std::shared_ptr<void>(nullptr, [this](void*) {
      {
        std::lock_guard<std::mutex> l(mutex);
        --active;
      }
      freed.notify_one();
    });
  }

  /// A place for a completion: a row of the decode batch or the queue, or a 503.
  std::shared_ptr<void> admit_completion() {
    std::lock_guard<std::mutex> lock(mutex);
    if (stopping.load()) throw Reject{503, "the server is shutting down", "server_busy", {"Retry-After: 5"}};
    const auto rows = options.max_batch * static_cast<int64_t>(decoders.size());
    if (completing >= rows + options.queue)
      throw Reject{503,
                   "the server is busy: " + std::to_string(completing) + " completions decoding or waiting (--max-batch " +
                       std::to_string(options.max_batch) + " in each of " + std::to_string(decoders.size()) +
                       " decode loops, --queue " + std::to_string(options.queue) + "); retry shortly",
                   "server_busy", {"Retry-After: 1"}};
    ++completing;
    return std::shared_ptr<void>(nullptr, [this](void*) {
      std::lock_guard<std::mutex> l(mutex);
      --completing;
    });
  }

  bool cancelled() const {
    return stopping.load() &&
           std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count() >=
               cancel_at_ns.load();
  }

  void route(const HttpRequest& req, HttpResponder& res);   // answer, then a log line
  void answer(const HttpRequest& req, HttpResponder& res);
  void completions(const HttpRequest& req, HttpResponder& res);
  void attention(const HttpRequest& req, HttpResponder& res);
  void metrics(HttpResponder& res);
  std::vector<int64_t> encode_prompt(const std::string& text) const;
};

}  // namespace tinylm::serve
