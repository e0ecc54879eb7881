// Fuzz target: a run config (TOML), applied and validated as `tinylm train --config`
// does.
#include <tinylm/config.h>

#include <c10/util/Exception.h>

#include <cstdint>
#include <string>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  tinylm::RunConfig config;
  try {
    tinylm::apply_toml(config, std::string(reinterpret_cast<const char*>(data), size), "fuzz.toml");
    tinylm::check_config(config);
    tinylm::to_toml(config);
  } catch (const c10::Error&) {
  }
  return 0;
}
