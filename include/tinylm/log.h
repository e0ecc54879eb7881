// tinylm's logger. The library never prints: it logs through spdlog's "tinylm" logger.
#pragma once

#include <spdlog/spdlog.h>

#include <memory>

namespace tinylm {

/// The "tinylm" logger: the one registered under that name if an application made one,
/// otherwise a stderr logger created on first use.
std::shared_ptr<spdlog::logger> logger();

}  // namespace tinylm
