// Internal: memory and CPUs as the operating system reports them.
#include "internal/machine.h"

#include <c10/util/Exception.h>

#include <sched.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <string>

namespace tinylm::internal {

uint64_t available_memory_bytes() {
  uint64_t available = 0;
  {
    std::ifstream meminfo("/proc/meminfo");
    std::string key;
    uint64_t kib = 0;
    std::string unit;
    while (meminfo >> key >> kib) {
      std::getline(meminfo, unit);
      if (key == "MemAvailable:") {
        available = kib * 1024;
        break;
      }
    }
  }
  // cgroup v2: the limit of this process's group, less what it already uses.
  std::ifstream cgroup_file("/proc/self/cgroup");
  std::string line;
  while (std::getline(cgroup_file, line)) {
    if (line.rfind("0::", 0) != 0) continue;
    const std::string dir = "/sys/fs/cgroup" + line.substr(3);
    std::ifstream max_file(dir + "/memory.max"), current_file(dir + "/memory.current");
    std::string max_text;
    uint64_t current = 0;
    if (max_file >> max_text && max_text != "max" && current_file >> current) {
      uint64_t limit = 0;
      try {
        limit = std::stoull(max_text);
      } catch (const std::exception&) {
        continue;
      }
      const uint64_t room = limit > current ? limit - current : 0;
      if (available == 0 || room < available) available = room;
    }
  }
  // An address-space limit (ulimit -v): what is left of it. Allocations past it fail
  // however much memory the machine has.
  struct rlimit as_limit {};
  if (::getrlimit(RLIMIT_AS, &as_limit) == 0 && as_limit.rlim_cur != RLIM_INFINITY) {
    std::ifstream statm("/proc/self/statm");
    uint64_t pages = 0;
    if (statm >> pages) {
      const uint64_t used = pages * static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
      const uint64_t limit = static_cast<uint64_t>(as_limit.rlim_cur);
      const uint64_t room = limit > used ? limit - used : 1;
      if (available == 0 || room < available) available = room;
    }
  }
  return available;
}

int usable_cpu_count() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
  const long n = ::sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? static_cast<int>(n) : 1;
}

void check_thread_count(int64_t threads) {
  const int cpus = usable_cpu_count();
  TORCH_CHECK(threads >= 0, "threads must be >= 0 (0 = LibTorch's default), got ", threads);
  TORCH_CHECK(threads <= cpus, "threads ", threads, " is more than the ", cpus,
              " CPU(s) this process may use: use 1 to ", cpus, ", or 0 for LibTorch's default");
}

}  // namespace tinylm::internal
