// src/data/prepare.cpp: text files to train and val token files, losslessly; bad input refused.
#include "../test_util.h"

#include <tinylm/data/prepare.h>
#include <tinylm/data/token_file.h>
#include <tinylm/data/tokenizer.h>

#include "internal/text.h"

#include <ATen/CPUGeneratorImpl.h>

#include <filesystem>
#include <string>
#include <vector>

using namespace tinylm;
using tinylm::test::all_tokens;
using tinylm::test::corpus;
using tinylm::test::error_message;
using tinylm::test::lines_of;
using tinylm::test::read_file;
using tinylm::test::scratch_dir;
using tinylm::test::write_file;
namespace fs = std::filesystem;

TEST_CASE("prepare with the byte tokenizer splits text into train and val losslessly") {
  const auto dir = scratch_dir("prepare_bytes");
  fs::create_directories(dir / "in");
  const std::string a = corpus(400), b = corpus(150).substr(7);
  write_file(dir / "in" / "a.txt", a);
  write_file(dir / "in" / "b.txt", b);
  write_file(dir / "in" / "index.dat", std::string("\0\1\2binary", 9));
  data::PrepareOptions o;
  o.inputs = {(dir / "in").string()};
  o.tokenizer = "byte";
  o.out_dir = (dir / "out").string();
  int calls = 0;
  o.progress = [&](const data::PrepareProgress& p) {
    ++calls;
    CHECK(p.bytes_done <= p.bytes_total);
  };
  const auto s = data::prepare(o);
  CHECK(calls >= 1);
  CHECK(s.files.size() == 2);
  REQUIRE(s.skipped.size() == 1);
  CHECK_THAT(s.skipped[0], Catch::Contains("index.dat"));
  CHECK(s.train_bytes + s.val_bytes == a.size() + b.size());
  CHECK(s.train_tokens == s.train_bytes);  // bytes
  const double held_out = static_cast<double>(s.val_bytes) / (s.train_bytes + s.val_bytes);
  CHECK(held_out > 0.05);
  CHECK(held_out < 0.2);
  data::TokenFile train((dir / "out" / "train.bin").string()), val((dir / "out" / "val.bin").string());
  const auto tok = data::byte_tokenizer();
  const std::string train_text = tok->decode(all_tokens(train)), val_text = tok->decode(all_tokens(val));
  CHECK(train_text.size() + val_text.size() == a.size() + b.size());
  CHECK(lines_of(val_text, a + b));
  CHECK(fs::exists(dir / "out" / "prepare.json"));
  CHECK_FALSE(fs::exists(dir / "out" / "tokenizer.model"));

  // the task reads it: windows are contiguous runs of the files, the same for a seed,
  // from the map or from memory
  data::TokenFileTask task((dir / "out").string(), 16);
  data::TokenFileTask in_memory((dir / "out").string(), 16, data::TokenFileTaskOptions{true});
  CHECK(task.vocab_size() == 256);
  CHECK(task.tokenizer()->kind() == "byte");
  CHECK(task.bytes_per_token(data::Split::validation) == Approx(1.0));
  auto g1 = at::make_generator<at::CPUGeneratorImpl>(7), g2 = at::make_generator<at::CPUGeneratorImpl>(7);
  auto b1 = task.sample(8, data::Split::validation, g1), b2 = in_memory.sample(8, data::Split::validation, g2);
  CHECK(torch::equal(b1.inputs, b2.inputs));
  CHECK(torch::equal(b1.inputs.narrow(1, 1, 15), b1.targets.narrow(1, 0, 15)));
  const std::string row = task.decode(b1.inputs[3].unsqueeze(0));
  CHECK(val_text.find(row) != std::string::npos);
  CHECK_THAT(error_message([&] { data::TokenFileTask((dir / "out").string(), 1000000); }),
             Catch::Contains("but a window needs seq-len + 1 = 1000001"));
  CHECK_THAT(error_message([&] { data::TokenFileTask((dir / "in" / "a.txt").string(), 8); }),
             Catch::Contains("is a file, but task tokens reads a directory made by tinylm prepare"));
  CHECK_THAT(error_message([&] { data::TokenFileTask((dir / "missing").string(), 8); }),
             Catch::Contains("does not exist: make it with tinylm prepare"));
}

TEST_CASE("prepare refuses bad input and leaves nothing behind") {
  const auto dir = scratch_dir("prepare_errors");
  write_file(dir / "good.txt", corpus(300));
  write_file(dir / "latin1.txt", "caf\xE9\nok\n");
  write_file(dir / "empty.txt", "");
  write_file(dir / "nul.txt", std::string("a\0b\n", 4));
  write_file(dir / "tiny.txt", "one line\n");
  auto run = [&](std::vector<std::string> inputs, const std::string& out, const std::string& tokenizer = "byte") {
    data::PrepareOptions o;
    for (auto& i : inputs) o.inputs.push_back((dir / i).string());
    o.tokenizer = tokenizer;
    o.out_dir = (dir / out).string();
    return error_message([&] { data::prepare(o); });
  };
  CHECK_THAT(run({"good.txt", "latin1.txt"}, "o1"), Catch::Contains("latin1.txt' is not UTF-8 text: line 1, byte offset 3"));
  CHECK_FALSE(fs::exists(dir / "o1"));
  CHECK_THAT(run({"empty.txt"}, "o2"), Catch::Contains("the input is empty"));
  CHECK_FALSE(fs::exists(dir / "o2"));
  CHECK_THAT(run({"nul.txt"}, "o3"), Catch::Contains("is binary (it holds NUL bytes)"));
  CHECK_THAT(run({"tiny.txt"}, "o4"), Catch::Contains("are too few to hold out val-fraction 0.1"));
  CHECK_FALSE(fs::exists(dir / "o4"));
  CHECK_THAT(run({"missing.txt"}, "o5"), Catch::Contains("does not exist"));
  CHECK_THAT(run({"good.txt"}, "o6", "wordpiece"), Catch::Contains("tokenizer 'wordpiece' is unknown"));
  fs::create_directories(dir / "full");
  write_file(dir / "full" / "keep.txt", "mine");
  CHECK_THAT(run({"good.txt"}, "full"), Catch::Contains("already holds files: choose a new directory"));
  CHECK(read_file(dir / "full" / "keep.txt") == "mine");
  CHECK_THAT(run({"good.txt"}, "good.txt"), Catch::Contains("exists and is not a directory"));
  data::PrepareOptions o;
  o.inputs = {"-"};
  o.tokenizer = "bpe";
  o.out_dir = (dir / "o7").string();
  CHECK_THAT(error_message([&] { data::prepare(o); }), Catch::Contains("which standard input cannot give"));
}

TEST_CASE("prepare skips a UTF-8 byte-order mark at the start of each file, and only there") {
  const auto dir = scratch_dir("prepare_bom");
  fs::create_directories(dir / "in");
  const std::string bom = "\xEF\xBB\xBF", a = corpus(300), b = corpus(120).substr(5);
  write_file(dir / "in" / "a.txt", bom + a);
  write_file(dir / "in" / "b.txt", bom + b);
  data::PrepareOptions o;
  o.inputs = {(dir / "in").string()};
  o.tokenizer = "byte";
  o.out_dir = (dir / "out").string();
  const auto s = data::prepare(o);
  CHECK(s.train_bytes + s.val_bytes == a.size() + b.size());
  data::TokenFile train((dir / "out" / "train.bin").string()), val((dir / "out" / "val.bin").string());
  const auto tok = data::byte_tokenizer();
  const std::string text = tok->decode(all_tokens(train)) + tok->decode(all_tokens(val));
  CHECK(text.find(bom) == std::string::npos);
  CHECK(text.size() == a.size() + b.size());
  // A mark later in a file is text (U+FEFF), kept; offsets in messages count the skipped one.
  write_file(dir / "late.txt", a + bom + "x\n");
  o.inputs = {(dir / "late.txt").string()};
  o.out_dir = (dir / "late").string();
  const auto late = data::prepare(o);
  CHECK(late.train_bytes + late.val_bytes == a.size() + bom.size() + 2);
  write_file(dir / "latin1.txt", bom + "caf\xE9\n");
  o.inputs = {(dir / "latin1.txt").string()};
  o.out_dir = (dir / "latin1").string();
  CHECK_THAT(error_message([&] { data::prepare(o); }), Catch::Contains("is not UTF-8 text: line 1, byte offset 6"));
}

TEST_CASE("prepare reads a line longer than its 1 MiB pieces without splitting a character") {
  const auto dir = scratch_dir("prepare_long_line");
  std::string line;
  while (line.size() < (3u << 20)) line += "aé☃";  // 1-, 2- and 3-byte characters
  const std::string text = line + "\n" + corpus(2000);
  write_file(dir / "long.txt", text);
  data::PrepareOptions o;
  o.inputs = {(dir / "long.txt").string()};
  o.tokenizer = "byte";
  o.out_dir = (dir / "out").string();
  const auto s = data::prepare(o);
  CHECK(s.train_bytes + s.val_bytes == text.size());
  const auto tok = data::byte_tokenizer();
  data::TokenFile train((dir / "out" / "train.bin").string()), val((dir / "out" / "val.bin").string());
  std::string bytes;
  for (const auto* f : {&train, &val})
    for (const auto id : all_tokens(*f)) bytes += static_cast<char>(id);
  CHECK(bytes.size() == text.size());
  CHECK(internal::utf8_valid_prefix(bytes) == bytes.size());  // no character was cut apart
}
