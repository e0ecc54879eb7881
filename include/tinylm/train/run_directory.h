// A run directory: where one training run writes its checkpoints and metrics.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tinylm::train {

/// What a run directory may already hold when it is claimed.
enum class RunDirMode {
  fresh,      // no run: a new or empty directory, or one holding only unrelated files
  resume,     // the run being resumed, with no checkpoint past the step it resumes from
  overwrite,  // anything: the run it holds (checkpoints, metrics) is deleted first
};

/// An exclusive claim on a run directory, held by one trainer until destruction.
/// Claiming creates the directory if needed, locks it (flock on ".tinylm.lock", which
/// names the holder's pid: a second claim fails at once, naming it), checks what it
/// holds against the mode, and removes partial checkpoints ("*.ckpt.tmp.<pid>") that a
/// killed run left behind. Every problem is refused with one line, before anything of
/// the user's is touched.
class RunDirectory {
 public:
  RunDirectory(const std::string& path, RunDirMode mode, int64_t resume_step = 0);
  ~RunDirectory();
  RunDirectory(const RunDirectory&) = delete;
  RunDirectory& operator=(const RunDirectory&) = delete;

  const std::string& path() const { return path_; }

  /// The files of a tinylm run in `dir`: step-*.ckpt, best.ckpt, metrics.jsonl (sorted;
  /// empty when there are none or `dir` does not exist).
  static std::vector<std::string> run_files(const std::string& dir);

  /// The one naming rule of step checkpoints: "step-NNNNNNNN.ckpt" (at least 8 digits).
  static std::string step_checkpoint_name(int64_t step);

  /// The step a "step-NNNNNNNN.ckpt" name stands for, or -1.
  static int64_t step_of_checkpoint_name(const std::string& file_name);

  /// The step checkpoints in `dir` (paths), by step, oldest first.
  static std::vector<std::string> step_checkpoints(const std::string& dir);

 private:
  std::string path_;
  int lock_fd_ = -1;
};

}  // namespace tinylm::train
