// src/data/tasks.cpp: the synthetic tasks (repeat, copy, reverse, sort) and the text task.
#include "../test_util.h"

#include <tinylm/data/task_kind.h>
#include <tinylm/data/tasks.h>

#include <ATen/CPUGeneratorImpl.h>

#include <filesystem>
#include <fstream>

using namespace tinylm;
using namespace tinylm::data;
using tinylm::test::error_message;

TEST_CASE("repeat task: each row is one id repeated, targets are inputs shifted",
          "[data][repeat]") {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(3);
  auto b = data::repeat_batch(16, 10, 32, gen);
  CHECK(b.inputs.sizes() == torch::IntArrayRef({16, 10}));
  CHECK(torch::equal(b.inputs, b.targets));  // one id per row: shifting changes nothing
  CHECK(torch::equal(b.inputs, b.inputs.select(1, 0).unsqueeze(1).expand({16, 10})));
  CHECK(b.inputs.max().item<int64_t>() < 32);
  CHECK(torch::bincount(b.inputs.select(1, 0)).gt(0).sum().item<int64_t>() > 4);  // rows differ
  auto again = at::make_generator<at::CPUGeneratorImpl>(3);
  CHECK(torch::equal(data::repeat_batch(16, 10, 32, again).inputs, b.inputs));
}

TEST_CASE("copy, reverse and sort rows: prefix, transformed prefix, scored second half",
          "[data][tasks]") {
  const std::string kind = GENERATE("copy", "reverse", "sort");
  auto gen = at::make_generator<at::CPUGeneratorImpl>(0);
  const int64_t T = 12, h = 7;  // rows of T + 1 = 13 ids: 7 random, 6 derived
  auto b = sequence_transform_batch(kind, 32, T, 50, gen);
  REQUIRE(b.inputs.sizes() == torch::IntArrayRef({32, T}));
  auto rows = torch::cat({b.inputs, b.targets.narrow(1, T - 1, 1)}, 1);  // (B, T + 1)
  CHECK(torch::equal(b.inputs.narrow(1, 1, T - 1), b.targets.narrow(1, 0, T - 1)));
  auto x = rows.narrow(1, 0, h);
  torch::Tensor y = kind == "copy" ? x : kind == "reverse" ? x.flip(1) : std::get<0>(x.sort(1));
  CHECK(torch::equal(rows.narrow(1, h, T + 1 - h), y.narrow(1, 0, T + 1 - h)));
  // scored: targets at positions >= h - 1 (they predict ids h..T)
  auto expected = (torch::arange(T) >= h - 1).unsqueeze(0).expand({32, T});
  CHECK(torch::equal(b.scored, expected));
}

TEST_CASE("synthetic prompts are ids, bad ones are refused", "[data][tasks][errors]") {
  auto task = make_task("repeat", TaskOptions());  // ids below 64
  auto ids = task->encode("3, 4 5");
  CHECK(torch::equal(ids, torch::tensor({3, 4, 5}, torch::kLong).unsqueeze(0)));
  CHECK(task->decode(ids) == "3 4 5");
  CHECK_THAT(error_message([&] { task->encode("3 four"); }),
             Catch::Contains("'four' is not a token id"));
  CHECK_THAT(error_message([&] { task->encode("64"); }),
             Catch::Contains("token id 64 is out of range [0, 64)"));
  CHECK_THAT(error_message([&] { task->encode("  "); }), Catch::Contains("prompt is empty"));
}

TEST_CASE("text task: byte-level, split train/validation, windows of T + 1 bytes",
          "[data][tasks][text]") {
  const auto path = tinylm::test::scratch_dir("text_task") / "text.txt";
  std::string text;
  for (int i = 0; i < 100; ++i) text += static_cast<char>('a' + i % 26);
  std::ofstream(path) << text;
  TextTask task(path.string(), 8, 0.2);
  CHECK(task.train_bytes() == 80);
  CHECK(task.validation_bytes() == 20);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(0);
  auto b = task.sample(16, Split::validation, gen);
  CHECK(b.inputs.sizes() == torch::IntArrayRef({16, 8}));
  // Consecutive bytes of the alphabet: each target is the next letter.
  CHECK(torch::equal((b.inputs - 'a' + 1) % 26, b.targets - 'a'));
  // Validation windows come from the last 20 bytes: positions 80..99 = letters 2..21 ('c'..'v').
  CHECK(b.inputs.min().item<int64_t>() >= 'c');
  // The windows start where the generator's draws say, as the text's own bytes.
  auto again = at::make_generator<at::CPUGeneratorImpl>(0);
  const auto starts = torch::randint(20 - 8, {16, 1}, again, torch::kLong);
  for (int64_t r = 0; r < 16; ++r)
    for (int64_t t = 0; t < 8; ++t) {
      const int64_t at = 80 + starts[r][0].item<int64_t>() + t;
      CHECK(b.inputs[r][t].item<int64_t>() == text[at]);
      CHECK(b.targets[r][t].item<int64_t>() == text[at + 1]);
    }
  CHECK(b.scored.dtype() == torch::kBool);
  CHECK(b.scored.all().item<bool>());
  CHECK(task.decode(task.encode("héllo")) == "héllo");
  CHECK_THAT(error_message([&] { TextTask(path.string(), 30, 0.2); }),
             Catch::Contains("is too small: 100 bytes give 80 training and 20 validation bytes"));
  CHECK_THAT(error_message([] { TextTask("/no/such/file.txt", 8, 0.1); }),
             Catch::Contains("data file '/no/such/file.txt' does not exist"));
  std::filesystem::remove(path);
}

TEST_CASE("text task: a UTF-8 byte-order mark at the start is not trained on, one later is",
          "[data][tasks][text]") {
  const auto path = tinylm::test::scratch_dir("text_task_bom") / "text.txt";
  std::string text;
  for (int i = 0; i < 100; ++i) text += static_cast<char>('a' + i % 26);
  std::ofstream(path, std::ios::binary) << "\xEF\xBB\xBF" << text;
  TextTask task(path.string(), 8, 0.2);
  CHECK(task.train_bytes() + task.validation_bytes() == 100);  // the mark's 3 bytes are gone
  auto gen = at::make_generator<at::CPUGeneratorImpl>(0);
  auto b = task.sample(64, Split::train, gen);
  CHECK(b.inputs.min().item<int64_t>() >= 'a');  // no 0xEF, 0xBB or 0xBF byte
  CHECK(b.inputs.max().item<int64_t>() <= 'z');
  std::ofstream(path, std::ios::binary) << text << "\xEF\xBB\xBF";  // not at the start: text
  const TextTask later(path.string(), 8, 0.2);
  CHECK(later.train_bytes() + later.validation_bytes() == 103);
  std::filesystem::remove(path);
}

TEST_CASE("repeat task: one symbol is refused, it leaves nothing to learn", "[data][tasks][errors]") {
  CHECK_THAT(error_message([] { RepeatTask(12, 1); }), Catch::Contains("must be >= 2 (one symbol leaves nothing"));
  auto gen = at::make_generator<at::CPUGeneratorImpl>(0);
  CHECK_THAT(error_message([&] { repeat_batch(4, 12, 1, gen); }), Catch::Contains("must be >= 2"));
  CHECK(RepeatTask(12, 2).vocab_size() == 2);
}
