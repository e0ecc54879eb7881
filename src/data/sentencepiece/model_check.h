// Internal: tinylm's own check of a SentencePiece model before SentencePiece sees it.
//
// SentencePiece (0.1.97 on Debian 12) trusts the model it loads: the normalizer's
// character map (`precompiled_charsmap`: a double-array trie and the strings it maps to)
// is walked without bounds checks, so a damaged map reads and jumps outside the model's
// bytes. A model from a file (a checkpoint, a prepared corpus, --tokenizer-model) is
// checked here first: the protobuf wire format as a whole, and every trie node a lookup
// can reach, in the normalizer and the denormalizer. Pure C++ (no LibTorch), so that a
// fuzz target can use it with SentencePiece linked directly.
#pragma once

#include <string>
#include <string_view>

namespace tinylm::internal {

/// What is wrong with a serialized SentencePiece ModelProto, in a few words, or an empty
/// string when SentencePiece may be given it.
std::string sentencepiece_model_problem(std::string_view proto);

}  // namespace tinylm::internal
