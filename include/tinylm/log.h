// tinylm's logger. The library never prints: it logs through spdlog's "tinylm" logger.
#pragma once

#include <spdlog/spdlog.h>

#include <memory>
#include <string>
#include <string_view>

namespace tinylm {

/// The "tinylm" logger: the one registered under that name if an application made one,
/// otherwise a stderr logger created on first use.
std::shared_ptr<spdlog::logger> logger();

/// A string from a file or a peer, made safe to print on a terminal: control characters
/// (escape sequences among them) as \xNN, invalid UTF-8 replaced.
std::string printable(std::string_view text);

}  // namespace tinylm
