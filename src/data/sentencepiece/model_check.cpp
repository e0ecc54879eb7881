// tinylm's check of a SentencePiece model: see model_check.h.
#include "data/sentencepiece/model_check.h"

#include <cstdint>
#include <cstring>
#include <functional>
#include <vector>

namespace tinylm::internal {
namespace {

// ---- protobuf wire format ------------------------------------------------------

struct Field {
  uint64_t number = 0;
  int wire = 0;                // 0 varint, 1 fixed64, 2 length-delimited, 5 fixed32
  std::string_view bytes;      // wire 2 only
};

bool read_varint(std::string_view& in, uint64_t& value) {
  value = 0;
  for (int i = 0; i < 10; ++i) {
    if (in.empty()) return false;
    const auto byte = static_cast<unsigned char>(in.front());
    in.remove_prefix(1);
    if (i == 9 && byte > 1) return false;  // more than 64 bits
    value |= static_cast<uint64_t>(byte & 0x7F) << (7 * i);
    if (!(byte & 0x80)) return true;
  }
  return false;
}

/// Calls `visit` for each field of a message; the first problem met, or "".
std::string walk(std::string_view message, const std::function<std::string(const Field&)>& visit) {
  while (!message.empty()) {
    uint64_t tag = 0;
    if (!read_varint(message, tag)) return "a field tag is cut short";
    Field f;
    f.number = tag >> 3;
    f.wire = static_cast<int>(tag & 7);
    if (f.number == 0 || f.number > 536870911) return "a field has number " + std::to_string(f.number);
    uint64_t value = 0;
    switch (f.wire) {
      case 0:
        if (!read_varint(message, value)) return "a number is cut short";
        break;
      case 1:
      case 5: {
        const size_t n = f.wire == 1 ? 8 : 4;
        if (message.size() < n) return "a number is cut short";
        message.remove_prefix(n);
        break;
      }
      case 2:
        if (!read_varint(message, value)) return "a length is cut short";
        if (value > message.size())
          return "field " + std::to_string(f.number) + " claims " + std::to_string(value) + " bytes where " +
                 std::to_string(message.size()) + " remain";
        f.bytes = message.substr(0, static_cast<size_t>(value));
        message.remove_prefix(static_cast<size_t>(value));
        break;
      default:
        return "field " + std::to_string(f.number) + " has wire type " + std::to_string(f.wire) +
               ", which SentencePiece models do not use";
    }
    if (auto problem = visit(f); !problem.empty()) return problem;
  }
  return {};
}

// ---- the normalizer's character map --------------------------------------------
// Layout (SentencePiece's normalizer.cc): a little-endian uint32 n, n bytes of a
// darts-clone double array (uint32 units), then NUL-terminated replacement strings that
// the trie's values index. A lookup walks the trie one input byte at a time: from node p
// to base = p ^ offset(p), then to base ^ byte, which is a child when its label is that
// byte; a child with a leaf holds its value at base(child). Nothing is bounds-checked, so
// every node a lookup can reach must have all 256 of its probes inside the array, and
// every value it can return must index a terminated string.

uint32_t unit_at(const char* units, uint64_t i) {
  uint32_t u = 0;
  std::memcpy(&u, units + 4 * i, 4);
  return u;
}
bool has_leaf(uint32_t u) { return (u >> 8) & 1; }
uint32_t value_of(uint32_t u) { return u & ((1u << 31) - 1); }
uint32_t label_of(uint32_t u) { return u & ((1u << 31) | 0xFF); }
uint64_t offset_of(uint32_t u) { return static_cast<uint64_t>(u >> 10) << ((u & (1u << 9)) >> 6); }

std::string charsmap_problem(std::string_view blob) {
  if (blob.empty()) return {};  // no map: SentencePiece maps nothing
  if (blob.size() <= 4) return "it is " + std::to_string(blob.size()) + " bytes long";
  uint32_t trie_bytes = 0;
  std::memcpy(&trie_bytes, blob.data(), 4);
  if (trie_bytes > blob.size() - 4)
    return "its trie claims " + std::to_string(trie_bytes) + " bytes of the map's " + std::to_string(blob.size());
  if (trie_bytes == 0 || trie_bytes % 4 != 0)
    return "its trie's size, " + std::to_string(trie_bytes) + " bytes, is not a positive multiple of 4";
  const char* units = blob.data() + 4;
  const uint64_t n = trie_bytes / 4;
  const std::string_view strings = blob.substr(4 + static_cast<size_t>(trie_bytes));
  std::vector<unsigned char> seen(static_cast<size_t>(n), 0);
  std::vector<uint64_t> todo = {0};
  seen[0] = 1;
  while (!todo.empty()) {
    const uint64_t node = todo.back();
    todo.pop_back();
    const uint64_t base = node ^ offset_of(unit_at(units, node));
    if ((base | 0xFF) >= n)
      return "trie node " + std::to_string(node) + " leads to units up to " + std::to_string(base | 0xFF) +
             " of " + std::to_string(n);
    for (uint32_t byte = 0; byte < 256; ++byte) {
      const uint64_t child = base ^ byte;
      const uint32_t u = unit_at(units, child);
      if (label_of(u) != byte) continue;
      if (has_leaf(u)) {
        const uint64_t leaf = child ^ offset_of(u);
        if (leaf >= n)
          return "trie node " + std::to_string(child) + " has its value at unit " + std::to_string(leaf) +
                 " of " + std::to_string(n);
        const uint32_t value = value_of(unit_at(units, leaf));
        if (value >= strings.size() || !std::memchr(strings.data() + value, '\0', strings.size() - value))
          return "trie node " + std::to_string(child) + " maps to byte " + std::to_string(value) + " of " +
                 std::to_string(strings.size()) + " bytes of strings, which holds no terminated string";
      }
      if (!seen[static_cast<size_t>(child)]) {
        seen[static_cast<size_t>(child)] = 1;
        todo.push_back(child);
      }
    }
  }
  return {};
}

}  // namespace

std::string sentencepiece_model_problem(std::string_view proto) {
  if (proto.empty()) return "it is empty";
  // ModelProto: 1 pieces, 2 trainer_spec, 3 normalizer_spec, 4 self_test_data,
  // 5 denormalizer_spec. NormalizerSpec: 2 precompiled_charsmap. A message field that
  // occurs twice is merged, so the last map of each spec is the one SentencePiece uses.
  int64_t pieces = 0;
  std::string_view maps[2];
  bool has_map[2] = {false, false};
  std::string problem = walk(proto, [&](const Field& f) -> std::string {
    if (f.wire != 2) return {};
    if (f.number == 1) ++pieces;
    if (f.number != 3 && f.number != 5) return {};
    const int which = f.number == 3 ? 0 : 1;
    auto inner = walk(f.bytes, [&](const Field& g) -> std::string {
      if (g.number == 2 && g.wire == 2) {
        maps[which] = g.bytes;
        has_map[which] = true;
      }
      return {};
    });
    return inner.empty() ? inner : std::string(which == 0 ? "its normalizer" : "its denormalizer") + " is damaged (" + inner + ")";
  });
  if (!problem.empty()) return problem;
  if (pieces == 0) return "it has no pieces";
  for (int which = 0; which < 2; ++which) {
    if (!has_map[which]) continue;
    if (auto p = charsmap_problem(maps[which]); !p.empty())
      return std::string(which == 0 ? "its normalizer's" : "its denormalizer's") + " character map is damaged (" + p + ")";
  }
  return {};
}

}  // namespace tinylm::internal
