// Internal: the interface of tinylm's SentencePiece module (tinylm_sentencepiece.so).
//
// Why a module: Debian's libsentencepiece carries its own copy of protobuf (3.14) and
// exports its symbols, while LibTorch loads the system libprotobuf (3.21). Linked into
// one program, whichever copy comes first in the symbol search order breaks the other
// (a crash while loading, or protobuf's version check). So SentencePiece is reached only
// through this module, loaded with dlopen(RTLD_LOCAL | RTLD_DEEPBIND): it and its
// libraries resolve their own symbols first and stay out of the program's namespace.
// Both sides share libstdc++, so the interface is plain C++ with virtual functions;
// the module throws std::runtime_error.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace tinylm::internal {

/// Bumped whenever the classes below change: a module of another version is refused.
constexpr int kSentencePieceModuleAbi = 1;

class SentencePieceModel {
 public:
  virtual ~SentencePieceModel() = default;
  virtual int piece_size() const = 0;
  virtual int piece_to_id(const std::string& piece) const = 0;
  virtual int unk_id() const = 0;
  virtual bool is_byte(int id) const = 0;
  virtual void encode(std::string_view text, std::vector<int>& ids) const = 0;
  virtual std::string decode(const std::vector<int>& ids) const = 0;
};

class SentencePieceModule {
 public:
  virtual ~SentencePieceModule() = default;
  virtual int abi() const = 0;
  virtual std::unique_ptr<SentencePieceModel> load(const std::string& proto) const = 0;
  /// Trains on the lines `next` yields; returns the model proto.
  virtual std::string train(const std::unordered_map<std::string, std::string>& spec,
                            const std::function<bool(std::string&)>& next) const = 0;
};

}  // namespace tinylm::internal

/// The module's one exported symbol.
extern "C" __attribute__((visibility("default"))) const tinylm::internal::SentencePieceModule*
tinylm_sentencepiece_module();
