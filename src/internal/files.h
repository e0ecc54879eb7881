// Internal: user files read safely (regular files only, sizes checked) and files
// written atomically (temporary name, fsync, rename).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace tinylm::internal {

/// Reads a whole regular file. A missing path, a directory, a FIFO, a device, a socket
/// or an unreadable file is refused with one line naming `what`, the path and the
/// problem; a FIFO never blocks (it is opened non-blocking and refused). A file larger
/// than `max_bytes` is refused too.
std::string read_regular_file(const std::string& path, const std::string& what,
                              uint64_t max_bytes = UINT64_MAX);

/// The same checks without reading; returns the file's size in bytes.
uint64_t check_regular_file(const std::string& path, const std::string& what);

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

/// Refuses, with one line, a path about to be written that exists (unless `overwrite` and
/// it is a regular file) or whose directory does not exist: checked before the work.
void check_output_path(const std::string& path, bool overwrite);

}  // namespace tinylm::internal
