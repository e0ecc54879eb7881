// tinylm_sentencepiece.so: SentencePiece behind the interface of module.h.
#include "module.h"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <stdexcept>

// Exported by libsentencepiece, declared in none of its headers on Debian 12.
namespace sentencepiece::logging {
void SetMinLogLevel(int v);
}

namespace {

// SentencePiece logs to std::cerr, and inside this module (loaded with RTLD_DEEPBIND)
// std::cerr binds to libstdc++'s own object rather than the program's copy of it, which
// is the one that was constructed: any log line would crash. So the module lets nothing
// below FATAL through (3: LOG_FATAL); errors reach the library as statuses.
constexpr int kQuiet = 3;

using tinylm::internal::SentencePieceModel;
using tinylm::internal::SentencePieceModule;

void check(const sentencepiece::util::Status& status) {
  if (!status.ok()) throw std::runtime_error(status.ToString());
}

class Model final : public SentencePieceModel {
 public:
  explicit Model(const std::string& proto) {
    sentencepiece::logging::SetMinLogLevel(kQuiet);
    check(sp_.LoadFromSerializedProto(proto));
  }
  int piece_size() const override { return sp_.GetPieceSize(); }
  int piece_to_id(const std::string& piece) const override { return sp_.PieceToId(piece); }
  int unk_id() const override { return sp_.unk_id(); }
  bool is_byte(int id) const override { return sp_.IsByte(id); }
  void encode(std::string_view text, std::vector<int>& ids) const override {
    check(sp_.Encode(absl::string_view(text.data(), text.size()), &ids));
  }
  std::string decode(const std::vector<int>& ids) const override {
    std::string text;
    check(sp_.Decode(ids, &text));
    return text;
  }

 private:
  sentencepiece::SentencePieceProcessor sp_;
};

/// Feeds the trainer from a callback.
class Lines final : public sentencepiece::SentenceIterator {
 public:
  explicit Lines(const std::function<bool(std::string&)>& next) : next_(next) { Next(); }
  bool done() const override { return done_; }
  void Next() override { done_ = !next_(value_); }
  const std::string& value() const override { return value_; }
  sentencepiece::util::Status status() const override { return {}; }

 private:
  const std::function<bool(std::string&)>& next_;
  std::string value_;
  bool done_ = false;
};

class Module final : public SentencePieceModule {
 public:
  int abi() const override { return tinylm::internal::kSentencePieceModuleAbi; }
  std::unique_ptr<SentencePieceModel> load(const std::string& proto) const override {
    return std::make_unique<Model>(proto);
  }
  std::string train(const std::unordered_map<std::string, std::string>& spec,
                    const std::function<bool(std::string&)>& next) const override {
    sentencepiece::logging::SetMinLogLevel(kQuiet);
    Lines lines(next);
    std::string proto;
    check(sentencepiece::SentencePieceTrainer::Train(spec, &lines, &proto));
    return proto;
  }
};

}  // namespace

extern "C" const SentencePieceModule* tinylm_sentencepiece_module() {
  static const Module module;
  return &module;
}
