// Fuzz target: a SentencePiece model as a checkpoint or a prepared corpus carries it.
// tinylm's check (src/data/sentencepiece/model_check.h) must refuse every model that
// SentencePiece cannot load safely: what it accepts is loaded into SentencePiece itself
// (linked directly here: no LibTorch, so no protobuf clash and no module to dlopen) and
// used to encode and decode. A crash or a sanitizer report inside SentencePiece is a
// model the check let through: a finding.
#include "data/sentencepiece/model_check.h"
#include "internal/protobuf.h"

#include <sentencepiece_processor.h>

#include <cstdint>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <string_view>
#include <vector>

extern "C" size_t LLVMFuzzerMutate(uint8_t* data, size_t size, size_t max_size);

namespace sentencepiece::logging {
void SetMinLogLevel(int v);
}

namespace {

// ---- a structure-aware mutator -------------------------------------------------
// Byte mutations seldom build a trie that stays inside its array, let alone one with
// many rules along one path. Half the time, this mutator keeps the input's pieces and
// gives it a freshly built normalizer or denormalizer map: random keys over a small
// alphabet with long shared prefixes (up to 48 rules, paths up to 48 bytes, so the
// 32-match bound is crossed both ways), values into the middle of the strings or past
// their last NUL, now and then a loop (a node whose children are an ancestor's) or a
// damaged unit; sometimes a chain of user-defined pieces that start one another.

using tinylm::internal::protobuf::field;
using tinylm::internal::protobuf::number_field;

/// The top-level fields of `proto` other than the normalizer and denormalizer specs, or
/// "" when it does not parse.
std::string pieces_of(std::string_view proto) {
  std::string kept;
  while (!proto.empty()) {
    const size_t start = proto.size();
    uint64_t tag = 0, value = 0;
    auto read = [&](uint64_t& v) {
      v = 0;
      for (int i = 0; i < 10 && !proto.empty(); ++i) {
        const auto b = static_cast<unsigned char>(proto.front());
        proto.remove_prefix(1);
        v |= static_cast<uint64_t>(b & 0x7F) << (7 * i);
        if (!(b & 0x80)) return true;
      }
      return false;
    };
    const char* at = proto.data();
    if (!read(tag)) return {};
    const int wire = static_cast<int>(tag & 7);
    if (wire == 0 && !read(value)) return {};
    if (wire == 2) {
      if (!read(value) || value > proto.size()) return {};
      proto.remove_prefix(static_cast<size_t>(value));
    } else if (wire != 0) {
      return {};
    }
    const size_t used = start - proto.size();
    if ((tag >> 3) != 3 && (tag >> 3) != 5) kept.append(at, used);
  }
  return kept;
}

std::string random_charsmap(std::mt19937& rng) {
  auto pick = [&](uint32_t n) { return static_cast<uint32_t>(rng() % n); };
  const unsigned char alphabet[] = {'a', 'a', 'a', 'b', 0xE3, 0x80, ' ', 0};
  struct Node {
    std::map<unsigned char, uint32_t> next;
    uint32_t parent = 0;
    bool rule = false;
  };
  std::vector<Node> nodes(1);
  const uint32_t rules = 1 + pick(48);
  for (uint32_t r = 0; r < rules; ++r) {
    // Extend a node already there (shared prefixes), by up to 48 bytes in all.
    uint32_t at = pick(static_cast<uint32_t>(nodes.size()));
    for (uint32_t len = 1 + pick(pick(4) == 0 ? 48 : 4); len > 0; --len) {
      const unsigned char c = alphabet[pick(sizeof alphabet)];
      auto it = nodes[at].next.find(c);
      if (it == nodes[at].next.end()) {
        nodes.push_back({});
        nodes.back().parent = at;
        it = nodes[at].next.emplace(c, static_cast<uint32_t>(nodes.size() - 1)).first;
      }
      at = it->second;
    }
    nodes[at].rule = true;
  }
  std::string strings = "b";
  strings += '\0';
  strings += "\xE2\x96\x81";
  strings += '\0';
  strings += "cc";
  if (pick(4)) strings += '\0';  // else the last string is unterminated
  // One 256-unit block per node, its children at block ^ byte, its value at block ^ 0.
  const uint32_t none = 1u << 31;
  std::vector<uint32_t> units(256 * (nodes.size() + 1), none);
  std::vector<uint32_t> unit_of(nodes.size(), 0);
  std::vector<uint32_t> block_of(nodes.size());
  for (uint32_t i = 0; i < nodes.size(); ++i) block_of[i] = 256 * (i + 1);
  if (pick(8) == 0 && nodes.size() > 2) {  // a loop: a node's children are an ancestor's
    const uint32_t i = 1 + pick(static_cast<uint32_t>(nodes.size() - 1));
    block_of[i] = block_of[nodes[i].parent];
  }
  for (uint32_t i = 0; i < nodes.size(); ++i)
    for (const auto& [c, child] : nodes[i].next) unit_of[child] = block_of[i] ^ c;
  for (uint32_t i = 0; i < nodes.size(); ++i) {
    const uint32_t u = unit_of[i], block = block_of[i];
    uint32_t unit = ((u ^ block) << 10);
    if (i > 0) unit |= static_cast<uint32_t>(static_cast<unsigned char>(u ^ block_of[nodes[i].parent]));
    if (nodes[i].rule) {
      unit |= 1u << 8;
      units[block] = none | pick(static_cast<uint32_t>(strings.size() + 2));  // sometimes past the end
    }
    units[u] = unit;
  }
  for (uint32_t k = pick(3) == 0 ? 1 + pick(3) : 0; k > 0; --k) units[pick(static_cast<uint32_t>(units.size()))] = rng();
  std::string map(4, '\0');
  const uint32_t trie_bytes = static_cast<uint32_t>(units.size() * 4);
  std::memcpy(map.data(), &trie_bytes, 4);
  map.append(reinterpret_cast<const char*>(units.data()), trie_bytes);
  return map + strings;
}

}  // namespace

extern "C" size_t LLVMFuzzerCustomMutator(uint8_t* data, size_t size, size_t max_size, unsigned seed) {
  std::mt19937 rng(seed);
  if (rng() % 2) return LLVMFuzzerMutate(data, size, max_size);
  std::string proto = pieces_of(std::string_view(reinterpret_cast<const char*>(data), size));
  if (proto.empty()) proto = field(1, field(1, "<unk>") + number_field(3, 2)) + field(1, field(1, "b"));
  if (rng() % 4 == 0) {
    const uint32_t chain = 1 + rng() % 80;
    for (uint32_t i = 1; i <= chain; ++i) proto += field(1, field(1, std::string(i, 'a')) + number_field(3, 4));
  } else {
    proto += field(rng() % 4 ? 3 : 5, field(2, random_charsmap(rng)));
  }
  if (proto.size() > max_size) return LLVMFuzzerMutate(data, size, max_size);
  std::memcpy(data, proto.data(), proto.size());
  return proto.size();
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string proto(reinterpret_cast<const char*>(data), size);
  if (!tinylm::internal::sentencepiece_model_problem(proto).empty()) return 0;
  sentencepiece::logging::SetMinLogLevel(3);
  sentencepiece::SentencePieceProcessor sp;
  if (!sp.LoadFromSerializedProto(proto).ok()) return 0;
  // Text, and a long run of one byte: the input that walks a trie path (or a chain of
  // user-defined pieces) as deep as it goes, where matches pile up (the regression files
  // and the mutator's tries use 'a').
  for (const std::string input : {std::string("The cat sat on the mat. ｆｕｌｌｗｉｄｔｈ ① ㍿ naïve \t\n 42"),
                                  std::string(80, 'a')}) {
    std::vector<int> ids;
    if (!sp.Encode(input, &ids).ok()) return 0;
    std::string text;
    (void)sp.Decode(ids, &text);
  }
  return 0;
}
