// Internal: CRC-32, as zlib computes it.
#pragma once

#include <cstddef>
#include <cstdint>

namespace tinylm::internal {

/// CRC-32 (IEEE 802.3), as zlib computes it: the checkpoint header's checksum.
uint32_t crc32(const void* data, size_t size);

}  // namespace tinylm::internal
