// Fuzz target: a whole connection to tinylm serve's HTTP layer (tinylm_http, no LibTorch):
// the input is what a client sends (any number of requests, pipelined, cut anywhere), fed
// through a socket pair to HttpServer::serve, with handlers that answer whole, stream,
// throw or do not answer; what comes back is read to the end. Whatever the bytes: no
// crash, no hang (the input ends with the client's half-close, so no deadline is waited
// for), and every byte that comes back belongs to responses that start "HTTP/1.1 ".
#include "http.h"

#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <thread>

namespace {

void handle(const tinylm::serve::HttpRequest& req, tinylm::serve::HttpResponder& res) {
  if (req.path == "/stream") {
    if (!res.start_stream("text/event-stream")) return;
    for (size_t at = 0; at < req.body.size(); at += 7)
      if (!res.write_chunk(req.body.substr(at, 7))) return;
    res.end_stream();
  } else if (req.path == "/throw") {
    throw std::runtime_error("a handler failed");
  } else if (req.path == "/twice") {
    res.send(200, "text/plain", "once");
    res.send(200, "text/plain", "twice");  // throws: the connection must survive it
  } else if (req.path != "/silent") {
    res.send(200, "text/plain", req.method + " " + req.target + " " + req.header("x-echo") + " " + req.body);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  tinylm::serve::HttpLimits limits;
  limits.max_head_bytes = 1024;
  limits.max_headers = 8;
  limits.max_body_bytes = 4096;
  limits.request_seconds = limits.idle_seconds = limits.write_seconds = 5;  // never reached: see above
  static tinylm::serve::HttpServer server(limits, handle);
  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) std::abort();
  std::thread serving([&] { server.serve(fds[1], "fuzz"); });
  std::string out;
  std::thread reading([&] {
    char buf[65536];
    for (ssize_t n; (n = ::recv(fds[0], buf, sizeof buf, 0)) > 0;) out.append(buf, static_cast<size_t>(n));
  });
  for (size_t sent = 0; sent < size;) {
    const auto n = ::send(fds[0], data + sent, size - sent, MSG_NOSIGNAL);
    if (n <= 0) break;  // the server closed its side (a refused request): the rest is not read
    sent += static_cast<size_t>(n);
  }
  ::shutdown(fds[0], SHUT_WR);
  serving.join();
  reading.join();
  ::close(fds[0]);
  if (!out.empty() && out.compare(0, 9, "HTTP/1.1 ") != 0) std::abort();
  return 0;
}
