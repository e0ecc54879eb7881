// src/data/task_kind.cpp: the registry of task kinds, the settings every task takes
// (declared once), and each kind's own rules.
#include "../test_util.h"

#include <tinylm/data/task_kind.h>

#include <ATen/CPUGeneratorImpl.h>

#include <filesystem>
#include <fstream>

using namespace tinylm;
using namespace tinylm::data;
using tinylm::test::error_message;

namespace {

// A program's own task: every row counts down from a random start.
class CountDownTask : public Task {
 public:
  CountDownTask(int64_t seq_len, int64_t vocab) : T_(seq_len), V_(vocab) {}
  std::string name() const override { return "count-down"; }
  int64_t vocab_size() const override { return V_; }
  int64_t seq_len() const override { return T_; }
  Batch sample(int64_t batch_size, Split, at::Generator& gen) override {
    auto start = torch::randint(V_, {batch_size, 1}, gen, torch::kLong);
    auto rows = (start - torch::arange(T_ + 1, torch::kLong)).remainder(V_);
    return {rows.narrow(1, 0, T_), rows.narrow(1, 1, T_), torch::ones({batch_size, T_}, torch::kBool)};
  }

 private:
  int64_t T_, V_;
};

}  // namespace

TEST_CASE("tinylm's task kinds are registered and made from one set of options", "[data][task_kind]") {
  const auto names = task_kind_names();
  REQUIRE(names.size() >= 6);
  CHECK(std::vector<std::string>(names.begin(), names.begin() + 6) ==
        std::vector<std::string>{"repeat", "copy", "reverse", "sort", "text", "tokens"});
  for (const char* kind : {"repeat", "copy", "reverse", "sort"}) {
    INFO(kind);
    auto task = make_task(kind, TaskOptions().seq_len(9).vocab_size(20));
    CHECK(task->name() == kind);
    CHECK(task->seq_len() == 9);
    CHECK(task->vocab_size() == 20);
  }
  const auto dir = tinylm::test::scratch_dir("task_kind");
  const auto file = (dir / "t.txt").string();
  std::ofstream(file) << std::string(400, 'a');
  auto text = make_task("text", TaskOptions().seq_len(8).vocab_size(256).data(file).val_fraction(0.25));
  CHECK(text->name() == "text");
  CHECK(dynamic_cast<TextTask&>(*text).validation_bytes() == 100);
  CHECK(find_task_kind("text").reads == std::vector<std::string>{"seq_len", "data", "val_fraction"});
}

TEST_CASE("each rule is stated once: the options' spec, then the kind's", "[data][task_kind][errors]") {
  CHECK_THAT(error_message([] { make_task("repeat", TaskOptions().seq_len(0)); }),
             Catch::Contains("TaskOptions: seq_len must be >= 1, got 0"));
  CHECK_THAT(error_message([] { check_task("repeat", TaskOptions().seq_len(0), Spelling::config); }),
             Catch::Contains("seq-len must be >= 1, got 0"));
  CHECK_THAT(error_message([] { make_task("sort", TaskOptions().seq_len(2)); }),
             Catch::Contains("task sort needs seq_len >= 3, got 2"));
  CHECK_THAT(error_message([] { check_task("copy", TaskOptions().seq_len(2), Spelling::config); }),
             Catch::Contains("task copy needs seq-len >= 3, got 2"));
  CHECK_THAT(error_message([] { make_task("text", TaskOptions().vocab_size(256)); }),
             Catch::Contains("task text needs a training file"));
  CHECK_THAT(error_message([] { make_task("text", TaskOptions().data("f.txt")); }),
             Catch::Contains("task text is byte-level: vocab_size must be 256, got 64"));
  CHECK_THAT(error_message([] { make_task("text", TaskOptions().data("f.txt").vocab_size(256).val_fraction(1)); }),
             Catch::Contains("val_fraction must be in (0, 1), got 1"));
  CHECK_THAT(error_message([] { check_task("repeat", TaskOptions().vocab_size(1), Spelling::config); }),
             Catch::Contains("vocab-size 1 leaves the repeat task nothing to learn: it needs at least 2 symbols"));
  CHECK_THAT(error_message([] { make_task("tokens", TaskOptions()); }),
             Catch::Contains("task tokens needs a prepared corpus"));
  CHECK_THAT(error_message([] { make_task("addition", TaskOptions()); }),
             Catch::Contains("unknown task 'addition': the kinds known are repeat, copy, reverse, sort, text, tokens"));
}

TEST_CASE("a program's own task kind is made by the same path", "[data][task_kind]") {
  static const bool registered = [] {
    register_task_kind({"count-down", "rows counting down", {"seq_len", "vocab_size"},
                        [](const TaskOptions& o, Spelling s) {
                          TORCH_CHECK(o.vocab_size() >= 3, "task count-down needs ", spell("vocab_size", s), " >= 3");
                        },
                        [](const TaskOptions& o) -> std::unique_ptr<Task> {
                          return std::make_unique<CountDownTask>(o.seq_len(), o.vocab_size());
                        }});
    return true;
  }();
  CHECK(registered);
  auto task = make_task("count-down", TaskOptions().seq_len(5).vocab_size(7));
  auto gen = at::make_generator<at::CPUGeneratorImpl>(3);
  const auto batch = task->sample(4, Split::train, gen);
  CHECK(batch.inputs.sizes() == torch::IntArrayRef({4, 5}));
  CHECK(torch::equal((batch.inputs - batch.targets).remainder(7), torch::ones({4, 5}, torch::kLong)));
  CHECK_THAT(error_message([] { make_task("count-down", TaskOptions().vocab_size(2)); }),
             Catch::Contains("task count-down needs vocab_size >= 3"));
  CHECK_THAT(error_message([] {
               register_task_kind({"text", "", {}, [](const TaskOptions&, Spelling) {},
                                   [](const TaskOptions&) -> std::unique_ptr<Task> { return nullptr; }});
             }),
             Catch::Contains("a task kind named 'text' is already registered"));
}
