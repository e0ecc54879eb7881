// Internal: what the library asks of the operating system — reading user files safely,
// showing user text in messages, and how much memory and how many CPUs there are.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace tinylm::internal {

/// Reads a whole regular file. A missing path, a directory, a FIFO, a device, a socket
/// or an unreadable file is refused with one line naming `what`, the path and the
/// problem; a FIFO never blocks (it is opened non-blocking and refused). A file larger
/// than `max_bytes` is refused too.
std::string read_regular_file(const std::string& path, const std::string& what,
                              uint64_t max_bytes = UINT64_MAX);

/// The same checks without reading; returns the file's size in bytes.
uint64_t check_regular_file(const std::string& path, const std::string& what);

/// `s` for an error message: control characters, DEL and bytes that are not UTF-8 are
/// written as \xNN, so a message stays one readable line whatever the user typed.
std::string printable(std::string_view s);

/// The length of the longest prefix of `s` that is valid UTF-8 (== s.size() when all of
/// it is): what a reader of text files checks before taking a file.
size_t utf8_valid_prefix(std::string_view s);

/// `s` with every byte that is not part of valid UTF-8 replaced by U+FFFD.
std::string to_valid_utf8(std::string_view s);

/// Memory this process can still take, in bytes: the smallest of the kernel's
/// MemAvailable, the room left under a cgroup v2 limit and the address space left under
/// RLIMIT_AS. 0 when unknown.
uint64_t available_memory_bytes();

/// CPUs this process may run on (its affinity mask); at least 1.
int usable_cpu_count();

/// Refuses a thread count below 0 or above usable_cpu_count() (0 = the default).
void check_thread_count(int64_t threads);

/// Bytes as "1.50 GiB", "12.0 MiB", "3.2 TiB".
std::string human_bytes(double bytes);

/// CRC-32 (IEEE 802.3), as zlib computes it: the checkpoint header's checksum.
uint32_t crc32(const void* data, size_t size);

/// A file written in pieces to a temporary name next to `path` (path.tmp.PID) and put in
/// place by commit(): fsync, rename, fsync of the directory. Destroyed before commit(),
/// it removes the temporary file: a failure never leaves half a file under `path`.
class AtomicFile {
 public:
  AtomicFile(std::string path, std::string what);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  void write(const void* data, size_t size);
  /// Overwrites bytes already written (a header whose counts are known at the end).
  void write_at(uint64_t offset, const void* data, size_t size);
  uint64_t size() const { return size_; }
  void commit();
  const std::string& path() const { return path_; }

 private:
  std::string path_, what_, tmp_;
  int fd_ = -1;
  uint64_t size_ = 0;
};

/// Writes bytes to a temporary file next to `path`, fsyncs it, renames it over `path` and
/// fsyncs the directory: a crash leaves the old file or the new one, never half of one.
/// `what` names the file in errors ("checkpoint").
void write_file_atomically(const std::string& path, const std::string& bytes, const std::string& what);

}  // namespace tinylm::internal
