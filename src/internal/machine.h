// Internal: what this machine gives the process: memory left and usable CPUs.
#pragma once

#include <cstdint>

namespace tinylm::internal {

/// Memory this process can still take, in bytes: the smallest of the kernel's
/// MemAvailable, the room left under a cgroup v2 limit and the address space left under
/// RLIMIT_AS. 0 when unknown.
uint64_t available_memory_bytes();

/// CPUs this process may run on (its affinity mask); at least 1.
int usable_cpu_count();

/// Refuses a thread count below 0 or above usable_cpu_count() (0 = the default).
void check_thread_count(int64_t threads);

}  // namespace tinylm::internal
