// Fuzz target: a tinylm checkpoint (any format's header; format 3's index, metadata,
// architecture and tensors). Every input must be read whole or refused with a c10::Error;
// a small enough model is rebuilt and the weights loaded into it. Any other exception, a
// crash or a sanitizer report is a finding.
#include "fuzz_util.h"

#include <tinylm/nn/model.h>
#include <tinylm/train/checkpoint.h>

#include <c10/util/Exception.h>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& path = tinylm::fuzz::input_file(data, size, ".ckpt");
  try {
    const auto ck = tinylm::train::read_checkpoint(path);
    // Models up to a few MB: the fuzzer's memory limit is not the reader's business (the
    // reader has refused every architecture its weights do not match).
    const auto& o = ck.architecture.options;
    auto small = [&](const char* key, int64_t limit) {
      auto it = o.find(key);
      return it == o.end() || (it->second.size() < 7 && std::atoll(it->second.c_str()) <= limit);
    };
    if (tinylm::nn::parameter_count(ck.architecture) < 1'000'000 && small("context_length", 512) &&
        small("n_layers", 8)) {
      auto model = tinylm::nn::build_model(ck.architecture);
      tinylm::train::load_model_state(ck, *model);
    }
    tinylm::train::checkpoint_tokenizer(ck);
  } catch (const c10::Error&) {
  }
  return 0;
}
