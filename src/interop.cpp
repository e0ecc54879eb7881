// nanoGPT checkpoints from tinylm ones, through LibTorch's pickle (torch.load reads it).
#include <tinylm/error.h>
#include <tinylm/interop.h>

#include <tinylm/nn/model.h>
#include <tinylm/nn/model_kind.h>

#include "internal/files.h"
#include "internal/text.h"
#include "internal/torch_file.h"

#include <ATen/core/Dict.h>
#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/serialization/export.h>
#include <torch/csrc/jit/serialization/pickler.h>
#include <torch/serialize.h>
#include <torch/types.h>
#include <torch/utils.h>

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
std::string torch_save_bytes(const c10::IValue& value) { return internal::torch_save_archive(value, nullptr); }

NanoGPTFit nanogpt_fit(const train::Checkpoint& ck) {
  NanoGPTFit fit;
  if (ck.architecture.kind != "transformer") {
    fit.refusals.push_back("its model is a '" + ck.architecture.kind +
                           "' model; nanoGPT's GPT is a transformer (pre-LN, learned positions, tied head)");
    return fit;
  }
  const auto o = nn::transformer_options(ck.architecture);
  const auto& block = o.block();
  if (!block.pre_ln()) fit.refusals.push_back("its blocks are post-LN; nanoGPT's are pre-LN");
  if (o.positions() != nn::PositionEncoding::learned)
    fit.refusals.push_back(std::string("its positions are ") + nn::to_string(o.positions()) +
                           "; nanoGPT's are learned");
  if (!o.tie_weights()) fit.refusals.push_back("its LM head is untied; nanoGPT ties it to the token embedding");
  const bool bias = block.attention().bias(), norm_bias = block.norm().bias();
  if (!bias && norm_bias) {
    // nanoGPT's bias=False has no LayerNorm biases either: exported where tinylm's are zero.
    for (const auto& [name, t] : ck.model)
      if (name.size() > 5 && name.compare(name.size() - 5, 5, ".bias") == 0 && t.count_nonzero().item<int64_t>() != 0) {
        fit.refusals.push_back("it has no Linear biases but non-zero LayerNorm biases ('" + internal::printable(name) +
                               "'); nanoGPT's bias=False has neither");
        break;
      }
  }
  if (bias && !norm_bias)
    fit.notes.push_back("its LayerNorms have no biases; nanoGPT's bias=True has them: written as zeros");
  const int64_t hidden = block.mlp().hidden() > 0 ? block.mlp().hidden() : block.mlp().expansion() * o.d_model();
  if (hidden != 4 * o.d_model())
    fit.refusals.push_back("its MLP is " + std::to_string(hidden) + " wide; nanoGPT's is 4 x n_embd = " +
                           std::to_string(4 * o.d_model()));
  if (block.mlp().activation() == nn::Activation::swiglu)
    fit.refusals.push_back("its MLP is SwiGLU (gated); nanoGPT's is GELU");
  if (block.norm().kind() != nn::NormKind::layer_norm)
    fit.refusals.push_back("its norms are RMSNorm; nanoGPT's are LayerNorm");
  if (!block.norm().gain()) fit.refusals.push_back("its norms have no gain; nanoGPT's LayerNorms have one");
  const int64_t kv_heads = block.attention().n_kv_heads();
  if (kv_heads != 0 && kv_heads != o.n_heads())
    fit.refusals.push_back("its attention shares key/value heads (n_kv_heads " + std::to_string(kv_heads) + " for " +
                           std::to_string(o.n_heads()) + " query heads); nanoGPT's has one per query head");
  if (block.mlp().activation() == nn::Activation::gelu_tanh)
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
  internal::check_output_path(path, overwrite);

  const auto o = nn::transformer_options(ck.architecture);
  const bool bias = o.block().attention().bias(), norm_bias = o.block().norm().bias();
  c10::Dict<std::string, at::Tensor> state;
  for (const auto& name : ck.parameter_names) {
    const bool layer_norm_bias = name.size() > 5 && name.compare(name.size() - 5, 5, ".bias") == 0;
    if (!bias && layer_norm_bias) continue;  // zero (checked above): nanoGPT's bias=False has none
    state.insert(nanogpt_name(name), ck.model.at(name).contiguous());
    // A LayerNorm without a bias in a model with Linear biases: nanoGPT's bias=True has
    // one, and a zero bias computes the same.
    const bool layer_norm_gain = name.size() > 7 && name.compare(name.size() - 7, 7, ".weight") == 0 &&
                                 ck.model.at(name).dim() == 1;
    if (bias && !norm_bias && layer_norm_gain) {
      const std::string bias_name = name.substr(0, name.size() - 7) + ".bias";
      state.insert(nanogpt_name(bias_name), torch::zeros_like(ck.model.at(name)).contiguous());
    }
  }
  // nanoGPT's state dict names the tied head under both names, as PyTorch's does.
  state.insert("lm_head.weight", ck.model.at("token_embedding.weight").contiguous());

  c10::impl::GenericDict args(c10::StringType::get(), c10::AnyType::get());
  args.insert("n_layer", o.n_layers());
  args.insert("n_head", o.n_heads());
  args.insert("n_embd", o.d_model());
  args.insert("block_size", o.context_length());
  args.insert("bias", bias);
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
  // Read with tinylm's own checked reader (internal/torch_file.h), never LibTorch's
  // unpickler: the file comes from elsewhere.
  const internal::TorchFile file(internal::read_regular_file(path, "nanoGPT checkpoint"), path);
  const std::string where = "'" + internal::printable(path) + "'";
  using Kind = internal::PyValue::Kind;
  const auto& top = file.root();
  TORCH_CHECK(top.kind == Kind::dict, where, " holds a ", top.kind_name(),
              ", not a dict: expected nanoGPT's checkpoint or a state dict");
  NanoGPTImport result;
  const internal::PyValue* state = &top;
  const internal::PyValue* args = nullptr;
  if (const auto* model = top.find("model"); model && model->kind == Kind::dict) {
    state = model;
    if (const auto* a = top.find("model_args"); a && a->kind == Kind::dict) args = a;
    if (const auto* i = top.find("iter_num"); i && i->kind == Kind::integer) result.iter_num = i->integer;
    if (top.find("optimizer"))
      result.notes.push_back("its optimizer state is not imported: training it further starts a fresh optimizer");
  }

  // Names and shapes first, from the file's own description: nothing is read or built
  // until every key and shape has been checked.
  std::map<std::string, const internal::TensorRecord*> weights;
  int64_t masks = 0;
  bool converted = false, prefixed = false;
  for (const auto& [key, value] : state->entries) {
    TORCH_CHECK(key->kind == Kind::string, where, ": its state dict has a key that is a ", key->kind_name(),
                ", not a string");
    std::string name = key->text;
    if (name.rfind("_orig_mod.", 0) == 0) {
      name = name.substr(10);
      prefixed = true;
    }
    TORCH_CHECK(value->kind == Kind::tensor, where, ": '", internal::printable(name), "' is a ",
                value->kind_name(), ", not a tensor");
    const auto& record = *value->tensor;
    const std::string suffix = ".attn.bias";  // nanoGPT's causal mask, without flash attention
    if (record.sizes.size() == 4 && name.size() > suffix.size() &&
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0) {
      ++masks;
      continue;
    }
    TORCH_CHECK(c10::isFloatingType(record.dtype), where, ": '", internal::printable(name), "' is ",
                record.dtype, ", not floating point");
    converted = converted || record.dtype != c10::ScalarType::Float;
    TORCH_CHECK(weights.emplace(name, &record).second, where, " holds '", internal::printable(name), "' twice");
  }
  if (prefixed) result.notes.push_back("stripped torch.compile's '_orig_mod.' prefix");
  if (masks) result.notes.push_back("skipped " + std::to_string(masks) + " causal-mask buffers (attn.bias)");
  if (converted) result.notes.push_back("converted weights to float32");

  auto shape_text = [](const std::vector<int64_t>& sizes) {
    std::string out = "[";
    for (size_t i = 0; i < sizes.size(); ++i) out += (i ? ", " : "") + std::to_string(sizes[i]);
    return out + "]";
  };
  auto need = [&](const std::string& name, size_t dims) -> const internal::TensorRecord& {
    auto it = weights.find(name);
    TORCH_CHECK(it != weights.end(), where, " has no '", name,
                "': not the state dict of nanoGPT's GPT (pre-LN, learned positions)");
    TORCH_CHECK(it->second->sizes.size() == dims, where, ": '", name, "' has shape ", shape_text(it->second->sizes),
                ", expected ", dims, " dimensions");
    return *it->second;
  };
  const auto& wte = need("transformer.wte.weight", 2);
  const auto& wpe = need("transformer.wpe.weight", 2);
  const int64_t V = wte.sizes[0], D = wte.sizes[1], C = wpe.sizes[0];
  TORCH_CHECK(V >= 1 && D >= 1 && C >= 1, where, ": its embeddings are empty");
  int64_t L = 0;
  while (weights.count("transformer.h." + std::to_string(L) + ".ln_1.weight")) ++L;
  TORCH_CHECK(L >= 1, where, " has no transformer.h.0 block");
  const bool bias = weights.count("transformer.h.0.attn.c_attn.bias") > 0;
  auto arg = [&](const char* key) -> std::optional<int64_t> {
    const auto* v = args ? args->find(key) : nullptr;
    if (!v || v->kind != Kind::integer) return std::nullopt;
    return v->integer;
  };
  int64_t H = n_heads;
  if (H == 0) {
    TINYLM_CHECK(arg("n_head"), ErrorKind::heads_unknown, where, " does not say its number of heads (a bare state dict, "
                "or no model_args): give the number of heads");
    H = *arg("n_head");
  }
  const std::pair<const char*, int64_t> implied[] = {
      {"n_layer", L}, {"n_embd", D}, {"vocab_size", V}, {"block_size", C}, {"n_head", H}};
  for (const auto& [key, value] : implied) {
    const auto stated = arg(key);
    TORCH_CHECK(!stated || *stated == value, where, ": model_args says ", key, "=", *stated,
                " but ", n_heads && std::string(key) == "n_head" ? "the number of heads given is "
                                                                 : "the weights imply ", value);
  }
  TORCH_CHECK(H >= 1 && D % H == 0, where, ": ", H, " heads do not divide the width ", D);
  if (const auto* b = args ? args->find("bias") : nullptr; b && b->kind == Kind::boolean)
    TORCH_CHECK(b->boolean == bias, where, ": model_args says bias=", b->boolean ? "True" : "False",
                " but the weights ", bias ? "have" : "lack", " biases");
  double dropout = 0.0;
  if (const auto* d = args ? args->find("dropout") : nullptr; d && (d->kind == Kind::real || d->kind == Kind::integer)) {
    dropout = d->kind == Kind::real ? d->real : static_cast<double>(d->integer);
    TORCH_CHECK(dropout >= 0 && dropout < 1, where, ": model_args says dropout=", dropout, ", outside [0, 1)");
  }

  // Every weight nanoGPT's GPT with these sizes has, with its shape, and nothing else.
  auto options = nn::TransformerLMOptions(V, C, D, H, L).positions(nn::PositionEncoding::learned);
  const auto& spec = nn::TransformerLMOptions::spec();
  spec.set(options, "activation", std::string("gelu"));
  spec.set(options, "bias", bias);
  spec.set(options, "layer_norm_bias", bias);
  spec.set(options, "pre_ln", true);
  spec.set(options, "mlp_expansion", int64_t{4});
  spec.set(options, "dropout", dropout);
  std::map<std::string, std::vector<int64_t>> expected = {
      {"transformer.wte.weight", {V, D}}, {"transformer.wpe.weight", {C, D}}, {"transformer.ln_f.weight", {D}}};
  if (bias) expected["transformer.ln_f.bias"] = {D};
  for (int64_t l = 0; l < L; ++l) {
    const std::string b = "transformer.h." + std::to_string(l) + ".";
    const std::pair<const char*, std::vector<int64_t>> per_block[] = {
        {"ln_1.weight", {D}},          {"attn.c_attn.weight", {3 * D, D}}, {"attn.c_proj.weight", {D, D}},
        {"ln_2.weight", {D}},          {"mlp.c_fc.weight", {4 * D, D}},    {"mlp.c_proj.weight", {D, 4 * D}}};
    for (const auto& [name, shape] : per_block) expected[b + name] = shape;
    if (bias) {
      const std::pair<const char*, std::vector<int64_t>> biases[] = {
          {"ln_1.bias", {D}}, {"attn.c_attn.bias", {3 * D}}, {"attn.c_proj.bias", {D}},
          {"ln_2.bias", {D}}, {"mlp.c_fc.bias", {4 * D}},    {"mlp.c_proj.bias", {D}}};
      for (const auto& [name, shape] : biases) expected[b + name] = shape;
    }
  }
  const auto head = weights.find("lm_head.weight");
  if (head != weights.end()) expected["lm_head.weight"] = {V, D};
  for (const auto& [name, shape] : expected) {
    auto it = weights.find(name);
    TORCH_CHECK(it != weights.end(), where, " has no '", name, "', which nanoGPT's GPT with ", L, " layers",
                bias ? "" : " and no biases", " has");
    TORCH_CHECK(it->second->sizes == shape, where, ": '", name, "' has shape ", shape_text(it->second->sizes),
                " but a GPT with n_embd=", D, ", vocab_size=", V, ", block_size=", C, " has ", shape_text(shape));
  }
  for (const auto& [name, record] : weights)
    TORCH_CHECK(expected.count(name), where, " has '", internal::printable(name),
                "', which nanoGPT's GPT with these model args does not have (a different model?)");

  // Checked: read the weights, one at a time, into the model.
  auto read = [&](const std::string& name) { return file.tensor(*weights.at(name)).to(torch::kFloat); };
  bool tied = true;
  if (head != weights.end()) {
    const auto& h = *head->second;
    const bool same_view = h.storage_key == wte.storage_key && h.offset == wte.offset && h.strides == wte.strides;
    tied = same_view || torch::equal(read("lm_head.weight"), read("transformer.wte.weight"));
  }
  options.tie_weights(tied);
  result.model = nn::build_model(nn::ModelOptions("transformer", options));  // checks that it fits in memory
  torch::NoGradGuard no_grad;
  for (auto& p : result.model->named_parameters()) {
    const std::string theirs = nanogpt_name(p.key());
    TORCH_CHECK(weights.count(theirs), where, " has no '", theirs, "'");
    p.value().copy_(read(theirs));
  }
  if (!tied) result.notes.push_back("its lm_head differs from its token embedding: an untied model");
  if (dropout > 0) result.notes.push_back("dropout " + std::to_string(dropout) + " from its model_args");
  return result;
}

}  // namespace tinylm::interop

namespace tinylm::internal {

std::string torch_save_archive(const c10::IValue& value, const std::function<void(std::vector<char>&)>& change_pickle) {
  std::vector<char> pickle;
  torch::jit::Pickler pickler([&](const char* data, size_t size) { pickle.insert(pickle.end(), data, data + size); },
                              /*tensor_table=*/nullptr, /*type_renamer=*/nullptr,
                              /*memoized_class_types=*/nullptr, /*get_tensor_id=*/nullptr,
                              /*tag_aggregates=*/false);
  pickler.protocol();
  pickler.pushIValue(value);
  pickler.stop();
  if (change_pickle) change_pickle(pickle);
  std::string archive;
  caffe2::serialize::PyTorchStreamWriter writer([&](const void* data, size_t size) {
    archive.append(static_cast<const char*>(data), size);
    return size;
  });
  torch::jit::writeArchiveAndTensors("data", pickle.data(), pickle.size(), pickler.tensorData(), writer);
  writer.writeEndOfFile();
  return archive;
}

}  // namespace tinylm::internal
