// TOML text from elsewhere (a config file, a checkpoint's stored recipe), parsed safely.
// The one source that compiles toml++ (header-only, and heavy to compile).
#pragma once

#include <cstdint>
#include <string>
#include <variant>
#include <vector>

namespace tinylm::internal {

/// One top-level key of a TOML document.
struct TomlEntry {
  std::string key;
  int64_t line = 0;
  std::string type;  // TOML's name of its type: "integer", "string", "table", ...
  bool table = false;  // a table or an array of tables
  std::variant<std::monostate, bool, int64_t, double, std::string> value;  // monostate: anything else
};

/// The top-level keys of TOML text, in order; a UTF-8 byte-order mark at its start is
/// skipped (elsewhere it is refused as below). Refuses first, naming the line, what
/// toml++ 3.3 (Debian 12) cannot be handed (a character outside ASCII outside a string or
/// a comment reaches its undefined behaviour); a syntax error is one line:
/// "ORIGIN:LINE: not valid TOML: ...".
std::vector<TomlEntry> parse_flat_toml(const std::string& text, const std::string& origin);

}  // namespace tinylm::internal
