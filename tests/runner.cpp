// Catch2's implementation (v2: defined by CATCH_CONFIG_RUNNER in this one file; v3: the
// library) and the session both test programs run. No LibTorch here.
#define CATCH_CONFIG_RUNNER
#include "runner.h"

#include "catch_compat.h"
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

namespace tinylm::test {

int run_catch(int argc, char* argv[]) {
  auto log = std::make_shared<spdlog::logger>("tinylm",
                                              std::make_shared<spdlog::sinks::stderr_sink_mt>());
  log->set_level(spdlog::level::warn);
  spdlog::register_logger(log);
  return Catch::Session().run(argc, argv);
}

}  // namespace tinylm::test
