// Fuzz target: a SentencePiece model as a checkpoint or a prepared corpus carries it.
// tinylm's check (src/data/sentencepiece/model_check.h) must refuse every model that
// SentencePiece cannot load safely: what it accepts is loaded into SentencePiece itself
// (linked directly here: no LibTorch, so no protobuf clash and no module to dlopen) and
// used to encode and decode. A crash or a sanitizer report inside SentencePiece is a
// model the check let through: a finding.
#include "data/sentencepiece/model_check.h"

#include <sentencepiece_processor.h>

#include <cstdint>
#include <string>
#include <vector>

namespace sentencepiece::logging {
void SetMinLogLevel(int v);
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string proto(reinterpret_cast<const char*>(data), size);
  if (!tinylm::internal::sentencepiece_model_problem(proto).empty()) return 0;
  sentencepiece::logging::SetMinLogLevel(3);
  sentencepiece::SentencePieceProcessor sp;
  if (!sp.LoadFromSerializedProto(proto).ok()) return 0;
  std::vector<int> ids;
  if (!sp.Encode("The cat sat on the mat. ｆｕｌｌｗｉｄｔｈ ① ㍿ naïve \t\n 42", &ids).ok()) return 0;
  std::string text;
  (void)sp.Decode(ids, &text);
  return 0;
}
