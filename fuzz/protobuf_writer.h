// Protobuf wire format, written: enough to build SentencePiece models field by field (the
// sentencepiece fuzz target's mutator and the tokenizer tests' damaged models).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace tinylm::fuzz {

inline std::string varint(uint64_t v) {
  std::string out;
  do {
    out += static_cast<char>((v & 0x7F) | (v > 0x7F ? 0x80 : 0));
    v >>= 7;
  } while (v);
  return out;
}

/// A length-delimited field (wire type 2).
inline std::string field(uint64_t number, std::string_view bytes) {
  return varint(number << 3 | 2) + varint(bytes.size()) + std::string(bytes);
}

/// A varint field (wire type 0).
inline std::string number_field(uint64_t number, uint64_t value) { return varint(number << 3) + varint(value); }

}  // namespace tinylm::fuzz
