// nanoGPT checkpoints from tinylm ones, through LibTorch's pickle (torch.load reads it).
#include <tinylm/interop.h>

#include <tinylm/nn/model.h>

#include "internal/system.h"

#include <ATen/core/Dict.h>
#include <torch/serialize.h>
#include <torch/torch.h>

#include <filesystem>
#include <memory>
#include <sstream>

namespace tinylm::interop {

namespace {

std::vector<std::string> split(const std::string& name) {
  std::vector<std::string> parts;
  std::stringstream ss(name);
  for (std::string part; std::getline(ss, part, '.');) parts.push_back(part);
  return parts;
}

std::string join(const std::vector<std::string>& parts, size_t from) {
  std::string out;
  for (size_t i = from; i < parts.size(); ++i) out += (out.empty() ? "" : ".") + parts[i];
  return out;
}

}  // namespace

std::string nanogpt_name(const std::string& name) {
  const auto p = split(name);
  const bool leaf = p.size() >= 2 && (p.back() == "weight" || p.back() == "bias");
  if (leaf && p.size() == 2) {
    if (p[0] == "token_embedding" && p[1] == "weight") return "transformer.wte.weight";
    if (p[0] == "learned_positions" && p[1] == "weight") return "transformer.wpe.weight";
    if (p[0] == "ln_f") return "transformer.ln_f." + p[1];
    if (p[0] == "lm_head" && p[1] == "weight") return "lm_head.weight";
  }
  if (leaf && p[0] == "blocks" && p.size() >= 4) {
    const std::string block = "transformer.h." + p[1] + ".";
    const std::string rest = join(p, 2);
    static const std::pair<const char*, const char*> map[] = {
        {"ln1.", "ln_1."},         {"ln2.", "ln_2."},
        {"attn.qkv_proj.", "attn.c_attn."}, {"attn.out_proj.", "attn.c_proj."},
        {"mlp.fc.", "mlp.c_fc."},  {"mlp.proj.", "mlp.c_proj."}};
    for (const auto& [ours, theirs] : map) {
      const std::string prefix = ours;
      if (rest.rfind(prefix, 0) == 0 && rest.size() > prefix.size() &&
          rest.find('.', prefix.size()) == std::string::npos)
        return block + theirs + rest.substr(prefix.size());
    }
  }
  TORCH_CHECK(false, "nanoGPT has no parameter for tinylm's '", internal::printable(name), "'");
  return {};
}

NanoGPTFit nanogpt_fit(const train::Checkpoint& ck) {
  NanoGPTFit fit;
  if (ck.architecture.kind != "transformer") {
    fit.refusals.push_back("its model is a '" + ck.architecture.kind +
                           "' model; nanoGPT's GPT is a transformer (pre-LN, learned positions, tied head)");
    return fit;
  }
  auto model = nn::build_model(ck.architecture);
  const auto* t = dynamic_cast<const nn::TransformerLMImpl*>(model.get());
  TORCH_CHECK(t, "a transformer architecture did not build a TransformerLM");
  const auto& o = t->options;
  if (!o.pre_ln()) fit.refusals.push_back("its blocks are post-LN; nanoGPT's are pre-LN");
  if (o.positions() != nn::PositionEncoding::learned)
    fit.refusals.push_back(std::string("its positions are ") + nn::to_string(o.positions()) +
                           "; nanoGPT's are learned");
  if (!o.tie_weights()) fit.refusals.push_back("its LM head is untied; nanoGPT ties it to the token embedding");
  if (!o.bias())
    fit.refusals.push_back("it has no Linear biases but LayerNorm biases; nanoGPT's bias=False drops both");
  if (o.mlp_expansion() != 4)
    fit.refusals.push_back("its MLP expands " + std::to_string(o.mlp_expansion()) + "x; nanoGPT's 4x");
  if (o.activation() == nn::Activation::gelu_tanh)
    fit.notes.push_back("its MLP uses tanh-approximated GELU and nanoGPT exact GELU, so logits differ "
                        "slightly (train with activation gelu for an exact match)");
  return fit;
}

std::vector<std::string> export_nanogpt(const train::Checkpoint& ck, const std::string& path,
                                        bool overwrite) {
  const auto fit = nanogpt_fit(ck);
  if (!fit.refusals.empty()) {
    std::string why;
    for (const auto& r : fit.refusals) why += (why.empty() ? "" : "; ") + r;
    TORCH_CHECK(false, "cannot export '", ck.path, "' for nanoGPT: ", why);
  }
  namespace fs = std::filesystem;
  std::error_code ec;
  const auto status = fs::status(path, ec);
  TORCH_CHECK(!fs::exists(status) || (overwrite && fs::is_regular_file(status)), "'", path, "' ",
              fs::is_regular_file(status) ? "already exists: choose another path, or overwrite it on purpose"
                                          : "exists and is not a regular file: choose another path");
  const auto parent = fs::path(path).has_parent_path() ? fs::path(path).parent_path() : fs::path(".");
  TORCH_CHECK(fs::is_directory(parent, ec), "cannot write '", path, "': directory '", parent.string(),
              "' does not exist");

  auto model = nn::build_model(ck.architecture);
  const auto& o = dynamic_cast<const nn::TransformerLMImpl&>(*model).options;
  c10::Dict<std::string, at::Tensor> state;
  for (const auto& name : ck.parameter_names) state.insert(nanogpt_name(name), ck.model.at(name).contiguous());
  // nanoGPT's state dict names the tied head under both names, as PyTorch's does.
  state.insert("lm_head.weight", ck.model.at("token_embedding.weight").contiguous());

  c10::impl::GenericDict args(c10::StringType::get(), c10::AnyType::get());
  args.insert("n_layer", o.n_layers());
  args.insert("n_head", o.n_heads());
  args.insert("n_embd", o.d_model());
  args.insert("block_size", o.context_length());
  args.insert("bias", o.bias());
  args.insert("vocab_size", o.vocab_size());
  args.insert("dropout", o.dropout());
  c10::Dict<std::string, std::string> architecture;
  architecture.insert("kind", ck.architecture.kind);
  for (const auto& [key, value] : ck.architecture.options) architecture.insert(key, value);

  c10::impl::GenericDict top(c10::StringType::get(), c10::AnyType::get());
  top.insert("model", state);
  top.insert("model_args", args);
  top.insert("iter_num", ck.state.step);
  top.insert("best_val_loss", ck.state.best_val_loss < 1e299 ? ck.state.best_val_loss : 0.0);
  top.insert("tinylm_architecture", architecture);
  const std::vector<char> bytes = torch::pickle_save(top);
  internal::write_file_atomically(path, std::string(bytes.begin(), bytes.end()), "export");
  return fit.notes;
}

}  // namespace tinylm::interop
