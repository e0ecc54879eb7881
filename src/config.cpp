// The run configuration: its field table (the model part made from the registered model
// kinds) and its validation. TOML reading and writing: config_toml.cpp.
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
  /// Each model key's default (the run's preset, else the first kind's that has it):
  /// what its field reads where the chosen kind has no such option.
  std::map<std::string, OptionValue> model_defaults;
};
const Fields& fields();

/// A kind's options as a run starts them: its defaults, with the run's presets for the
/// options it has, and a zero of its type for a required one without a preset.
nn::ModelOptions run_defaults(const nn::ModelKind& kind) {
  nn::ModelOptions o = kind.defaults;
  for (const auto& info : kind.options) {
    auto preset = model_presets().find(info.name);
    if (preset != model_presets().end()) kind.set(o, info.name, preset->second.value);
    else if (!info.default_value) kind.set(o, info.name, fields().model_defaults.at(info.name));
  }
  return o;
}

/// The model's option `name` (stored spelling): the chosen kind's when it has one; else
/// one given for another kind, or the key's default.
OptionValue model_option(const RunConfig& c, const std::string& name) {
  if (auto v = nn::find_model_kind(c.model.kind()).get(c.model, name)) return *v;
  auto it = c.other_model_options.find(name);
  return it != c.other_model_options.end() ? it->second : fields().model_defaults.at(name);
}

void set_model_option(RunConfig& c, const std::string& name, const OptionValue& v) {
  const auto& kind = nn::find_model_kind(c.model.kind());
  if (kind.get(c.model, name)) {
    kind.set(c.model, name, v);
    c.other_model_options.erase(name);
  } else {
    c.other_model_options[name] = v;
  }
}

/// The config's model becomes a model of that kind: the options the two kinds share keep
/// their values, options given for other kinds that this one has are taken up, and those
/// given for the old kind that this one lacks wait (check_config() refuses them).
void set_model_kind(RunConfig& c, const std::string& name) {
  const auto& to = nn::find_model_kind(name);
  if (c.model.kind() == to.name) return;
  nn::ModelOptions next = run_defaults(to);
  const auto& from = nn::find_model_kind(c.model.kind());
  for (const auto& info : from.options) {
    const OptionValue v = *from.get(c.model, info.name);
    if (to.get(next, info.name)) to.set(next, info.name, v);
    else if (c.given.count(spell(info.name, Spelling::config))) c.other_model_options[info.name] = v;
  }
  for (auto it = c.other_model_options.begin(); it != c.other_model_options.end();) {
    if (!to.get(next, it->first)) {
      ++it;
      continue;
    }
    to.set(next, it->first, it->second);
    it = c.other_model_options.erase(it);
  }
  c.model = std::move(next);
}

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
  ConfigField model;
  model.name = "model";
  model.group = "model";
  model.help = "the model kind: " + internal::join(kinds);
  model.type = OptionType::text;
  model.choices = kinds;
  model.get = [](const RunConfig& c) { return OptionValue(c.model.kind()); };
  model.set = [](RunConfig& c, const OptionValue& v) { set_model_kind(c, std::get<std::string>(v)); };
  out.list.push_back(std::move(model));
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
    f.get = [key](const RunConfig& c) { return model_option(c, key); };
    f.set = [key](RunConfig& c, const OptionValue& v) { set_model_option(c, key, v); };
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
    f.get = [](const RunConfig& c) {
      return OptionValue(std::get<std::string>(model_option(c, "attention_kernel")) != "plain");
    };
    f.set = [](RunConfig& c, const OptionValue& v) {
      set_model_option(c, "attention_kernel", std::string(std::get<bool>(v) ? "automatic" : "plain"));
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

RunConfig::RunConfig() : model(run_defaults(nn::find_model_kind("tiny"))) { trainer.out_dir("runs/default"); }

data::TaskOptions RunConfig::task_settings() const {
  data::TaskOptions o = task_options;
  return o.vocab_size(get<int64_t>("vocab-size"));
}

int64_t RunConfig::effective_context() const {
  const auto v = nn::find_model_kind(model.kind()).get(model, "context_length");
  const int64_t c = v && std::holds_alternative<int64_t>(*v) ? std::get<int64_t>(*v) : 0;
  return c > 0 ? c : task_options.seq_len();
}

nn::ModelOptions RunConfig::model_settings() const {
  nn::ModelOptions o = model;
  const auto& kind = nn::find_model_kind(o.kind());
  if (kind.get(o, "context_length")) kind.set(o, "context_length", effective_context());
  return o;
}

void RunConfig::set(const std::string& key, OptionValue value) {
  const ConfigField* f = &config_field(key);
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

const ConfigField& config_field(const std::string& name) {
  if (const ConfigField* f = find_config_field(name)) return *f;
  const ConfigField* best = nullptr;
  size_t best_d = std::numeric_limits<size_t>::max();
  for (const auto& f : config_fields()) {
    const size_t d = internal::edit_distance(name, f.name);
    if (d < best_d) best_d = d, best = &f;
  }
  TORCH_CHECK(false, "unknown key '", internal::printable(name), "'",
              best && best_d <= 3 ? std::string(" (did you mean '") + best->name + "'?)"
                                  : std::string(" (a printed config lists every key)"));
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
  const std::string& chosen = model ? c.model.kind() : c.task;
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

std::string accepted_values(const ConfigField& f) {
  return !f.choices.empty() ? "one of " + internal::join(f.choices) : f.rule;
}

void check_config(const RunConfig& c) {
  for (const auto& f : config_fields())
    if (!f.choices.empty()) check_one_of(f.name.c_str(), std::get<std::string>(f.get(c)), f.choices);
  // A key given for another model or task kind would be silently unused: refused.
  for (const auto& [key, where] : c.given) {
    const std::string why = not_taken(c, config_field(key));
    TORCH_CHECK(why.empty(), where.empty() ? "" : where + ": ", why);
  }
  const auto given_context = nn::find_model_kind(c.model.kind()).get(c.model, "context_length");
  const int64_t context = given_context ? std::get<int64_t>(*given_context) : 0;
  TORCH_CHECK(context >= 0, "context-length must be >= 0 (0 = seq-len), got ", context);
  // The task's rules (its settings' spec, then its kind's), with the model's vocabulary.
  const data::TaskOptions task = c.task_settings();
  data::check_task(c.task, task, Spelling::config);
  // The model's own rules, each stated once by its kind, in the config's spelling.
  nn::find_model_kind(c.model.kind()).check(c.model_settings(), Spelling::config);
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
