// Fuzz target: a format-1 checkpoint (a LibTorch archive), what `tinylm upgrade` reads
// with tinylm's own zip and pickle reader. The input is the archive (a whole checkpoint's
// first 32 bytes are dropped, so the fixtures seed it); the target puts it behind a header
// with the right length and CRC, so the archive's own checks must catch what is wrong.
// A small enough model is rebuilt and, as upgrade does, a Trainer resumes from the file
// (weights and optimizer state loaded). Refusals are c10::Errors; anything else is a finding.
#include "fuzz_util.h"

#include <tinylm/run.h>
#include <tinylm/train/checkpoint.h>
#include <tinylm/train/trainer.h>

#include "internal/crc32.h"

#include <c10/util/Exception.h>

#include <cstdlib>
#include <cstring>
#include <string>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string payload(reinterpret_cast<const char*>(data), size);
  if (payload.size() >= 32 && payload.compare(0, 8, "TINYLMCK") == 0) payload.erase(0, 32);
  std::string file = "TINYLMCK";
  auto put = [&](uint64_t v, int bytes) {
    for (int i = 0; i < bytes; ++i) file += static_cast<char>((v >> (8 * i)) & 0xFF);
  };
  put(1, 4);  // format 1
  put(0, 4);
  put(payload.size(), 8);
  put(tinylm::internal::crc32(payload.data(), payload.size()), 4);
  put(0, 4);
  file += payload;
  const std::string& path =
      tinylm::fuzz::input_file(reinterpret_cast<const uint8_t*>(file.data()), file.size(), ".ckpt");
  try {
    const auto ck = tinylm::train::read_checkpoint(path);
    if (tinylm::fuzz::small_model(ck)) {
      tinylm::RunConfig c = tinylm::config_from_checkpoint(ck);
      c.trainer.out_dir(path + ".run");  // nothing is written there: resume only reads
      tinylm::train::Trainer trainer = tinylm::make_trainer(c);
      trainer.resume(ck);
    }
  } catch (const c10::Error&) {
  }
  return 0;
}
