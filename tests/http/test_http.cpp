// tinylm serve's HTTP layer alone (apps/serve/http.cpp, the tinylm_http target: no LibTorch
// in this program): the connection loop driven over socket pairs, byte by byte as a
// client sends them, and the accepting server over TCP for its connection limit.
#include "catch_compat.h"
#include "http.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace {

using tinylm::serve::HttpLimits;
using tinylm::serve::HttpRequest;
using tinylm::serve::HttpResponder;
using tinylm::serve::HttpServer;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

/// What the handlers below did, for the tests to look at.
struct Seen {
  std::atomic<int> requests{0};
  std::atomic<bool> stream_write_failed{false};
};

/// Answers by path: /echo (method, target, a header and the body), /stream (64 KiB chunks
/// until the client stops taking them), /throw, /silent (no answer), /twice.
tinylm::serve::HttpHandler handler(Seen& seen) {
  return [&seen](const HttpRequest& req, HttpResponder& res) {
    ++seen.requests;
    if (req.path == "/stream") {
      if (!res.start_stream("text/plain")) return;
      const std::string chunk(64 * 1024, 'x');
      const auto start = Clock::now();
      while (seconds_since(start) < 60)
        if (!res.write_chunk(chunk)) {
          seen.stream_write_failed = true;
          return;
        }
      res.end_stream();
    } else if (req.path == "/throw") {
      throw std::runtime_error("the handler failed");
    } else if (req.path == "/silent") {
    } else if (req.path == "/twice") {
      res.send(200, "text/plain", "once");
      res.send(200, "text/plain", "twice");
    } else {
      res.send(200, "text/plain", req.method + " " + req.target + " [" + req.header("x-echo") + "] " + req.body);
    }
  };
}

HttpLimits small_limits() {
  HttpLimits l;
  l.max_head_bytes = 512;
  l.max_headers = 4;
  l.max_body_bytes = 100;
  l.request_seconds = 0.5;
  l.idle_seconds = 0.5;
  l.write_seconds = 0.5;
  return l;
}

struct Response {
  int status = 0;
  std::string head, body;
};

/// A client on one end of a socket pair, the server's serve() on the other, in a thread.
class Connection {
 public:
  explicit Connection(HttpServer& server) {
    int fds[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) throw std::runtime_error("socketpair");
    fd_ = fds[0];
    serving_ = std::thread([&server, fd = fds[1]] { server.serve(fd, "test"); });
  }
  ~Connection() {
    ::close(fd_);
    serving_.join();
  }
  void send(const std::string& bytes) {
    for (size_t at = 0; at < bytes.size();) {
      const auto n = ::send(fd_, bytes.data() + at, bytes.size() - at, MSG_NOSIGNAL);
      if (n <= 0) throw std::runtime_error("send: the server closed the connection");
      at += static_cast<size_t>(n);
    }
  }
  /// Reads what has come (waiting up to `seconds`); false on EOF or when nothing came.
  bool read_more(double seconds = 10) {
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(seconds * 1000)) <= 0) return false;
    char buf[65536];
    const auto n = ::recv(fd_, buf, sizeof buf, 0);
    if (n <= 0) return false;
    in_.append(buf, static_cast<size_t>(n));
    return true;
  }
  /// The next whole response (Content-Length or chunked); status 0 when the connection
  /// ended or nothing came within `seconds`.
  Response response(double seconds = 10) {
    Response r;
    size_t end;
    while ((end = in_.find("\r\n\r\n")) == std::string::npos)
      if (!read_more(seconds)) return r;
    r.head = in_.substr(0, end + 4);
    in_.erase(0, end + 4);
    r.status = std::stoi(r.head.substr(9, 3));
    const auto cl = header(r.head, "Content-Length");
    if (!cl.empty()) {
      const size_t length = std::stoul(cl);
      while (in_.size() < length)
        if (!read_more(seconds)) return Response{};
      r.body = in_.substr(0, length);
      in_.erase(0, length);
    } else if (header(r.head, "Transfer-Encoding") == "chunked") {
      for (;;) {
        size_t line;
        while ((line = in_.find("\r\n")) == std::string::npos)
          if (!read_more(seconds)) return Response{};
        const size_t size = std::stoul(in_.substr(0, line), nullptr, 16);
        while (in_.size() < line + 2 + size + 2)
          if (!read_more(seconds)) return Response{};
        r.body += in_.substr(line + 2, size);
        in_.erase(0, line + 2 + size + 2);
        if (size == 0) break;
      }
    }
    return r;
  }
  /// The head of a response that is to be streamed, without reading its chunks.
  std::string head_only(double seconds = 10) {
    size_t end;
    while ((end = in_.find("\r\n\r\n")) == std::string::npos)
      if (!read_more(seconds)) return {};
    auto head = in_.substr(0, end + 4);
    in_.erase(0, end + 4);
    return head;
  }
  /// Whether the server closes its side within `seconds` (what it sends meanwhile is kept).
  bool closes_within(double seconds) {
    const auto start = Clock::now();
    while (seconds_since(start) < seconds) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 50) <= 0) continue;
      char buf[65536];
      const auto n = ::recv(fd_, buf, sizeof buf, 0);
      if (n <= 0) return true;
      in_.append(buf, static_cast<size_t>(n));
    }
    return false;
  }
  const std::string& unread() const { return in_; }
  static std::string header(const std::string& head, const std::string& name) {
    const auto at = head.find("\r\n" + name + ": ");
    if (at == std::string::npos) return {};
    const auto from = at + 4 + name.size();
    return head.substr(from, head.find("\r\n", from) - from);
  }

 private:
  int fd_ = -1;
  std::string in_;
  std::thread serving_;
};

}  // namespace

TEST_CASE("a kept-alive connection answers one request after another") {
  Seen seen;
  HttpServer server(small_limits(), handler(seen));
  Connection c(server);
  c.send("GET /echo?a=1 HTTP/1.1\r\nHost: x\r\nX-Echo: one\r\n\r\n");
  auto r = c.response();
  CHECK(r.status == 200);
  CHECK(r.body == "GET /echo?a=1 [one] ");
  CHECK(Connection::header(r.head, "Connection") == "keep-alive");
  c.send("POST /echo HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello");
  r = c.response();
  CHECK(r.status == 200);
  CHECK(r.body == "POST /echo [] hello");
  CHECK(seen.requests == 2);
  CHECK(server.open_connections() == 1);
  // "Connection: close" is honoured: the answer says so and the server closes.
  c.send("GET /echo HTTP/1.1\r\nConnection: close\r\n\r\n");
  r = c.response();
  CHECK(r.status == 200);
  CHECK(Connection::header(r.head, "Connection") == "close");
  CHECK(c.closes_within(5));
}

TEST_CASE("pipelined requests are answered in order, bodies kept apart") {
  Seen seen;
  HttpServer server(small_limits(), handler(seen));
  Connection c(server);
  c.send("GET /echo?n=1 HTTP/1.1\r\n\r\nPOST /echo?n=2 HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc"
         "POST /echo?n=3 HTTP/1.1\r\nContent-Length: 2\r\n\r\ndeGET /echo?n=4 HTTP/1.0\n\n");
  CHECK(c.response().body == "GET /echo?n=1 [] ");
  CHECK(c.response().body == "POST /echo?n=2 [] abc");
  CHECK(c.response().body == "POST /echo?n=3 [] de");
  // The fourth: bare LF line ends, HTTP/1.0 without keep-alive: answered, then closed.
  const auto r = c.response();
  CHECK(r.body == "GET /echo?n=4 [] ");
  CHECK(Connection::header(r.head, "Connection") == "close");
  CHECK(c.closes_within(5));
  CHECK(seen.requests == 4);
}

TEST_CASE("Expect: 100-continue is answered before the body is sent") {
  Seen seen;
  HttpServer server(small_limits(), handler(seen));
  Connection c(server);
  c.send("POST /echo HTTP/1.1\r\nContent-Length: 4\r\nExpect: 100-continue\r\n\r\n");
  const auto interim = c.head_only();
  CHECK(interim == "HTTP/1.1 100 Continue\r\n\r\n");
  c.send("body");
  const auto r = c.response();
  CHECK(r.status == 200);
  CHECK(r.body == "POST /echo [] body");
  // With the body already there, no interim answer.
  c.send("POST /echo HTTP/1.1\r\nContent-Length: 2\r\nExpect: 100-continue\r\n\r\nok");
  CHECK(c.response().body == "POST /echo [] ok");
  // Refused before the body: the body is never asked for.
  c.send("POST /echo HTTP/1.1\r\nContent-Length: 1000\r\nExpect: 100-continue\r\n\r\n");
  CHECK(c.response().status == 413);
  CHECK(c.closes_within(5));
}

TEST_CASE("every limit and malformed request has its status, and the connection closes") {
  struct Case {
    const char* what;
    std::string request;
    int status;
  };
  const std::vector<Case> cases = {
      {"a head over max_head_bytes", "GET / HTTP/1.1\r\nX-Long: " + std::string(600, 'a') + "\r\n\r\n", 431},
      {"a head over max_head_bytes, still coming", "GET / HTTP/1.1\r\nX-Long: " + std::string(600, 'a'), 431},
      {"more than max_headers lines", "GET / HTTP/1.1\r\nA: 1\r\nB: 2\r\nC: 3\r\nD: 4\r\nE: 5\r\n\r\n", 431},
      {"a body over max_body_bytes", "POST /echo HTTP/1.1\r\nContent-Length: 101\r\n\r\n", 413},
      {"a chunked body", "POST /echo HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n1\r\na\r\n0\r\n\r\n", 411},
      {"two Content-Lengths", "POST /echo HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\nab", 400},
      {"a Content-Length that is no number", "POST /echo HTTP/1.1\r\nContent-Length: -1\r\n\r\n", 400},
      {"a malformed request line", "GET /\r\n\r\n", 400},
      {"a target that is not a path", "GET echo HTTP/1.1\r\n\r\n", 400},
      {"a folded header", "GET / HTTP/1.1\r\nA: 1\r\n continued\r\n\r\n", 400},
      {"HTTP/2.0", "GET / HTTP/2.0\r\n\r\n", 505},
  };
  for (const auto& k : cases) {
    INFO(k.what);
    Seen seen;
    HttpServer server(small_limits(), handler(seen));
    Connection c(server);
    c.send(k.request);
    const auto r = c.response();
    CHECK(r.status == k.status);
    CHECK(Connection::header(r.head, "Content-Type") == "application/json");
    CHECK_THAT(r.body, Catch::StartsWith("{\"error\":{"));
    CHECK(c.closes_within(5));
    CHECK(seen.requests == 0);
  }
}

TEST_CASE("a request that does not arrive in time is answered 408; an idle connection is closed") {
  Seen seen;
  HttpServer server(small_limits(), handler(seen));
  {
    Connection c(server);
    const auto start = Clock::now();
    c.send("GET /echo HTTP/1.1\r\nHost:");  // and then nothing
    const auto r = c.response(10);
    CHECK(r.status == 408);
    CHECK(seconds_since(start) < 5);
    CHECK(c.closes_within(5));
  }
  {
    Connection c(server);
    c.send("POST /echo HTTP/1.1\r\nContent-Length: 10\r\n\r\nabc");  // 7 bytes short
    CHECK(c.response(10).status == 408);
  }
  {
    Connection c(server);
    c.send("GET /echo HTTP/1.1\r\n\r\n");
    CHECK(c.response().status == 200);
    const auto start = Clock::now();
    CHECK(c.closes_within(10));  // idle_seconds after the answer, quietly
    CHECK(seconds_since(start) < 5);
    CHECK(c.unread().empty());
  }
  CHECK(seen.requests == 1);
}

TEST_CASE("a client that stops reading a stream is dropped after write_seconds, its thread freed") {
  Seen seen;
  HttpServer server(small_limits(), handler(seen));
  Connection c(server);
  c.send("GET /stream HTTP/1.1\r\n\r\n");
  const auto head = c.head_only();
  CHECK(Connection::header(head, "Transfer-Encoding") == "chunked");
  // ... and reads no more. The server's writes fill the socket's buffers, then wait: the
  // deadline ends the stream and the connection, while the client still holds its end.
  const auto start = Clock::now();
  while (!seen.stream_write_failed && seconds_since(start) < 20)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  CHECK(seen.stream_write_failed);
  CHECK(seconds_since(start) < 10);
  while (server.open_connections() > 0 && seconds_since(start) < 20)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  CHECK(server.open_connections() == 0);
}

TEST_CASE("a handler that throws, answers nothing or answers twice gets a 500 or keeps its first answer") {
  Seen seen;
  HttpServer server(small_limits(), handler(seen));
  {
    Connection c(server);
    c.send("GET /throw HTTP/1.1\r\n\r\n");
    const auto r = c.response();
    CHECK(r.status == 500);
    CHECK_THAT(r.body, Catch::Contains("the handler failed"));
    CHECK(c.closes_within(5));
  }
  {
    Connection c(server);
    c.send("GET /silent HTTP/1.1\r\n\r\n");
    const auto r = c.response();
    CHECK(r.status == 500);
    CHECK_THAT(r.body, Catch::Contains("gave no response"));
  }
  {
    Connection c(server);
    c.send("GET /twice HTTP/1.1\r\n\r\nGET /echo HTTP/1.1\r\n\r\n");
    const auto r = c.response();
    CHECK(r.status == 200);
    CHECK(r.body == "once");
    CHECK(c.closes_within(5));  // the second request is not read: the first answer may be cut
    CHECK(c.unread().empty());
  }
}

TEST_CASE("stop() closes an idle connection at once and lets a request in flight finish") {
  Seen seen;
  auto limits = small_limits();
  limits.idle_seconds = 30;
  HttpServer server(limits, handler(seen));
  Connection c(server);
  c.send("GET /echo HTTP/1.1\r\n\r\n");
  CHECK(c.response().status == 200);
  const auto start = Clock::now();
  server.stop();
  CHECK(c.closes_within(5));
  CHECK(seconds_since(start) < 5);
  CHECK(server.stopping());
}

namespace {

int connect_to(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd < 0 || ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) throw std::runtime_error("connect");
  return fd;
}

std::string exchange(int fd, const std::string& request) {
  ::send(fd, request.data(), request.size(), MSG_NOSIGNAL);
  std::string out;
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 10'000) <= 0) break;
    char buf[4096];
    const auto n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
    const auto end = out.find("\r\n\r\n");
    const auto cl = Connection::header(out, "Content-Length");
    if (end != std::string::npos && !cl.empty() && out.size() >= end + 4 + std::stoul(cl)) break;
  }
  return out;
}

}  // namespace

TEST_CASE("the accepting server: a pool bounded by max_connections, 503 beyond it") {
  Seen seen;
  auto limits = small_limits();
  limits.max_connections = 2;
  limits.idle_seconds = 30;
  HttpServer server(limits, handler(seen));
  server.bind("127.0.0.1", 0);
  REQUIRE(server.port() > 0);
  std::thread running([&] { server.run(); });
  const int a = connect_to(server.port()), b = connect_to(server.port());
  CHECK_THAT(exchange(a, "GET /echo?a HTTP/1.1\r\n\r\n"), Catch::StartsWith("HTTP/1.1 200 OK"));
  CHECK_THAT(exchange(b, "GET /echo?b HTTP/1.1\r\n\r\n"), Catch::StartsWith("HTTP/1.1 200 OK"));
  CHECK(server.open_connections() == 2);
  // A third while both are open (kept alive): refused with Retry-After.
  const int c = connect_to(server.port());
  const auto refused = exchange(c, "GET /echo?c HTTP/1.1\r\n\r\n");
  CHECK_THAT(refused, Catch::StartsWith("HTTP/1.1 503"));
  CHECK_THAT(refused, Catch::Contains("Retry-After: 1"));
  ::close(c);
  // One closes: its slot (and its thread) serves the next.
  ::close(a);
  const auto start = Clock::now();
  while (server.open_connections() > 1 && seconds_since(start) < 10)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  const int d = connect_to(server.port());
  CHECK_THAT(exchange(d, "GET /echo?d HTTP/1.1\r\n\r\n"), Catch::StartsWith("HTTP/1.1 200 OK"));
  server.stop();
  running.join();  // idle connections closed, the pool joined
  CHECK(server.open_connections() == 0);
  ::close(b);
  ::close(d);
  CHECK(seen.requests == 3);
}
