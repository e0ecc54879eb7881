// Options declared once. An options struct's spec lists each field a single time (its
// name, type, help, rule, and whether it must be given) and everything else is derived
// from that list: the text a checkpoint stores and its exact inverse, validation (each
// rule once), and what a front end shows (config keys, flags, defaults, choices).
#pragma once

#include <c10/util/Exception.h>

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

namespace tinylm {

enum class OptionType { boolean, integer, real, text };
const char* to_string(OptionType type);

/// One option's value, as a config file or a checkpoint holds it.
using OptionValue = std::variant<bool, int64_t, double, std::string>;
OptionType type_of(const OptionValue& value);

/// How an option is named in messages: as stored (d_model), or as a config file and the
/// command line spell it (d-model).
enum class Spelling { stored, config };
std::string spell(const std::string& name, Spelling spelling);

/// What a front end needs to know of one option.
struct OptionInfo {
  std::string name;  // as stored: d_model
  OptionType type = OptionType::integer;
  std::string help;
  std::optional<OptionValue> default_value;  // none: it must be given
  std::vector<std::string> choices;          // a text option's allowed values
  std::string group;                         // a heading for a front end ("" = none)
  std::string rule;                          // the values it takes, in words ("must be >= 1"; "" = any)
};

/// The stored text of a value: true/false, a decimal integer, the shortest decimal that
/// reads back exactly, text as it is.
std::string option_text(const OptionValue& value);

/// Reads `text` as the option's type (and one of its choices). Throws naming `where`, the
/// option and the value.
OptionValue parse_option_text(const OptionInfo& option, const std::string& text, const std::string& where);

/// A rule on one value and the words for it ("must be >= 1").
template <typename T>
struct Rule {
  std::function<bool(const T&)> holds;
  std::string says;
};
Rule<int64_t> at_least(int64_t min);
Rule<double> fraction();       // [0, 1)
Rule<double> unit_interval();  // [0, 1]
Rule<double> positive();       // finite and > 0
Rule<double> non_negative();   // finite and >= 0

/// The spec of an options struct O (fields reached through accessors returning a
/// reference, such as TORCH_ARG's).
template <typename O>
class OptionSpec {
 public:
  /// `owner` names O's user in messages ("TransformerLM").
  explicit OptionSpec(std::string owner) : owner_(std::move(owner)) {}

  /// A bool, integer, real or text field; `ref(o)` returns a reference to it.
  template <typename Ref, typename T = std::decay_t<std::invoke_result_t<Ref, O&>>>
  OptionSpec& add(const char* name, Ref ref, const char* help, Rule<T> rule = {}) {
    return field<T>(
        name, [ref](const O& o) { return T(ref(const_cast<O&>(o))); }, [ref](O& o, const T& v) { ref(o) = v; },
        help, std::move(rule));
  }

  /// A field read and written through functions: one that is not a member of its own,
  /// or is held in another type (an unsigned seed as an integer).
  template <typename T>
  OptionSpec& field(const char* name, std::function<T(const O&)> get, std::function<void(O&, const T&)> set,
                    const char* help, Rule<T> rule = {}) {
    static_assert(std::is_same_v<T, bool> || std::is_same_v<T, int64_t> || std::is_same_v<T, double> ||
                      std::is_same_v<T, std::string>,
                  "an option is bool, int64_t, double or std::string (enums: choice())");
    Field f;
    f.info.name = name;
    f.info.type = type_of(OptionValue(T{}));
    f.info.help = help;
    f.info.group = group_;
    f.info.rule = rule.holds ? rule.says : std::string();
    f.get = [get](const O& o) { return OptionValue(get(o)); };
    f.set = [set](O& o, const OptionValue& v) { set(o, std::get<T>(v)); };
    if (rule.holds)
      f.violation = [get, rule](const O& o) {
        const T v = get(o);
        return rule.holds(v) ? std::string() : rule.says + ", got " + option_text(OptionValue(v));
      };
    fields_.push_back(std::move(f));
    return *this;
  }

  /// An enum field, stored as the text of its value in `names`.
  template <typename Ref, typename E = std::decay_t<std::invoke_result_t<Ref, O&>>>
  OptionSpec& choice(const char* name, Ref ref, std::vector<std::pair<std::string, E>> names, const char* help) {
    static_assert(std::is_enum_v<E>, "choice() is for enums");
    Field f;
    f.info.name = name;
    f.info.type = OptionType::text;
    f.info.help = help;
    f.info.group = group_;
    for (const auto& n : names) f.info.choices.push_back(n.first);
    f.get = [ref, names](const O& o) {
      const E v = ref(const_cast<O&>(o));
      for (const auto& n : names)
        if (n.second == v) return OptionValue(n.first);
      TORCH_CHECK(false, "an option holds a value its spec does not name (", static_cast<int64_t>(v), ")");
    };
    f.set = [ref, names](O& o, const OptionValue& v) {
      for (const auto& n : names)
        if (n.first == std::get<std::string>(v)) ref(o) = n.second;
    };
    fields_.push_back(std::move(f));
    return *this;
  }

  /// The fields added from now on belong to `group` (a heading for a front end).
  OptionSpec& group(std::string name) {
    group_ = std::move(name);
    return *this;
  }

  /// The last field added has no default: reading options without it is an error.
  OptionSpec& required() {
    TORCH_CHECK(!fields_.empty(), "required() follows the field it marks");
    fields_.back().required = true;
    return *this;
  }

  /// A rule between fields: `violation(o, spelling)` says what is wrong ("" when nothing).
  OptionSpec& rule(std::function<std::string(const O&, Spelling)> violation) {
    rules_.push_back(std::move(violation));
    return *this;
  }

  const std::string& owner() const { return owner_; }

  /// Every field, with its value in `defaults` as the default unless it is required.
  std::vector<OptionInfo> describe(const O& defaults) const {
    std::vector<OptionInfo> out;
    for (const auto& f : fields_) {
      out.push_back(f.info);
      if (!f.required) out.back().default_value = f.get(defaults);
    }
    return out;
  }

  /// Throws at the first rule `o` breaks, naming the option and its value.
  void check(const O& o, Spelling spelling = Spelling::stored) const {
    const std::string prefix = spelling == Spelling::stored ? owner_ + ": " : std::string();
    for (const auto& f : fields_) {
      if (!f.violation) continue;
      const std::string why = f.violation(o);
      TORCH_CHECK(why.empty(), prefix, spell(f.info.name, spelling), " ", why);
    }
    for (const auto& r : rules_) {
      const std::string why = r(o, spelling);
      TORCH_CHECK(why.empty(), prefix, why);
    }
  }

  /// The options as stored text, one entry per field.
  std::map<std::string, std::string> write(const O& o) const {
    std::map<std::string, std::string> out;
    for (const auto& f : fields_) out[f.info.name] = option_text(f.get(o));
    return out;
  }

  /// write()'s inverse, over `start`: fields absent from `text` keep start's values (a
  /// required one absent is an error); keys no field has go to `unknown` (an error when
  /// it is null). `where` names the source in messages. The result is not check()ed.
  O read(const std::map<std::string, std::string>& text, O start, const std::string& where,
         std::vector<std::string>* unknown = nullptr) const {
    for (const auto& f : fields_) {
      auto it = text.find(f.info.name);
      TORCH_CHECK(it != text.end() || !f.required, where, ": ", owner_, " option ", f.info.name,
                  " is missing: it has no default");
      if (it != text.end()) f.set(start, parse_option_text(f.info, it->second, where));
    }
    for (const auto& entry : text) {
      if (find(entry.first)) continue;
      TORCH_CHECK(unknown, where, ": ", owner_, " has no option '", entry.first, "'");
      unknown->push_back(entry.first);
    }
    return start;
  }

  /// One field's value and its setter by name (nullopt / false when there is none).
  std::optional<OptionValue> get(const O& o, const std::string& name) const {
    const Field* f = find(name);
    return f ? std::optional<OptionValue>(f->get(o)) : std::nullopt;
  }
  void set(O& o, const std::string& name, const OptionValue& value) const {
    const Field* f = find(name);
    TORCH_CHECK(f, owner_, " has no option '", name, "'");
    f->set(o, parse_option_text(f->info, option_text(value), owner_));
  }

 private:
  struct Field {
    OptionInfo info;
    bool required = false;
    std::function<OptionValue(const O&)> get;
    std::function<void(O&, const OptionValue&)> set;
    std::function<std::string(const O&)> violation;
  };
  const Field* find(const std::string& name) const {
    for (const auto& f : fields_)
      if (f.info.name == name) return &f;
    return nullptr;
  }
  std::string owner_;
  std::string group_;
  std::vector<Field> fields_;
  std::vector<std::function<std::string(const O&, Spelling)>> rules_;
};

}  // namespace tinylm

/// The accessor add() and choice() take for a TORCH_ARG field of Options:
/// spec.add(TINYLM_OPTION(Options, d_model), "embedding width", at_least(1)).
#define TINYLM_OPTION(Options, field) \
  #field, [](Options & o) -> auto& { return o.field(); }

/// The same for a field held deeper, under a name of its own:
/// spec.add(TINYLM_OPTION_AT(Options, "mlp_expansion", block().mlp().expansion), ...).
#define TINYLM_OPTION_AT(Options, name, path) \
  name, [](Options & o) -> auto& { return o.path(); }
