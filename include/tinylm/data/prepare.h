// Preparing a corpus: text files -> a tokenizer and token files (see token_file.h).
#pragma once

#include <tinylm/data/tokenizer.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace tinylm::data {

struct PrepareProgress {
  std::string phase;        // "tokenizer" (reading to train it) or "encode"
  uint64_t bytes_done = 0;  // of this phase
  uint64_t bytes_total = 0; // 0 when unknown (standard input)
  uint64_t tokens = 0;      // written so far
  double seconds = 0;       // since the phase began
};

struct PrepareOptions {
  /// Text files, directories (their regular files, by name; binary files skipped) or
  /// "-" (standard input). Every file must be UTF-8.
  std::vector<std::string> inputs;
  /// "byte", "bpe" or "unigram" (SentencePiece, trained here); ignored when
  /// tokenizer_model is given.
  std::string tokenizer = "bpe";
  /// A SentencePiece .model file to reuse instead of training one.
  std::string tokenizer_model;
  int64_t vocab_size = 4096;
  /// The share of the text held out for validation: one block of lines (64 KiB; 1/200
  /// of a smaller input; 4 KiB from standard input) in every 1 / val_fraction goes to
  /// val.bin, evenly spread over the corpus.
  double val_fraction = 0.1;
  /// The directory written: it must not exist or be empty. Made if missing.
  std::string out_dir;
  /// Trainer options (vocab_size and model_type are taken from above).
  SentencePieceOptions sentencepiece;
  /// Called about every 64 KiB and at the end of each phase.
  std::function<void(const PrepareProgress&)> progress;
};

struct PrepareSummary {
  std::vector<std::string> files;  // what was read, in order
  std::vector<std::string> skipped;  // binary files in the directories given
  uint64_t train_bytes = 0, val_bytes = 0;    // UTF-8 text
  uint64_t train_tokens = 0, val_tokens = 0;
  int64_t vocab_size = 0;
  std::string tokenizer;          // Tokenizer::describe()
  uint32_t token_bytes = 0;       // 2 or 4
  double tokenizer_seconds = 0, encode_seconds = 0;
  double bytes_per_token() const {
    return train_tokens + val_tokens ? static_cast<double>(train_bytes + val_bytes) / (train_tokens + val_tokens) : 0;
  }
};

/// Reads the inputs (streaming: memory stays bounded whatever their size), trains or
/// loads the tokenizer, and writes out_dir/{train.bin, val.bin, tokenizer.model,
/// prepare.json}. Each file is written to a temporary name and renamed at the end; on
/// any error nothing is left (an out_dir made here is removed). Input that is not UTF-8
/// is refused with the file, line and byte offset; an empty corpus, a validation split
/// with no text, or a vocabulary the corpus cannot fill, with the fix.
PrepareSummary prepare(const PrepareOptions& options);

}  // namespace tinylm::data
