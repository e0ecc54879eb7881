// A small, strict HTTP/1.1 server for `tinylm serve`, a library of its own (the target
// tinylm_http: no LibTorch): a bounded pool of connection threads, a deadline on every
// request's head and body (a client that drips bytes is answered 408 and closed) and on
// every response (one too slow to read is dropped), limits on the head's size, its header
// count and the body (431, 413), Content-Length bodies only (411 otherwise), keep-alive,
// pipelining, `Expect: 100-continue`, and streamed (chunked) responses that notice a
// client that went away. Errors are JSON. tests/http/ drives it over socket pairs;
// fuzz/fuzz_http_connection.cpp feeds it bytes.
//
// Why not cpp-httplib (Debian 12's 0.11): it has no limit on the number of header lines
// (memory grows while a client keeps sending them) and no deadline for a whole request
// (a slow-loris client holds a thread for as long as it sends a byte every few seconds),
// and its compiled build cannot be hooked to add either. Why not Boost.Beast: docs/serve.md.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
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
  /// Accepts connections until stop(), each served by a thread of a pool that grows to at
  /// most max_connections threads (and is kept: a thread serves one connection after
  /// another); then waits for the open connections to finish and joins the pool.
  void run();
  /// Serves one connected socket (what each accepted connection gets) on the calling
  /// thread until either side ends, then closes it. Counted in open_connections(); after
  /// stop() it answers 503 to a request in progress and closes at the next request.
  void serve(int fd, const std::string& peer);
  /// Stops accepting; idle connections close at once, requests in flight finish. Safe to
  /// call from any thread.
  void stop();
  bool stopping() const { return stopping_.load(); }
  int64_t open_connections() const;
  /// Every response also carries these header lines.
  std::vector<std::string> common_headers;

 private:
  void converse(int fd, const std::string& peer);  // requests and answers until one side ends
  void finish(int fd, const std::string& peer);    // converse, then close it and count it gone
  void work();                                     // a pool thread: connections from the queue
  HttpLimits limits_;
  HttpHandler handler_;
  int listen_fd_ = -1, port_ = 0;
  int wake_[2] = {-1, -1};  // stop() writes to wake_[1]; poll() watches wake_[0]
  std::atomic<bool> stopping_{false};
  mutable std::mutex mutex_;
  std::condition_variable all_closed_;
  int64_t connections_ = 0;  // open: served or waiting in queue_
  // The pool: accepted sockets wait in queue_ for a thread; idle_ threads wait for them.
  std::condition_variable queued_;
  std::deque<std::pair<int, std::string>> queue_;
  std::vector<std::thread> pool_;
  int64_t idle_ = 0;
  bool closing_pool_ = false;
};

/// Parses a request's head (the request line and headers, without the blank line after
/// them) into req. Returns {0, ""}, or the status to answer with (400, 431, 505) and why.
std::pair<int, std::string> parse_request_head(std::string_view head, const HttpLimits& limits, HttpRequest& req);

/// "200 OK", "404 Not Found", ...
std::string_view status_text(int status);

}  // namespace tinylm::serve
