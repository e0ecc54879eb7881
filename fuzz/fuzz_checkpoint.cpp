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
    if (tinylm::fuzz::small_model(ck)) {
      auto model = tinylm::nn::build_model(ck.architecture);
      tinylm::train::load_model_state(ck, *model);
    }
    tinylm::train::checkpoint_tokenizer(ck);
  } catch (const c10::Error&) {
  }
  return 0;
}
