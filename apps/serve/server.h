// `tinylm serve`: one checkpoint behind an HTTP server — the explorer page, OpenAI's
// completions API, attention for any prompt, the run's metrics. A client of the library's
// inference API (open_for_inference, generate); the HTTP layer is http.h.
#pragma once

#include "http.h"
#include "page.h"

#include <tinylm/run.h>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <string>

namespace tinylm::serve {

struct ServeOptions {
  std::string host = "127.0.0.1";
  int port = 8080;
  std::string api_key;      // required as "Authorization: Bearer KEY" on /v1/ when set
  std::string cors_origin;  // "" = no CORS headers
  int64_t workers = 0;      // attention requests using the model at once; 0 = the CPUs
  int64_t max_batch = 64;   // completions decoded together by one decode loop (continuous batching)
  int64_t decoders = 0;     // decode loops, a thread each; 0 = the CPUs (one on a GPU)
  int64_t prefill_chunk = 64;  // prompt tokens prefilled per decode step
  int64_t queue = 64;       // requests waiting for a worker or a row; beyond: 503
  int64_t max_tokens = 1024;          // per completion
  int64_t max_prompt_bytes = 64 * 1024;
  int64_t max_attention_cells = 4'000'000;  // layers x heads x T x T in one /v1/attention answer
  double shutdown_seconds = 10;       // SIGTERM: running requests are cancelled after this
  std::string model_id;               // "" = the checkpoint's file name
  std::string metrics_path;           // the run's metrics.jsonl ("" = none)
  HttpLimits http;
};

/// What the server knows about its model, for /v1/models and the page's model card.
struct ModelCard {
  std::string id;
  int64_t created = 0;          // the checkpoint's modification time (seconds since 1970)
  nlohmann::ordered_json card;  // architecture, parameters, tokenizer, training state
};

class Server {
 public:
  Server(InferenceRun run, ModelCard card, ServeOptions options);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;
  /// Binds the address; throws with the reason.
  void bind();
  int port() const;
  /// Serves until stop(), then finishes (or, past shutdown_seconds, cancels) what runs.
  void run();
  /// Stops accepting and starts the shutdown deadline. Any thread.
  void stop();

 private:
  struct State;
  std::unique_ptr<State> state_;
};

/// Whether `host` is a loopback address (127.0.0.0/8, ::1, localhost): what serve binds
/// without --api-key or --insecure.
bool is_loopback(const std::string& host);

}  // namespace tinylm::serve
