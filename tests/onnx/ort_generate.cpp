// A tinylm model exported as ONNX, run by ONNX Runtime's C++ API alone (no LibTorch, no
// tinylm). Built where Debian packages ONNX Runtime (13 on).
// - MODEL.onnx "PROMPT IDS" N [--time]: a model exported with --kv-cache generates greedily
//   a token at a time on the cache, as tinylm's generate() decodes (past the context, the
//   last C tokens read afresh), and the prompt's ids and the new ones are printed on one
//   line, as `tinylm sample --greedy` prints an ids task's text; --time: tokens/s on stderr.
// - --logits MODEL.onnx IDS LOGITS B T: the ids (B, T) int64 and tinylm's logits (B, T, V)
//   float32, raw little-endian files; the model's logits (either graph, the KV-cache one
//   with an empty past) must be within 1e-5 of the largest; prints the largest difference.
// usage: tinylm_ort_generate MODEL.onnx "PROMPT IDS" N [--time]
//        tinylm_ort_generate --logits MODEL.onnx IDS LOGITS B T
#include <onnxruntime_cxx_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

struct Model {
  Ort::Env env{ORT_LOGGING_LEVEL_WARNING, "tinylm"};
  Ort::Session session{nullptr};
  Ort::AllocatorWithDefaultOptions alloc;
  std::vector<std::string> past;                // past_key_values.N.key/value, in input order
  std::map<std::string, std::vector<int64_t>> shape;  // each past input's declared shape
  int64_t context = 0;

  explicit Model(const char* path, bool need_cache = true) {
    Ort::SessionOptions options;
    options.SetIntraOpNumThreads(1);
    session = Ort::Session(env, path, options);
    for (size_t i = 0; i < session.GetInputCount(); ++i) {
      const std::string name = session.GetInputNameAllocated(i, alloc).get();
      if (name.rfind("past_key_values.", 0) != 0) continue;
      past.push_back(name);
      shape[name] = session.GetInputTypeInfo(i).GetTensorTypeAndShapeInfo().GetShape();
    }

    if (need_cache && past.empty())
      throw std::runtime_error(std::string(path) + " has no past_key_values inputs (export it with --kv-cache)");
    const auto value = session.GetModelMetadata().LookupCustomMetadataMapAllocated("tinylm.context_length", alloc);
    if (!value) throw std::runtime_error(std::string(path) + " has no tinylm.context_length in its metadata");
    context = std::stoll(value.get());
  }

  /// input_ids (B, T) on `cache` (empty: past 0): the logits (B, T, V), and the cache now.
  Ort::Value run(const std::vector<int64_t>& ids, int64_t B, std::vector<Ort::Value>& cache) {
    std::vector<Ort::Value> inputs;
    std::vector<const char*> in_names = {"input_ids"}, out_names = {"logits"};
    const std::vector<int64_t> id_shape = {B, static_cast<int64_t>(ids.size()) / B};
    const auto memory = Ort::MemoryInfo::CreateCpu(OrtArenaAllocator, OrtMemTypeDefault);
    inputs.push_back(Ort::Value::CreateTensor<int64_t>(memory, const_cast<int64_t*>(ids.data()), ids.size(),
                                                       id_shape.data(), id_shape.size()));
    std::vector<std::string> present;
    for (size_t i = 0; i < past.size(); ++i) {
      in_names.push_back(past[i].c_str());
      if (cache.empty()) {  // (B, kv_heads, 0, d_head)
        auto s = shape[past[i]];
        s[0] = B, s[2] = 0;
        inputs.push_back(Ort::Value::CreateTensor<float>(alloc, s.data(), s.size()));
      } else {
        inputs.push_back(std::move(cache[i]));
      }
      present.push_back("present." + past[i].substr(std::strlen("past_key_values.")));
    }
    for (const auto& p : present) out_names.push_back(p.c_str());
    auto outputs = session.Run(Ort::RunOptions{nullptr}, in_names.data(), inputs.data(), inputs.size(),
                               out_names.data(), out_names.size());
    cache.clear();
    for (size_t i = 1; i < outputs.size(); ++i) cache.push_back(std::move(outputs[i]));
    return std::move(outputs[0]);
  }

  /// input_ids (1, T) on `cache`: the most likely next token (the first of equals, as argmax).
  int64_t step(const std::vector<int64_t>& ids, std::vector<Ort::Value>& cache) {
    const auto logits = run(ids, 1, cache);
    const auto dims = logits.GetTensorTypeAndShapeInfo().GetShape();  // (1, T, V)
    const float* last = logits.GetTensorData<float>() + (dims[1] - 1) * dims[2];
    return std::max_element(last, last + dims[2]) - last;
  }

  int64_t cached(const std::vector<Ort::Value>& cache) const {
    return cache.empty() ? 0 : cache.front().GetTensorTypeAndShapeInfo().GetShape()[2];
  }
};

}  // namespace

template <typename T>
std::vector<T> read_raw(const char* path, size_t count) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in || static_cast<size_t>(in.tellg()) != count * sizeof(T))
    throw std::runtime_error(std::string(path) + ": expected " + std::to_string(count * sizeof(T)) + " bytes");
  std::vector<T> out(count);
  in.seekg(0);
  in.read(reinterpret_cast<char*>(out.data()), static_cast<std::streamsize>(count * sizeof(T)));
  return out;
}

/// --logits: the model's logits against tinylm's; prints the largest difference (relative
/// to the largest logit), exits 1 past 1e-5.
int check_logits(char** argv) {
  Model m(argv[2], /*need_cache=*/false);
  const int64_t B = std::stoll(argv[5]), T = std::stoll(argv[6]);
  const auto ids = read_raw<int64_t>(argv[3], static_cast<size_t>(B * T));
  std::vector<Ort::Value> cache;
  const auto logits = m.run(ids, B, cache);
  const auto dims = logits.GetTensorTypeAndShapeInfo().GetShape();
  if (dims.size() != 3 || dims[0] != B || dims[1] != T) throw std::runtime_error("the logits' shape is not (B, T, V)");
  const auto n = static_cast<size_t>(B * T * dims[2]);
  const auto want = read_raw<float>(argv[4], n);
  const float* got = logits.GetTensorData<float>();
  double scale = 1, worst = 0;
  for (size_t i = 0; i < n; ++i) scale = std::max(scale, static_cast<double>(std::fabs(want[i])));
  for (size_t i = 0; i < n; ++i) worst = std::max(worst, std::fabs(static_cast<double>(got[i]) - want[i]) / scale);
  std::printf("%.3g\n", worst);
  return worst <= 1e-5 ? 0 : 1;
}

int main(int argc, char** argv) {
  if (argc == 7 && std::string(argv[1]) == "--logits") {
    try {
      return check_logits(argv);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "error: %s\n", e.what());
      return 2;
    }
  }
  if (argc < 4 || argc > 5 || (argc == 5 && std::string(argv[4]) != "--time")) {
    std::fprintf(stderr, "usage: %s MODEL.onnx \"PROMPT IDS\" N [--time]\n       %s --logits MODEL.onnx IDS LOGITS B T\n",
                 argv[0], argv[0]);
    return 2;
  }
  try {
    Model m(argv[1]);
    std::vector<int64_t> seq;
    std::istringstream words(argv[2]);
    for (int64_t id; words >> id;) seq.push_back(id);
    if (seq.empty() || !words.eof()) throw std::runtime_error(std::string("the prompt must be token ids, got '") + argv[2] + "'");
    const int64_t n = std::stoll(argv[3]);
    const auto start = std::chrono::steady_clock::now();
    std::vector<Ort::Value> cache;
    const auto window = [&] {
      return std::vector<int64_t>(seq.end() - std::min<int64_t>(m.context, static_cast<int64_t>(seq.size())), seq.end());
    };
    int64_t next = m.step(window(), cache);
    for (int64_t i = 0; i < n; ++i) {
      seq.push_back(next);
      if (i == n - 1) break;
      if (m.cached(cache) < m.context) {
        next = m.step({seq.back()}, cache);
      } else {
        cache.clear();
        next = m.step(window(), cache);
      }
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    for (size_t i = 0; i < seq.size(); ++i) std::printf("%s%lld", i ? " " : "", static_cast<long long>(seq[i]));
    std::printf("\n");
    if (argc == 5) std::fprintf(stderr, "%lld tokens in %.4f s: %.1f tokens/s\n", static_cast<long long>(n), seconds, n / seconds);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
