// The model of a format-1 or format-2 checkpoint, from its stored run config.
#include "train/legacy_recipe.h"

#include "internal/text.h"
#include "internal/toml_text.h"

#include <c10/util/Exception.h>

#include <cstdint>
#include <map>
#include <string>
#include <type_traits>
#include <variant>

namespace tinylm::internal {

namespace {

using Value = std::variant<bool, int64_t, double, std::string>;

/// The model keys of the run config formats 1 and 2 were written with, and their
/// defaults then (tinylm 0.1, November 2026). Frozen: never edit to follow today's.
const std::map<std::string, Value>& frozen_defaults() {
  static const std::map<std::string, Value> defaults = {
      {"model", std::string("tiny")}, {"vocab-size", int64_t{64}},    {"d-model", int64_t{32}},
      {"n-heads", int64_t{4}},        {"n-layers", int64_t{2}},       {"context-length", int64_t{0}},
      {"seq-len", int64_t{12}},       {"positions", std::string("learned")},
      {"pre-ln", true},               {"tie-weights", true},          {"dropout", 0.0},
      {"attn-dropout", 0.0},          {"bias", true},                 {"mlp-expansion", int64_t{4}},
      {"fused-attention", true},      {"activation", std::string("gelu-tanh")}};
  return defaults;
}

const char* type_name(const Value& v) {
  switch (v.index()) {
    case 0: return "true or false";
    case 1: return "an integer";
    case 2: return "a number";
    default: return "a string";
  }
}

}  // namespace

nn::ModelArchitecture legacy_architecture(const std::string& recipe, const std::string& path) {
  std::map<std::string, Value> v = frozen_defaults();
  for (const auto& entry : parse_flat_toml(recipe, path + " (stored config)")) {
    auto it = v.find(entry.key);
    if (it == v.end()) continue;  // not the model's
    Value& slot = it->second;
    const auto& given = entry.value;
    const bool fits = (std::holds_alternative<bool>(slot) && std::holds_alternative<bool>(given)) ||
                      (std::holds_alternative<int64_t>(slot) && std::holds_alternative<int64_t>(given)) ||
                      (std::holds_alternative<double>(slot) &&
                       (std::holds_alternative<double>(given) || std::holds_alternative<int64_t>(given))) ||
                      (std::holds_alternative<std::string>(slot) && std::holds_alternative<std::string>(given));
    TORCH_CHECK(fits, "checkpoint '", path, "' is damaged: its stored config's '", entry.key, "' is ", entry.type,
                " where ", type_name(slot), " belongs");
    if (std::holds_alternative<double>(slot) && std::holds_alternative<int64_t>(given))
      slot = static_cast<double>(std::get<int64_t>(given));
    else
      std::visit(
          [&slot](const auto& x) {
            if constexpr (!std::is_same_v<std::decay_t<decltype(x)>, std::monostate>) slot = x;
          },
          given);
  }
  auto integer = [&](const char* k) { return std::get<int64_t>(v.at(k)); };
  auto real = [&](const char* k) { return std::get<double>(v.at(k)); };
  auto flag = [&](const char* k) { return std::get<bool>(v.at(k)); };
  auto text = [&](const char* k) { return std::get<std::string>(v.at(k)); };
  const int64_t context = integer("context-length") > 0 ? integer("context-length") : integer("seq-len");
  const auto kernel = flag("fused-attention") ? nn::AttentionKernel::automatic : nn::AttentionKernel::plain;
  const std::string model = text("model");
  if (model == "tiny") {
    return nn::architecture_of(
        nn::TinyAttentionLMOptions(integer("vocab-size"), context, integer("d-model"), integer("n-heads"))
            .attention_kernel(kernel));
  }
  TORCH_CHECK(model == "transformer", "checkpoint '", path, "' is damaged: its stored config names model '",
              printable(model), "' (formats 1 and 2 hold tiny or transformer models)");
  try {
    auto options = nn::TransformerLMOptions(integer("vocab-size"), context, integer("d-model"), integer("n-heads"),
                                            integer("n-layers"))
                       .tie_weights(flag("tie-weights"))
                       .positions(nn::position_encoding_from_string(text("positions")));
    // The stored keys, set as an architecture's are (dropout and bias set several parts).
    const auto& spec = nn::TransformerLMOptions::spec();
    spec.set(options, "mlp_expansion", integer("mlp-expansion"));
    spec.set(options, "dropout", real("dropout"));
    spec.set(options, "attn_dropout", real("attn-dropout"));
    spec.set(options, "bias", flag("bias"));
    spec.set(options, "pre_ln", flag("pre-ln"));
    spec.set(options, "activation", text("activation"));
    spec.set(options, "attention_kernel", std::string(nn::to_string(kernel)));
    return nn::architecture_of(options);
  } catch (const c10::Error& e) {
    TORCH_CHECK(false, "checkpoint '", path, "' is damaged: its stored config: ", e.what_without_backtrace());
  }
}

}  // namespace tinylm::internal
