// Option values as text, and the common rules.
#include <tinylm/spec.h>

#include "internal/text.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdlib>

namespace tinylm {

const char* to_string(OptionType type) {
  switch (type) {
    case OptionType::boolean: return "true or false";
    case OptionType::integer: return "an integer";
    case OptionType::real: return "a number";
    case OptionType::text: return "text";
  }
  return "?";
}

OptionType type_of(const OptionValue& value) {
  switch (value.index()) {
    case 0: return OptionType::boolean;
    case 1: return OptionType::integer;
    case 2: return OptionType::real;
    default: return OptionType::text;
  }
}

std::string spell(const std::string& name, Spelling spelling) {
  std::string out = name;
  if (spelling == Spelling::config)
    for (char& c : out)
      if (c == '_') c = '-';
  return out;
}

namespace {

// The shortest decimal that reads back as exactly v (fixed notation on a tie).
std::string shortest(double v) {
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

}  // namespace

std::string option_text(const OptionValue& value) {
  switch (value.index()) {
    case 0: return std::get<bool>(value) ? "true" : "false";
    case 1: return std::to_string(std::get<int64_t>(value));
    case 2: return shortest(std::get<double>(value));
    default: return std::get<std::string>(value);
  }
}

OptionValue parse_option_text(const OptionInfo& option, const std::string& text, const std::string& where) {
  auto refuse = [&](const std::string& what) {
    TORCH_CHECK(false, where, ": option ", option.name, " = '", internal::printable(text), "' is not ", what);
  };
  switch (option.type) {
    case OptionType::boolean:
      if (text != "true" && text != "false") refuse("true or false");
      return text == "true";
    case OptionType::integer:
    case OptionType::real: {
      const bool integer = option.type == OptionType::integer;
      // strtoll / strtod: whole text, no leading space, no integer overflow (a double past
      // its range reads as infinity or a subnormal, which the rules judge).
      const char* begin = text.c_str();
      char* end = nullptr;
      errno = 0;
      const int64_t whole = integer ? static_cast<int64_t>(std::strtoll(begin, &end, 10)) : 0;
      const double real = integer ? 0.0 : std::strtod(begin, &end);
      if (text.empty() || std::isspace(static_cast<unsigned char>(text[0])) || end != begin + text.size() ||
          (integer && errno == ERANGE))
        refuse(integer ? "an integer" : "a number");
      return integer ? OptionValue(whole) : OptionValue(real);
    }
    case OptionType::text:
      if (!option.choices.empty() &&
          std::find(option.choices.begin(), option.choices.end(), text) == option.choices.end())
        refuse("one of " + internal::join(option.choices));
      return text;
  }
  refuse("readable");
  return {};
}

Rule<int64_t> at_least(int64_t min) {
  return {[min](const int64_t& v) { return v >= min; }, "must be >= " + std::to_string(min)};
}

Rule<double> fraction() {
  return {[](const double& v) { return v >= 0 && v < 1; }, "must be in [0, 1)"};
}

Rule<double> unit_interval() {
  return {[](const double& v) { return v >= 0 && v <= 1; }, "must be in [0, 1]"};
}

Rule<double> non_negative() {
  return {[](const double& v) { return std::isfinite(v) && v >= 0; }, "must be a finite number >= 0"};
}

Rule<double> positive() {
  return {[](const double& v) { return std::isfinite(v) && v > 0; }, "must be a finite number > 0"};
}

}  // namespace tinylm
