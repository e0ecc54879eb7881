// The task kinds make_task() knows: tinylm's own six and any a program registers.
#include <tinylm/data/task_kind.h>
#include <tinylm/data/token_file.h>
#include <tinylm/log.h>

#include "internal/kind_registry.h"

#include <c10/util/Exception.h>

#include <memory>
#include <utility>
#include <mutex>

namespace tinylm::data {

const OptionSpec<TaskOptions>& TaskOptions::spec() {
  using O = TaskOptions;
  static const auto spec = [] {
    OptionSpec<O> s("TaskOptions");
    s.group("task");
    s.add(TINYLM_OPTION(O, seq_len), "tokens per training sequence", at_least(1));
    s.add(TINYLM_OPTION(O, vocab_size), "vocabulary size of a synthetic task", at_least(1));
    s.add(TINYLM_OPTION(O, data), "text task: the training text file; tokens task: the directory tinylm prepare made");
    s.add(TINYLM_OPTION(O, val_fraction), "text task: fraction of the file held out for validation",
          Rule<double>{[](const double& v) { return v > 0 && v < 1; }, "must be in (0, 1)"});
    s.add(TINYLM_OPTION(O, in_memory), "tokens task: copy the corpus into memory instead of mapping it");
    return s;
  }();
  return spec;
}

namespace {

// Rules several kinds state.
void needs_data(const std::string& kind, const TaskOptions& o, const char* what) {
  TORCH_CHECK(!o.data().empty(), "task ", kind, " needs ", what);
}

std::vector<TaskKind> builtin_task_kinds() {
  std::vector<TaskKind> out;
  out.push_back({"repeat", "one random id repeated (the reference task)", {"seq_len", "vocab_size"},
                 [](const TaskOptions& o, Spelling s) {
                   // One symbol is always right: loss 0, "solved", nothing learned.
                   TORCH_CHECK(o.vocab_size() >= 2, spell("vocab_size", s), " ", o.vocab_size(),
                               " leaves the repeat task nothing to learn: it needs at least 2 symbols");
                 },
                 [](const TaskOptions& o) -> std::unique_ptr<Task> {
                   return std::make_unique<RepeatTask>(o.seq_len(), o.vocab_size());
                 }});
  for (const auto& [name, what] : {std::pair<const char*, const char*>{"copy", "copied"}, {"reverse", "reversed"},
                                   {"sort", "sorted"}}) {
    const std::string kind = name;
    out.push_back({kind, std::string("a random prefix, then the prefix ") + what,
                   {"seq_len", "vocab_size"},
                   [kind](const TaskOptions& o, Spelling s) {
                     TORCH_CHECK(o.seq_len() >= 3, "task ", kind, " needs ", spell("seq_len", s), " >= 3, got ",
                                 o.seq_len());
                     TORCH_CHECK(o.vocab_size() >= 2, "task ", kind, " needs ", spell("vocab_size", s), " >= 2, got ",
                                 o.vocab_size());
                   },
                   [kind](const TaskOptions& o) -> std::unique_ptr<Task> {
                     return std::make_unique<SequenceTransformTask>(kind, o.seq_len(), o.vocab_size());
                   }});
  }
  out.push_back({"text", "a file's bytes, in memory", {"seq_len", "data", "val_fraction"},
                 [](const TaskOptions& o, Spelling s) {
                   needs_data("text", o, "a training file: set data = \"path/to/file.txt\"");
                   TORCH_CHECK(o.vocab_size() == 256, "task text is byte-level: ", spell("vocab_size", s),
                               " must be 256, got ", o.vocab_size());
                 },
                 [](const TaskOptions& o) -> std::unique_ptr<Task> {
                   return std::make_unique<TextTask>(o.data(), o.seq_len(), o.val_fraction());
                 }});
  out.push_back({"tokens", "a prepared corpus, memory-mapped", {"seq_len", "data", "in_memory"},
                 [](const TaskOptions& o, Spelling) {
                   needs_data("tokens", o, "a prepared corpus: set data = \"DIR\", a directory made by tinylm prepare");
                 },
                 [](const TaskOptions& o) -> std::unique_ptr<Task> {
                   return std::make_unique<TokenFileTask>(o.data(), o.seq_len(), TokenFileTaskOptions{o.in_memory()});
                 }});
  return out;
}

internal::KindRegistry<TaskKind>& registry() {
  // Outlives static destruction: kinds may be looked up until the process exits.
  static auto* r = new internal::KindRegistry<TaskKind>("task", builtin_task_kinds());
  return *r;
}

}  // namespace

void register_task_kind(TaskKind kind) {
  TORCH_CHECK(!kind.name.empty() && kind.check && kind.make, "register_task_kind: a kind needs a name, check and make");
  registry().add(std::move(kind));
}

const TaskKind& find_task_kind(const std::string& name) {
  const TaskKind* kind = registry().find(name);
  TORCH_CHECK(kind, "unknown task '", printable(name), "': the kinds known are ", registry().list(),
              "; register yours with register_task_kind (tinylm/data/task_kind.h)");
  return *kind;
}

std::vector<std::string> task_kind_names() { return registry().names(); }

void check_task(const std::string& kind, const TaskOptions& options, Spelling spelling) {
  const TaskKind& k = find_task_kind(kind);
  TaskOptions::spec().check(options, spelling);
  k.check(options, spelling);
}

std::unique_ptr<Task> make_task(const std::string& kind, const TaskOptions& options) {
  check_task(kind, options);
  return find_task_kind(kind).make(options);
}

}  // namespace tinylm::data
