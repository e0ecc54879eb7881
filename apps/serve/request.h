// What `tinylm serve`'s JSON requests are checked with, before anything uses them: the body
// (JSON, an object, not too deep), its fields (known, typed, in range). A check that fails
// throws a Reject, which the router answers with.
#pragma once

#include "http.h"

#include <tinylm/generate.h>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <set>
#include <string>
#include <string_view>
#include <vector>

namespace tinylm::serve {

/// A request's answer before it is sent: thrown by the checks, caught by the router.
struct Reject {
  int status;
  std::string message;
  std::string type = "invalid_request_error";
  std::vector<std::string> headers = {};
};

/// JSON text as the server sends it (bytes that are not UTF-8 replaced).
std::string dump(const nlohmann::json& j);
std::string dump(const nlohmann::ordered_json& j);

/// Refuses JSON nested deeper than `limit`, before any parser sees it.
void check_depth(std::string_view body, int limit);
/// The request's body as a JSON object: 415 for another Content-Type, 400 for bad JSON.
nlohmann::json parse_body(const HttpRequest& req);
/// Refuses a field not in `known`, naming the known ones.
void check_fields(const nlohmann::json& body, const std::set<std::string>& known);

// One optional field of a known type: absent or null gives `fallback`; a wrong type or a
// value out of range is refused with the field's name.
int64_t integer_field(const nlohmann::json& body, const char* name, int64_t fallback, int64_t lo, int64_t hi);
double number_field(const nlohmann::json& body, const char* name, double fallback, double lo, double hi,
                    bool lo_open);
bool bool_field(const nlohmann::json& body, const char* name, bool fallback);

/// A completion request (OpenAI's fields), checked: every field known, typed and in range.
struct CompletionRequest {
  std::string prompt_text;           // a string prompt (to be tokenized) ...
  std::vector<int64_t> prompt_ids;   // ... or token ids, each in the vocabulary
  GenerateOptions generate;
  std::vector<std::string> stops;
  bool stream = false, echo = false, include_usage = false;
};
struct CompletionLimits {
  std::string model_id;  // the one model served
  int64_t max_tokens = 0, vocab_size = 0, context_length = 0;
};
CompletionRequest parse_completion(const nlohmann::json& body, const CompletionLimits& limits);

}  // namespace tinylm::serve
