// src/internal/files.cpp: atomic writes, bounded reads of regular files.
#include "../test_util.h"

#include "internal/files.h"

#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

using namespace tinylm;
using tinylm::test::error_message;

TEST_CASE("atomic writes replace a file whole and leave no temporary file", "[system]") {
  const auto dir = tinylm::test::scratch_dir("system_atomic");
  const auto path = dir / "f.bin";
  auto files_in_dir = [&] {
    std::vector<std::string> names;
    for (const auto& e : std::filesystem::directory_iterator(dir)) names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  };
  tinylm::test::write_file(path, "the old contents, longer than the new");
  internal::write_file_atomically(path.string(), "new", "test file");
  CHECK(tinylm::test::read_file(path) == "new");
  CHECK(files_in_dir() == std::vector<std::string>{"f.bin"});

  SECTION("pieces and a header written last, put in place by commit()") {
    internal::AtomicFile file(path.string(), "test file");
    file.write("hello ", 6);
    file.write("world", 5);
    file.write_at(0, "J", 1);
    CHECK(file.size() == 11);
    CHECK(tinylm::test::read_file(path) == "new");  // untouched until commit()
    CHECK(files_in_dir().size() == 2);               // f.bin and the temporary file
    file.commit();
    CHECK(tinylm::test::read_file(path) == "Jello world");
    CHECK(files_in_dir() == std::vector<std::string>{"f.bin"});
    CHECK_THAT(error_message([&] { file.commit(); }), Catch::Contains("is already committed"));
    CHECK_THAT(error_message([&] { file.write("x", 1); }), Catch::Contains("is already committed"));
  }
  SECTION("dropped before commit(): the old file stays, the temporary file goes") {
    {
      internal::AtomicFile file(path.string(), "test file");
      file.write("half", 4);
    }
    CHECK(tinylm::test::read_file(path) == "new");
    CHECK(files_in_dir() == std::vector<std::string>{"f.bin"});
  }
  SECTION("a directory that does not exist is named") {
    CHECK_THAT(error_message([&] { internal::write_file_atomically((dir / "no" / "f.bin").string(), "x", "test file"); }),
               Catch::Contains("cannot write test file '") && Catch::Contains("No such file or directory"));
    CHECK(files_in_dir() == std::vector<std::string>{"f.bin"});
  }
}

TEST_CASE("files are read only when they are regular files, within their size limit", "[system][errors]") {
  const auto dir = tinylm::test::scratch_dir("system_read");
  const auto path = dir / "data.txt";
  tinylm::test::write_file(path, "hello world");
  CHECK(internal::read_regular_file(path.string(), "data file") == "hello world");
  CHECK(internal::check_regular_file(path.string(), "data file") == 11);
  CHECK(internal::read_regular_file(path.string(), "data file", 11) == "hello world");
  CHECK_THAT(error_message([&] { internal::read_regular_file(path.string(), "data file", 10); }),
             Catch::Contains("data file '" + path.string() + "' is 11 B, more than the 10 B it may take here"));
  CHECK_THAT(error_message([&] { internal::read_regular_file((dir / "none.txt").string(), "data file"); }),
             Catch::Contains("data file '" + (dir / "none.txt").string() + "' does not exist"));
  CHECK_THAT(error_message([&] { internal::check_regular_file(dir.string(), "data file"); }),
             Catch::Contains("is a directory, not a regular file"));
  CHECK_THAT(error_message([&] { internal::read_regular_file("", "data file"); }),
             Catch::Contains("data file: the path is empty"));
  // A FIFO with no writer would block a plain open(); it is refused at once.
  const auto fifo = dir / "pipe";
  REQUIRE(::mkfifo(fifo.c_str(), 0644) == 0);
  CHECK_THAT(error_message([&] { internal::read_regular_file(fifo.string(), "data file"); }),
             Catch::Contains("is a FIFO (named pipe), not a regular file"));
  // A path is shown escaped: the message stays one line.
  const std::string msg = error_message([&] { internal::read_regular_file((dir / "a\nb").string(), "data file"); });
  CHECK_THAT(msg, Catch::Contains("a\\x0Ab' does not exist"));
  CHECK(msg.find('\n') == std::string::npos);
}
