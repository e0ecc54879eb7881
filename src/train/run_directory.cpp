// Run directories: create, lock, check, and clear a killed run's partial files.
#include <tinylm/error.h>
#include <tinylm/log.h>
#include <tinylm/train/run_directory.h>

#include "internal/text.h"

#include <c10/util/Exception.h>

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>

namespace fs = std::filesystem;

namespace tinylm::train {

namespace {

constexpr const char* kLockName = ".tinylm.lock";

bool is_partial_checkpoint(const std::string& name) {
  const auto at = name.find(".ckpt.tmp.");
  if (at == std::string::npos) return false;
  const std::string pid = name.substr(at + 10);
  return !pid.empty() && pid.find_first_not_of("0123456789") == std::string::npos;
}

/// "metrics.jsonl, best.ckpt and 3 step checkpoints (newest step-00000360.ckpt)"
std::string describe(const std::vector<std::string>& files) {
  std::vector<std::string> parts, steps;
  for (const auto& f : files) {
    if (RunDirectory::step_of_checkpoint_name(f) >= 0) steps.push_back(f);
    else parts.push_back(f);
  }
  std::sort(steps.begin(), steps.end(), [](const std::string& a, const std::string& b) {
    return RunDirectory::step_of_checkpoint_name(a) < RunDirectory::step_of_checkpoint_name(b);
  });
  if (!steps.empty())
    parts.push_back(std::to_string(steps.size()) + " step checkpoint(s), newest " + steps.back());
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) out += (i ? ", " : "") + parts[i];
  return out;
}

}  // namespace

std::string RunDirectory::step_checkpoint_name(int64_t step) {
  std::string digits = std::to_string(step);
  if (digits.size() < 8) digits.insert(0, 8 - digits.size(), '0');
  return "step-" + digits + ".ckpt";
}

std::vector<std::string> RunDirectory::step_checkpoints(const std::string& dir) {
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const int64_t step = step_of_checkpoint_name(e.path().filename().string());
    if (step >= 0) found.emplace_back(step, e.path().string());
  }
  std::sort(found.begin(), found.end());
  std::vector<std::string> paths;
  for (auto& f : found) paths.push_back(std::move(f.second));
  return paths;
}

int64_t RunDirectory::step_of_checkpoint_name(const std::string& name) {
  if (name.size() < 11 || name.rfind("step-", 0) != 0 || name.substr(name.size() - 5) != ".ckpt")
    return -1;
  const std::string digits = name.substr(5, name.size() - 10);
  if (digits.empty() || digits.size() > 18 || digits.find_first_not_of("0123456789") != std::string::npos)
    return -1;
  return std::stoll(digits);
}

std::vector<std::string> RunDirectory::run_files(const std::string& dir) {
  std::vector<std::string> files;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return files;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name == "metrics.jsonl" || name == "best.ckpt" || step_of_checkpoint_name(name) >= 0)
      files.push_back(name);
  }
  std::sort(files.begin(), files.end());
  return files;
}

namespace {

/// Takes the lock on an open lock file, or fails naming the pid written in it.
void take_lock(int fd, const std::string& shown) {
  if (::flock(fd, LOCK_EX | LOCK_NB) == 0) return;
  char pid[32] = {0};
  const ssize_t n = ::pread(fd, pid, sizeof pid - 1, 0);
  std::string holder(pid, n > 0 ? static_cast<size_t>(n) : 0);
  holder.erase(holder.find_last_not_of(" \n") + 1);
  ::close(fd);
  TORCH_CHECK(false, "out-dir '", shown, "' is in use by another training process (pid ",
              holder.empty() ? "unknown" : internal::printable(holder),
              "): wait for it to end, or choose another out-dir");
}

void check_fresh(const std::vector<std::string>& files, const std::string& shown) {
  TINYLM_CHECK(files.empty(), ErrorKind::run_directory_taken, "out-dir '", shown, "' already holds a run (", describe(files),
              "): resume it, choose another out-dir, or allow overwriting it");
}

}  // namespace

RunDirectory::RunDirectory(const std::string& path, RunDirMode mode, int64_t resume_step)
    : path_(path) {
  const std::string shown = internal::printable(path);
  TORCH_CHECK(!path.empty(), "out-dir must not be empty");
  const std::string lock_path = (fs::path(path) / kLockName).string();
  std::error_code ec;
  const auto status = fs::status(path, ec);
  int fd = -1;
  if (fs::exists(status)) {
    TORCH_CHECK(fs::is_directory(status), "out-dir '", shown,
                "' exists and is not a directory: choose another out-dir");
    // A running trainer is named first; an earlier run is refused before anything is
    // written next to it.
    fd = ::open(lock_path.c_str(), O_RDWR | O_CLOEXEC);
    if (fd >= 0) take_lock(fd, shown);
    if (mode == RunDirMode::fresh) {
      try {
        check_fresh(run_files(path), shown);
      } catch (...) {
        if (fd >= 0) ::close(fd);
        throw;
      }
    }
  } else {
    fs::create_directories(path, ec);
    TORCH_CHECK(!ec && fs::is_directory(path), "cannot create out-dir '", shown, "': ",
                ec ? ec.message() : std::string("it is not a directory"));
  }
  if (fd < 0) {
    fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    TORCH_CHECK(fd >= 0, "cannot write in out-dir '", shown, "': ", std::strerror(errno));
    take_lock(fd, shown);
  }
  lock_fd_ = fd;
  try {
    const std::string me = std::to_string(::getpid()) + "\n";
    TORCH_CHECK(::ftruncate(fd, 0) == 0 && ::pwrite(fd, me.data(), me.size(), 0) >= 0,
                "cannot write in out-dir '", shown, "': ", std::strerror(errno));
    // Checked again under the lock: another process may have written in between.
    const auto files = run_files(path);
    if (mode == RunDirMode::fresh) {
      check_fresh(files, shown);
    } else if (mode == RunDirMode::resume) {
      for (const auto& f : files) {
        TORCH_CHECK(step_of_checkpoint_name(f) <= resume_step, "out-dir '", shown, "' holds ", f,
                    ", past the step ", resume_step,
                    " being resumed: continuing here would overwrite it; resume into another out-dir");
      }
    } else {
      for (const auto& f : files) {
        fs::remove(fs::path(path) / f, ec);
        TORCH_CHECK(!ec, "cannot remove '", internal::printable(f), "' from out-dir '", shown,
                    "': ", ec.message());
      }
      if (!files.empty()) logger()->info("overwriting the run in {}: removed {}", path, describe(files));
    }
    // We hold the lock, so no live trainer owns a temporary file here: they are what a
    // killed run left.
    for (const auto& e : fs::directory_iterator(path, ec)) {
      const std::string name = e.path().filename().string();
      if (!is_partial_checkpoint(name)) continue;
      std::error_code rm;
      fs::remove(e.path(), rm);
      if (!rm) logger()->warn("removed {} from {}: a partial checkpoint left by a killed run", name, path);
    }
  } catch (...) {
    ::close(lock_fd_);
    lock_fd_ = -1;
    throw;
  }
}

RunDirectory::~RunDirectory() {
  if (lock_fd_ >= 0) ::close(lock_fd_);  // releases the flock
}

}  // namespace tinylm::train
