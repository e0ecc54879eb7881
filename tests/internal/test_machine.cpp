// src/internal/machine.cpp: the CPUs this process may use, the memory available to it.
#include "../test_util.h"

#include "internal/machine.h"

#include <unistd.h>

#include <fstream>
#include <string>

using namespace tinylm;
using tinylm::test::error_message;

TEST_CASE("thread counts are checked against the CPUs this process may use", "[system][errors]") {
  const int cpus = internal::usable_cpu_count();
  INFO("usable CPUs " << cpus);
  CHECK(cpus >= 1);
  const long configured = ::sysconf(_SC_NPROCESSORS_CONF);
  if (configured > 0) CHECK(cpus <= configured);  // an affinity mask is a subset of the CPUs
  internal::check_thread_count(0);  // LibTorch's default
  internal::check_thread_count(1);
  internal::check_thread_count(cpus);
  CHECK_THAT(error_message([&] { internal::check_thread_count(cpus + 1); }),
             Catch::Contains("threads " + std::to_string(cpus + 1) + " is more than the " +
                             std::to_string(cpus) + " CPU(s) this process may use"));
  CHECK_THAT(error_message([] { internal::check_thread_count(-1); }),
             Catch::Contains("threads must be >= 0"));
}

TEST_CASE("available memory is positive and within the machine's and the cgroup's limits", "[system]") {
  // The kernel's MemTotal bounds MemAvailable; a cgroup v2 memory.max bounds the room left.
  uint64_t total = 0;
  {
    std::ifstream meminfo("/proc/meminfo");
    std::string key, unit;
    uint64_t kib = 0;
    while (meminfo >> key >> kib) {
      std::getline(meminfo, unit);
      if (key == "MemTotal:") total = kib * 1024;
    }
  }
  if (total == 0) return;  // no /proc here: nothing to compare against
  const uint64_t available = internal::available_memory_bytes();
  INFO("available " << available << " of " << total);
  CHECK(available > 0);
  CHECK(available <= total);
  std::ifstream cgroup("/proc/self/cgroup");
  std::string line;
  while (std::getline(cgroup, line)) {
    if (line.rfind("0::", 0) != 0) continue;
    std::ifstream max_file("/sys/fs/cgroup" + line.substr(3) + "/memory.max");
    std::string limit;
    if (max_file >> limit && limit != "max") {
      INFO("cgroup memory.max " << limit);
      CHECK(available <= std::stoull(limit));
    }
  }
}
