// src/internal/crc32.cpp: CRC-32.
#include "../test_util.h"

#include "internal/crc32.h"

#include <string>

using namespace tinylm;

TEST_CASE("CRC-32 matches the standard check value", "[checkpoint]") {
  CHECK(internal::crc32("123456789", 9) == 0xCBF43926u);
  CHECK(internal::crc32("", 0) == 0u);
}

TEST_CASE("CRC-32 changes with every single flipped bit", "[system]") {
  // A CRC detects every one-bit error: flipping any bit of a message changes its CRC.
  CHECK(internal::crc32("The quick brown fox jumps over the lazy dog", 43) == 0x414FA339u);
  std::string message(64, '\0');
  for (size_t i = 0; i < message.size(); ++i) message[i] = static_cast<char>(i * 37 + 11);
  const uint32_t good = internal::crc32(message.data(), message.size());
  int unchanged = 0;
  for (size_t byte = 0; byte < message.size(); ++byte) {
    for (int bit = 0; bit < 8; ++bit) {
      std::string flipped = message;
      flipped[byte] = static_cast<char>(flipped[byte] ^ (1 << bit));
      unchanged += internal::crc32(flipped.data(), flipped.size()) == good;
    }
  }
  CHECK(unchanged == 0);
}
