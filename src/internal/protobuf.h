// Internal: protobuf's wire format, written field by field from a schema's field numbers
// (ONNX export, src/onnx.cpp; and the SentencePiece models the fuzz target and the
// tokenizer tests build). No protobuf library: the messages written are few and small.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace tinylm::internal::protobuf {

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

/// A varint field (wire type 0). A negative int64 is written as its two's complement, as
/// protobuf writes int64.
inline std::string number_field(uint64_t number, uint64_t value) { return varint(number << 3) + varint(value); }

/// A float field (wire type 5: four bytes, little-endian).
inline std::string float_field(uint64_t number, float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  std::string out = varint(number << 3 | 5);
  for (int i = 0; i < 4; ++i) out += static_cast<char>((bits >> (8 * i)) & 0xFF);
  return out;
}

}  // namespace tinylm::internal::protobuf
