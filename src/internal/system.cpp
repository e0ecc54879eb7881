// Internal: files, memory and CPUs as the operating system reports them.
#include "internal/system.h"

#include <array>
#include <c10/util/Exception.h>

#include <fcntl.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

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

namespace {

/// Bytes in the valid UTF-8 sequence starting at s[i] (1 for ASCII), or 0 when the bytes
/// there are not one (a stray continuation byte, an overlong or surrogate form, a cut).
size_t utf8_sequence_length(std::string_view s, size_t i) {
  const auto c = static_cast<unsigned char>(s[i]);
  if (c < 0x80) return 1;
  const size_t len = c >= 0xF0 && c <= 0xF4 ? 4 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xC2 && c < 0xE0 ? 2 : 0;
  if (len == 0 || i + len > s.size()) return 0;
  for (size_t k = 1; k < len; ++k)
    if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return 0;
  const auto c1 = static_cast<unsigned char>(s[i + 1]);
  if ((c == 0xE0 && c1 < 0xA0) || (c == 0xED && c1 >= 0xA0) || (c == 0xF0 && c1 < 0x90) ||
      (c == 0xF4 && c1 >= 0x90))
    return 0;  // overlong, a UTF-16 surrogate, or past U+10FFFF
  return len;
}

}  // namespace

size_t utf8_valid_prefix(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const size_t len = utf8_sequence_length(s, i);
    if (len == 0) break;
    i += len;
  }
  return i;
}

std::string to_valid_utf8(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const size_t len = utf8_sequence_length(s, i);
    if (len == 0) {
      out += "\xEF\xBF\xBD";  // U+FFFD
      ++i;
    } else {
      out.append(s.substr(i, len));
      i += len;
    }
  }
  return out;
}

std::string printable(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  auto hex = [&](unsigned char c) {
    const char* digits = "0123456789ABCDEF";
    out += "\\x";
    out += digits[c >> 4];
    out += digits[c & 0xF];
  };
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x20 || c == 0x7F) {
      hex(c);
      ++i;
      continue;
    }
    if (c < 0x80) {
      out += static_cast<char>(c);
      ++i;
      continue;
    }
    const size_t len = utf8_sequence_length(s, i);
    if (len == 0) {
      hex(c);
      ++i;
      continue;
    }
    out.append(s.substr(i, len));
    i += len;
  }
  return out;
}

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

std::string human_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  int u = 0;
  while (bytes >= 1024 && u < 6) {
    bytes /= 1024;
    ++u;
  }
  std::ostringstream os;
  os.setf(std::ios::fixed);
  os.precision(u == 0 ? 0 : bytes < 10 ? 2 : 1);
  os << bytes << " " << units[u];
  if (u == 6 && bytes >= 1024) return "more than 1024 EiB";
  return os.str();
}

uint32_t crc32(const void* data, size_t size) {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  uint32_t crc = 0xFFFFFFFFu;
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < size; ++i) crc = table[(crc ^ p[i]) & 0xFF] ^ (crc >> 8);
  return crc ^ 0xFFFFFFFFu;
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

void write_file_atomically(const std::string& path, const std::string& bytes, const std::string& what) {
  AtomicFile file(path, what);
  file.write(bytes.data(), bytes.size());
  file.commit();
}

}  // namespace tinylm::internal
