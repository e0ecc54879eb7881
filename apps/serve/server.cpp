// `tinylm serve`'s routes: the page, /v1/completions (OpenAI's completions API, streamed as
// server-sent events on request), /v1/attention, /v1/models, /v1/metrics, /health.
// Completions are decoded together by `decoders` decode loops (continuous batching:
// decode_loop.h), at most `max_batch` at once in each; attention requests run at most
// `workers` at once on their own threads; `queue` more of each wait; beyond that, 503.
#include "server.h"

#include "request.h"
#include "state.h"

#include <tinylm/data/tokenizer.h>
#include <tinylm/generate.h>
#include <tinylm/log.h>

#include <torch/types.h>
#include <torch/utils.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace tinylm::serve {

namespace {

using json = nlohmann::json;

/// Constant-time comparison of a presented key with the expected one.
bool same_secret(const std::string& given, const std::string& expected) {
  unsigned char diff = given.size() == expected.size() ? 0 : 1;
  for (size_t i = 0; i < expected.size(); ++i)
    diff |= static_cast<unsigned char>(expected[i] ^ (i < given.size() ? given[i] : 0));
  return diff == 0;
}

}  // namespace

bool is_loopback(const std::string& host) {
  return host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

Server::Server(InferenceRun run, ModelCard card, ServeOptions options) : state_(std::make_unique<State>()) {
  auto& s = *state_;
  if (options.workers <= 0) options.workers = std::max(1u, std::thread::hardware_concurrency());
  TORCH_CHECK(options.queue >= 0, "--queue must be >= 0, got ", options.queue);
  TORCH_CHECK(options.max_batch >= 1, "--max-batch must be >= 1, got ", options.max_batch);
  TORCH_CHECK(options.decoders >= 0, "--decoders must be >= 0 (0 = the CPUs), got ", options.decoders);
  TORCH_CHECK(options.prefill_chunk >= 1, "--prefill-chunk must be >= 1, got ", options.prefill_chunk);
  TORCH_CHECK(options.max_tokens >= 1, "--max-tokens must be >= 1, got ", options.max_tokens);
  TORCH_CHECK(options.max_prompt_bytes >= 1, "--max-prompt-bytes must be >= 1, got ", options.max_prompt_bytes);
  TORCH_CHECK(options.shutdown_seconds >= 0, "--shutdown-seconds must be >= 0, got ", options.shutdown_seconds);
  TORCH_CHECK(options.http.max_connections >= 1, "--max-connections must be >= 1, got ",
              options.http.max_connections);
  TORCH_CHECK(options.http.max_body_bytes >= 64, "--max-body-bytes must be >= 64, got ",
              options.http.max_body_bytes);
  s.run = std::move(run);
  s.run.model->eval();
  s.model = std::move(card);
  s.options = std::move(options);
  s.options.http.write_seconds = s.options.http.request_seconds;  // one deadline, both ways
  // A loop per core on the CPU, each on one thread: the batch's products are a core's
  // work, and the loops use every core at once. One on a GPU, which batches on its own.
  if (s.options.decoders == 0)
    s.options.decoders = s.run.device.is_cpu() ? std::max(1u, std::thread::hardware_concurrency()) : 1;
  for (int64_t i = 0; i < s.options.decoders; ++i)
    s.decoders.push_back(
        std::make_unique<DecodeLoop>(*s.run.model, BatchDecoderOptions{s.options.max_batch, s.options.prefill_chunk}));
  s.http = std::make_unique<HttpServer>(s.options.http,
                                        [&s](const HttpRequest& req, HttpResponder& res) { s.route(req, res); });
  if (!s.options.cors_origin.empty())
    s.http->common_headers = {"Access-Control-Allow-Origin: " + s.options.cors_origin, "Vary: Origin"};
}

Server::~Server() = default;

void Server::bind() { state_->http->bind(state_->options.host, state_->options.port); }
int Server::port() const { return state_->http->port(); }
void Server::run() { state_->http->run(); }

void Server::stop() {
  auto& s = *state_;
  const auto at = std::chrono::steady_clock::now() + std::chrono::milliseconds(static_cast<int64_t>(s.options.shutdown_seconds * 1000));
  s.cancel_at_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(at.time_since_epoch()).count();
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    s.stopping = true;
  }
  s.freed.notify_all();
  s.http->stop();
}

std::vector<int64_t> Server::State::encode_prompt(const std::string& text) const {
  if (static_cast<int64_t>(text.size()) > options.max_prompt_bytes)
    throw Reject{400, "the prompt is " + std::to_string(text.size()) + " bytes, over the limit of " +
                          std::to_string(options.max_prompt_bytes) + " (--max-prompt-bytes)"};
  std::vector<int64_t> ids;
  try {
    ids = run.tokenizer->encode(text);
  } catch (const std::exception& e) {
    std::string why = e.what();
    why = why.substr(0, why.find('\n'));
    throw Reject{400, "the prompt cannot be tokenized: " + why};
  }
  if (ids.empty())
    throw Reject{400, run.tokenizer->kind() == "ids" ? "the prompt is empty: give token ids, e.g. \"3 3 3\""
                                                     : "the prompt is empty"};
  const int64_t C = run.model->context_length();
  if (static_cast<int64_t>(ids.size()) > C)
    throw Reject{400, "the prompt is " + std::to_string(ids.size()) + " tokens, over the model's context of " +
                          std::to_string(C) + ": shorten it"};
  return ids;
}

void Server::State::route(const HttpRequest& req, HttpResponder& res) {
  const auto started = std::chrono::steady_clock::now();
  answer(req, res);
  // One line per request for whoever runs the server with --log-level debug.
  tinylm::logger()->debug("{} {} {} -> {} in {:.1f} ms", req.peer, req.method, req.target.substr(0, 200), res.status(),
                std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started).count());
}

void Server::State::answer(const HttpRequest& req, HttpResponder& res) {
  try {
    const bool api = req.path.rfind("/v1/", 0) == 0;
    if (req.method == "OPTIONS" && !options.cors_origin.empty()) {
      res.send(204, "text/plain", "",
               {"Access-Control-Allow-Methods: GET, POST, OPTIONS",
                "Access-Control-Allow-Headers: Authorization, Content-Type", "Access-Control-Max-Age: 600"});
      return;
    }
    if (api && !options.api_key.empty()) {
      const auto auth = req.header("authorization");
      const std::string bearer = "Bearer ";
      if (auth.rfind(bearer, 0) != 0 || !same_secret(auth.substr(bearer.size()), options.api_key))
        throw Reject{401, "a valid API key is required: send 'Authorization: Bearer KEY' (the key given to --api-key)",
                     "authentication_error", {"WWW-Authenticate: Bearer"}};
    }
    auto only = [&](const char* method) {
      if (req.method != method)
        throw Reject{405, req.path + " takes " + method + ", not " + req.method.substr(0, 16), "invalid_request_error",
                     {std::string("Allow: ") + method}};
    };
    if (req.path == "/" || req.path == "/index.html" || req.path == "/explorer.js" || req.path == "/explorer.css") {
      only("GET");
      const auto* f = page_file(req.path == "/" ? "index.html" : req.path.substr(1));
      if (!f) throw Reject{404, "no such page file"};
      res.send(200, f->content_type, std::string_view(reinterpret_cast<const char*>(f->data), f->size),
               {"Cache-Control: no-cache",
                "Content-Security-Policy: default-src 'self'; img-src 'self' data:; style-src 'self'"});
    } else if (req.path == "/health") {
      only("GET");
      DecodeLoop::Stats batch;  // every loop's, summed (widest: the widest of any)
      json loops = json::array();
      for (const auto& d : decoders) {
        const auto b = d->stats();
        batch.decoding += b.decoding, batch.joining += b.joining, batch.last_batch += b.last_batch;
        batch.widest = std::max(batch.widest, b.widest), batch.steps += b.steps, batch.batched_tokens += b.batched_tokens;
        loops.push_back({{"decoding", b.decoding}, {"joining", b.joining}, {"last", b.last_batch}, {"widest", b.widest}});
      }
      std::lock_guard<std::mutex> lock(mutex);
      res.send(200, "application/json",
               dump(json{{"status", stopping.load() ? "stopping" : "ok"}, {"model", model.id},
                         {"workers", options.workers}, {"active", active}, {"queued", waiting},
                         {"queue", options.queue}, {"served", served.load()},
                         {"connections", http->open_connections()},
                         {"batch", {{"max", options.max_batch}, {"decoders", options.decoders},
                                    {"loops", loops}, {"completions", completing},
                                    {"decoding", batch.decoding}, {"joining", batch.joining},
                                    {"last", batch.last_batch}, {"widest", batch.widest}, {"steps", batch.steps},
                                    {"tokens", batch.batched_tokens}}}}));
    } else if (req.path == "/v1/models") {
      only("GET");
      nlohmann::ordered_json entry = {{"id", model.id}, {"object", "model"}, {"created", model.created},
                                      {"owned_by", "tinylm"}, {"card", model.card}};
      res.send(200, "application/json", dump(nlohmann::ordered_json{{"object", "list"}, {"data", {entry}}}));
    } else if (req.path == "/v1/models/" + model.id) {
      only("GET");
      res.send(200, "application/json",
               dump(nlohmann::ordered_json{{"id", model.id}, {"object", "model"}, {"created", model.created},
                                           {"owned_by", "tinylm"}, {"card", model.card}}));
    } else if (req.path == "/v1/completions") {
      only("POST");
      completions(req, res);
    } else if (req.path == "/v1/attention") {
      only("POST");
      attention(req, res);
    } else if (req.path == "/v1/metrics") {
      only("GET");
      metrics(res);
    } else {
      throw Reject{404, "no such path: " + req.path.substr(0, 100) +
                            " (served: /, /health, /v1/models, /v1/completions, /v1/attention, /v1/metrics)",
                   "not_found"};
    }
  } catch (const Reject& r) {
    if (!res.responded()) res.error(r.status, r.message, r.type, r.headers);
  }
}

// ---- /v1/attention -----------------------------------------------------------------------

void Server::State::attention(const HttpRequest& req, HttpResponder& res) {
  const auto body = parse_body(req);
  check_fields(body, {"model", "prompt", "top_k"});
  if (!body.contains("prompt") || !body["prompt"].is_string()) throw Reject{400, "prompt (a string) is required"};
  const auto ids = encode_prompt(body["prompt"].get<std::string>());
  const int64_t top_k = integer_field(body, "top_k", 10, 1, std::min<int64_t>(100, run.model->vocab_size()));
  const auto slot = admit();
  torch::NoGradGuard no_grad;
  const auto input = torch::tensor(ids, torch::kLong).unsqueeze(0).to(run.device);
  auto out = run.model->forward(input, /*need_attention=*/true);
  const int64_t T = static_cast<int64_t>(ids.size()), L = static_cast<int64_t>(out.attention.size());
  const int64_t H = L ? out.attention[0].size(1) : 0;
  if (L * H * T * T > options.max_attention_cells)
    throw Reject{400, "the attention of this prompt has " + std::to_string(L * H * T * T) +
                          " weights, over the limit of " + std::to_string(options.max_attention_cells) +
                          ": shorten the prompt"};
  json tokens = json::array();
  for (auto id : ids) tokens.push_back({{"id", id}, {"text", run.tokenizer->decode({id})}});
  json layers = json::array();
  for (const auto& a : out.attention) {  // (1, H, T, T)
    auto w = a[0].to(torch::kCPU, torch::kFloat).contiguous();
    const float* d = w.data_ptr<float>();
    json heads = json::array();
    for (int64_t h = 0; h < H; ++h) {
      json rows = json::array();
      for (int64_t i = 0; i < T; ++i) rows.push_back(std::vector<float>(d + (h * T + i) * T, d + (h * T + i + 1) * T));
      heads.push_back(std::move(rows));
    }
    layers.push_back(std::move(heads));
  }
  auto probs = torch::softmax(out.logits[0][T - 1].to(torch::kCPU, torch::kFloat), -1);
  auto [p, top] = probs.topk(top_k);
  json next = json::array();
  for (int64_t i = 0; i < top_k; ++i) {
    const auto id = top[i].item<int64_t>();
    next.push_back({{"id", id}, {"text", run.tokenizer->decode({id})}, {"prob", p[i].item<float>()}});
  }
  res.send(200, "application/json",
           dump(json{{"model", model.id}, {"tokens", tokens}, {"layers", L}, {"heads", H}, {"attention", layers},
                     {"next", next}}));
}

// ---- /v1/metrics -------------------------------------------------------------------------

void Server::State::metrics(HttpResponder& res) {
  json records = json::array();
  int64_t skipped = 0;
  double age = -1;
  const auto& path = options.metrics_path;
  std::error_code ec;
  if (!path.empty() && std::filesystem::is_regular_file(path, ec)) {
    std::ifstream f(path, std::ios::binary);
    const auto size = static_cast<int64_t>(std::filesystem::file_size(path, ec));
    constexpr int64_t kMaxBytes = 16 << 20;  // the newest 16 MiB of a long run
    if (size > kMaxBytes) f.seekg(size - kMaxBytes);
    std::string line;
    if (size > kMaxBytes) std::getline(f, line);  // a partial first line
    int64_t bytes = 0;
    while (bytes < kMaxBytes && std::getline(f, line)) {
      bytes += static_cast<int64_t>(line.size()) + 1;
      const auto r = json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (r.is_object()) records.push_back(r);
      else ++skipped;  // a line being written, or damaged
    }
    const auto written = std::filesystem::last_write_time(path, ec);
    if (!ec)
      age = std::chrono::duration<double>(std::filesystem::file_time_type::clock::now() - written).count();
  }
  res.send(200, "application/json",
           dump(json{{"object", "metrics"}, {"path", path.empty() ? json(nullptr) : json(path)},
                     {"records", records}, {"skipped_lines", skipped},
                     {"seconds_since_update", age < 0 ? json(nullptr) : json(age)}}));
}

}  // namespace tinylm::serve
