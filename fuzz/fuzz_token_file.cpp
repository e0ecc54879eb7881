// Fuzz target: a prepared corpus's token file (header checked against the file, then
// its tokens read and verified).
#include "fuzz_util.h"

#include <tinylm/data/token_file.h>

#include <c10/util/Exception.h>

#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const tinylm::data::TokenFile file(tinylm::fuzz::input_file(data, size, ".bin"));
    std::vector<int64_t> tokens(static_cast<size_t>(std::min<int64_t>(file.size(), 64)));
    if (!tokens.empty()) {
      file.read(0, static_cast<int64_t>(tokens.size()), tokens.data());
      file.read(file.size() - static_cast<int64_t>(tokens.size()), static_cast<int64_t>(tokens.size()), tokens.data());
    }
    file.verify();
  } catch (const c10::Error&) {
  }
  return 0;
}
