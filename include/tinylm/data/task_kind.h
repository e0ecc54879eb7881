// Task kinds: what make_task() knows how to make from a run's settings. tinylm registers
// repeat, copy, reverse, sort, text and tokens; a program registers its own the same way.
#pragma once

#include <tinylm/data/tasks.h>
#include <tinylm/spec.h>

#include <torch/arg.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace tinylm::data {

/// The settings a run gives its task, declared once (spec()); each kind reads those it
/// needs.
struct TaskOptions {
  TORCH_ARG(int64_t, seq_len) = 12;
  /// Synthetic tasks draw ids below it; a task with data has the data's own (checked).
  TORCH_ARG(int64_t, vocab_size) = 64;
  /// text: the training file; tokens: the directory tinylm prepare made.
  TORCH_ARG(std::string, data) = "";
  /// text: the fraction of the file held out for validation (its tail).
  TORCH_ARG(double, val_fraction) = 0.1;
  /// tokens: copy the token files into memory instead of mapping them.
  TORCH_ARG(bool, in_memory) = false;

 public:
  static const OptionSpec<TaskOptions>& spec();
};

struct TaskKind {
  std::string name;
  std::string help;
  std::vector<std::string> reads;  // the TaskOptions it uses (seq_len, data ...)
  /// Its own rules, beyond the spec's (a kind that needs data, a longer sequence).
  std::function<void(const TaskOptions&, Spelling)> check;
  std::function<std::unique_ptr<Task>(const TaskOptions&)> make;
};

/// Adds a kind (another of the same name is an error).
void register_task_kind(TaskKind kind);

/// The kind of that name; an error listing the known kinds when there is none.
const TaskKind& find_task_kind(const std::string& name);

/// Every registered kind's name, tinylm's first.
std::vector<std::string> task_kind_names();

/// Throws at the first rule the options break for that kind: the spec's, then the kind's.
void check_task(const std::string& kind, const TaskOptions& options, Spelling spelling = Spelling::stored);

/// The task of that kind, its options checked first.
std::unique_ptr<Task> make_task(const std::string& kind, const TaskOptions& options);

}  // namespace tinylm::data
