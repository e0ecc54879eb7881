// TOML text from elsewhere, checked before toml++ sees it.
#include "internal/toml_text.h"
#include "internal/text.h"

#include <c10/util/Exception.h>
#include <toml++/toml.h>

#include <cstdint>
#include <cstring>
#include <sstream>
#include <string>

namespace tinylm::internal {

namespace {

/// The line of the first byte outside ASCII that stands outside a string or a comment
/// (or right after a backslash in a string), or 0. toml++ 3.3 (Debian 12) reaches __builtin_unreachable() (undefined behaviour)
/// when it tests such a character (U+00A1 to U+0499) for whitespace; TOML allows
/// non-ASCII characters only in strings and comments anyway, so they are refused here,
/// before toml++ sees the text (a recipe read from a checkpoint is untrusted input).
int64_t non_ascii_outside_strings(const std::string& text) {
  enum { normal, comment, basic, literal, multi_basic, multi_literal } state = normal;
  int64_t line = 1;
  char last = '\n';  // the last character outside strings, spaces aside
  const std::string three_double(3, '"'), three_single(3, '\'');
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    auto starts = [&](const std::string& s) { return text.compare(i, s.size(), s) == 0; };
    if (c == '\n') {
      ++line;
      if (state == comment || state == basic || state == literal) state = normal;
      if (state == normal) last = '\n';
      continue;
    }
    switch (state) {
      case normal: {
        if (static_cast<unsigned char>(c) >= 0x80) return line;
        if (c == ' ' || c == '\t' || c == '\r') break;
        // A string starts where TOML has a key or a value: at a line's start, after '=',
        // '[', ',', '{' or '.'. Elsewhere (2"...) toml++ fails on it, and must not be
        // handed what follows as if it were quoted.
        const bool may_open = last != '\0' && std::strchr("\n=[,{.", last) != nullptr;
        last = c;
        if (c == '#') {
          state = comment;
        } else if (may_open && starts(three_double)) {
          state = multi_basic;
          i += 2;
        } else if (may_open && starts(three_single)) {
          state = multi_literal;
          i += 2;
        } else if (may_open && c == '"') {
          state = basic;
        } else if (may_open && c == '\'') {
          state = literal;
        }
        break;
      }
      case comment:
        break;
      case basic:
        if (c == '\\') {
          // toml++ tests the character after a backslash for whitespace: never non-ASCII
          // there (no escape starts with one).
          if (i + 1 < text.size() && static_cast<unsigned char>(text[i + 1]) >= 0x80) return line;
          ++i;
        } else if (c == '"') {
          state = normal;
        }
        break;
      case literal:
        if (c == '\'') state = normal;
        break;
      case multi_basic:
        if (c == '\\') {
          // A line-ending backslash: toml++ tests everything up to the next character
          // that is not whitespace, across lines.
          size_t j = i + 1;
          while (j < text.size() && std::strchr(" \t\r\n", text[j]) && text[j] != '\0') ++j;
          if (j < text.size() && static_cast<unsigned char>(text[j]) >= 0x80) return line;
          ++i;
        } else if (starts(three_double)) {
          state = normal;
          i += 2;
        }
        break;
      case multi_literal:
        if (starts(three_single)) {
          state = normal;
          i += 2;
        }
        break;
    }
  }
  return 0;
}

}  // namespace

std::vector<TomlEntry> parse_flat_toml(const std::string& file_text, const std::string& origin) {
  // A UTF-8 byte-order mark at the very start (Notepad and PowerShell's UTF-8 write one)
  // says only that the file is UTF-8: skipped. Anywhere else it is a character outside
  // ASCII like any other, refused below with its line.
  const std::string text = file_text.substr(utf8_bom_length(file_text));
  const int64_t stray = non_ascii_outside_strings(text);
  TORCH_CHECK(stray == 0, origin, ":", stray, ": a character outside ASCII stands outside a string or a comment "
              "(TOML keys are ASCII; put text in quotes)");
  toml::table table;
  try {
    table = toml::parse(text, origin);
  } catch (const toml::parse_error& e) {
    TORCH_CHECK(false, origin, ":", e.source().begin.line, ": not valid TOML: ", e.description());
  }
  std::vector<TomlEntry> out;
  for (const auto& [key, node] : table) {
    TomlEntry e;
    e.key = std::string(key.str());
    e.line = static_cast<int64_t>(node.source().begin.line);
    std::ostringstream type;
    type << node.type();
    e.type = type.str();
    e.table = node.is_table() || node.is_array_of_tables();
    if (node.is_boolean()) e.value = *node.value<bool>();
    else if (node.is_integer()) e.value = *node.value<int64_t>();
    else if (node.is_floating_point()) e.value = *node.value<double>();
    else if (node.is_string()) e.value = *node.value<std::string>();
    out.push_back(std::move(e));
  }
  return out;
}

}  // namespace tinylm::internal
