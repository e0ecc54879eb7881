// PyTorch interop: nanoGPT's names and layout for a tinylm transformer, refusals for
// what nanoGPT cannot express, and the exported file read back through LibTorch's pickle.
// Python's side (nanoGPT's GPT loading the export) is tests/cli/test_nanogpt.sh.
#include "test_util.h"

#include <tinylm/interop.h>
#include <tinylm/nn/model.h>
#include <tinylm/train/checkpoint.h>

#include <torch/serialize.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

using namespace tinylm;
using tinylm::test::error_message;

namespace {

/// A checkpoint of `model` (weights only) in `dir`, read back.
train::Checkpoint checkpoint_of(nn::LanguageModelImpl& model, const std::filesystem::path& dir,
                                const std::string& name) {
  const auto path = (dir / (name + ".ckpt")).string();
  train::TrainingState state;
  state.step = 7;
  train::save_checkpoint(path, model, nullptr, state);
  return train::read_checkpoint(path);
}

nn::TransformerLMOptions small() { return nn::TransformerLMOptions(10, 8, 16, 2, 2); }

c10::impl::GenericDict read_pickle(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return torch::pickle_load(bytes).toGenericDict();
}

}  // namespace

TEST_CASE("every transformer parameter has its nanoGPT name", "[interop]") {
  nn::TransformerLM model(small());
  std::set<std::string> names;
  for (const auto& p : model->named_parameters()) names.insert(interop::nanogpt_name(p.key()));
  CHECK(names.size() == model->named_parameters().size());  // no two share a name
  CHECK(interop::nanogpt_name("token_embedding.weight") == "transformer.wte.weight");
  CHECK(interop::nanogpt_name("learned_positions.weight") == "transformer.wpe.weight");
  CHECK(interop::nanogpt_name("blocks.1.attn.qkv_proj.weight") == "transformer.h.1.attn.c_attn.weight");
  CHECK(interop::nanogpt_name("blocks.0.attn.out_proj.bias") == "transformer.h.0.attn.c_proj.bias");
  CHECK(interop::nanogpt_name("blocks.0.mlp.fc.weight") == "transformer.h.0.mlp.c_fc.weight");
  CHECK(interop::nanogpt_name("blocks.0.mlp.proj.weight") == "transformer.h.0.mlp.c_proj.weight");
  CHECK(interop::nanogpt_name("blocks.12.ln2.bias") == "transformer.h.12.ln_2.bias");
  CHECK(interop::nanogpt_name("ln_f.weight") == "transformer.ln_f.weight");
  CHECK_THAT(error_message([] { interop::nanogpt_name("attention.qkv_proj.weight"); }),
             Catch::Contains("nanoGPT has no parameter for tinylm's 'attention.qkv_proj.weight'"));
  CHECK_THAT(error_message([] { interop::nanogpt_name("blocks.0.mlp.fc.weight.extra"); }),
             Catch::Contains("nanoGPT has no parameter"));
}

TEST_CASE("export refuses what nanoGPT cannot express and writes nothing", "[interop][errors]") {
  const auto dir = test::scratch_dir("interop_refusals");
  struct Case {
    std::string name, reason;
    nn::LanguageModel model;
  };
  std::vector<Case> cases = {
      {"tiny", "its model is a 'tiny' model", nn::TinyAttentionLM(nn::TinyAttentionLMOptions(10, 8, 16, 2)).ptr()},
      {"post-ln", "its blocks are post-LN", nn::TransformerLM(test::with(small(), {{"pre_ln", "false"}})).ptr()},
      {"sinusoidal", "its positions are sinusoidal",
       nn::TransformerLM(small().positions(nn::PositionEncoding::sinusoidal)).ptr()},
      {"untied", "its LM head is untied", nn::TransformerLM(small().tie_weights(false)).ptr()},
      {"no-bias", "it has no Linear biases but non-zero LayerNorm biases ('blocks.0.ln1.bias')", [] {
         nn::TransformerLM m(test::with(small(), {{"bias", "false"}}));
         torch::NoGradGuard no_grad;
         m->blocks[0]->as<nn::TransformerBlockImpl>()->ln1->bias.fill_(0.5);  // trained: not nanoGPT's bias=False
         return m.ptr();
       }()},
      {"expansion", "its MLP is 32 wide; nanoGPT's is 4 x n_embd = 64", nn::TransformerLM(test::with(small(), {{"mlp_expansion", "2"}})).ptr()},
      {"rotary", "its positions are rotary; nanoGPT's are learned",
       nn::TransformerLM(small().positions(nn::PositionEncoding::rotary)).ptr()},
      {"rms-norm", "its norms are RMSNorm; nanoGPT's are LayerNorm",
       nn::TransformerLM(test::with(small(), {{"norm", "rms-norm"}})).ptr()},
      {"no-gain", "its norms have no gain", nn::TransformerLM(test::with(small(), {{"norm_gain", "false"}})).ptr()},
      {"swiglu", "its MLP is SwiGLU (gated); nanoGPT's is GELU",
       nn::TransformerLM(test::with(small(), {{"activation", "swiglu"}})).ptr()},
      {"gqa", "its attention shares key/value heads (n_kv_heads 1 for 2 query heads)",
       nn::TransformerLM(test::with(small(), {{"n_kv_heads", "1"}})).ptr()},
  };
  for (auto& c : cases) {
    INFO(c.name);
    const auto ck = checkpoint_of(*c.model, dir, c.name);
    CHECK_FALSE(interop::nanogpt_fit(ck).refusals.empty());
    const auto out = (dir / (c.name + ".pt")).string();
    CHECK_THAT(error_message([&] { interop::export_nanogpt(ck, out); }),
               Catch::Contains("cannot export") && Catch::Contains(c.reason));
    CHECK_FALSE(std::filesystem::exists(out));
  }
  // bias=False with zero LayerNorm biases (an untouched nanoGPT import) is nanoGPT's
  // bias=False: exported without them.
  nn::TransformerLM no_bias(test::with(small(), {{"bias", "false"}, {"activation", "gelu"}}));
  const auto ck = checkpoint_of(*no_bias, dir, "zero-ln-bias");
  CHECK(interop::nanogpt_fit(ck).refusals.empty());
  const auto out = (dir / "zero-ln-bias.pt").string();
  interop::export_nanogpt(ck, out);
  const auto top = read_pickle(out);
  CHECK_FALSE(top.at("model").toGenericDict().contains("transformer.ln_f.bias"));
  CHECK(top.at("model").toGenericDict().contains("transformer.ln_f.weight"));
  CHECK(top.at("model_args").toGenericDict().at("bias").toBool() == false);

  // Without LayerNorm biases at all (what a bias=False import is now): the same file.
  nn::TransformerLM gains(test::with(small(), {{"bias", "false"}, {"layer_norm_bias", "false"}, {"activation", "gelu"}}));
  const auto gains_ck = checkpoint_of(*gains, dir, "gains");
  CHECK(interop::nanogpt_fit(gains_ck).refusals.empty());
  CHECK(interop::nanogpt_fit(gains_ck).notes.empty());
  const auto gains_out = (dir / "gains.pt").string();
  interop::export_nanogpt(gains_ck, gains_out);
  const auto gains_state = read_pickle(gains_out).at("model").toGenericDict();
  CHECK(gains_state.size() == gains_ck.parameter_names.size() + 1);  // + lm_head.weight, tied
  CHECK_FALSE(gains_state.contains("transformer.h.0.ln_1.bias"));
  auto back = interop::import_nanogpt(gains_out);
  CHECK(back.model->architecture().options.at("layer_norm_bias") == "false");
  CHECK(back.model->named_parameters().size() == gains->named_parameters().size());

  // Linear biases but no LayerNorm biases: nanoGPT's bias=True has them, written as zeros,
  // and the import (with bias=True, LayerNorm biases) computes the same logits.
  torch::manual_seed(6);
  nn::TransformerLM linear_only(test::with(small(), {{"layer_norm_bias", "false"}, {"activation", "gelu"}}));
  const auto lo_ck = checkpoint_of(*linear_only, dir, "linear-only");
  const auto fit = interop::nanogpt_fit(lo_ck);
  CHECK(fit.refusals.empty());
  REQUIRE(fit.notes.size() == 1);
  CHECK_THAT(fit.notes[0], Catch::Contains("written as zeros"));
  const auto lo_out = (dir / "linear-only.pt").string();
  interop::export_nanogpt(lo_ck, lo_out);
  const auto lo_state = read_pickle(lo_out).at("model").toGenericDict();
  REQUIRE(lo_state.contains("transformer.h.1.ln_2.bias"));
  CHECK(lo_state.at("transformer.h.1.ln_2.bias").toTensor().abs().max().item<float>() == 0.0f);
  CHECK(lo_state.contains("transformer.ln_f.bias"));
  auto lo_back = interop::import_nanogpt(lo_out);
  CHECK(lo_back.model->architecture().options.at("layer_norm_bias") == "true");
  auto ids = torch::randint(10, {2, 8}, torch::kLong);
  linear_only->eval();
  lo_back.model->eval();
  CHECK(torch::allclose(linear_only->forward(ids).logits, lo_back.model->forward(ids).logits, 0, 1e-6));
}

TEST_CASE("an export holds nanoGPT's state dict and model_args, read back by LibTorch's pickle",
          "[interop]") {
  const auto dir = test::scratch_dir("interop_export");
  torch::manual_seed(5);
  nn::TransformerLM model(test::with(small(), {{"activation", "gelu"}}));
  const auto ck = checkpoint_of(*model, dir, "gelu");
  CHECK(interop::nanogpt_fit(ck).refusals.empty());
  CHECK(interop::nanogpt_fit(ck).notes.empty());
  const auto out = (dir / "gelu.pt").string();
  CHECK(interop::export_nanogpt(ck, out).empty());

  auto top = read_pickle(out);
  auto state = top.at("model").toGenericDict();
  CHECK(state.size() == ck.parameter_names.size() + 1);  // + lm_head.weight, tied
  for (const auto& name : ck.parameter_names) {
    INFO(name);
    REQUIRE(state.contains(interop::nanogpt_name(name)));
    CHECK(torch::equal(state.at(interop::nanogpt_name(name)).toTensor(), ck.model.at(name)));
  }
  CHECK(torch::equal(state.at("lm_head.weight").toTensor(), ck.model.at("token_embedding.weight")));
  auto args = top.at("model_args").toGenericDict();
  CHECK(args.at("n_layer").toInt() == 2);
  CHECK(args.at("n_head").toInt() == 2);
  CHECK(args.at("n_embd").toInt() == 16);
  CHECK(args.at("block_size").toInt() == 8);
  CHECK(args.at("vocab_size").toInt() == 10);
  CHECK(args.at("bias").toBool());
  CHECK(top.at("iter_num").toInt() == 7);

  // An existing file is kept unless overwriting is asked for.
  CHECK_THAT(error_message([&] { interop::export_nanogpt(ck, out); }), Catch::Contains("already exists"));
  CHECK_NOTHROW(interop::export_nanogpt(ck, out, /*overwrite=*/true));
  CHECK_THAT(error_message([&] { interop::export_nanogpt(ck, (dir / "nowhere" / "x.pt").string()); }),
             Catch::Contains("does not exist"));

  // The default MLP (tanh GELU) exports, with a note saying what differs.
  nn::TransformerLM tanh_model(small());
  const auto tanh_ck = checkpoint_of(*tanh_model, dir, "tanh");
  const auto notes = interop::export_nanogpt(tanh_ck, (dir / "tanh.pt").string());
  REQUIRE(notes.size() == 1);
  CHECK_THAT(notes[0], Catch::Contains("tanh-approximated GELU"));
}

TEST_CASE("an export imports back to the same model, and broken state dicts are refused",
          "[interop][errors]") {
  const auto dir = test::scratch_dir("interop_import");
  torch::manual_seed(9);
  nn::TransformerLM model(test::with(small(), {{"activation", "gelu"}}));
  const auto ck = checkpoint_of(*model, dir, "source");
  const auto pt = (dir / "source.pt").string();
  interop::export_nanogpt(ck, pt);
  auto imported = interop::import_nanogpt(pt);
  CHECK(imported.iter_num == 7);
  CHECK(imported.model->architecture().options.at("activation") == "gelu");
  auto ids = torch::randint(10, {2, 8}, torch::kLong);
  model->eval();
  imported.model->eval();
  CHECK(torch::equal(model->forward(ids).logits, imported.model->forward(ids).logits));

  // Broken copies of the export's state dict, written the way the export writes.
  auto write = [&](const std::string& name, const std::function<void(c10::impl::GenericDict&)>& edit) {
    auto top = read_pickle(pt);
    auto state = top.at("model").toGenericDict().copy();
    edit(state);
    top.insert_or_assign("model", state);
    const auto bytes = interop::torch_save_bytes(top);
    const auto path = (dir / name).string();
    std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    return path;
  };
  const auto missing = write("missing.pt", [](auto& s) { (void)s.erase("transformer.h.1.mlp.c_proj.bias"); });
  CHECK_THAT(error_message([&] { interop::import_nanogpt(missing); }),
             Catch::Contains("has no 'transformer.h.1.mlp.c_proj.bias'"));
  const auto extra = write("extra.pt", [](auto& s) { s.insert("transformer.h.0.attn.rotary", torch::ones({2})); });
  CHECK_THAT(error_message([&] { interop::import_nanogpt(extra); }),
             Catch::Contains("has 'transformer.h.0.attn.rotary', which nanoGPT's GPT"));
  const auto shape = write("shape.pt", [](auto& s) { s.insert_or_assign("transformer.h.0.mlp.c_fc.weight", torch::ones({64, 15})); });
  CHECK_THAT(error_message([&] { interop::import_nanogpt(shape); }),
             Catch::Contains("'transformer.h.0.mlp.c_fc.weight' has shape [64, 15]"));
  // An untied head imports as an untied model.
  const auto untied = write("untied.pt", [](auto& s) { s.insert_or_assign("lm_head.weight", torch::zeros({10, 16})); });
  auto u = interop::import_nanogpt(untied);
  CHECK(u.model->architecture().options.at("tie_weights") == "false");
  CHECK(u.model->forward(ids).logits.abs().max().item<float>() == 0.0f);
  // Heads given that contradict model_args.
  CHECK_THAT(error_message([&] { interop::import_nanogpt(pt, 4); }),
             Catch::Contains("model_args says n_head=2 but the number of heads given is 4"));
}

// Run by tests/cli/test_nanogpt.sh: writes the logits tinylm's model gives for fixed ids,
// so Python can compare nanoGPT's on the exported weights.
TEST_CASE("write a checkpoint's logits for fixed ids", "[.][nanogpt-logits]") {
  const char* ckpt = std::getenv("TINYLM_EXPORT_CKPT");
  const char* out = std::getenv("TINYLM_LOGITS_OUT");
  REQUIRE(ckpt);
  REQUIRE(out);
  const auto ck = train::read_checkpoint(train::resolve_checkpoint_path(ckpt));
  auto model = nn::build_model(ck.architecture);
  train::load_model_state(ck, *model);
  model->eval();
  torch::NoGradGuard no_grad;
  const int64_t T = model->context_length(), V = model->vocab_size();
  auto ids = (torch::arange(2 * T, torch::kLong) * 7 + 3).remainder(V).view({2, T});
  auto logits = model->forward(ids).logits;
  c10::Dict<std::string, at::Tensor> dict;
  dict.insert("ids", ids);
  dict.insert("logits", logits);
  const auto bytes = interop::torch_save_bytes(dict);  // read by torch.load(weights_only=True)
  std::ofstream(out, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  std::printf("wrote %s: logits %s\n", out, c10::str(logits.sizes()).c_str());
}

TEST_CASE("write models of today's architectures with their logits and gradients", "[.][architecture-parity]") {
  // Read by tests/python/architecture_parity.py, which computes the same in PyTorch.
  const char* dir = std::getenv("TINYLM_PARITY_DIR");
  REQUIRE(dir);
  const std::vector<std::pair<std::string, std::map<std::string, std::string>>> configs = {
      {"rotary", {{"positions", "rotary"}}},
      {"rotary-base-500", {{"positions", "rotary"}, {"pos_base", "500"}}},
      {"rms-norm", {{"norm", "rms-norm"}}},
      {"rms-norm-no-gain", {{"norm", "rms-norm"}, {"norm_gain", "false"}, {"layer_norm_bias", "false"}}},
      {"swiglu", {{"activation", "swiglu"}, {"mlp_hidden", "88"}}},
      {"gqa", {{"n_kv_heads", "2"}}},
      {"mqa", {{"n_kv_heads", "1"}}},
      {"llama", {{"positions", "rotary"}, {"norm", "rms-norm"}, {"activation", "swiglu"}, {"mlp_hidden", "88"},
                 {"n_kv_heads", "2"}, {"bias", "false"}, {"layer_norm_bias", "false"}}}};
  std::vector<nn::AttentionKernel> kernels = {nn::AttentionKernel::plain, nn::AttentionKernel::fused};
  if (nn::sdpa_available()) kernels.push_back(nn::AttentionKernel::sdpa);
  int written = 0;
  for (const auto& [name, set] : configs) {
    auto options = test::with(nn::TransformerLMOptions(40, 16, 32, 4, 2), set);
    torch::manual_seed(21);
    nn::TransformerLM model(options);
    {  // Gains, biases and weights away from their initial values, as after training.
      torch::NoGradGuard no_grad;
      for (auto& p : model->parameters()) p.add_(torch::randn_like(p) * (p.dim() == 1 ? 0.2 : 0.05));
    }
    model->eval();
    auto ids = torch::randint(40, {3, 16}, torch::kLong), targets = torch::randint(40, {3, 16}, torch::kLong);
    for (const auto kernel : kernels) {
      model->options.block().attention().kernel(kernel);  // kept, with the weights, for the modules
      for (const auto& module : *model->blocks) module->as<nn::TransformerBlock>()->attn->options.kernel(kernel);
      model->zero_grad();
      auto logits = model->forward(ids).logits;
      auto loss = model->loss(ids, targets);
      loss.backward();
      c10::Dict<std::string, at::Tensor> dict;
      dict.insert("ids", ids);
      dict.insert("targets", targets);
      dict.insert("logits", logits.detach());
      dict.insert("loss", loss.detach());
      for (const auto& p : model->named_parameters()) {
        dict.insert("param." + p.key(), p.value().detach().clone());
        dict.insert("grad." + p.key(), p.value().grad().clone());
      }
      const std::string stem = std::string(dir) + "/" + name + "-" + nn::to_string(kernel);
      const auto bytes = interop::torch_save_bytes(dict);
      std::ofstream(stem + ".pt", std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
      std::ofstream json(stem + ".json");
      json << "{";
      bool first = true;
      for (const auto& [key, value] : model->architecture().options) {
        json << (first ? "" : ", ") << '"' << key << "\": \"" << value << '"';
        first = false;
      }
      json << "}\n";
      ++written;
    }
  }
  std::printf("wrote %d models to %s\n", written, dir);
}
