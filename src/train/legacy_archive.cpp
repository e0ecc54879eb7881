// Format-1 checkpoints: see legacy_archive.h.
//
// What tinylm wrote (OutputArchive: one TorchScript module, its attributes):
//   tinylm_version, config (the run config, TOML), step, best_val_loss, epoch_loss_sum,
//   data_rng_state, torch_rng_state, model_parameter_names (one per line), model.<name>
//   (the weights), optimizer (a module), optimizer_kind.
// The optimizer module: flat Adam's layout ("name:numel" per line), step, exp_avg,
// exp_avg_sq; or LibTorch's Adam/AdamW archive: state (a module: one module per
// parameter, under the saving process's TensorImpl address, holding step, exp_avg,
// exp_avg_sq[, max_exp_avg_sq]) and param_groups ("param_groups/size", then
// "param_groups/<g>": "params/size", "params/<i>" = an address, options).
#include "train/legacy_archive.h"

#include "internal/text.h"
#include "internal/torch_file.h"

#include <torch/types.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace tinylm::internal {

namespace {

using Kind = PyValue::Kind;

/// The archive's values, looked up with a message naming the file and what is missing.
class Reader {
 public:
  Reader(const TorchFile& file, std::string path) : file_(file), path_(std::move(path)) {}

  void damaged(const std::string& what) const {
    TORCH_CHECK(false, "checkpoint '", printable(path_), "' is damaged: ", what);
  }

  /// The attribute `key` of `module` (`where` names it), of `kind`; nullptr when absent
  /// and optional.
  const PyValue* get(const PyValue& module, const std::string& where, const std::string& key, Kind kind,
                     bool optional = false) const {
    const PyValue* v = module.find(key);
    if (!v && optional) return nullptr;
    if (!v) damaged(where + " has no '" + printable(key) + "'");
    if (v->kind != kind)
      damaged(where + "'s '" + printable(key) + "' is of type " + v->kind_name() + ", not " + PyValue::name_of(kind));
    return v;
  }
  const std::string& text(const PyValue& module, const std::string& where, const std::string& key) const {
    return get(module, where, key, Kind::string)->text;
  }
  int64_t count(const PyValue& module, const std::string& where, const std::string& key) const {
    const int64_t n = get(module, where, key, Kind::integer)->integer;
    if (n < 0) damaged(where + "'s '" + printable(key) + "' is " + std::to_string(n) + ", below 0");
    return n;
  }
  torch::Tensor tensor(const PyValue& module, const std::string& where, const std::string& key) const {
    return file_.tensor(*get(module, where, key, Kind::tensor)->tensor);
  }
  /// A count stored as a one-element integer tensor (LibTorch's optimizer archives).
  int64_t tensor_count(const PyValue& module, const std::string& where, const std::string& key, int64_t limit) const {
    const auto t = tensor(module, where, key);
    if (t.numel() != 1 || !c10::isIntegralType(t.scalar_type(), /*includeBool=*/false))
      damaged(where + "'s '" + printable(key) + "' is not one integer");
    const int64_t n = t.item<int64_t>();
    if (n < 0 || n > limit)
      damaged(where + "'s '" + printable(key) + "' is " + std::to_string(n) + ", outside 0.." + std::to_string(limit));
    return n;
  }

 private:
  const TorchFile& file_;
  std::string path_;
};

/// Flat Adam's state in today's layout (FlatAdam::state_dict): its layout line per
/// parameter gives the numels.
train::TensorMap flat_adam_state(const Reader& r, const PyValue& opt) {
  const std::string where = "its flat Adam state";
  std::vector<int64_t> numels;
  for (const auto& line : split_lines(r.text(opt, where, "layout"))) {
    const auto colon = line.rfind(':');
    const std::string n = colon == std::string::npos ? "" : line.substr(colon + 1);
    if (n.empty() || n.size() > 15 || n.find_first_not_of("0123456789") != std::string::npos)
      r.damaged(where + " has the layout line '" + printable(line) + "' (expected name:count)");
    numels.push_back(std::stoll(n));
  }
  return {{"step", torch::scalar_tensor(r.count(opt, where, "step"), torch::kLong)},
          {"exp_avg", r.tensor(opt, where, "exp_avg")},
          {"exp_avg_sq", r.tensor(opt, where, "exp_avg_sq")},
          {"numels", torch::tensor(numels, torch::kLong)}};
}

/// LibTorch's Adam/AdamW archive: each group's parameters' state, by position.
train::GroupedState grouped_state(const Reader& r, const PyValue& opt) {
  const std::string where = "its optimizer state";
  const PyValue& states = *r.get(opt, where, "state", Kind::object);
  const PyValue& groups = *r.get(opt, where, "param_groups", Kind::object);
  // Counts are bounded by what the file holds: an entry each.
  const int64_t n_groups = r.tensor_count(groups, where, "param_groups/size", static_cast<int64_t>(groups.entries.size()));
  train::GroupedState out(static_cast<size_t>(n_groups));
  for (int64_t g = 0; g < n_groups; ++g) {
    const std::string group_name = "param_groups/" + std::to_string(g);
    const PyValue& group = *r.get(groups, where, group_name, Kind::object);
    const std::string in_group = where + "'s " + group_name;
    const int64_t n = r.tensor_count(group, in_group, "params/size", static_cast<int64_t>(group.entries.size()));
    auto& params = out[static_cast<size_t>(g)];
    params.resize(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      const std::string& address = r.text(group, in_group, "params/" + std::to_string(i));
      const PyValue* state = r.get(states, where + "'s state", address, Kind::object,
                                   /*optional=*/true);  // absent: no update touched it
      if (!state) continue;
      const std::string of = where + " for '" + printable(address) + "'";
      auto& s = params[static_cast<size_t>(i)];
      for (const auto& [key, value] : state->entries) {
        if (key->kind != Kind::string) r.damaged(of + " has a key that is a " + std::string(key->kind_name()));
        if (key->text == "step") {
          s["step"] = torch::scalar_tensor(r.count(*state, of, "step"), torch::kLong);
        } else if (key->text == "exp_avg" || key->text == "exp_avg_sq" || key->text == "max_exp_avg_sq") {
          s[key->text] = r.tensor(*state, of, key->text);
        } else {
          r.damaged(of + " holds '" + printable(key->text) + "', which Adam does not keep");
        }
      }
    }
  }
  return out;
}

}  // namespace

void read_legacy_archive(train::Checkpoint& ck, const std::string& payload) {
  const TorchFile file(payload, ck.path, TorchFile::Format::libtorch_archive);
  const Reader r(file, ck.path);
  const PyValue& top = file.root();
  if (top.kind != Kind::object) r.damaged(std::string("its archive holds a ") + top.kind_name() + ", not a module");
  const std::string where = "its archive";
  if (const PyValue* v = r.get(top, where, "tinylm_version", Kind::string, /*optional=*/true)) ck.tinylm_version = v->text;
  ck.recipe = r.text(top, where, "config");
  ck.state.step = r.count(top, where, "step");
  if (const PyValue* v = r.get(top, where, "best_val_loss", Kind::real, true)) ck.state.best_val_loss = v->real;
  if (const PyValue* v = r.get(top, where, "epoch_loss_sum", Kind::real, true)) ck.state.epoch_loss_sum = v->real;
  if (r.get(top, where, "data_rng_state", Kind::tensor, true))
    ck.state.data_rng_state = r.tensor(top, where, "data_rng_state");
  if (r.get(top, where, "torch_rng_state", Kind::tensor, true))
    ck.state.dropout_rng_state = r.tensor(top, where, "torch_rng_state");
  ck.parameter_names = split_lines(r.text(top, where, "model_parameter_names"));
  for (const auto& name : ck.parameter_names) {
    if (ck.model.count(name)) r.damaged("it names parameter '" + printable(name) + "' twice");
    ck.model[name] = r.tensor(top, where, "model." + name);
  }
  const PyValue* opt = r.get(top, where, "optimizer", Kind::object, /*optional=*/true);
  if (!opt) return;
  ck.optimizer_kind = r.text(top, where, "optimizer_kind");
  if (ck.optimizer_kind.rfind("flat-", 0) == 0) ck.optimizer = flat_adam_state(r, *opt);
  else ck.optimizer_groups = grouped_state(r, *opt);
}

}  // namespace tinylm::internal
