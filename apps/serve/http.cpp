// The HTTP/1.1 layer of `tinylm serve` (see http.h for what it enforces and why).
// Over 400 lines on purpose: the whole life of a connection (accepting, reading with
// deadlines, the limits, keep-alive, answers, closing) in one file, so every limit can be
// read together. No LibTorch: errors are std::exceptions.
#include "http.h"

#include <nlohmann/json.hpp>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <stdexcept>
#include <system_error>
#include <thread>

namespace tinylm::serve {

namespace {

using Clock = std::chrono::steady_clock;

/// A misuse of the server or a resource it cannot have: thrown with the reason.
void require(bool ok, const std::string& why) {
  if (!ok) throw std::runtime_error(why);
}

std::string lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return std::string(s);
}

/// Milliseconds left until `deadline` (0 when passed), for poll().
int ms_until(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<int64_t>(left, 0, 60'000));
}

enum class Wait { readable, timeout, stopping };

/// Waits until fd has bytes (or EOF), the deadline passes, or the server stops.
Wait wait_readable(int fd, int wake_fd, Clock::time_point deadline) {
  for (;;) {
    pollfd p[2] = {{fd, POLLIN, 0}, {wake_fd, POLLIN, 0}};
    const int ms = ms_until(deadline);
    const int n = ::poll(p, 2, ms);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Wait::timeout;
    if (p[0].revents) return Wait::readable;
    if (p[1].revents) return Wait::stopping;
    if (ms == 0 || Clock::now() >= deadline) return Wait::timeout;
  }
}

Clock::time_point after(double seconds) {
  return Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
}

/// A lingering close: what the client still sends (a request or body that was refused) is
/// read and dropped for up to `seconds`, so closing does not reset the connection before
/// the client has read the answer.
void close_gently(int fd, int wake_fd, double seconds) {
  ::shutdown(fd, SHUT_WR);
  const auto linger = after(seconds);
  for (size_t drained = 0; drained < (4u << 20) && wait_readable(fd, wake_fd, linger) == Wait::readable;) {
    char buf[16384];
    const auto n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    drained += static_cast<size_t>(n);
  }
  ::close(fd);
}

std::string json_error(std::string_view message, std::string_view type) {
  return nlohmann::json{{"error", {{"message", message}, {"type", type}, {"code", nullptr}}}}.dump(
      -1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace

std::string_view status_text(int status) {
  switch (status) {
    case 100: return "100 Continue";
    case 200: return "200 OK";
    case 204: return "204 No Content";
    case 400: return "400 Bad Request";
    case 401: return "401 Unauthorized";
    case 404: return "404 Not Found";
    case 405: return "405 Method Not Allowed";
    case 408: return "408 Request Timeout";
    case 411: return "411 Length Required";
    case 413: return "413 Content Too Large";
    case 415: return "415 Unsupported Media Type";
    case 431: return "431 Request Header Fields Too Large";
    case 500: return "500 Internal Server Error";
    case 501: return "501 Not Implemented";
    case 503: return "503 Service Unavailable";
    case 505: return "505 HTTP Version Not Supported";
    default: return "500 Internal Server Error";
  }
}

std::pair<int, std::string> parse_request_head(std::string_view head, const HttpLimits& limits, HttpRequest& req) {
  auto next_line = [&head]() -> std::string_view {
    const auto end = head.find('\n');
    auto line = head.substr(0, end);
    head = end == std::string_view::npos ? std::string_view{} : head.substr(end + 1);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    return line;
  };
  const auto request_line = next_line();
  const auto sp1 = request_line.find(' ');
  const auto sp2 = sp1 == std::string_view::npos ? sp1 : request_line.find(' ', sp1 + 1);
  if (sp2 == std::string_view::npos || request_line.find(' ', sp2 + 1) != std::string_view::npos)
    return {400, "malformed request line: expected METHOD TARGET HTTP/1.1"};
  req.method = std::string(request_line.substr(0, sp1));
  req.target = std::string(request_line.substr(sp1 + 1, sp2 - sp1 - 1));
  const auto version = request_line.substr(sp2 + 1);
  if (version != "HTTP/1.1" && version != "HTTP/1.0") return {505, "only HTTP/1.0 and HTTP/1.1 are served"};
  for (char c : req.method)
    if (!std::isupper(static_cast<unsigned char>(c))) return {400, "malformed request method"};
  if (req.target.empty() || req.target[0] != '/') return {400, "the request target must be a path starting with /"};
  for (unsigned char c : req.target)
    if (c <= 0x20 || c >= 0x7f) return {400, "the request target has a control or non-ASCII byte"};
  const auto q = req.target.find('?');
  req.path = req.target.substr(0, q);
  req.query = q == std::string::npos ? "" : req.target.substr(q + 1);
  while (!head.empty()) {
    const auto line = next_line();
    if (line.empty()) continue;
    if (line[0] == ' ' || line[0] == '\t') return {400, "folded header lines are not accepted"};
    const auto colon = line.find(':');
    if (colon == std::string_view::npos || colon == 0) return {400, "malformed header line (no 'name:')"};
    for (char c : line.substr(0, colon))
      if (c <= 0x20 || c >= 0x7f) return {400, "malformed header name"};
    if (req.headers.size() >= limits.max_headers)
      return {431, "more than " + std::to_string(limits.max_headers) + " header lines"};
    req.headers.emplace_back(lower(std::string(line.substr(0, colon))), trim(line.substr(colon + 1)));
  }
  if (version == "HTTP/1.0" && lower(req.header("connection")) != "keep-alive")
    req.headers.emplace_back("connection", "close");
  return {0, {}};
}

std::string HttpRequest::header(std::string_view name) const {
  for (const auto& [k, v] : headers)
    if (k == name) return v;
  return {};
}

// ---- responses ----------------------------------------------------------------------

bool HttpResponder::write_all(std::string_view data) {
  // All of `data` (a response, or one event of a stream) must be taken within
  // write_seconds: a client that reads a byte now and then cannot hold this thread, as it
  // could where each send() had its own timeout.
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(limits_.write_seconds));
  while (!broken_ && !data.empty()) {
    const auto n = ::send(fd_, data.data(), data.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd p{fd_, POLLOUT, 0};
      const int ms = ms_until(deadline);
      const int ready = ms > 0 ? ::poll(&p, 1, ms) : 0;
      if (ready < 0 && errno == EINTR) continue;
      if (ready <= 0) broken_ = true;  // the deadline passed: the client reads too slowly
      continue;
    }
    if (n <= 0) {
      broken_ = true;  // the client is gone
      break;
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
  return !broken_;
}

std::string HttpResponder::head(int status, std::string_view content_type, const std::vector<std::string>& extra,
                                std::string_view length_or_chunked) {
  std::string h = "HTTP/1.1 ";
  h += status_text(status);
  h += "\r\nServer: tinylm\r\nContent-Type: ";
  h += content_type;
  h += "\r\nX-Content-Type-Options: nosniff\r\n";
  h += length_or_chunked;
  h += keep_alive && !stopping_.load() ? "Connection: keep-alive\r\n" : "Connection: close\r\n";
  for (const auto& line : common_headers) h += line + "\r\n";
  for (const auto& line : extra) h += line + "\r\n";
  return h + "\r\n";
}

void HttpResponder::send(int status, std::string_view content_type, std::string_view body,
                         const std::vector<std::string>& extra) {
  if (responded_) throw std::logic_error("HttpResponder: a response was already sent");
  responded_ = true;
  status_ = status;
  if (status >= 400 && status != 404 && status != 405 && status != 401) keep_alive = false;
  auto h = head(status, content_type, extra, "Content-Length: " + std::to_string(body.size()) + "\r\n");
  if (body.size() < 64 * 1024) {
    write_all(h + std::string(body));
  } else if (write_all(h)) {
    write_all(body);
  }
}

void HttpResponder::error(int status, std::string_view message, std::string_view type,
                          const std::vector<std::string>& extra) {
  send(status, "application/json", json_error(message, type), extra);
}

bool HttpResponder::start_stream(std::string_view content_type, const std::vector<std::string>& extra) {
  if (responded_) throw std::logic_error("HttpResponder: a response was already sent");
  responded_ = streaming_ = true;
  status_ = 200;
  auto more = extra;
  more.emplace_back("Cache-Control: no-cache");
  return write_all(head(200, content_type, more, "Transfer-Encoding: chunked\r\n"));
}

bool HttpResponder::write_chunk(std::string_view data) {
  if (data.empty()) return !broken_;
  char size[32];
  std::snprintf(size, sizeof size, "%zx\r\n", data.size());
  std::string chunk = size;
  chunk.append(data);
  chunk += "\r\n";
  return write_all(chunk);
}

void HttpResponder::end_stream() {
  if (streaming_) write_all("0\r\n\r\n");
  streaming_ = false;
}

bool HttpResponder::client_gone() const {
  if (broken_) return true;
  pollfd p{fd_, POLLRDHUP, 0};
  return ::poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR));
}

// ---- the server -----------------------------------------------------------------------

HttpServer::HttpServer(HttpLimits limits, HttpHandler handler) : limits_(limits), handler_(std::move(handler)) {
  require(::pipe2(wake_, O_CLOEXEC | O_NONBLOCK) == 0, std::string("cannot create a pipe: ") + std::strerror(errno));
}

HttpServer::~HttpServer() {
  stop();
  {
    std::unique_lock<std::mutex> lock(mutex_);
    all_closed_.wait(lock, [this] { return connections_ == 0; });
  }
  if (listen_fd_ >= 0) ::close(listen_fd_);
  ::close(wake_[0]);
  ::close(wake_[1]);
}

void HttpServer::bind(const std::string& host, int port) {
  require(port >= 0 && port <= 65535, "port must be in [0, 65535], got " + std::to_string(port));
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const auto service = std::to_string(port);
  const int rc = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &found);
  require(rc == 0 && found, "cannot listen on '" + host + "': " + ::gai_strerror(rc) +
                               " (give an address such as 127.0.0.1, ::1 or 0.0.0.0)");
  std::string why;
  for (auto* a = found; a; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    const int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, 128) == 0) {
      listen_fd_ = fd;
      sockaddr_storage bound{};
      socklen_t len = sizeof bound;
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len);
      port_ = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                                : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
      break;
    }
    why = std::strerror(errno);
    ::close(fd);
  }
  ::freeaddrinfo(found);
  require(listen_fd_ >= 0,
          "cannot listen on " + host + ":" + std::to_string(port) + ": " + why +
              (why == std::strerror(EADDRINUSE) ? " (another program has that port: choose another with --port)" : ""));
}

int64_t HttpServer::open_connections() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return connections_;
}

void HttpServer::stop() {
  if (stopping_.exchange(true)) return;
  const char byte = 1;
  [[maybe_unused]] auto n = ::write(wake_[1], &byte, 1);  // the pipe stays readable: every poll wakes
}

void HttpServer::run() {
  require(listen_fd_ >= 0, "HttpServer::run: bind() first");
  while (!stopping_.load()) {
    pollfd p[2] = {{listen_fd_, POLLIN, 0}, {wake_[0], POLLIN, 0}};
    if (::poll(p, 2, -1) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    if (p[1].revents || stopping_.load()) break;
    if (!(p[0].revents & POLLIN)) continue;
    sockaddr_storage addr{};
    socklen_t len = sizeof addr;
    const int fd = ::accept4(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EMFILE || errno == ENFILE) std::this_thread::sleep_for(std::chrono::milliseconds(50));
      continue;
    }
    char host[INET6_ADDRSTRLEN] = "?";
    int peer_port = 0;
    if (addr.ss_family == AF_INET) {
      auto* a = reinterpret_cast<sockaddr_in*>(&addr);
      ::inet_ntop(AF_INET, &a->sin_addr, host, sizeof host);
      peer_port = ntohs(a->sin_port);
    } else if (addr.ss_family == AF_INET6) {
      auto* a = reinterpret_cast<sockaddr_in6*>(&addr);
      ::inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof host);
      peer_port = ntohs(a->sin6_port);
    }
    // A bounded send buffer (the kernel's autotuning grows it to megabytes): what a client
    // leaves unread stops the writes within a second or two, and the write deadline applies.
    const int send_buffer = 256 * 1024;
    ::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &send_buffer, sizeof send_buffer);
    const int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    // Admitted: queued for the pool, which gains a thread when none is free (up to the
    // connection limit, so a queued connection never waits for another to end).
    bool admitted = false;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (connections_ < limits_.max_connections) {
        queue_.emplace_back(fd, std::string(host) + ":" + std::to_string(peer_port));
        ++connections_;
        admitted = true;
        if (static_cast<int64_t>(queue_.size()) > idle_) {
          try {
            pool_.emplace_back(&HttpServer::work, this);
          } catch (const std::system_error&) {  // no thread to be had
            if (pool_.empty()) {  // and none to come: answered below
              queue_.pop_back();
              --connections_;
              admitted = false;
            }
          }
        }
      }
    }
    if (admitted) {
      queued_.notify_one();
      continue;
    }
    HttpResponder r(fd, limits_, stopping_);
    r.keep_alive = false;
    r.common_headers = common_headers;
    r.error(503, "the server has " + std::to_string(limits_.max_connections) +
                     " connections open, its limit: retry shortly", "server_busy", {"Retry-After: 1"});
    close_gently(fd, wake_[0], 0.02);  // short: this is the accepting thread
  }
  std::unique_lock<std::mutex> lock(mutex_);
  all_closed_.wait(lock, [this] { return connections_ == 0; });
  closing_pool_ = true;
  queued_.notify_all();
  auto pool = std::move(pool_);
  lock.unlock();
  for (auto& t : pool) t.join();
}

void HttpServer::work() {
  for (;;) {
    std::pair<int, std::string> next;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      ++idle_;
      queued_.wait(lock, [this] { return !queue_.empty() || closing_pool_; });
      --idle_;
      if (queue_.empty()) return;  // closing
      next = std::move(queue_.front());
      queue_.pop_front();
    }
    finish(next.first, next.second);
  }
}

void HttpServer::serve(int fd, const std::string& peer) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ++connections_;
  }
  finish(fd, peer);
}

void HttpServer::finish(int fd, const std::string& peer) {
  try {
    converse(fd, peer);
  } catch (const std::exception&) {
    // Something failed outside a handler (out of memory): this connection alone is closed.
  }
  close_gently(fd, wake_[0], 0.5);
  std::lock_guard<std::mutex> lock(mutex_);
  if (--connections_ == 0) all_closed_.notify_all();
}

void HttpServer::converse(int fd, const std::string& peer) {
  std::string in;  // bytes read and not yet used (a pipelined next request stays here)
  bool first = true;
  for (bool open = true; open;) {
    HttpResponder r(fd, limits_, stopping_);
    r.common_headers = common_headers;
    // The head: the first byte within the idle time, the rest within the request time.
    auto deadline = after(first ? limits_.request_seconds : limits_.idle_seconds);
    bool started = !in.empty();
    if (started) deadline = after(limits_.request_seconds);
    size_t head_end = std::string::npos, sep = 0;
    int status = 0;
    std::string reason;
    for (;;) {
      head_end = in.find("\r\n\r\n");
      sep = 4;
      if (head_end == std::string::npos) {
        head_end = in.find("\n\n");
        sep = 2;
      }
      if (head_end != std::string::npos) break;
      if (in.size() > limits_.max_head_bytes) {
        status = 431;
        reason = "the request head is over " + std::to_string(limits_.max_head_bytes) + " bytes";
        break;
      }
      const auto w = wait_readable(fd, wake_[0], deadline);
      if (w == Wait::stopping && !started) { open = false; break; }
      if (w != Wait::readable) {
        if (started) {
          status = w == Wait::stopping ? 503 : 408;
          reason = w == Wait::stopping ? "the server is shutting down"
                                       : "the request did not arrive within " +
                                             std::to_string(static_cast<int>(limits_.request_seconds)) + " s";
        } else {
          open = false;  // an idle keep-alive connection: closed quietly
        }
        break;
      }
      char buf[8192];
      const auto n = ::recv(fd, buf, sizeof buf, 0);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) { open = false; break; }
      if (!started) deadline = after(limits_.request_seconds);
      started = true;
      in.append(buf, static_cast<size_t>(n));
    }
    first = false;
    if (!open) break;
    HttpRequest req;
    req.peer = peer;
    if (status == 0 && head_end > limits_.max_head_bytes) {
      status = 431;
      reason = "the request head is over " + std::to_string(limits_.max_head_bytes) + " bytes";
    }
    if (status == 0) std::tie(status, reason) = parse_request_head(std::string_view(in).substr(0, head_end), limits_, req);
    if (status != 0) {
      r.keep_alive = false;
      r.error(status, reason);
      break;
    }
    in.erase(0, head_end + sep);
    const auto connection = lower(req.header("connection"));
    r.keep_alive = connection.find("close") == std::string::npos;
    // The body: Content-Length only, within the limit and the same deadline.
    size_t length = 0;
    const auto te = req.header("transfer-encoding");
    const auto cl = req.header("content-length");
    int lengths = 0;
    for (const auto& h : req.headers) lengths += h.first == "content-length";
    if (!te.empty()) {
      status = 411;
      reason = "chunked request bodies are not accepted: send a Content-Length";
    } else if (lengths > 1) {
      status = 400;
      reason = "more than one Content-Length header";
    } else if (lengths == 1) {
      if (cl.empty() || cl.size() > 18 || cl.find_first_not_of("0123456789") != std::string::npos) {
        status = 400;
        reason = "Content-Length is not a number";
      } else {
        length = static_cast<size_t>(std::stoull(cl));
        if (length > limits_.max_body_bytes) {
          status = 413;
          reason = "the request body is " + cl + " bytes, over the limit of " +
                   std::to_string(limits_.max_body_bytes) + " (--max-body-bytes)";
        }
      }
    }
    if (status == 0 && length > in.size() && lower(req.header("expect")) == "100-continue") {
      if (!r.client_gone()) {
        const std::string_view cont = "HTTP/1.1 100 Continue\r\n\r\n";
        if (::send(fd, cont.data(), cont.size(), MSG_NOSIGNAL | MSG_DONTWAIT) != static_cast<ssize_t>(cont.size()))
          break;  // a client that cannot take 25 bytes is not reading
      }
    }
    while (status == 0 && in.size() < length) {
      const auto w = wait_readable(fd, wake_[0], deadline);
      if (w == Wait::stopping) {
        status = 503;
        reason = "the server is shutting down";
        break;
      }
      if (w == Wait::timeout) {
        status = 408;
        reason = "the request body did not arrive within " +
                 std::to_string(static_cast<int>(limits_.request_seconds)) + " s";
        break;
      }
      char buf[16384];
      const auto n = ::recv(fd, buf, std::min(sizeof buf, length - in.size()), 0);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) { open = false; break; }
      in.append(buf, static_cast<size_t>(n));
    }
    if (!open) break;
    if (status != 0) {
      r.keep_alive = false;
      r.error(status, reason);
      break;
    }
    req.body = in.substr(0, length);
    in.erase(0, length);
    try {
      handler_(req, r);
      if (!r.responded()) r.error(500, "the server gave no response", "server_error");
    } catch (const std::exception& e) {
      if (!r.responded()) {
        r.error(500, std::string("internal error: ") + e.what(), "server_error");
      } else {
        r.keep_alive = false;  // a stream cut short: the client cannot reuse the connection
      }
    }
    if (!r.keep_alive || stopping_.load() || r.client_gone()) break;
  }
}

}  // namespace tinylm::serve
