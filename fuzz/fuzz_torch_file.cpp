// Fuzz target: a file Python's torch.save wrote (the zip archive and the pickle), read by
// tinylm's own reader, every tensor it describes materialised, then imported as nanoGPT's
// checkpoint. Refusals are c10::Errors; anything else is a finding.
#include "fuzz_util.h"

#include <tinylm/interop.h>

#include "internal/torch_file.h"

#include <c10/util/Exception.h>
#include <torch/torch.h>

#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using tinylm::internal::PyValue;
  try {
    const tinylm::internal::TorchFile file(std::string(reinterpret_cast<const char*>(data), size), "fuzz.pt");
    std::vector<const PyValue*> todo = {&file.root()};
    for (size_t n = 0; n < todo.size() && n < 10000; ++n) {
      const PyValue* v = todo[n];
      if (v->kind == PyValue::Kind::tensor) file.tensor(*v->tensor).sum();
      for (const auto& item : v->items) todo.push_back(item.get());
      for (const auto& entry : v->entries) todo.push_back(entry.second.get());
    }
  } catch (const c10::Error&) {
    return 0;
  }
  try {
    tinylm::interop::import_nanogpt(tinylm::fuzz::input_file(data, size, ".pt"), 2);
  } catch (const c10::Error&) {
  }
  return 0;
}
