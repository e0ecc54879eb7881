// Internal: checked reads of user files and atomic writes.
#include "internal/files.h"
#include "internal/machine.h"
#include "internal/text.h"

#include <c10/util/Exception.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

namespace tinylm::internal {

namespace {

/// Closes a file descriptor on scope exit.
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

const char* kind_of(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

/// Opens `path` for reading without blocking and checks that it is a regular file.
int open_regular(const std::string& path, const std::string& what, uint64_t* size) {
  TORCH_CHECK(!path.empty(), what, ": the path is empty");
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    TORCH_CHECK(err != ENOENT, what, " '", printable(path), "' does not exist");
    TORCH_CHECK(err != EACCES, what, " '", printable(path), "' is not readable (permission denied)");
    TORCH_CHECK(false, "cannot open ", what, " '", printable(path), "': ", std::strerror(err));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    TORCH_CHECK(false, "cannot read ", what, " '", printable(path), "': ", std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    TORCH_CHECK(false, what, " '", printable(path), "' is ", kind_of(st.st_mode),
                ", not a regular file: give the path of a file");
  }
  *size = static_cast<uint64_t>(st.st_size);
  return fd;
}

}  // namespace

uint64_t check_regular_file(const std::string& path, const std::string& what) {
  uint64_t size = 0;
  Fd fd(open_regular(path, what, &size));
  return size;
}

std::string read_regular_file(const std::string& path, const std::string& what, uint64_t max_bytes) {
  uint64_t size = 0;
  Fd fd(open_regular(path, what, &size));
  TORCH_CHECK(size <= max_bytes, what, " '", printable(path), "' is ", human_bytes(size),
              ", more than the ", human_bytes(max_bytes), " it may take here");
  const uint64_t available = available_memory_bytes();
  TORCH_CHECK(available == 0 || size < available, what, " '", printable(path), "' is ",
              human_bytes(size), ": more than the ", human_bytes(available),
              " of memory available to read it into");
  std::string bytes;
  bytes.reserve(size);
  char buffer[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd.get(), buffer, sizeof buffer);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    TORCH_CHECK(n >= 0, "cannot read ", what, " '", printable(path), "': ", std::strerror(errno));
    if (n == 0) break;
    bytes.append(buffer, static_cast<size_t>(n));
    TORCH_CHECK(bytes.size() <= max_bytes, what, " '", printable(path), "' grew past ",
                human_bytes(max_bytes), " while it was read");
  }
  return bytes;
}

AtomicFile::AtomicFile(std::string path, std::string what)
    : path_(std::move(path)), what_(std::move(what)), tmp_(path_ + ".tmp." + std::to_string(::getpid())) {
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  TORCH_CHECK(fd_ >= 0, "cannot write ", what_, " '", printable(tmp_), "': ", std::strerror(errno));
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(tmp_.c_str());
  }
}

void AtomicFile::write_at(uint64_t offset, const void* data, size_t size) {
  TORCH_CHECK(fd_ >= 0, "AtomicFile: '", printable(path_), "' is already committed");
  const auto* p = static_cast<const char*>(data);
  size_t done = 0;
  while (done < size) {
    const ssize_t n = ::pwrite(fd_, p + done, size - done, static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    TORCH_CHECK(n > 0, "cannot write ", what_, " '", printable(tmp_), "': ", std::strerror(errno),
                " (is the disk full?)");
    done += static_cast<size_t>(n);
  }
  size_ = std::max<uint64_t>(size_, offset + size);
}

void AtomicFile::write(const void* data, size_t size) { write_at(size_, data, size); }

void AtomicFile::commit() {
  TORCH_CHECK(fd_ >= 0, "AtomicFile: '", printable(path_), "' is already committed");
  const int fd = fd_;
  fd_ = -1;
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    const std::string why = std::strerror(errno);
    ::unlink(tmp_.c_str());
    TORCH_CHECK(false, "cannot flush ", what_, " '", printable(tmp_), "': ", why);
  }
  if (::rename(tmp_.c_str(), path_.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    ::unlink(tmp_.c_str());
    TORCH_CHECK(false, "cannot rename '", printable(tmp_), "' to '", printable(path_), "': ", why);
  }
  const std::filesystem::path target(path_);
  const std::filesystem::path dir = target.has_parent_path() ? target.parent_path() : std::filesystem::path(".");
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);  // make the rename itself durable
    ::close(dfd);
  }
}

void check_output_path(const std::string& path, bool overwrite) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const auto status = fs::status(path, ec);
  TORCH_CHECK(!fs::exists(status) || (overwrite && fs::is_regular_file(status)), "'", path, "' ",
              fs::is_regular_file(status) ? "already exists: choose another path, or overwrite it on purpose"
                                          : "exists and is not a regular file: choose another path");
  const auto parent = fs::path(path).has_parent_path() ? fs::path(path).parent_path() : fs::path(".");
  TORCH_CHECK(fs::is_directory(parent, ec), "cannot write '", path, "': directory '", parent.string(),
              "' does not exist");
}

void write_file_atomically(const std::string& path, const std::string& bytes, const std::string& what) {
  AtomicFile file(path, what);
  file.write(bytes.data(), bytes.size());
  file.commit();
}

}  // namespace tinylm::internal
