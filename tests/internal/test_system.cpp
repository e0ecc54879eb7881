// src/internal/{crc32,text,files,machine}.cpp: CRC-32, UTF-8, printable(), safe file reads and writes, CPUs, memory.
#include "../test_util.h"

#include "internal/crc32.h"
#include "internal/files.h"
#include "internal/machine.h"
#include "internal/text.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

using namespace tinylm;
using tinylm::test::error_message;

TEST_CASE("CRC-32 matches the standard check value", "[checkpoint]") {
  CHECK(internal::crc32("123456789", 9) == 0xCBF43926u);
  CHECK(internal::crc32("", 0) == 0u);
}

TEST_CASE("UTF-8 checks find the first bad byte") {
  CHECK(internal::utf8_valid_prefix("abc") == 3);
  CHECK(internal::utf8_valid_prefix("ab\xC3") == 2);          // cut
  CHECK(internal::utf8_valid_prefix("a\xC0\x80") == 1);       // overlong
  CHECK(internal::utf8_valid_prefix("a\xED\xA0\x80") == 1);   // surrogate
  CHECK(internal::utf8_valid_prefix("€\xFF") == 3);
  CHECK(internal::to_valid_utf8("a\xFF" "b") == "a\xEF\xBF\xBD" "b");
}

TEST_CASE("CRC-32 changes with every single flipped bit", "[system]") {
  // A CRC detects every one-bit error: flipping any bit of a message changes its CRC.
  CHECK(internal::crc32("The quick brown fox jumps over the lazy dog", 43) == 0x414FA339u);
  std::string message(64, '\0');
  for (size_t i = 0; i < message.size(); ++i) message[i] = static_cast<char>(i * 37 + 11);
  const uint32_t good = internal::crc32(message.data(), message.size());
  int unchanged = 0;
  for (size_t byte = 0; byte < message.size(); ++byte) {
    for (int bit = 0; bit < 8; ++bit) {
      std::string flipped = message;
      flipped[byte] = static_cast<char>(flipped[byte] ^ (1 << bit));
      unchanged += internal::crc32(flipped.data(), flipped.size()) == good;
    }
  }
  CHECK(unchanged == 0);
}

TEST_CASE("printable() escapes control characters, DEL and bytes that are not UTF-8, and keeps the rest",
          "[system]") {
  CHECK(internal::printable("plain text, 123 (ok)") == "plain text, 123 (ok)");
  CHECK(internal::printable("café ☃ — naïve") == "café ☃ — naïve");  // valid UTF-8 is kept
  CHECK(internal::printable("a\nb\tc\x1b[31m") == "a\\x0Ab\\x09c\\x1B[31m");
  CHECK(internal::printable(std::string("a\0b\x7F", 4)) == "a\\x00b\\x7F");
  CHECK(internal::printable("caf\xE9") == "caf\\xE9");          // Latin-1, not UTF-8
  CHECK(internal::printable("\xE2\x98" "x") == "\\xE2\\x98x");  // a character cut short
  CHECK(internal::printable("\xC0\x80") == "\\xC0\\x80");       // an overlong NUL
  // Whatever goes in, what comes out is one line of printable text.
  std::string all;
  for (int c = 0; c < 256; ++c) all += static_cast<char>(c);
  const std::string shown = internal::printable(all);
  for (const char c : shown) {
    INFO("byte " << static_cast<int>(static_cast<unsigned char>(c)));
    CHECK((static_cast<unsigned char>(c) >= 0x20 && c != 0x7F));
  }
  CHECK(internal::utf8_valid_prefix(shown) == shown.size());
}

TEST_CASE("for_terminal() keeps lines and tabs, escapes every other control, C1 included", "[system]") {
  CHECK(internal::for_terminal("two\nlines\tand a tab, café") == "two\nlines\tand a tab, café");
  CHECK(internal::for_terminal("red \x1b[31mtext\x1b]0;title\x07\r") == "red \\x1B[31mtext\\x1B]0;title\\x07\\x0D");
  CHECK(internal::for_terminal("\xC2\x9B" "2J") == "\\xC2\\x9B2J");  // U+009B, CSI in C1 form
  CHECK(internal::for_terminal("\xC2\xA0") == "\xC2\xA0");           // U+00A0 is text
  CHECK(internal::printable("\xC2\x9B") == "\\xC2\\x9B");
  std::string all;
  for (int c = 0; c < 256; ++c) all += static_cast<char>(c);
  for (const std::string& s : {all, std::string("\xC2\x80\xC2\x9F")}) {
    const std::string shown = internal::for_terminal(s);
    for (size_t i = 0; i < shown.size(); ++i) {
      const auto c = static_cast<unsigned char>(shown[i]);
      INFO("byte " << static_cast<int>(c) << " at " << i);
      CHECK(((c >= 0x20 && c != 0x7F) || c == '\n' || c == '\t'));
      CHECK(!(c == 0xC2 && i + 1 < shown.size() && static_cast<unsigned char>(shown[i + 1]) < 0xA0));
    }
  }
}

TEST_CASE("human_bytes() writes sizes in binary units", "[system]") {
  CHECK(internal::human_bytes(0) == "0 B");
  CHECK(internal::human_bytes(1023) == "1023 B");
  CHECK(internal::human_bytes(1024) == "1.00 KiB");
  CHECK(internal::human_bytes(1.5 * 1024 * 1024 * 1024) == "1.50 GiB");
  CHECK(internal::human_bytes(12.0 * 1024 * 1024) == "12.0 MiB");
  // Sizes from absurd settings (the memory check's 1e9-layer models) stay readable.
  CHECK(internal::human_bytes(2000.0 * 1152921504606846976.0) == "more than 1024 EiB");  // 2000 EiB
  CHECK(internal::human_bytes(1e300) == "more than 1024 EiB");
}

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

TEST_CASE("thread counts are checked against the CPUs this process may use", "[system][errors]") {
  const int cpus = internal::usable_cpu_count();
  INFO("usable CPUs " << cpus);
  CHECK(cpus >= 1);
  const long configured = ::sysconf(_SC_NPROCESSORS_CONF);
  if (configured > 0) CHECK(cpus <= configured);  // an affinity mask is a subset of the CPUs
  internal::check_thread_count(0);  // LibTorch's default
  internal::check_thread_count(1);
  internal::check_thread_count(cpus);
  CHECK_THAT(error_message([&] { internal::check_thread_count(cpus + 1); }),
             Catch::Contains("threads " + std::to_string(cpus + 1) + " is more than the " +
                             std::to_string(cpus) + " CPU(s) this process may use"));
  CHECK_THAT(error_message([] { internal::check_thread_count(-1); }),
             Catch::Contains("threads must be >= 0"));
}

TEST_CASE("available memory is positive and within the machine's and the cgroup's limits", "[system]") {
  // The kernel's MemTotal bounds MemAvailable; a cgroup v2 memory.max bounds the room left.
  uint64_t total = 0;
  {
    std::ifstream meminfo("/proc/meminfo");
    std::string key, unit;
    uint64_t kib = 0;
    while (meminfo >> key >> kib) {
      std::getline(meminfo, unit);
      if (key == "MemTotal:") total = kib * 1024;
    }
  }
  if (total == 0) return;  // no /proc here: nothing to compare against
  const uint64_t available = internal::available_memory_bytes();
  INFO("available " << available << " of " << total);
  CHECK(available > 0);
  CHECK(available <= total);
  std::ifstream cgroup("/proc/self/cgroup");
  std::string line;
  while (std::getline(cgroup, line)) {
    if (line.rfind("0::", 0) != 0) continue;
    std::ifstream max_file("/sys/fs/cgroup" + line.substr(3) + "/memory.max");
    std::string limit;
    if (max_file >> limit && limit != "max") {
      INFO("cgroup memory.max " << limit);
      CHECK(available <= std::stoull(limit));
    }
  }
}
