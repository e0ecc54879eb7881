// tinylm inspect CKPT|DIR [--verify] [--json]: what a checkpoint holds.
#include "../command.h"

#include <tinylm/log.h>
#include <tinylm/nn/model.h>
#include <tinylm/train/checkpoint.h>

#include <nlohmann/json.hpp>
#include <spdlog/fmt/fmt.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <sstream>
#include <string>

namespace tinylm::cli {

namespace {

struct InspectArgs {
  std::string checkpoint;
  bool verify = false, json = false;
};

/// "[64, 32]"
std::string shape_text(const torch::Tensor& t) {
  std::string out = "[";
  for (int64_t i = 0; i < t.dim(); ++i) out += (i ? ", " : "") + std::to_string(t.size(i));
  return out + "]";
}

/// PyTorch's spelling: float32, int64, ...
std::string dtype_name(torch::ScalarType t) {
  switch (t) {
    case torch::kFloat: return "float32";
    case torch::kDouble: return "float64";
    case torch::kHalf: return "float16";
    case torch::kBFloat16: return "bfloat16";
    case torch::kLong: return "int64";
    case torch::kInt: return "int32";
    case torch::kByte: return "uint8";
    default: return c10::toString(t);
  }
}

/// 1234567 -> "1,234,567"
std::string grouped(int64_t n) {
  std::string digits = std::to_string(n), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

}  // namespace

nlohmann::ordered_json checkpoint_json(const train::Checkpoint& ck) {
  const auto& st = ck.state;
  int64_t total = 0;
  nlohmann::ordered_json params = nlohmann::ordered_json::array();
  for (const auto& name : ck.parameter_names) {
    const auto& t = ck.model.at(name);
    total += t.numel();
    params.push_back({{"name", name}, {"shape", t.sizes().vec()},
                      {"dtype", dtype_name(t.scalar_type())}, {"count", t.numel()},
                      {"norm", t.to(torch::kFloat64).norm().item<double>()}});
  }
  nlohmann::ordered_json options = nlohmann::ordered_json::object();
  for (const auto& [k, v] : ck.architecture.options) options[k] = v;
  auto generator_bytes = [](const torch::Tensor& t) { return t.defined() ? t.numel() : int64_t{0}; };
  // One dropout stream per rank that trained it.
  const int64_t dropout_streams =
      st.dropout_rng_state.defined() ? (st.dropout_rng_state.dim() == 2 ? st.dropout_rng_state.size(0) : 1) : 0;
  nlohmann::ordered_json tokenizer = nullptr;
  if (!ck.tokenizer_kind.empty())
    tokenizer = {{"kind", ck.tokenizer_kind}, {"model_bytes", ck.tokenizer_model.size()}};
  std::error_code ec;
  const auto bytes = std::filesystem::file_size(ck.path, ec);
  return {{"path", ck.path}, {"bytes", ec ? 0 : static_cast<int64_t>(bytes)}, {"format_version", ck.format_version},
          {"tinylm_version", ck.tinylm_version}, {"checksum", "ok"},
          {"step", st.step}, {"world_size", st.world_size},
          {"best_val_loss", st.best_val_loss < 1e299 ? nlohmann::ordered_json(st.best_val_loss) : nullptr},
          {"model", {{"kind", ck.architecture.kind}, {"version", ck.architecture.version}, {"options", options}}},
          {"tokenizer", tokenizer}, {"parameter_count", total}, {"parameters", params},
          {"optimizer", {{"kind", ck.optimizer_kind}, {"tensors", ck.optimizer.size()}}},
          {"generators", {{"data_bytes", generator_bytes(st.data_rng_state)},
                          {"dropout_streams", dropout_streams},
                          {"dropout_bytes", generator_bytes(st.dropout_rng_state)}}},
          {"recipe", ck.recipe}};
}

namespace {

/// Reading the file checks its header, size, checksum and every entry; --verify also
/// rebuilds the model from its architecture, loads the weights (names, shapes, dtypes,
/// finite values) and runs one forward pass.
int run_inspect(const InspectArgs& a) {
  const auto ck = open_checkpoint(a.checkpoint);
  auto j = checkpoint_json(ck);
  std::string verified;
  if (a.verify) {
    auto model = nn::build_model(ck.architecture);
    train::load_model_state(ck, *model);
    model->eval();
    torch::NoGradGuard no_grad;
    const int64_t T = std::max<int64_t>(1, std::min<int64_t>(8, model->context_length()));
    auto logits = model->forward(torch::zeros({1, T}, torch::kLong)).logits;
    TORCH_CHECK(logits.isfinite().all().item<bool>(), "checkpoint '", ck.path,
                "': the rebuilt model gives non-finite logits");
    verified = "model rebuilt from its architecture, " + std::to_string(ck.parameter_names.size()) +
               " weights fit, logits of a 1 x " + std::to_string(T) + " batch finite";
  }
  // Built (and so checked) only for what it says; a SentencePiece model needs its module.
  std::string tokenizer =
      "none stored (an import without --tokenizer, or written before tinylm stored tokenizers): the task's own symbols";
  if (!ck.tokenizer_kind.empty()) {
    tokenizer = ck.tokenizer_kind + " (" + std::to_string(ck.tokenizer_model.size()) + " bytes of model)";
    if (a.verify) {
      const auto t = train::checkpoint_tokenizer(ck);
      tokenizer = t->describe();
      j["tokenizer"]["vocab_size"] = t->vocab_size();
    }
  }
  if (a.json) {
    if (a.verify) j["verified"] = verified;
    std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    return 0;
  }
  const auto& st = ck.state;
  std::printf("checkpoint %s: %s bytes, format %u (tinylm %s), checksum ok\n", ck.path.c_str(),
              grouped(j["bytes"].get<int64_t>()).c_str(), ck.format_version,
              ck.tinylm_version.empty() ? "before 0.1" : printable(ck.tinylm_version).c_str());
  size_t optimizer_tensors = ck.optimizer.size();
  for (const auto& group : ck.optimizer_groups)
    for (const auto& state : group) optimizer_tensors += state.size();
  const std::string optimizer_state = std::to_string(optimizer_tensors) + " tensors";
  std::printf("step %lld | world size %lld | best validation loss %s | optimizer %s (%s)\n",
              static_cast<long long>(st.step), static_cast<long long>(st.world_size),
              st.best_val_loss < 1e299 ? fmt::format("{:.6f}", st.best_val_loss).c_str() : "none yet",
              ck.optimizer_kind.empty() ? "none" : printable(ck.optimizer_kind).c_str(), optimizer_state.c_str());
  std::string opts;
  for (const auto& [k, v] : ck.architecture.options) opts += " " + printable(k) + "=" + printable(v);
  std::printf("model %s (version %lld):%s\n", printable(ck.architecture.kind).c_str(),
              static_cast<long long>(ck.architecture.version), opts.c_str());
  std::printf("tokenizer: %s\n", printable(tokenizer).c_str());
  const auto& gen = j["generators"];
  const auto dropout_streams = gen["dropout_streams"].get<int64_t>();
  std::printf("generators: data %lld bytes, dropout %lld stream(s) of %lld bytes\n",
              static_cast<long long>(gen["data_bytes"].get<int64_t>()), static_cast<long long>(dropout_streams),
              static_cast<long long>(dropout_streams ? gen["dropout_bytes"].get<int64_t>() / dropout_streams : 0));
  size_t width = 9;
  for (const auto& name : ck.parameter_names) width = std::max(width, printable(name).size());
  std::printf("\n%-*s  %-14s %-8s %12s %12s\n", static_cast<int>(width), "parameter", "shape", "dtype", "count", "norm");
  for (const auto& p : j["parameters"])
    std::printf("%-*s  %-14s %-8s %12s %12.6g\n", static_cast<int>(width), printable(p["name"].get<std::string>()).c_str(),
                shape_text(ck.model.at(p["name"].get<std::string>())).c_str(),
                p["dtype"].get<std::string>().c_str(), grouped(p["count"].get<int64_t>()).c_str(),
                p["norm"].get<double>());
  std::printf("%-*s  %-14s %-8s %12s\n", static_cast<int>(width), "total", "", "",
              grouped(j["parameter_count"].get<int64_t>()).c_str());
  if (!ck.recipe.empty()) {
    std::printf("\nrecipe (the run config it was trained with):\n");
    std::istringstream lines(ck.recipe);
    for (std::string line; std::getline(lines, line);)
      if (!line.empty()) std::printf("  %s\n", printable(line).c_str());
  }
  if (a.verify) std::printf("\nverify: %s: ok\n", verified.c_str());
  return 0;
}

}  // namespace

Command add_inspect(CLI::App& app) {
  auto args = std::make_shared<InspectArgs>();
  InspectArgs& inspect_args = *args;
  auto* inspect_cmd = app.add_subcommand("inspect", "what a checkpoint holds: header, model, parameters");
  inspect_cmd->add_option("checkpoint", inspect_args.checkpoint, "checkpoint file or run directory")->required();
  inspect_cmd->add_flag("--verify", inspect_args.verify,
                        "also rebuild the model, load the weights and run it once");
  inspect_cmd->add_flag("--json", inspect_args.json, "one JSON object instead of text");

  return {inspect_cmd, [args] { return run_inspect(*args); }};
}

}  // namespace tinylm::cli
