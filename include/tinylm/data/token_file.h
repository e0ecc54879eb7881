// Token files: a corpus encoded once (tinylm prepare), read through a memory map.
//
// Layout (little-endian), a 64-byte header then the tokens:
//   bytes  0..7   magic "TINYLMTK"
//   bytes  8..11  format version (uint32, 1)
//   bytes 12..15  bytes per token (uint32: 2 = uint16 when the vocabulary has at most
//                 65536 ids, 4 = uint32)
//   bytes 16..23  token count (uint64)
//   bytes 24..31  vocabulary size (uint64): every token is below it
//   bytes 32..35  CRC-32 of the tokenizer's model bytes (0 for byte-level)
//   bytes 36..39  tokenizer kind (uint32: 0 none, 1 byte, 2 sentencepiece)
//   bytes 40..47  UTF-8 bytes of text the tokens encode (uint64; bits per byte)
//   bytes 48..63  reserved (0)
//   bytes 64..    the tokens
// A prepared corpus is a directory: train.bin, val.bin, tokenizer.model (SentencePiece
// only) and prepare.json (what was read, the counts, the tokenizer).
#pragma once

#include <tinylm/data/tasks.h>
#include <tinylm/data/tokenizer.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace tinylm::data {

constexpr uint32_t kTokenFileVersion = 1;
constexpr uint64_t kTokenFileHeaderBytes = 64;

enum class TokenizerCode : uint32_t { none = 0, byte = 1, sentencepiece = 2 };

struct TokenFileHeader {
  uint32_t version = kTokenFileVersion;
  uint32_t token_bytes = 2;
  uint64_t tokens = 0;
  uint64_t vocab_size = 0;
  uint32_t tokenizer_crc = 0;
  TokenizerCode tokenizer = TokenizerCode::none;
  uint64_t text_bytes = 0;
};

/// The code and CRC a header records for `tokenizer` (nullptr: none).
TokenFileHeader header_for(const Tokenizer* tokenizer, int64_t vocab_size);

/// Writes a token file: tokens are appended, the header is completed by finish(), which
/// puts the file in place atomically. Destroyed unfinished, it leaves nothing behind.
class TokenFileWriter {
 public:
  TokenFileWriter(const std::string& path, TokenFileHeader header);
  ~TokenFileWriter();
  TokenFileWriter(const TokenFileWriter&) = delete;
  TokenFileWriter& operator=(const TokenFileWriter&) = delete;
  /// Throws on an id outside [0, vocab_size).
  void append(const std::vector<int64_t>& ids, uint64_t text_bytes);
  uint64_t tokens() const { return header_.tokens; }
  uint64_t text_bytes() const { return header_.text_bytes; }
  void finish();

 private:
  void flush();
  struct File;
  std::unique_ptr<File> file_;
  TokenFileHeader header_;
  std::vector<unsigned char> buffer_;
};

/// A token file opened read-only: header checked against the file's size before
/// anything is mapped; the tokens are read through a memory map (or, with
/// in_memory, copied into memory once).
class TokenFile {
 public:
  explicit TokenFile(const std::string& path, bool in_memory = false);
  ~TokenFile();
  TokenFile(const TokenFile&) = delete;
  TokenFile& operator=(const TokenFile&) = delete;
  const TokenFileHeader& header() const { return header_; }
  const std::string& path() const { return path_; }
  int64_t size() const { return static_cast<int64_t>(header_.tokens); }
  /// Copies tokens [start, start + n) into out as int64.
  void read(int64_t start, int64_t n, int64_t* out) const;
  /// Every token, checked to be below the vocabulary size (a full pass over the file).
  void verify() const;
  /// Drops the mapped pages read so far from this process's resident memory (they stay
  /// in the kernel's page cache); a no-op in memory.
  void release_pages() const;

 private:
  std::string path_;
  TokenFileHeader header_;
  const unsigned char* tokens_ = nullptr;  // the mapped (or copied) tokens
  void* map_ = nullptr;
  size_t map_bytes_ = 0;
  std::vector<unsigned char> copy_;
};

struct TokenFileTaskOptions {
  /// Copy the token files into memory instead of mapping them (for comparison).
  bool in_memory = false;
};

/// Language modelling on a prepared corpus (a directory made by prepare()): batches are
/// random windows of T + 1 tokens drawn from train.bin or val.bin with the generator
/// alone, like TextTask, so a saved generator state is an exact position in the data.
/// Resident memory does not grow with the corpus: the files are mapped read-only, and
/// the pages a batch read are released once it is copied out.
class TokenFileTask : public Task {
 public:
  TokenFileTask(const std::string& dir, int64_t seq_len, TokenFileTaskOptions options = {});
  std::string name() const override { return "tokens"; }
  int64_t vocab_size() const override { return static_cast<int64_t>(train_->header().vocab_size); }
  int64_t seq_len() const override { return seq_len_; }
  bool synthetic() const override { return false; }
  Batch sample(int64_t batch_size, Split split, at::Generator& gen) override;
  std::shared_ptr<const Tokenizer> tokenizer() const override { return tokenizer_; }
  double bytes_per_token(Split split) const override;
  const TokenFile& file(Split split) const { return split == Split::train ? *train_ : *val_; }

 private:
  int64_t seq_len_;
  std::unique_ptr<TokenFile> train_, val_;
  std::shared_ptr<const Tokenizer> tokenizer_;
};

}  // namespace tinylm::data
