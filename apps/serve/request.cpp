// The checks of `tinylm serve`'s JSON requests (request.h).
#include "request.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <set>
#include <string>

namespace tinylm::serve {

using json = nlohmann::json;

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }
std::string dump(const nlohmann::ordered_json& j) {
  return j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

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
  } catch (const json::exception& e) {  // parse_error, and out_of_range for a number like 1e99999
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

CompletionRequest parse_completion(const json& body, const CompletionLimits& limits) {
  check_fields(body, {"model", "prompt", "max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "stream",
                      "stream_options", "n", "echo", "logprobs", "best_of", "presence_penalty",
                      "frequency_penalty", "user", "suffix", "logit_bias"});
  if (body.contains("model") && !body["model"].is_null() &&
      (!body["model"].is_string() || body["model"].get<std::string>() != limits.model_id))
    throw Reject{404, "model " + body["model"].dump().substr(0, 80) + " is not served here; this server has '" +
                          limits.model_id + "' (GET /v1/models)",
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
  CompletionRequest c;
  if (p.is_string()) {
    c.prompt_text = p.get<std::string>();
  } else if (p.is_array() && p.size() == 1 && p[0].is_string()) {
    c.prompt_text = p[0].get<std::string>();
  } else if (p.is_array() && !p.empty() && std::all_of(p.begin(), p.end(), [](const json& x) { return x.is_number_integer(); })) {
    if (static_cast<int64_t>(p.size()) > limits.context_length)
      throw Reject{400, "the prompt is " + std::to_string(p.size()) + " tokens, over the model's context of " +
                            std::to_string(limits.context_length) + ": shorten it"};
    const int64_t V = limits.vocab_size;
    for (const auto& x : p) {
      const auto id = x.is_number_unsigned() && x.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX) ? -1 : x.get<int64_t>();
      if (id < 0 || id >= V)
        throw Reject{400, "prompt token " + x.dump() + " is outside the vocabulary [0, " + std::to_string(V) + ")"};
      c.prompt_ids.push_back(id);
    }
  } else {
    throw Reject{400, "prompt must be a string, an array of one string, or an array of token ids"};
  }

  auto& g = c.generate;
  g.max_new_tokens = integer_field(body, "max_tokens", 16, 0, limits.max_tokens);
  const double temperature = number_field(body, "temperature", 1.0, 0, 2, false);
  g.greedy = temperature == 0;
  g.temperature = g.greedy ? 1.0 : temperature;
  g.top_p = number_field(body, "top_p", 1.0, 0, 1, true);
  g.top_k = integer_field(body, "top_k", 0, 0, limits.vocab_size);
  if (body.contains("seed") && !body["seed"].is_null())
    g.seed = static_cast<uint64_t>(integer_field(body, "seed", 0, INT64_MIN, INT64_MAX));
  auto& stops = c.stops;
  if (body.contains("stop") && !body["stop"].is_null()) {
    const auto& s = body["stop"];
    if (s.is_string()) stops.push_back(s.get<std::string>());
    else if (s.is_array() && s.size() <= 4 && std::all_of(s.begin(), s.end(), [](const json& x) { return x.is_string(); }))
      for (const auto& x : s) stops.push_back(x.get<std::string>());
    else throw Reject{400, "stop must be a string or an array of up to 4 strings"};
    for (const auto& x : stops)
      if (x.empty() || x.size() > 256) throw Reject{400, "each stop sequence must be 1 to 256 bytes"};
  }
  c.stream = bool_field(body, "stream", false);
  c.echo = bool_field(body, "echo", false);
  if (body.contains("stream_options") && !body["stream_options"].is_null()) {
    const auto& so = body["stream_options"];
    if (!so.is_object()) throw Reject{400, "stream_options must be an object"};
    check_fields(so, {"include_usage"});
    c.include_usage = bool_field(so, "include_usage", false);
  }
  return c;
}

}  // namespace tinylm::serve
