// fork + exec of this program, for workers.
#include "spawn.h"

#include <c10/util/Exception.h>

#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace tinylm::cli {

pid_t spawn_self(const SpawnOptions& o) {
  std::vector<std::string> args = o.args;  // execv takes non-const strings
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t pid = ::fork();
  TORCH_CHECK(pid >= 0, "cannot start a worker process: ", std::strerror(errno));
  if (pid != 0) return pid;
  // The child: only async-signal-safe work until exec, bar setenv (one thread here).
  if (o.die_with_parent) {
    std::signal(SIGINT, SIG_DFL);
    std::signal(SIGTERM, SIG_DFL);
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // no orphaned workers if the parent is killed
    if (::getppid() == 1) ::_exit(137);  // it died before that was set
  }
  if (o.stdout_fd >= 0) ::dup2(o.stdout_fd, STDOUT_FILENO);
  if (o.quiet && std::freopen("/dev/null", "w", stdout) == nullptr) {
    std::fprintf(stderr, "error: cannot start a worker process: /dev/null: %s\n", std::strerror(errno));
    ::_exit(127);
  }
  for (int fd : o.close_fds) ::close(fd);
  for (const auto& [name, value] : o.env) ::setenv(name.c_str(), value.c_str(), 1);
  ::execv("/proc/self/exe", argv.data());
  std::fprintf(stderr, "error: cannot start a worker process: %s\n", std::strerror(errno));
  ::_exit(127);
}

std::string run_self(SpawnOptions o, const std::string& what) {
  int out[2];
  TORCH_CHECK(::pipe(out) == 0, what, ": cannot open a pipe: ", std::strerror(errno));
  o.stdout_fd = out[1];
  o.close_fds = {out[0], out[1]};
  const pid_t pid = spawn_self(o);
  ::close(out[1]);
  const std::string text = read_all(out[0]);
  ::close(out[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  TORCH_CHECK(exit_code(status) == 0 && !text.empty(), what, " failed (status ", exit_code(status), ")");
  return text.substr(0, text.find('\n'));
}

std::string read_all(int fd) {
  std::string text;
  char buffer[4096];
  for (ssize_t n; (n = ::read(fd, buffer, sizeof buffer)) > 0;) text.append(buffer, static_cast<size_t>(n));
  return text;
}

int exit_code(int status) { return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status); }

}  // namespace tinylm::cli
