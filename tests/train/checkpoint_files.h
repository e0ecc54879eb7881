// Shared by the checkpoint tests: checkpoint files with a changed payload.
#pragma once

#include "internal/crc32.h"

#include <cstdint>
#include <string>

namespace tinylm::test {

/// The file `good` with `payload` behind its header, whose length and CRC are recomputed,
/// so the reader's own checks, not the checksum, must catch what is wrong.
inline std::string with_header(const std::string& good, const std::string& payload) {
  std::string out = good.substr(0, 32) + payload;
  for (int i = 0; i < 8; ++i) out[16 + i] = static_cast<char>((payload.size() >> (8 * i)) & 0xFF);
  const uint32_t crc = internal::crc32(payload.data(), payload.size());
  for (int i = 0; i < 4; ++i) out[24 + i] = static_cast<char>((crc >> (8 * i)) & 0xFF);
  return out;
}

}  // namespace tinylm::test
