// A small, strict HTTP/1.1 server for `tinylm serve`: one thread per connection up to a
// bound, a deadline on every request's head and body (a client that drips bytes is
// answered 408 and closed), limits on the head's size, its header count and the body
// (431, 413), Content-Length bodies only (411 otherwise), keep-alive, and streamed
// (chunked) responses that notice a client that went away. Errors are JSON.
//
// Why not cpp-httplib (Debian 12's 0.11): it has no limit on the number of header lines
// (memory grows while a client keeps sending them) and no deadline for a whole request
// (a slow-loris client holds a thread for as long as it sends a byte every few seconds),
// and its compiled build cannot be hooked to add either.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tinylm::serve {

struct HttpLimits {
  size_t max_head_bytes = 16 * 1024;   // request line and headers
  size_t max_headers = 64;
  size_t max_body_bytes = 1 << 20;
  double request_seconds = 10;         // the whole head and body must arrive within this
  double idle_seconds = 5;             // a kept-alive connection waits this long for the next request
  double write_seconds = 10;           // each response (each event of a stream) must be taken within this
  int64_t max_connections = 128;       // beyond: 503 and close
};

struct HttpRequest {
  std::string method, target, path, query;  // target = path [? query]
  std::vector<std::pair<std::string, std::string>> headers;  // names lower-cased
  std::string body;
  std::string peer;  // "address:port"
  /// The first header of that (lower-case) name, "" when absent.
  std::string header(std::string_view name) const;
};

/// What a handler answers with: one whole response, or a stream of chunks.
class HttpResponder {
 public:
  HttpResponder(int fd, const HttpLimits& limits, const std::atomic<bool>& stopping)
      : fd_(fd), limits_(limits), stopping_(stopping) {}
  /// The whole response. extra: more header lines, each "Name: value".
  void send(int status, std::string_view content_type, std::string_view body,
            const std::vector<std::string>& extra = {});
  /// A JSON error in OpenAI's shape: {"error": {"message", "type", "code"}}.
  void error(int status, std::string_view message, std::string_view type = "invalid_request_error",
             const std::vector<std::string>& extra = {});
  /// A chunked response; false when the client is gone.
  bool start_stream(std::string_view content_type, const std::vector<std::string>& extra = {});
  bool write_chunk(std::string_view data);
  void end_stream();
  /// Whether the client closed its side or the connection broke (checked without waiting).
  bool client_gone() const;
  bool responded() const { return responded_; }
  int status() const { return status_; }  // of the answer sent (0 before)
  bool keep_alive = true;  // cleared by the server when the request asked to close
  /// Headers every response carries (CORS), set by the server.
  std::vector<std::string> common_headers;

 private:
  bool write_all(std::string_view data);
  std::string head(int status, std::string_view content_type, const std::vector<std::string>& extra,
                   std::string_view length_or_chunked);
  int fd_;
  const HttpLimits& limits_;
  const std::atomic<bool>& stopping_;
  bool responded_ = false, streaming_ = false, broken_ = false;
  int status_ = 0;
};

using HttpHandler = std::function<void(const HttpRequest&, HttpResponder&)>;

class HttpServer {
 public:
  HttpServer(HttpLimits limits, HttpHandler handler);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;
  /// Binds host:port (port 0 = any free port); throws with the reason.
  void bind(const std::string& host, int port);
  int port() const { return port_; }
  /// Accepts connections until stop(); then waits for the open connections to finish.
  void run();
  /// Stops accepting; idle connections close at once, requests in flight finish. Safe to
  /// call from any thread.
  void stop();
  bool stopping() const { return stopping_.load(); }
  int64_t open_connections() const;
  /// Every response also carries these header lines.
  std::vector<std::string> common_headers;

 private:
  void serve_connection(int fd, std::string peer);  // converse, then close and count
  void converse(int fd, const std::string& peer);   // requests and answers until one side ends
  HttpLimits limits_;
  HttpHandler handler_;
  int listen_fd_ = -1, port_ = 0;
  int wake_[2] = {-1, -1};  // stop() writes to wake_[1]; poll() watches wake_[0]
  std::atomic<bool> stopping_{false};
  mutable std::mutex mutex_;
  std::condition_variable all_closed_;
  int64_t connections_ = 0;
};

/// Parses a request's head (the request line and headers, without the blank line after
/// them) into req. Returns {0, ""}, or the status to answer with (400, 431, 505) and why.
std::pair<int, std::string> parse_request_head(std::string_view head, const HttpLimits& limits, HttpRequest& req);

/// "200 OK", "404 Not Found", ...
std::string_view status_text(int status);

}  // namespace tinylm::serve
