// Starting this program again as a child process: data-parallel workers (`train --nproc`)
// and the benchmarks' worker processes.
#pragma once

#include <sys/types.h>

#include <string>
#include <utility>
#include <vector>

namespace tinylm::cli {

struct SpawnOptions {
  std::vector<std::string> args;                         // argv, argv[0] included
  std::vector<std::pair<std::string, std::string>> env;  // set in the child
  int stdout_fd = -1;            // >= 0: the child's standard output; -1: inherited
  bool quiet = false;            // the child's standard output goes to /dev/null
  std::vector<int> close_fds;    // closed in the child (a pipe's other ends)
  bool die_with_parent = false;  // SIGKILL when the parent dies; SIGINT/SIGTERM default
};

/// fork + exec of /proc/self/exe; the child's pid. Throws when fork fails; a child that
/// cannot exec says why on stderr and exits 127.
pid_t spawn_self(const SpawnOptions& options);

/// Runs this program with `options` (its stdout captured) and waits for it; the first
/// line it printed. Throws with `what` when it fails or prints nothing.
std::string run_self(SpawnOptions options, const std::string& what);

/// Everything a pipe's read end gives until its writers close it.
std::string read_all(int fd);

/// What a child's wait status means as an exit status: its code, or 128 + its signal.
int exit_code(int wait_status);

}  // namespace tinylm::cli
