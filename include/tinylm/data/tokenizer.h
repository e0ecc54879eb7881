// Tokenizers: text <-> token ids. Three kinds, one interface:
//   ids            synthetic tasks: integers separated by spaces or commas
//   byte           each UTF-8 byte is a token (V = 256): zero setup
//   sentencepiece  BPE or unigram pieces from Google's SentencePiece library, trained by
//                  train_sentencepiece() (or any SentencePiece .model file)
// A tokenizer travels inside checkpoints (model_bytes()), so sampling needs no data.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace tinylm::data {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  /// "ids", "byte" or "sentencepiece".
  virtual std::string kind() const = 0;
  virtual int64_t vocab_size() const = 0;
  /// Text -> ids. Throws on text the tokenizer cannot take (ids: a word that is not an
  /// id in range).
  virtual std::vector<int64_t> encode(std::string_view text) const = 0;
  /// Ids -> text, always valid UTF-8: bytes that do not form UTF-8 (a byte model's
  /// sample cut mid-character) become U+FFFD. Throws on an id outside [0, vocab_size).
  virtual std::string decode(const std::vector<int64_t>& ids) const = 0;
  /// What rebuilds it with make_tokenizer(kind(), model_bytes()): the SentencePiece
  /// model proto, the vocabulary size of an ids tokenizer, nothing for bytes.
  virtual std::string model_bytes() const = 0;
  /// One line for people: "sentencepiece bpe, 2048 pieces".
  virtual std::string describe() const;
};

/// Integers in [0, vocab_size) separated by spaces or commas (decode: spaces).
std::shared_ptr<const Tokenizer> ids_tokenizer(int64_t vocab_size);
/// Bytes (V = 256).
std::shared_ptr<const Tokenizer> byte_tokenizer();
/// A SentencePiece model from its serialized proto (the bytes of a .model file);
/// `origin` names it in errors. Newlines are encoded as the model's byte piece <0x0A>
/// when it has one (models trained by tinylm do), else as SentencePiece normalizes them.
std::shared_ptr<const Tokenizer> sentencepiece_tokenizer(const std::string& model_proto,
                                                         const std::string& origin);
/// A SentencePiece .model file.
std::shared_ptr<const Tokenizer> load_sentencepiece(const std::string& path);
/// Whether SentencePiece can be used here (tinylm's SentencePiece module is found and
/// loads); `why` gets the reason when not. The sentencepiece functions throw it.
bool sentencepiece_available(std::string* why = nullptr);
/// The inverse of kind() + model_bytes(); throws naming `origin` on an unknown kind.
std::shared_ptr<const Tokenizer> make_tokenizer(const std::string& kind, const std::string& model_bytes,
                                                const std::string& origin);

struct SentencePieceOptions {
  /// "bpe" or "unigram".
  std::string model_type = "bpe";
  /// Pieces, including the 256 byte pieces and <unk>.
  int64_t vocab_size = 4096;
  /// The trainer keeps at most this many lines (a uniform sample of them): its memory
  /// stays bounded whatever the corpus size.
  int64_t max_sentences = 1'000'000;
  /// Lines longer than this many bytes are cut into pieces for training.
  int64_t max_sentence_bytes = 4096;
  /// Trainer threads; 0 = the CPUs this process may use.
  int64_t threads = 0;
  uint64_t seed = 0;
  /// SentencePiece's normalization rule: "identity" (the text as it is, lossless) or
  /// "nmt_nfkc" (Unicode NFKC, as SentencePiece's own default; not lossless).
  std::string normalization = "identity";
};

/// Trains a SentencePiece model on the lines `next_line` yields (it returns false at the
/// end). By default text is kept exactly: no normalization, spaces as they are, byte
/// fallback for characters outside the vocabulary (so every text encodes and decodes
/// losslessly).
/// A vocabulary the corpus cannot fill is refused with the largest size that fits.
std::shared_ptr<const Tokenizer> train_sentencepiece(const std::function<bool(std::string&)>& next_line,
                                                     const SentencePieceOptions& options);

}  // namespace tinylm::data
