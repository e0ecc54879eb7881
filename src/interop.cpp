// nanoGPT checkpoints from tinylm ones, through LibTorch's pickle (torch.load reads it).
#include <tinylm/interop.h>

#include <tinylm/nn/model.h>

#include "internal/system.h"

#include <ATen/core/Dict.h>
#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/serialization/export.h>
#include <torch/csrc/jit/serialization/pickler.h>
#include <torch/serialize.h>
#include <torch/torch.h>

#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <set>
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

// archive/data.pkl (pickle protocol 2) and archive/data/N (tensor storages), as Python
// writes them. torch::pickle_save writes the same archive but tags every dict with its
// TorchScript type through torch.jit._pickle.restore_type_tag, a global PyTorch 2.6's
// torch.load refuses under its default weights_only=True; untagged, the pickle uses only
// what that loader allows (dicts, strings, numbers, torch._utils._rebuild_tensor_v2,
// torch.*Storage, collections.OrderedDict).
std::string torch_save_bytes(const c10::IValue& value) {
  std::vector<char> pickle;
  torch::jit::Pickler pickler([&](const char* data, size_t size) { pickle.insert(pickle.end(), data, data + size); },
                              /*tensor_table=*/nullptr, /*type_renamer=*/nullptr,
                              /*memoized_class_types=*/nullptr, /*get_tensor_id=*/nullptr,
                              /*tag_aggregates=*/false);
  pickler.protocol();
  pickler.pushIValue(value);
  pickler.stop();
  std::string archive;
  caffe2::serialize::PyTorchStreamWriter writer([&](const void* data, size_t size) {
    archive.append(static_cast<const char*>(data), size);
    return size;
  });
  torch::jit::writeArchiveAndTensors("data", pickle.data(), pickle.size(), pickler.tensorData(), writer);
  writer.writeEndOfFile();
  return archive;
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
  internal::write_file_atomically(path, torch_save_bytes(top), "export");
  return fit.notes;
}

// ---- import ------------------------------------------------------------------------

NanoGPTImport import_nanogpt(const std::string& path, int64_t n_heads) {
  TORCH_CHECK(n_heads >= 0, "import: n_heads must be >= 0 (0 = the checkpoint's), got ", n_heads);
  const std::string bytes = internal::read_regular_file(path, "nanoGPT checkpoint");
  // torch.save's format since PyTorch 1.6: a zip archive holding the pickle and the tensors.
  TORCH_CHECK(bytes.rfind("PK\x03\x04", 0) == 0, "'", path, "' is not a file Python's torch.save "
              "wrote (not its zip format; PyTorch before 1.6 wrote another: save it again with a newer one)");
  c10::IValue top;
  try {
    top = torch::pickle_load(std::vector<char>(bytes.begin(), bytes.end()));
  } catch (const std::exception& e) {
    std::string why = e.what();
    if (auto* c10_error = dynamic_cast<const c10::Error*>(&e)) why = c10_error->what_without_backtrace();
    why = why.substr(0, std::min(why.find('\n'), size_t{160}));
    // LibTorch's unpickler reads dicts, lists and tensors; before 2.1 it lacks APPEND (a
    // one-element list: an optimizer's param_groups) and an OrderedDict (a state_dict()).
    TORCH_CHECK(false, "'", path, "' holds a pickle this LibTorch cannot read (", internal::printable(why),
                "): save plain dicts of tensors in Python, e.g. torch.save({'model': dict(ck['model']), "
                "'model_args': ck['model_args']}, PATH)");
  }
  TORCH_CHECK(top.isGenericDict(), "'", path, "' holds a ", top.tagKind(),
              ", not a dict: expected nanoGPT's checkpoint or a state dict");
  NanoGPTImport result;
  auto state = top.toGenericDict();
  std::optional<c10::impl::GenericDict> args;
  if (state.contains("model") && state.at("model").isGenericDict()) {
    const auto outer = state;
    state = outer.at("model").toGenericDict();
    if (outer.contains("model_args") && outer.at("model_args").isGenericDict())
      args = outer.at("model_args").toGenericDict();
    if (outer.contains("iter_num") && outer.at("iter_num").isInt()) result.iter_num = outer.at("iter_num").toInt();
  }
  std::map<std::string, torch::Tensor> weights;
  int64_t masks = 0;
  bool converted = false, prefixed = false;
  for (const auto& entry : state) {
    TORCH_CHECK(entry.key().isString(), "'", path, "': its state dict has a key that is not a string");
    std::string name = entry.key().toStringRef();
    if (name.rfind("_orig_mod.", 0) == 0) {
      name = name.substr(10);
      prefixed = true;
    }
    TORCH_CHECK(entry.value().isTensor(), "'", path, "': '", internal::printable(name), "' is a ",
                entry.value().tagKind(), ", not a tensor");
    auto t = entry.value().toTensor();
    const std::string suffix = ".attn.bias";  // nanoGPT's causal mask, without flash attention
    if (t.dim() == 4 && name.size() > suffix.size() &&
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0) {
      ++masks;
      continue;
    }
    if (t.scalar_type() != torch::kFloat) {
      TORCH_CHECK(t.is_floating_point(), "'", path, "': '", internal::printable(name), "' is ",
                  t.scalar_type(), ", not floating point");
      t = t.to(torch::kFloat);
      converted = true;
    }
    weights[name] = t.contiguous();
  }
  if (prefixed) result.notes.push_back("stripped torch.compile's '_orig_mod.' prefix");
  if (masks) result.notes.push_back("skipped " + std::to_string(masks) + " causal-mask buffers (attn.bias)");
  if (converted) result.notes.push_back("converted weights to float32");

  auto need = [&](const std::string& name, int64_t dims) -> const torch::Tensor& {
    auto it = weights.find(name);
    TORCH_CHECK(it != weights.end(), "'", path, "' has no '", name,
                "': not the state dict of nanoGPT's GPT (pre-LN, learned positions)");
    TORCH_CHECK(it->second.dim() == dims, "'", path, "': '", name, "' has shape ", it->second.sizes(),
                ", expected ", dims, " dimensions");
    return it->second;
  };
  const auto& wte = need("transformer.wte.weight", 2);
  const auto& wpe = need("transformer.wpe.weight", 2);
  const int64_t V = wte.size(0), D = wte.size(1), C = wpe.size(0);
  int64_t L = 0;
  while (weights.count("transformer.h." + std::to_string(L) + ".ln_1.weight")) ++L;
  TORCH_CHECK(L >= 1, "'", path, "' has no transformer.h.0 block");
  const bool bias = weights.count("transformer.h.0.attn.c_attn.bias") > 0;
  auto arg = [&](const char* key) -> std::optional<int64_t> {
    if (!args || !args->contains(key) || !args->at(key).isInt()) return std::nullopt;
    return args->at(key).toInt();
  };
  int64_t H = n_heads;
  if (H == 0) {
    TORCH_CHECK(arg("n_head"), "'", path, "' does not say its number of heads (a bare state dict, "
                "or no model_args): give the number of heads");
    H = *arg("n_head");
  }
  const std::pair<const char*, int64_t> implied[] = {
      {"n_layer", L}, {"n_embd", D}, {"vocab_size", V}, {"block_size", C}, {"n_head", H}};
  for (const auto& [key, value] : implied) {
    const auto stated = arg(key);
    TORCH_CHECK(!stated || *stated == value, "'", path, "': model_args says ", key, "=", *stated,
                " but ", n_heads && std::string(key) == "n_head" ? "the number of heads given is "
                                                                 : "the weights imply ", value);
  }
  TORCH_CHECK(H >= 1 && D % H == 0, "'", path, "': ", H, " heads do not divide the width ", D);
  const bool tied = !weights.count("lm_head.weight") || torch::equal(weights.at("lm_head.weight"), wte);

  auto options = nn::TransformerLMOptions(V, C, D, H, L)
                     .activation(nn::Activation::gelu)
                     .bias(bias)
                     .tie_weights(tied)
                     .pre_ln(true)
                     .positions(nn::PositionEncoding::learned)
                     .mlp_expansion(4);
  result.model = nn::build_model(nn::architecture_of(options));  // checks that it fits in memory
  std::set<std::string> used;
  torch::NoGradGuard no_grad;
  for (auto& p : result.model->named_parameters()) {
    const std::string theirs = nanogpt_name(p.key());
    auto it = weights.find(theirs);
    if (it == weights.end() && !bias && p.key().size() > 5 &&
        p.key().compare(p.key().size() - 5, 5, ".bias") == 0) {
      p.value().zero_();  // bias=False: nanoGPT's LayerNorm has no bias, tinylm's is zero
      continue;
    }
    TORCH_CHECK(it != weights.end(), "'", path, "' has no '", theirs, "', which nanoGPT's GPT with ",
                L, " layers", bias ? "" : " and no biases", " has");
    TORCH_CHECK(it->second.sizes() == p.value().sizes(), "'", path, "': '", theirs, "' has shape ",
                it->second.sizes(), " but a GPT with n_embd=", D, ", vocab_size=", V,
                ", block_size=", C, " has ", p.value().sizes());
    p.value().copy_(it->second);
    used.insert(theirs);
  }
  if (tied) used.insert("lm_head.weight");
  for (const auto& [name, t] : weights)
    TORCH_CHECK(used.count(name), "'", path, "' has '", internal::printable(name),
                "', which nanoGPT's GPT with these model args does not have (a different model?)");
  if (!bias) result.notes.push_back("bias=False: tinylm's LayerNorm biases are set to zero");
  if (!tied) result.notes.push_back("its lm_head differs from its token embedding: an untied model");
  return result;
}

}  // namespace tinylm::interop
