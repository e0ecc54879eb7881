// Fuzz target: an HTTP request to `tinylm serve`, as its server reads one: the head parsed
// with the server's limits, then the body checked as a completion request (JSON, fields,
// types, ranges). Whatever the bytes, the answer is a status, never a crash.
#include "http.h"
#include "request.h"

#include <c10/util/Exception.h>

#include <cstdint>
#include <string>
#include <string_view>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  const auto end = in.find("\r\n\r\n");
  tinylm::serve::HttpLimits limits;
  tinylm::serve::HttpRequest req;
  const auto [status, reason] = tinylm::serve::parse_request_head(in.substr(0, end), limits, req);
  if (status != 0) return 0;
  if (end != std::string_view::npos) req.body = std::string(in.substr(end + 4));
  if (req.header("content-type").empty()) req.headers.emplace_back("content-type", "application/json");
  try {
    const auto body = tinylm::serve::parse_body(req);
    tinylm::serve::parse_completion(body, {"model", 1024, 64, 12});
  } catch (const tinylm::serve::Reject&) {
  } catch (const c10::Error&) {
  }
  return 0;
}
