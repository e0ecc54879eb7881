// `tinylm serve`'s routes: the page, /v1/completions (OpenAI's completions API, streamed as
// server-sent events on request), /v1/attention, /v1/models, /v1/metrics, /health.
// Requests that use the model run at most `workers` at once, each with its own generation
// state (the KV cache lives in generate()); `queue` more wait; beyond that, 503.
#include "server.h"

#include <tinylm/data/tokenizer.h>
#include <tinylm/generate.h>

#include <torch/torch.h>

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
#include <vector>

namespace tinylm::serve {

namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

/// A request's answer before it is sent: thrown by the checks, caught by the router.
struct Reject {
  int status;
  std::string message;
  std::string type = "invalid_request_error";
  std::vector<std::string> headers = {};
};

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }
std::string dump(const nlohmann::ordered_json& j) {
  return j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

/// Refuses JSON nested deeper than `limit` before any parser sees it.
void check_depth(std::string_view body, int limit) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (char c : body) {
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > limit)
        throw Reject{400, "the JSON body is nested deeper than " + std::to_string(limit) + " levels"};
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
}

json parse_body(const HttpRequest& req) {
  const auto type = req.header("content-type");
  if (type.rfind("application/json", 0) != 0)
    throw Reject{415, "send the body as JSON with Content-Type: application/json (got '" +
                          (type.empty() ? std::string("none") : type.substr(0, 100)) + "')"};
  check_depth(req.body, 32);
  json body;
  try {
    body = json::parse(req.body);
  } catch (const json::parse_error& e) {
    throw Reject{400, std::string("the body is not valid JSON (or not UTF-8): ") + e.what()};
  }
  if (!body.is_object()) throw Reject{400, "the body must be a JSON object"};
  return body;
}

void check_fields(const json& body, const std::set<std::string>& known) {
  for (const auto& [key, value] : body.items()) {
    if (known.count(key)) continue;
    std::string list;
    for (const auto& k : known) list += (list.empty() ? "" : ", ") + k;
    throw Reject{400, "unknown field '" + key.substr(0, 64) + "' (known: " + list + ")"};
  }
}

// Typed readers of one optional field: absent or null gives `fallback`.
int64_t integer_field(const json& body, const char* name, int64_t fallback, int64_t lo, int64_t hi) {
  if (!body.contains(name) || body[name].is_null()) return fallback;
  const auto& v = body[name];
  if (!v.is_number_integer() && !(v.is_number_float() && v.get<double>() == std::floor(v.get<double>()) &&
                                  std::abs(v.get<double>()) < 9e18))
    throw Reject{400, std::string(name) + " must be an integer, got " + v.dump().substr(0, 40)};
  const auto x = v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)
                     ? INT64_MAX
                     : (v.is_number_integer() ? v.get<int64_t>() : static_cast<int64_t>(v.get<double>()));
  if (x < lo || x > hi)
    throw Reject{400, std::string(name) + " must be in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                          "], got " + std::to_string(x)};
  return x;
}

double number_field(const json& body, const char* name, double fallback, double lo, double hi, bool lo_open) {
  if (!body.contains(name) || body[name].is_null()) return fallback;
  const auto& v = body[name];
  if (!v.is_number()) throw Reject{400, std::string(name) + " must be a number, got " + v.dump().substr(0, 40)};
  const double x = v.get<double>();
  if (!(lo_open ? x > lo : x >= lo) || !(x <= hi))
    throw Reject{400, std::string(name) + " must be in " + (lo_open ? "(" : "[") + std::to_string(lo) + ", " +
                          std::to_string(hi) + "], got " + v.dump()};
  return x;
}

bool bool_field(const json& body, const char* name, bool fallback) {
  if (!body.contains(name) || body[name].is_null()) return fallback;
  if (!body[name].is_boolean()) throw Reject{400, std::string(name) + " must be true or false"};
  return body[name].get<bool>();
}

/// The text a completion adds, as its tokens arrive: decoded with a few tokens of the
/// prompt before it (so a tokenizer's spaces come out right), with what may still change
/// held back — a character cut mid-way (U+FFFD at the end) and the tail that could be the
/// start of a stop sequence.
class CompletionText {
 public:
  CompletionText(const data::Tokenizer& tokenizer, const std::vector<int64_t>& prompt,
                 std::vector<std::string> stops)
      : tokenizer_(tokenizer), stops_(std::move(stops)) {
    context_.assign(prompt.end() - std::min<size_t>(prompt.size(), 8), prompt.end());
    prefix_ = tokenizer_.decode(context_);
    for (const auto& s : stops_) hold_ = std::max(hold_, s.size() - 1);
  }
  /// Adds a token; false once a stop sequence appeared (the text ends before it).
  bool add(int64_t id) {
    context_.push_back(id);
    ++tokens_;
    auto full = tokenizer_.decode(context_);
    text_ = full.rfind(prefix_, 0) == 0 ? full.substr(prefix_.size())
                                        : tokenizer_.decode({context_.end() - tokens_, context_.end()});
    for (const auto& s : stops_) {
      const auto at = text_.find(s);
      if (at != std::string::npos) {
        text_.resize(at);
        stopped_ = true;
      }
    }
    return !stopped_;
  }
  /// The text not yet handed out that can no longer change (all of it when final).
  std::string take(bool final) {
    size_t ready = text_.size();
    if (!final && !stopped_) {
      static const std::string replacement = "\xEF\xBF\xBD";
      while (ready >= 3 && text_.compare(ready - 3, 3, replacement) == 0) ready -= 3;
      ready = ready > hold_ ? ready - hold_ : 0;
      while (ready > 0 && (static_cast<unsigned char>(text_[ready]) & 0xC0) == 0x80) --ready;  // a char's start
    }
    if (ready <= sent_) return {};
    auto out = text_.substr(sent_, ready - sent_);
    sent_ = ready;
    return out;
  }
  const std::string& text() const { return text_; }
  int64_t tokens() const { return tokens_; }
  bool stopped() const { return stopped_; }

 private:
  const data::Tokenizer& tokenizer_;
  std::vector<std::string> stops_;
  std::vector<int64_t> context_;
  std::string prefix_, text_;
  size_t hold_ = 0, sent_ = 0;
  int64_t tokens_ = 0;
  bool stopped_ = false;
};

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

struct Server::State {
  InferenceRun run;
  ModelCard model;
  ServeOptions options;
  std::unique_ptr<HttpServer> http;
  // Admission: `active` requests hold a worker, `waiting` wait for one.
  std::mutex mutex;
  std::condition_variable freed;
  int64_t active = 0, waiting = 0;
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

  bool cancelled() const {
    return stopping.load() &&
           std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count() >=
               cancel_at_ns.load();
  }

  void route(const HttpRequest& req, HttpResponder& res);
  void completions(const HttpRequest& req, HttpResponder& res);
  void attention(const HttpRequest& req, HttpResponder& res);
  void metrics(HttpResponder& res);
  std::vector<int64_t> encode_prompt(const std::string& text) const;
};

Server::Server(InferenceRun run, ModelCard card, ServeOptions options) : state_(std::make_unique<State>()) {
  auto& s = *state_;
  if (options.workers <= 0) options.workers = std::max(1u, std::thread::hardware_concurrency());
  TORCH_CHECK(options.queue >= 0, "--queue must be >= 0, got ", options.queue);
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
  const auto at = Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(s.options.shutdown_seconds * 1000));
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
      std::lock_guard<std::mutex> lock(mutex);
      res.send(200, "application/json",
               dump(json{{"status", stopping.load() ? "stopping" : "ok"}, {"model", model.id},
                         {"workers", options.workers}, {"active", active}, {"queued", waiting},
                         {"queue", options.queue}, {"served", served.load()},
                         {"connections", http->open_connections()}}));
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

// ---- /v1/completions ---------------------------------------------------------------------

void Server::State::completions(const HttpRequest& req, HttpResponder& res) {
  const auto body = parse_body(req);
  check_fields(body, {"model", "prompt", "max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "stream",
                      "stream_options", "n", "echo", "logprobs", "best_of", "presence_penalty",
                      "frequency_penalty", "user", "suffix", "logit_bias"});
  if (body.contains("model") && !body["model"].is_null() &&
      (!body["model"].is_string() || body["model"].get<std::string>() != model.id))
    throw Reject{404, "model " + body["model"].dump().substr(0, 80) + " is not served here; this server has '" +
                          model.id + "' (GET /v1/models)",
                 "invalid_request_error"};
  // What OpenAI's API has and a tiny model does not do, refused unless left at its default.
  for (const char* one : {"n", "best_of"})
    if (body.contains(one) && !body[one].is_null() && body[one] != 1)
      throw Reject{400, std::string(one) + " must be 1: one completion per request"};
  if (body.contains("logprobs") && !body["logprobs"].is_null())
    throw Reject{400, "logprobs is not supported (use POST /v1/attention for the next-token distribution)"};
  for (const char* penalty : {"presence_penalty", "frequency_penalty"})
    if (body.contains(penalty) && !body[penalty].is_null() && body[penalty] != 0)
      throw Reject{400, std::string(penalty) + " is not supported: leave it 0"};
  if (body.contains("suffix") && !body["suffix"].is_null()) throw Reject{400, "suffix is not supported"};
  if (body.contains("logit_bias") && !body["logit_bias"].is_null() &&
      !(body["logit_bias"].is_object() && body["logit_bias"].empty()))
    throw Reject{400, "logit_bias is not supported"};
  if (body.contains("user") && !body["user"].is_null() && !body["user"].is_string())
    throw Reject{400, "user must be a string"};

  // The prompt: a string, one string in an array, or an array of token ids.
  if (!body.contains("prompt")) throw Reject{400, "prompt is required"};
  const auto& p = body["prompt"];
  std::vector<int64_t> prompt;
  std::string prompt_text;
  if (p.is_string()) {
    prompt_text = p.get<std::string>();
    prompt = encode_prompt(prompt_text);
  } else if (p.is_array() && p.size() == 1 && p[0].is_string()) {
    prompt_text = p[0].get<std::string>();
    prompt = encode_prompt(prompt_text);
  } else if (p.is_array() && !p.empty() && std::all_of(p.begin(), p.end(), [](const json& x) { return x.is_number_integer(); })) {
    const int64_t V = run.model->vocab_size();
    for (const auto& x : p) {
      const auto id = x.get<int64_t>();
      if (id < 0 || id >= V)
        throw Reject{400, "prompt token " + std::to_string(id) + " is outside the vocabulary [0, " + std::to_string(V) + ")"};
      prompt.push_back(id);
    }
    if (static_cast<int64_t>(prompt.size()) > run.model->context_length())
      throw Reject{400, "the prompt is " + std::to_string(prompt.size()) + " tokens, over the model's context of " +
                            std::to_string(run.model->context_length()) + ": shorten it"};
    prompt_text = run.tokenizer->decode(prompt);
  } else {
    throw Reject{400, "prompt must be a string, an array of one string, or an array of token ids"};
  }

  GenerateOptions g;
  g.max_new_tokens = integer_field(body, "max_tokens", 16, 0, options.max_tokens);
  const double temperature = number_field(body, "temperature", 1.0, 0, 2, false);
  g.greedy = temperature == 0;
  g.temperature = g.greedy ? 1.0 : temperature;
  g.top_p = number_field(body, "top_p", 1.0, 0, 1, true);
  g.top_k = integer_field(body, "top_k", 0, 0, run.model->vocab_size());
  if (body.contains("seed") && !body["seed"].is_null())
    g.seed = static_cast<uint64_t>(integer_field(body, "seed", 0, INT64_MIN, INT64_MAX));
  std::vector<std::string> stops;
  if (body.contains("stop") && !body["stop"].is_null()) {
    const auto& s = body["stop"];
    if (s.is_string()) stops.push_back(s.get<std::string>());
    else if (s.is_array() && s.size() <= 4 && std::all_of(s.begin(), s.end(), [](const json& x) { return x.is_string(); }))
      for (const auto& x : s) stops.push_back(x.get<std::string>());
    else throw Reject{400, "stop must be a string or an array of up to 4 strings"};
    for (const auto& x : stops)
      if (x.empty() || x.size() > 256) throw Reject{400, "each stop sequence must be 1 to 256 bytes"};
  }
  const bool stream = bool_field(body, "stream", false);
  const bool echo = bool_field(body, "echo", false);
  bool include_usage = false;
  if (body.contains("stream_options") && !body["stream_options"].is_null()) {
    const auto& so = body["stream_options"];
    if (!so.is_object()) throw Reject{400, "stream_options must be an object"};
    check_fields(so, {"include_usage"});
    include_usage = bool_field(so, "include_usage", false);
  }

  const auto slot = admit();
  const std::string id = "cmpl-" + std::to_string(next_id++);
  const auto created = static_cast<int64_t>(std::time(nullptr));
  CompletionText text(*run.tokenizer, prompt, stops);
  std::string finish = "length";
  auto chunk = [&](const std::string& piece, const json& reason) {
    return "data: " +
           dump(json{{"id", id}, {"object", "text_completion"}, {"created", created}, {"model", model.id},
                     {"choices", {{{"text", piece}, {"index", 0}, {"logprobs", nullptr}, {"finish_reason", reason}}}}}) +
           "\n\n";
  };
  if (stream && !res.start_stream("text/event-stream")) return;
  if (stream && echo) res.write_chunk(chunk(prompt_text, nullptr));
  auto ids = torch::tensor(prompt, torch::kLong).unsqueeze(0).to(run.device);
  if (g.max_new_tokens > 0) {
    generate(*run.model, ids, g, [&](const torch::Tensor& next) {
      if (!text.add(next.to(torch::kCPU).item<int64_t>())) {
        finish = "stop";
        return false;
      }
      if (cancelled()) {
        finish = "cancelled";
        return false;
      }
      if (stream) {
        const auto piece = text.take(false);
        if (!piece.empty() && !res.write_chunk(chunk(piece, nullptr))) return false;
      }
      return !res.client_gone();
    });
  }
  ++served;
  const int64_t prompt_tokens = static_cast<int64_t>(prompt.size());
  const json usage = {{"prompt_tokens", prompt_tokens}, {"completion_tokens", text.tokens()},
                      {"total_tokens", prompt_tokens + text.tokens()}};
  if (stream) {
    const auto rest = text.take(true);
    if (!rest.empty()) res.write_chunk(chunk(rest, nullptr));
    res.write_chunk(chunk("", finish));
    if (include_usage)
      res.write_chunk("data: " +
                      dump(json{{"id", id}, {"object", "text_completion"}, {"created", created}, {"model", model.id},
                                {"choices", json::array()}, {"usage", usage}}) +
                      "\n\n");
    res.write_chunk("data: [DONE]\n\n");
    res.end_stream();
    return;
  }
  const auto out = (echo ? prompt_text : std::string()) + text.take(true);
  res.send(200, "application/json",
           dump(json{{"id", id}, {"object", "text_completion"}, {"created", created}, {"model", model.id},
                     {"choices", {{{"text", out}, {"index", 0}, {"logprobs", nullptr}, {"finish_reason", finish}}}},
                     {"usage", usage}}));
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
