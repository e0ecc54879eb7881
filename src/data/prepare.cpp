// tinylm prepare: text -> tokenizer + token files, streaming.
#include <tinylm/data/prepare.h>
#include <tinylm/data/token_file.h>

#include "internal/files.h"
#include "internal/text.h"

#include <c10/util/Exception.h>
#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace fs = std::filesystem;

namespace tinylm::data {

namespace {

using Clock = std::chrono::steady_clock;

/// The inputs as a list of sources: "-" or regular files, directories expanded.
struct Sources {
  std::vector<std::string> files;    // "-" is standard input
  std::vector<std::string> skipped;  // binary files found in directories
  uint64_t total_bytes = 0;          // of the regular files
  bool has_stdin = false;
};

/// True when the first 8 KiB hold a NUL byte (git's test for binary files).
bool looks_binary(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return false;  // reported when it is read
  char buffer[8192];
  const ssize_t n = ::read(fd, buffer, sizeof buffer);
  ::close(fd);
  return n > 0 && std::memchr(buffer, '\0', static_cast<size_t>(n)) != nullptr;
}

Sources list_sources(const std::vector<std::string>& inputs) {
  TORCH_CHECK(!inputs.empty(), "prepare: no input: give text files, directories or - (standard input)");
  Sources s;
  for (const auto& input : inputs) {
    if (input == "-") {
      TORCH_CHECK(!s.has_stdin, "prepare: standard input (-) is given twice");
      s.has_stdin = true;
      s.files.push_back(input);
      continue;
    }
    std::error_code ec;
    if (fs::is_directory(input, ec)) {
      std::vector<std::string> names;
      for (const auto& entry : fs::directory_iterator(input, ec)) {
        const auto name = entry.path().filename().string();
        // Regular files only: symbolic links (fortune's *.u8) would repeat a file.
        if (name.empty() || name[0] == '.' || !entry.is_regular_file(ec) || entry.is_symlink(ec)) continue;
        names.push_back(entry.path().string());
      }
      TORCH_CHECK(!ec, "prepare: cannot list directory '", internal::printable(input), "': ", ec.message());
      std::sort(names.begin(), names.end());
      size_t taken = 0;
      for (const auto& path : names) {
        if (looks_binary(path)) {
          s.skipped.push_back(path);
          continue;
        }
        s.total_bytes += internal::check_regular_file(path, "data file");
        s.files.push_back(path);
        ++taken;
      }
      TORCH_CHECK(taken > 0, "prepare: directory '", internal::printable(input),
                  "' holds no text files (regular files that are not binary)");
      continue;
    }
    s.total_bytes += internal::check_regular_file(input, "data file");
    TORCH_CHECK(!looks_binary(input), "data file '", internal::printable(input),
                "' is binary (it holds NUL bytes), not UTF-8 text: give text files");
    s.files.push_back(input);
  }
  return s;
}

/// Reads the sources line by line ('\n' not included), checking UTF-8, in bounded memory.
class LineReader {
 public:
  explicit LineReader(const std::vector<std::string>& files) : files_(files) {}
  ~LineReader() { close(); }
  /// The next line; false at the end of the last source. `newline` says whether a '\n'
  /// ended it (the last line of a file may have none).
  bool next(std::string& line, bool& newline) {
    line.swap(carry_);  // the end of a long line's previous piece, if any
    carry_.clear();
    for (;;) {
      if (fd_ < 0 && !open_next()) return false;
      const char* begin = buffer_.data() + pos_;
      const char* end = buffer_.data() + len_;
      const char* nl = static_cast<const char*>(std::memchr(begin, '\n', static_cast<size_t>(end - begin)));
      if (nl) {
        line.append(begin, nl);
        pos_ += static_cast<size_t>(nl - begin) + 1;
        bytes_read_ += static_cast<uint64_t>(nl - begin) + 1;
        newline = true;
        check(line, true);
        return true;
      }
      line.append(begin, end);
      bytes_read_ += static_cast<uint64_t>(end - begin);
      pos_ = len_;
      // Bounded memory: a line longer than 1 MiB is handed over in pieces (cut on a
      // character boundary).
      if (line.size() >= (1u << 20)) {
        const size_t cut = internal::utf8_valid_prefix(line);
        if (cut + 4 < line.size()) check(line, false);  // not just a character cut in two: fails
        carry_ = line.substr(cut);  // a character cut in two: its start goes with the next piece
        line.resize(cut);
        newline = false;
        check(line, false);
        return true;
      }
      if (!fill()) {
        close();
        if (!line.empty()) {
          newline = false;
          check(line, true);
          return true;
        }
      }
    }
  }
  uint64_t bytes_read() const { return bytes_read_; }

 private:
  bool open_next() {
    if (next_file_ >= files_.size()) return false;
    path_ = files_[next_file_++];
    line_number_ = 0;
    offset_ = 0;
    if (path_ == "-") {
      fd_ = STDIN_FILENO;
    } else {
      internal::check_regular_file(path_, "data file");
      fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
      TORCH_CHECK(fd_ >= 0, "cannot open data file '", internal::printable(path_), "': ", std::strerror(errno));
    }
    pos_ = len_ = 0;
    buffer_.resize(1 << 16);
    if (!fill()) return close(), open_next();
    // A UTF-8 byte-order mark at the start of a file (an editor's, not the text's) is
    // skipped; offsets in messages still count it. (From a pipe, a first read shorter
    // than the mark keeps it, as the text's first character.)
    pos_ = internal::utf8_bom_length(std::string_view(buffer_.data(), len_));
    offset_ = pos_;
    bytes_read_ += pos_;
    return true;
  }
  bool fill() {
    for (;;) {
      const ssize_t n = ::read(fd_, buffer_.data(), buffer_.size());
      if (n < 0 && errno == EINTR) continue;
      TORCH_CHECK(n >= 0, "cannot read data file '", internal::printable(path_), "': ", std::strerror(errno));
      pos_ = 0;
      len_ = static_cast<size_t>(n);
      return n > 0;
    }
  }
  void close() {
    if (fd_ > STDIN_FILENO) ::close(fd_);
    fd_ = -1;
  }
  /// `line` is the rest of the current line, or (complete = false) a piece of it.
  void check(const std::string& line, bool complete) {
    const std::string shown = internal::printable(path_ == "-" ? "standard input" : path_);
    const size_t ok = internal::utf8_valid_prefix(line);
    TORCH_CHECK(ok == line.size(), "data file '", shown, "' is not UTF-8 text: line ", line_number_ + 1,
                ", byte offset ", offset_ + ok, " (convert it, e.g. iconv -f latin1 -t utf-8, or leave it out)");
    TORCH_CHECK(line.find('\0') == std::string::npos, "data file '", shown, "' holds a NUL byte on line ",
                line_number_ + 1, ": it is binary, not text");
    offset_ += line.size() + (complete ? 1 : 0);
    if (complete) ++line_number_;
  }

  const std::vector<std::string>& files_;
  size_t next_file_ = 0;
  std::string path_;
  int fd_ = -1;
  std::vector<char> buffer_;
  std::string carry_;
  size_t pos_ = 0, len_ = 0;
  uint64_t line_number_ = 0, offset_ = 0, bytes_read_ = 0;
};

/// Progress at most every 64 KiB of input and 0.2 s.
class Reporter {
 public:
  Reporter(const PrepareOptions& o, std::string phase, uint64_t total)
      : o_(o), start_(Clock::now()), last_(start_) {
    p_.phase = std::move(phase);
    p_.bytes_total = total;
  }
  void update(uint64_t bytes, uint64_t tokens, bool final = false) {
    p_.bytes_done = bytes;
    p_.tokens = tokens;
    if (!o_.progress) return;
    const auto now = Clock::now();
    if (!final && (bytes - last_bytes_ < (1u << 16) || now - last_ < std::chrono::milliseconds(200))) return;
    last_ = now;
    last_bytes_ = bytes;
    p_.seconds = std::chrono::duration<double>(now - start_).count();
    o_.progress(p_);
  }
  double seconds() const { return std::chrono::duration<double>(Clock::now() - start_).count(); }

 private:
  const PrepareOptions& o_;
  PrepareProgress p_;
  Clock::time_point start_, last_;
  uint64_t last_bytes_ = 0;
};

/// Removes a directory this call made if it fails before the end.
struct MadeDirectory {
  std::string path;
  bool keep = false;
  ~MadeDirectory() {
    std::error_code ec;
    if (!path.empty() && !keep) fs::remove(path, ec);  // only when empty
  }
};

}  // namespace

PrepareSummary prepare(const PrepareOptions& o) {
  TORCH_CHECK(o.val_fraction > 0 && o.val_fraction < 1, "val-fraction must be in (0, 1), got ", o.val_fraction);
  TORCH_CHECK(!o.out_dir.empty(), "prepare: no output directory given");
  const bool train_tokenizer = o.tokenizer_model.empty() && o.tokenizer != "byte";
  TORCH_CHECK(!o.tokenizer_model.empty() || o.tokenizer == "byte" || o.tokenizer == "bpe" ||
                  o.tokenizer == "unigram",
              "tokenizer '", internal::printable(o.tokenizer), "' is unknown: use byte, bpe or unigram");
  auto sources = list_sources(o.inputs);
  TORCH_CHECK(!(sources.has_stdin && train_tokenizer), "prepare: training a tokenizer reads the text twice,"
              " which standard input cannot give: save it to a file, or use the byte tokenizer or an "
              "existing SentencePiece model");

  // The output directory: new or empty; nothing in it is ever replaced.
  MadeDirectory made;
  {
    std::error_code ec;
    const auto st = fs::status(o.out_dir, ec);
    if (fs::exists(st)) {
      TORCH_CHECK(fs::is_directory(st), "output directory '", internal::printable(o.out_dir),
                  "' exists and is not a directory: choose a new directory");
      TORCH_CHECK(fs::is_empty(o.out_dir, ec), "output directory '", internal::printable(o.out_dir),
                  "' already holds files: choose a new directory (tinylm never overwrites a prepared corpus)");
    } else {
      TORCH_CHECK(fs::create_directories(o.out_dir, ec) || fs::is_directory(o.out_dir),
                  "cannot make output directory '", internal::printable(o.out_dir), "': ", ec.message());
      made.path = o.out_dir;
    }
  }

  PrepareSummary summary;
  summary.files = sources.files;
  summary.skipped = sources.skipped;

  // 1. The tokenizer.
  std::shared_ptr<const Tokenizer> tokenizer;
  if (!o.tokenizer_model.empty()) {
    tokenizer = load_sentencepiece(o.tokenizer_model);
  } else if (o.tokenizer == "byte") {
    tokenizer = byte_tokenizer();
  } else {
    Reporter report(o, "tokenizer", sources.total_bytes);
    LineReader reader(sources.files);
    uint64_t text_bytes = 0;
    bool newline = false;
    auto next = [&](std::string& line) {
      while (reader.next(line, newline)) {
        report.update(reader.bytes_read(), 0);
        text_bytes += line.size();
        if (!line.empty()) return true;
      }
      return false;
    };
    auto options = o.sentencepiece;
    options.model_type = o.tokenizer;
    options.vocab_size = o.vocab_size;
    // Emptiness first: SentencePiece's own message for it is obscure.
    TORCH_CHECK(sources.total_bytes > 0, "prepare: the input is empty: give some text");
    tokenizer = train_sentencepiece(next, options);
    TORCH_CHECK(text_bytes > 0, "prepare: the input holds no text (only empty lines)");
    report.update(reader.bytes_read(), 0, true);
    summary.tokenizer_seconds = report.seconds();
  }
  summary.vocab_size = tokenizer->vocab_size();
  summary.tokenizer = tokenizer->describe();

  // 2. The tokens: blocks of lines go to train or val.
  const auto header = header_for(tokenizer.get(), tokenizer->vocab_size());
  summary.token_bytes = header.token_bytes;
  const auto out = fs::path(o.out_dir);
  TokenFileWriter train((out / "train.bin").string(), header);
  TokenFileWriter val((out / "val.bin").string(), header);
  // Block size: 64 KiB, or about 1/200 of a smaller input, so even a small corpus gets a
  // validation split spread over it (4 KiB from standard input, whose size is unknown).
  const uint64_t block_bytes =
      sources.has_stdin ? 4096 : std::clamp<uint64_t>(sources.total_bytes / 200, 256, 65536);
  Reporter report(o, "encode", sources.has_stdin ? 0 : sources.total_bytes);
  LineReader reader(sources.files);
  std::string line;
  bool newline = false;
  uint64_t block = 0, in_block = 0;
  // Block i is held out when i * f + 1/2 passes an integer: a share f of the blocks,
  // evenly spaced, the first one at 1 / (2 f) (block 4 for f = 0.1).
  auto in_val = [&](uint64_t i) {
    return std::floor((i + 1) * o.val_fraction + 0.5) > std::floor(i * o.val_fraction + 0.5);
  };
  const auto newline_ids = tokenizer->encode("\n");
  while (reader.next(line, newline)) {
    auto ids = tokenizer->encode(line);
    if (newline) ids.insert(ids.end(), newline_ids.begin(), newline_ids.end());
    auto& writer = in_val(block) ? val : train;
    writer.append(ids, line.size() + (newline ? 1 : 0));
    in_block += line.size() + 1;
    if (in_block >= block_bytes) {
      ++block;
      in_block = 0;
    }
    report.update(reader.bytes_read(), train.tokens() + val.tokens());
  }
  report.update(reader.bytes_read(), train.tokens() + val.tokens(), true);
  summary.encode_seconds = report.seconds();
  summary.train_bytes = train.text_bytes();
  summary.val_bytes = val.text_bytes();
  summary.train_tokens = train.tokens();
  summary.val_tokens = val.tokens();
  TORCH_CHECK(summary.train_tokens + summary.val_tokens > 0, "prepare: the input is empty: give some text");
  TORCH_CHECK(summary.val_tokens > 0 && summary.train_tokens > 0, "prepare: ",
              reader.bytes_read(), " bytes of text are too few to hold out val-fraction ", o.val_fraction,
              " (", block + 1, " block(s) of ", block_bytes, " bytes): give more text or a larger val-fraction");

  // 3. Everything in place, the summary last.
  const nlohmann::ordered_json meta = {
      {"format", "tinylm-prepared-corpus"},
      {"version", kTokenFileVersion},
      {"files", summary.files},
      {"skipped_binary_files", summary.skipped},
      {"tokenizer", {{"kind", tokenizer->kind()}, {"describe", summary.tokenizer}, {"vocab_size", summary.vocab_size},
                     {"type", o.tokenizer_model.empty() ? o.tokenizer : "given: " + o.tokenizer_model}}},
      {"token_bytes", summary.token_bytes},
      {"val_fraction", o.val_fraction},
      {"block_bytes", block_bytes},
      {"train", {{"bytes", summary.train_bytes}, {"tokens", summary.train_tokens}}},
      {"val", {{"bytes", summary.val_bytes}, {"tokens", summary.val_tokens}}},
      {"bytes_per_token", summary.bytes_per_token()},
      {"seconds", {{"tokenizer", summary.tokenizer_seconds}, {"encode", summary.encode_seconds}}}};
  std::vector<fs::path> written;
  try {
    if (tokenizer->kind() == "sentencepiece") {
      written.push_back(out / "tokenizer.model");
      internal::write_file_atomically(written.back().string(), tokenizer->model_bytes(), "tokenizer model");
    }
    written.push_back(out / "train.bin");
    train.finish();
    written.push_back(out / "val.bin");
    val.finish();
    written.push_back(out / "prepare.json");
    internal::write_file_atomically(written.back().string(),
                                    meta.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n",
                                    "corpus summary");
  } catch (...) {
    std::error_code ec;
    for (const auto& path : written) fs::remove(path, ec);  // no half-prepared corpus
    throw;
  }
  made.keep = true;
  return summary;
}

}  // namespace tinylm::data
