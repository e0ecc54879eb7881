// tinylm's check of a SentencePiece model: see model_check.h.
#include "data/sentencepiece/model_check.h"

#include <cstdint>
#include <cstring>
#include <algorithm>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace tinylm::internal {
namespace {

// ---- protobuf wire format ------------------------------------------------------

struct Field {
  uint64_t number = 0;
  int wire = 0;                // 0 varint, 1 fixed64, 2 length-delimited, 5 fixed32
  std::string_view bytes;      // wire 2 only
  uint64_t value = 0;          // wire 0 only
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
        f.value = value;
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

// The fixed-size storage SentencePiece gathers matches into (its current source; Debian
// 12's 0.1.97 crashed past each bound).
constexpr unsigned kMaxNormalizerMatches = 32;   // Normalizer::kMaxTrieResultsSize
constexpr size_t kMaxUserDefinedMatches = 64;    // PrefixMatcher::PrefixMatch's kResultSize
// tinylm's own bound on a trie path (its walk keeps one frame per byte of the path).
constexpr size_t kMaxRuleBytes = 1024;

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
  // A depth-first walk of every node a lookup can reach. Besides each node's probes and
  // values, it bounds how many rules one input can match: SentencePiece's normalizer
  // collects the matches along one path into kMaxTrieResultsSize (32) slots and then reads
  // as many as there were. So the reachable nodes must form no cycle (a darts-clone trie
  // never does; one would let a long input match without end), and no path from the root
  // may pass more than 32 nodes with a value. matches[node]: the most any path below node
  // passes (capped at 255). state: 0 unseen, 1 on the walk's path, 2 done.
  std::vector<unsigned char> state(static_cast<size_t>(n), 0), matches(static_cast<size_t>(n), 0);
  struct Frame {
    uint64_t node, base;
    uint32_t next_byte;
    unsigned most;  // the most matches below node among its children done so far
  };
  // What a child adds to its parent's count: the matches below it, and its own rule.
  auto through = [&](uint64_t child) {
    return matches[static_cast<size_t>(child)] + (has_leaf(unit_at(units, child)) ? 1u : 0u);
  };
  std::vector<Frame> path;
  auto enter = [&](uint64_t node) -> std::string {
    const uint64_t base = node ^ offset_of(unit_at(units, node));
    if ((base | 0xFF) >= n)
      return "trie node " + std::to_string(node) + " leads to units up to " + std::to_string(base | 0xFF) +
             " of " + std::to_string(n);
    if (path.size() > kMaxRuleBytes)
      return "a path through its trie is longer than " + std::to_string(kMaxRuleBytes) +
             " bytes (a rule's input is a character or a few)";
    state[static_cast<size_t>(node)] = 1;
    path.push_back({node, base, 0, 0});
    return {};
  };
  if (auto p = enter(0); !p.empty()) return p;
  while (!path.empty()) {
    Frame& f = path.back();
    if (f.next_byte == 256) {  // every child done: hand the count up to the parent
      const uint64_t node = f.node;
      matches[static_cast<size_t>(node)] = static_cast<unsigned char>(std::min(f.most, 255u));
      state[static_cast<size_t>(node)] = 2;
      path.pop_back();
      if (!path.empty()) path.back().most = std::max(path.back().most, through(node));
      continue;
    }
    const uint32_t byte = f.next_byte++;
    const uint64_t child = f.base ^ byte;
    const uint32_t u = unit_at(units, child);
    if (label_of(u) != byte) continue;
    if (has_leaf(u)) {
      const uint64_t leaf = child ^ offset_of(u);
      if (leaf >= n)
        return "trie node " + std::to_string(child) + " has its value at unit " + std::to_string(leaf) + " of " +
               std::to_string(n);
      const uint32_t value = value_of(unit_at(units, leaf));
      if (value >= strings.size() || !std::memchr(strings.data() + value, '\0', strings.size() - value))
        return "trie node " + std::to_string(child) + " maps to byte " + std::to_string(value) + " of " +
               std::to_string(strings.size()) + " bytes of strings, which holds no terminated string";
    }
    const unsigned char st = state[static_cast<size_t>(child)];
    if (st == 1) return "its trie has a cycle through node " + std::to_string(child);
    if (st == 2) f.most = std::max(f.most, through(child));  // shared, counted already
    if (st == 0)
      if (auto p = enter(child); !p.empty()) return p;
  }
  if (matches[0] > kMaxNormalizerMatches)
    return "one input can match " + std::string(matches[0] == 255 ? "255 or more" : std::to_string(matches[0])) +
           " of its rules, more than the " + std::to_string(kMaxNormalizerMatches) + " SentencePiece holds";
  return {};
}

// SentencePiece's PrefixMatcher finds the user-defined pieces that start an input in a
// trie of its own, into 64 slots (and reads as many as there were). So no user-defined
// piece may have more than 64 user-defined pieces as its prefixes (itself included). A
// trie of the pieces counts them in time linear in their bytes.
std::string user_defined_problem(const std::vector<std::string_view>& pieces) {
  struct Node {
    std::map<unsigned char, size_t> next;
    bool piece = false;
  };
  std::vector<Node> trie(1);
  for (const auto piece : pieces) {
    size_t at = 0;
    for (const char c : piece) {
      auto it = trie[at].next.find(static_cast<unsigned char>(c));
      if (it == trie[at].next.end()) {
        trie.emplace_back();
        it = trie[at].next.emplace(static_cast<unsigned char>(c), trie.size() - 1).first;
      }
      at = it->second;
    }
    trie[at].piece = true;
  }
  // The most pieces on one path from the root: nodes are created after their parents, so
  // a pass in creation order sees each parent first.
  std::vector<size_t> on_path(trie.size(), 0);
  size_t most = 0;
  for (size_t i = 0; i < trie.size(); ++i) {
    on_path[i] += trie[i].piece ? 1 : 0;
    most = std::max(most, on_path[i]);
    for (const auto& [byte, child] : trie[i].next) on_path[child] = on_path[i];
  }
  if (most > kMaxUserDefinedMatches)
    return std::to_string(most) + " of its user-defined pieces start one another, more than the " +
           std::to_string(kMaxUserDefinedMatches) + " SentencePiece holds";
  return {};
}

}  // namespace

std::string sentencepiece_model_problem(std::string_view proto) {
  if (proto.empty()) return "it is empty";
  // ModelProto: 1 pieces, 2 trainer_spec, 3 normalizer_spec, 4 self_test_data,
  // 5 denormalizer_spec. NormalizerSpec: 2 precompiled_charsmap. A message field that
  // occurs twice is merged, so the last map of each spec is the one SentencePiece uses.
  // ModelProto.SentencePiece: 1 piece, 3 type (4: USER_DEFINED).
  int64_t pieces = 0;
  std::vector<std::string_view> user_defined;
  std::string_view maps[2];
  bool has_map[2] = {false, false};
  std::string problem = walk(proto, [&](const Field& f) -> std::string {
    if (f.wire != 2) return {};
    if (f.number == 1) {
      ++pieces;
      std::string_view text;
      uint64_t type = 1;
      auto inner = walk(f.bytes, [&](const Field& g) -> std::string {
        if (g.number == 1 && g.wire == 2) text = g.bytes;
        if (g.number == 3 && g.wire == 0) type = g.value;
        return {};
      });
      if (!inner.empty()) return "piece " + std::to_string(pieces - 1) + " is damaged (" + inner + ")";
      // Its models hand their pieces to darts-clone as C strings, which throws on an
      // empty key and cuts one at a NUL byte (an empty key again, or keys out of order).
      if (text.empty() || text.find('\0') != std::string_view::npos)
        return "piece " + std::to_string(pieces - 1) + " is empty or holds a NUL byte";
      if (type == 4) user_defined.push_back(text);
      return {};
    }
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
  if (auto p = user_defined_problem(user_defined); !p.empty()) return p;
  for (int which = 0; which < 2; ++which) {
    if (!has_map[which]) continue;
    if (auto p = charsmap_problem(maps[which]); !p.empty())
      return std::string(which == 0 ? "its normalizer's" : "its denormalizer's") + " character map is damaged (" + p + ")";
  }
  return {};
}

}  // namespace tinylm::internal
