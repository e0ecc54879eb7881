// ONNX export (src/onnx.cpp): what it refuses and how it writes files here; the graphs'
// numbers are checked in Python (tests/python/onnx_export.py: the ONNX checker, the graph
// evaluated op by op, and ONNX Runtime where Debian packages it) from the models the
// hidden case below writes.
#include "test_util.h"

#include <tinylm/generate.h>
#include <tinylm/interop.h>
#include <tinylm/nn/model.h>
#include <tinylm/onnx.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

using namespace tinylm;
using tinylm::test::error_message;

namespace {

/// A program's own kind: ONNX export does not know its forward pass.
class OwnKind : public nn::LanguageModelImpl {
 public:
  OwnKind() : inner_(register_module("inner", nn::LanguageModel(nn::TinyAttentionLM(nn::TinyAttentionLMOptions(8, 4, 8, 2)).ptr()))) {}
  nn::LMOutput forward(const torch::Tensor& ids, bool w, const torch::Tensor& m) override { return inner_->forward(ids, w, m); }
  int64_t vocab_size() const override { return 8; }
  int64_t context_length() const override { return 4; }
  nn::ModelArchitecture architecture() const override { return {"own", 1, {}}; }
  torch::Tensor forward_cached(const torch::Tensor& ids, nn::KVCache& cache) override {
    return inner_->forward_cached(ids, cache);
  }

 private:
  nn::LanguageModel inner_;
};

std::string read(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

}  // namespace

TEST_CASE("ONNX export refuses a kind it does not know, and never writes over a file by accident", "[onnx]") {
  OwnKind own;
  CHECK(interop::onnx_refusal(own) == "ONNX export covers the kinds 'tiny' and 'transformer', not 'own'");
  CHECK_THAT(error_message([&] { interop::onnx_model(own); }), Catch::Contains("not 'own'"));

  const auto dir = test::scratch_dir("onnx_files");
  nn::TinyAttentionLM tiny(nn::TinyAttentionLMOptions(16, 8, 16, 2));
  const auto path = (dir / "m.onnx").string();
  {
    std::ofstream(path) << "the user's file";
  }
  CHECK_THAT(error_message([&] { interop::export_onnx(*tiny, path); }), Catch::Contains("already exists"));
  CHECK(read(path) == "the user's file");
  // Refused before anything is written: a kind it does not cover, to a new path.
  const auto fresh = (dir / "own.onnx").string();
  CHECK_THAT(error_message([&] { interop::export_onnx(own, fresh); }), Catch::Contains("not 'own'"));
  CHECK(!std::filesystem::exists(fresh));
  CHECK_THAT(error_message([&] { interop::export_onnx(*tiny, (dir / "no" / "m.onnx").string()); }),
             Catch::Contains("does not exist"));
  // With overwrite: replaced whole, the same bytes as onnx_model() gives, no temporary left.
  const auto written = interop::export_onnx(*tiny, path, {{"k", "v"}}, /*overwrite=*/true);
  CHECK(written == std::vector<std::string>{path});
  CHECK(read(path) == interop::onnx_model(*tiny, {{"k", "v"}}));
  CHECK(std::distance(std::filesystem::directory_iterator(dir), std::filesystem::directory_iterator()) == 1);
  // The file starts as a ModelProto does: ir_version (field 1, varint) 8.
  CHECK(read(path).substr(0, 2) == std::string("\x08\x08", 2));
}

// Run by tests/cli/test_onnx_export.sh: models of each kind and option, exported, with the
// logits tinylm gives for ids of two lengths, for Python to compare.
TEST_CASE("write ONNX models of every kind and option with their logits", "[.][onnx-export]") {
  const char* dir = std::getenv("TINYLM_ONNX_DIR");
  REQUIRE(dir);
  const std::vector<std::pair<std::string, std::map<std::string, std::string>>> configs = {
      {"transformer", {}},
      {"post-ln-sinusoidal-gelu-untied", {{"pre_ln", "false"}, {"positions", "sinusoidal"}, {"activation", "gelu"},
                                          {"tie_weights", "false"}, {"bias", "false"}}},
      {"no-positions-no-norm-bias", {{"positions", "none"}, {"layer_norm_bias", "false"}}},
      {"rotary-rms-norm-swiglu-gqa", {{"positions", "rotary"}, {"norm", "rms-norm"}, {"activation", "swiglu"},
                                      {"mlp_hidden", "88"}, {"n_kv_heads", "2"}, {"bias", "false"},
                                      {"layer_norm_bias", "false"}}},
      {"mqa-rms-norm-no-gain", {{"n_kv_heads", "1"}, {"norm", "rms-norm"}, {"norm_gain", "false"}}}};
  std::vector<std::pair<std::string, nn::LanguageModel>> models;
  torch::manual_seed(31);
  models.emplace_back("tiny", nn::LanguageModel(nn::TinyAttentionLM(nn::TinyAttentionLMOptions(40, 16, 32, 4)).ptr()));
  for (const auto& [name, set] : configs)
    models.emplace_back(name, nn::LanguageModel(nn::TransformerLM(test::with(nn::TransformerLMOptions(40, 16, 32, 4, 2), set)).ptr()));
  for (auto& [name, model] : models) {
    {  // Gains, biases and weights away from their initial values, as after training.
      torch::NoGradGuard no_grad;
      for (auto& p : model->parameters()) p.add_(torch::randn_like(p) * (p.dim() == 1 ? 0.2 : 0.05));
    }
    model->eval();
    torch::NoGradGuard no_grad;
    c10::Dict<std::string, at::Tensor> dict;
    const std::string stem = std::string(dir) + "/" + name;
    for (const int64_t T : {int64_t{16}, int64_t{5}}) {
      const auto ids = torch::randint(40, {3, T}, torch::kLong);
      const auto logits = model->forward(ids).logits;
      dict.insert("ids." + std::to_string(T), ids);
      dict.insert("logits." + std::to_string(T), logits);
      // The same as raw little-endian arrays, for the C++ runtime test (no LibTorch there).
      const auto raw = [](const std::string& path, const torch::Tensor& t) {
        const auto c = t.contiguous();
        std::ofstream(path, std::ios::binary)
            .write(static_cast<const char*>(c.data_ptr()), static_cast<std::streamsize>(c.nbytes()));
      };
      raw(stem + ".3x" + std::to_string(T) + ".ids", ids);
      raw(stem + ".3x" + std::to_string(T) + ".logits", logits);
    }
    // Greedy generation past the context (16): what the KV-cache graph must reproduce
    // (generate() is what `tinylm sample --greedy` runs).
    GenerateOptions greedy;
    greedy.greedy = true;
    greedy.max_new_tokens = 24;
    const auto prompt = torch::randint(40, {2, 3}, torch::kLong);
    dict.insert("greedy.prompt", prompt);
    dict.insert("greedy.tokens", generate(*model, prompt, greedy));
    const std::map<std::string, std::string> metadata = {
        {"tinylm.kind", model->architecture().kind},
        {"tinylm.context_length", std::to_string(model->context_length())}};
    interop::export_onnx(*model, stem + ".onnx", metadata, /*overwrite=*/true);
    interop::OnnxOptions kv;
    kv.kv_cache = true;
    interop::export_onnx(*model, stem + ".kv.onnx", metadata, /*overwrite=*/true, nullptr, kv);
    const auto bytes = interop::torch_save_bytes(dict);
    std::ofstream(stem + ".pt", std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  std::printf("wrote %zu models to %s\n", models.size(), dir);
}
