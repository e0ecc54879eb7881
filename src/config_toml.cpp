// The run configuration as TOML: writing it (what --print-config and every checkpoint's
// recipe hold) and reading it back, each key checked by its field.
#include <tinylm/config.h>

#include "internal/files.h"
#include "internal/text.h"
#include "internal/toml_text.h"

#include <c10/util/Exception.h>

#include <sstream>
#include <string>
#include <variant>
#include <vector>

namespace tinylm {

namespace {

// A double as TOML writes it: the shortest text that reads back exactly, still a float.
std::string format_double(double v) {
  std::string s = option_text(v);
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
  return s;
}

std::string quote(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

}  // namespace

std::string field_value_string(const ConfigField& field, const RunConfig& config) {
  const OptionValue v = field.get(config);
  switch (v.index()) {
    case 0: return std::get<bool>(v) ? "true" : "false";
    case 1: return std::to_string(std::get<int64_t>(v));
    case 2: return format_double(std::get<double>(v));
    default: return quote(std::get<std::string>(v));
  }
}

std::string to_toml(const RunConfig& config, bool with_accepted) {
  std::ostringstream os;
  std::string group;
  for (const auto& f : config_fields()) {
    if (!f.written || !takes(config, f)) continue;
    if (group != f.group) {
      os << (group.empty() ? "" : "\n") << "# ---- " << f.group << "\n";
      group = f.group;
    }
    os << f.name << " = " << field_value_string(f, config);
    if (const std::string accepted = accepted_values(f); with_accepted && !accepted.empty())
      os << "  # " << accepted;
    os << "\n";
  }
  return os.str();
}

std::vector<std::string> apply_toml(RunConfig& config, const std::string& text,
                                    const std::string& origin, std::vector<std::string>* unknown) {
  std::vector<std::string> set;
  for (const auto& entry : internal::parse_flat_toml(text, origin)) {
    const std::string& key = entry.key;
    const auto line = entry.line;
    TORCH_CHECK(!entry.table, origin, ":", line, ": [", key,
                "] is a table: tinylm configs use flat keys only, e.g. d-model = 32");
    if (!find_config_field(key) && unknown) {
      unknown->push_back(key);
      continue;
    }
    try {  // every error names the file and line
      const ConfigField& field = config_field(key);
      const auto& value = entry.value;
      OptionValue v;
      if (std::holds_alternative<bool>(value)) v = std::get<bool>(value);
      else if (std::holds_alternative<int64_t>(value)) v = std::get<int64_t>(value);
      else if (std::holds_alternative<double>(value)) v = std::get<double>(value);
      else if (std::holds_alternative<std::string>(value)) v = std::get<std::string>(value);
      const bool known_type = !std::holds_alternative<std::monostate>(value);
      if (field.type == OptionType::real && std::holds_alternative<int64_t>(v))  // 3 for 3.0
        v = static_cast<double>(std::get<int64_t>(v));
      static const char* const wanted[] = {"true or false", "an integer", "a number", "a string (in quotes)"};
      TORCH_CHECK(known_type && type_of(v) == field.type, "'", key, "' must be ",
                  wanted[static_cast<int>(field.type)], ", got ", entry.type);
      field.set(config, v);
    } catch (const c10::Error& e) {
      TORCH_CHECK(false, origin, ":", line, ": ", e.what_without_backtrace());
    }
    config.given[key] = origin + ":" + std::to_string(line);
    set.push_back(key);
  }
  return set;
}

std::vector<std::string> apply_toml_file(RunConfig& config, const std::string& path) {
  // A config is a few kilobytes; a megabyte is plenty and keeps a mistaken path cheap.
  return apply_toml(config, internal::read_regular_file(path, "config file", 1u << 20),
                    internal::printable(path));
}

}  // namespace tinylm
