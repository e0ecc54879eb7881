// The checks of `tinylm serve`'s JSON requests (request.h).
#include "request.h"

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

}  // namespace tinylm::serve
