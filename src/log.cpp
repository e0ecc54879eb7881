// tinylm's logger, and text from elsewhere made safe to print.
#include <tinylm/log.h>

#include "internal/text.h"

#include <spdlog/sinks/stdout_sinks.h>

#include <memory>
#include <mutex>
#include <string>
#include <string_view>

namespace tinylm {

std::shared_ptr<spdlog::logger> logger() {
  if (auto existing = spdlog::get("tinylm")) return existing;
  static std::mutex mutex;
  std::lock_guard<std::mutex> lock(mutex);
  if (auto existing = spdlog::get("tinylm")) return existing;
  auto made = std::make_shared<spdlog::logger>(
      "tinylm", std::make_shared<spdlog::sinks::stderr_sink_mt>());
  spdlog::register_logger(made);
  return made;
}

std::string printable(std::string_view text) { return internal::printable(text); }

}  // namespace tinylm
