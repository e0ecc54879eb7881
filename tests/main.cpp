// Catch2 runner. The library's progress logs are silenced to warnings in tests.
#define CATCH_CONFIG_RUNNER
#include "catch_compat.h"
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

int main(int argc, char* argv[]) {
  auto log = std::make_shared<spdlog::logger>("tinylm",
                                              std::make_shared<spdlog::sinks::stderr_sink_mt>());
  log->set_level(spdlog::level::warn);
  spdlog::register_logger(log);
  return Catch::Session().run(argc, argv);
}
