// The run configuration: field table, validation and TOML reading/writing.
#include <tinylm/config.h>
#include <tinylm/nn/model_kind.h>
#include <tinylm/run.h>

#include "internal/files.h"
#include "internal/text.h"
#include "internal/toml_text.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>
#include <string>
#include <variant>
#include <vector>

namespace tinylm {

namespace {

using R = RunConfig;

std::string suggestion(const std::string& key) {
  const ConfigField* best = nullptr;
  size_t best_d = std::numeric_limits<size_t>::max();
  for (const auto& f : config_fields()) {
    const size_t d = internal::edit_distance(key, f.name);
    if (d < best_d) best_d = d, best = &f;
  }
  if (best && best_d <= 3) return std::string(" (did you mean '") + best->name + "'?)";
  return " (a printed config lists every key)";
}

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

void check_one_of(const char* key, const std::string& value, const std::vector<std::string>& allowed) {
  TORCH_CHECK(std::find(allowed.begin(), allowed.end(), value) != allowed.end(), key, " must be one of ",
              internal::join(allowed), ", got '", internal::printable(value), "'");
}

// A field of RunConfig's own.
template <typename T>
ConfigField member(const char* name, const char* group, const char* help, T R::*m,
                   std::vector<std::string> choices = {}) {
  ConfigField f;
  f.name = name;
  f.group = group;
  f.help = help;
  f.type = type_of(OptionValue(T{}));
  f.choices = std::move(choices);
  f.get = [m](const RunConfig& c) { return OptionValue(c.*m); };
  f.set = [m](RunConfig& c, const OptionValue& v) { c.*m = std::get<T>(v); };
  return f;
}

// A key for each field of an options struct the config holds (`held`), its help, type,
// choices and group from the struct's spec.
// `options`: the fields are a kind's options (a task's settings), which a run uses only
// where its kind takes them.
template <typename O>
void add_spec_fields(std::vector<ConfigField>& out, const OptionSpec<O>& spec, O R::*held, bool options,
                     const std::string& skip = "") {
  for (const auto& o : spec.describe(O{})) {
    if (o.name == skip) continue;
    ConfigField f;
    f.name = spell(o.name, Spelling::config);
    f.group = o.group;
    f.help = o.help;
    f.type = o.type;
    f.choices = o.choices;
    f.rule = o.rule;
    if (options) f.option = o.name;
    const std::string key = o.name;
    f.get = [&spec, held, key](const RunConfig& c) { return *spec.get(c.*held, key); };
    f.set = [&spec, held, key](RunConfig& c, const OptionValue& v) { spec.set(c.*held, key, v); };
    out.push_back(std::move(f));
  }
}

// The run's own defaults for model options (the reference run's), where a kind has none
// or another, and what the run adds to their help.
struct Preset {
  OptionValue value;
  const char* help;            // replaces the kind's help when set
  const char* rule = nullptr;  // replaces the kind's rule's words when set
};
const std::map<std::string, Preset>& model_presets() {
  static const std::map<std::string, Preset> presets = {
      {"vocab_size", {int64_t{64}, "vocabulary size (text task: 256, byte-level; tokens task: the corpus's)"}},
      {"context_length", {int64_t{0}, "model context; 0 = seq-len", "must be >= 0 (0 = seq-len)"}},
      {"d_model", {int64_t{32}, nullptr}},
      {"n_heads", {int64_t{4}, nullptr}},
      {"n_layers", {int64_t{2}, nullptr}}};
  return presets;
}

struct Fields {
  std::vector<ConfigField> list;
  std::map<std::string, OptionValue> model_defaults;
};

// One key per option of the registered model kinds (an option several kinds have is one
// key, of one type), each kind's spec giving its help, type, choices and default.
void add_model_fields(Fields& out) {
  struct Seen {
    OptionInfo info;
    std::vector<std::string> kinds;
  };
  std::vector<Seen> seen;
  const auto kinds = nn::model_kind_names();
  for (const auto& name : kinds) {
    for (const auto& o : nn::find_model_kind(name).options) {
      auto it = std::find_if(seen.begin(), seen.end(), [&](const Seen& s) { return s.info.name == o.name; });
      if (it == seen.end()) {
        seen.push_back({o, {name}});
        continue;
      }
      TORCH_CHECK(it->info.type == o.type, "model kinds ", it->kinds.front(), " and ", name, " both have an option ",
                  o.name, " but of different types: a run config cannot hold both");
      it->kinds.push_back(name);
      if (!it->info.default_value) it->info.default_value = o.default_value;
    }
  }
  out.list.push_back(member("model", "model", "", &R::model, kinds));
  out.list.back().help = "the model kind: " + internal::join(kinds);
  for (const auto& s : seen) {
    ConfigField f;
    f.name = spell(s.info.name, Spelling::config);
    f.group = "model";
    f.help = s.info.help + (s.kinds.size() < kinds.size() ? " (" + internal::join(s.kinds) + ")" : "");
    f.type = s.info.type;
    f.choices = s.info.choices;
    f.rule = s.info.rule;
    f.option = s.info.name;
    const std::string key = s.info.name;
    f.get = [key](const RunConfig& c) {
      auto it = c.model_options.find(key);
      TORCH_CHECK(it != c.model_options.end(), "the run config holds no model option ", key);
      return it->second;
    };
    f.set = [key](RunConfig& c, const OptionValue& v) { c.model_options[key] = v; };
    auto preset = model_presets().find(key);
    const bool has_preset = preset != model_presets().end();
    if (has_preset && preset->second.help) f.help = preset->second.help;
    if (has_preset && preset->second.rule) f.rule = preset->second.rule;
    out.list.push_back(std::move(f));
    out.model_defaults[key] = has_preset ? preset->second.value
                              : s.info.default_value ? *s.info.default_value
                                                     : OptionValue();
    if (type_of(out.model_defaults[key]) != s.info.type) {  // required, and no preset: a zero of its type
      const OptionValue zeros[] = {false, int64_t{0}, 0.0, std::string()};
      out.model_defaults[key] = zeros[static_cast<int>(s.info.type)];
    }
  }
  // The spelling before attention kernels had names: read, never written.
  if (std::any_of(seen.begin(), seen.end(), [](const Seen& s) { return s.info.name == "attention_kernel"; })) {
    ConfigField f;
    f.name = "fused-attention";
    f.group = "model";
    f.help = "older spelling: true = attention-kernel automatic, false = plain";
    f.type = OptionType::boolean;
    f.written = false;
    f.option = "attention_kernel";
    f.get = [](const RunConfig& c) { return OptionValue(std::get<std::string>(c.model_options.at("attention_kernel")) != "plain"); };
    f.set = [](RunConfig& c, const OptionValue& v) {
      c.model_options["attention_kernel"] = std::string(std::get<bool>(v) ? "automatic" : "plain");
    };
    out.list.push_back(std::move(f));
  }
}

const Fields& fields() {
  static const Fields all = [] {
    Fields out;
    add_model_fields(out);
    auto& l = out.list;
    const auto tasks = data::task_kind_names();
    l.push_back(member("task", "task", "", &R::task, tasks));
    l.back().help = "the task kind: " + internal::join(tasks) +
                    " (text: a file's bytes, in memory; tokens: a prepared corpus, memory-mapped)";
    // The task's vocabulary is the model's vocab-size.
    add_spec_fields(out.list, data::TaskOptions::spec(), &R::task_options, true, "vocab_size");
    add_spec_fields(out.list, train::TrainerOptions::spec(), &R::trainer, false);
    l.push_back(member("device", "run", "auto, cpu, cuda or cuda:N", &R::device));
    l.push_back(member("threads", "run", "CPU threads for LibTorch and OpenBLAS; 0 = their defaults", &R::threads));
    // A value outside a field's choices is refused as it is set, in the config's words
    // (an enum behind it could not hold it).
    for (auto& f : l)
      if (!f.choices.empty())
        f.set = [inner = f.set, name = f.name, choices = f.choices](RunConfig& c, const OptionValue& v) {
          check_one_of(name.c_str(), std::get<std::string>(v), choices);
          inner(c, v);
        };
    return out;
  }();
  return all;
}

OptionValue coerce(const ConfigField& f, OptionValue v) {
  if (f.type == OptionType::real && std::holds_alternative<int64_t>(v))
    v = static_cast<double>(std::get<int64_t>(v));
  return v;
}

}  // namespace

RunConfig::RunConfig() : model_options(fields().model_defaults) { trainer.out_dir("runs/default"); }

data::TaskOptions RunConfig::task_settings() const {
  data::TaskOptions o = task_options;
  return o.vocab_size(get<int64_t>("vocab-size"));
}

int64_t RunConfig::effective_context() const {
  auto it = model_options.find("context_length");
  const int64_t c = it != model_options.end() && std::holds_alternative<int64_t>(it->second)
                        ? std::get<int64_t>(it->second)
                        : 0;
  return c > 0 ? c : task_options.seq_len();
}

void RunConfig::set(const std::string& key, OptionValue value) {
  const ConfigField* f = find_config_field(key);
  TORCH_CHECK(f, "the run config has no key '", internal::printable(key), "'", suggestion(key));
  value = coerce(*f, std::move(value));
  TORCH_CHECK(type_of(value) == f->type, "'", key, "' must be ", to_string(f->type), ", got ",
              to_string(type_of(value)));
  f->set(*this, value);
  given[key] = "";
}

const std::vector<ConfigField>& config_fields() { return fields().list; }

const ConfigField* find_config_field(const std::string& name) {
  for (const auto& f : config_fields()) {
    if (name == f.name) return &f;
  }
  return nullptr;
}

namespace {

// Why the config's kinds do not take the field, in one line ("" when they do).
std::string not_taken(const RunConfig& c, const ConfigField& f) {
  if (f.option.empty()) return "";
  const bool model = f.group == "model";
  auto takes_it = [&](const std::string& kind, std::vector<std::string>* names = nullptr) {
    std::vector<std::string> own = model ? std::vector<std::string>{} : data::find_task_kind(kind).reads;
    if (model)
      for (const auto& o : nn::find_model_kind(kind).options) own.push_back(o.name);
    const bool yes = std::find(own.begin(), own.end(), f.option) != own.end();
    if (names)
      for (const auto& n : own) names->push_back(spell(n, Spelling::config));
    return yes;
  };
  const std::string& chosen = model ? c.model : c.task;
  std::vector<std::string> own, others;
  if (takes_it(chosen, &own)) return "";
  for (const auto& kind : model ? nn::model_kind_names() : data::task_kind_names())
    if (takes_it(kind)) others.push_back(kind);
  const std::string what = model ? "model" : "task";
  return (model ? f.name + " is not an option of model " + chosen + " (its options: "
                : "task " + chosen + " reads no " + f.name + " (it reads ") +
         internal::join(own) + ")" +
         (others.empty() ? "" : ": " + f.name + " is for " + what + " " + internal::join(others) +
                                    "; drop it, or set " + what + " to one of those");
}

}  // namespace

bool takes(const RunConfig& c, const ConfigField& f) { return not_taken(c, f).empty(); }

std::string field_value_string(const ConfigField& field, const RunConfig& config) {
  const OptionValue v = field.get(config);
  switch (v.index()) {
    case 0: return std::get<bool>(v) ? "true" : "false";
    case 1: return std::to_string(std::get<int64_t>(v));
    case 2: return format_double(std::get<double>(v));
    default: return quote(std::get<std::string>(v));
  }
}

std::string accepted_values(const ConfigField& f) {
  return !f.choices.empty() ? "one of " + internal::join(f.choices) : f.rule;
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
    const ConfigField* field = find_config_field(key);
    if (!field && unknown) {
      unknown->push_back(key);
      continue;
    }
    TORCH_CHECK(field, origin, ": unknown key '", internal::printable(key), "'", suggestion(key));
    const auto& value = entry.value;
    OptionValue v;
    if (std::holds_alternative<bool>(value)) v = std::get<bool>(value);
    else if (std::holds_alternative<int64_t>(value)) v = std::get<int64_t>(value);
    else if (std::holds_alternative<double>(value)) v = std::get<double>(value);
    else if (std::holds_alternative<std::string>(value)) v = std::get<std::string>(value);
    const bool known_type = !std::holds_alternative<std::monostate>(value);
    if (known_type) v = coerce(*field, v);
    static const char* const wanted[] = {"true or false", "an integer", "a number", "a string (in quotes)"};
    TORCH_CHECK(known_type && type_of(v) == field->type, origin, ":", line, ": '", key, "' must be ",
                wanted[static_cast<int>(field->type)], ", got ", entry.type);
    try {
      field->set(config, v);
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

void check_config(const RunConfig& c) {
  for (const auto& f : config_fields())
    if (!f.choices.empty()) check_one_of(f.name.c_str(), std::get<std::string>(f.get(c)), f.choices);
  // A key given for another model or task kind would be silently unused: refused.
  for (const auto& [key, where] : c.given) {
    const ConfigField* f = find_config_field(key);
    TORCH_CHECK(f, "the run config has no key '", internal::printable(key), "'", suggestion(key));
    const std::string why = not_taken(c, *f);
    TORCH_CHECK(why.empty(), where.empty() ? "" : where + ": ", why);
  }
  const int64_t context = std::get<int64_t>(c.model_options.count("context_length")
                                                ? c.model_options.at("context_length")
                                                : OptionValue(int64_t{0}));
  TORCH_CHECK(context >= 0, "context-length must be >= 0 (0 = seq-len), got ", context);
  // The task's rules (its settings' spec, then its kind's), with the model's vocabulary.
  const data::TaskOptions task = c.task_settings();
  data::check_task(c.task, task, Spelling::config);
  // The model's own rules, each stated once by its kind, in the config's spelling.
  std::vector<std::string> unknown;
  nn::find_model_kind(c.model).check(model_architecture(c), Spelling::config, &unknown);
  TORCH_CHECK(c.effective_context() >= task.seq_len(), "context-length ", context, " is shorter than seq-len ",
              task.seq_len());
  // The Trainer's own rules, stated once by its options' spec.
  train::TrainerOptions::spec().check(c.trainer, Spelling::config);
  // What only a run config has: a signed seed, the tool's threads, a place to write, and
  // the token counter the trainer forms with the task's sequence length.
  const auto& t = c.trainer;
  TORCH_CHECK(static_cast<int64_t>(t.seed()) >= 0, "seed must be >= 0, got ", static_cast<int64_t>(t.seed()));
  TORCH_CHECK(c.threads >= 0, "threads must be >= 0 (0 = LibTorch's default), got ", c.threads);
  TORCH_CHECK(!t.out_dir().empty(), "out-dir must not be empty");
  int64_t product = 0;
  TORCH_CHECK(!__builtin_mul_overflow(t.batch_size(), task.seq_len(), &product) &&
                  !__builtin_mul_overflow(product, t.grad_accum(), &product),
              "batch-size ", t.batch_size(), " x seq-len ", task.seq_len(), " x grad-accum ", t.grad_accum(),
              " overflows the token counter");
}

}  // namespace tinylm
