// src/internal/text.cpp: UTF-8 checks, printable(), for_terminal(), human_bytes().
#include "../test_util.h"

#include "internal/text.h"

#include <string>

using namespace tinylm;

TEST_CASE("UTF-8 checks find the first bad byte") {
  CHECK(internal::utf8_valid_prefix("abc") == 3);
  CHECK(internal::utf8_valid_prefix("ab\xC3") == 2);          // cut
  CHECK(internal::utf8_valid_prefix("a\xC0\x80") == 1);       // overlong
  CHECK(internal::utf8_valid_prefix("a\xED\xA0\x80") == 1);   // surrogate
  CHECK(internal::utf8_valid_prefix("€\xFF") == 3);
  CHECK(internal::to_valid_utf8("a\xFF" "b") == "a\xEF\xBF\xBD" "b");
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
