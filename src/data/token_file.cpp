// Token files and the task that trains on them. B = batch, T = sequence length
#include <tinylm/data/token_file.h>

#include "internal/crc32.h"
#include "internal/files.h"
#include "internal/text.h"

#include <torch/types.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

namespace tinylm::data {

namespace {

constexpr char kMagic[8] = {'T', 'I', 'N', 'Y', 'L', 'M', 'T', 'K'};

template <typename T>
void put(unsigned char* p, T v) {
  std::memcpy(p, &v, sizeof v);  // little-endian hosts only (x86-64, aarch64)
}
template <typename T>
T get(const unsigned char* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

std::string encode_header(const TokenFileHeader& h) {
  std::string bytes(kTokenFileHeaderBytes, '\0');
  auto* p = reinterpret_cast<unsigned char*>(bytes.data());
  std::memcpy(p, kMagic, sizeof kMagic);
  put<uint32_t>(p + 8, h.version);
  put<uint32_t>(p + 12, h.token_bytes);
  put<uint64_t>(p + 16, h.tokens);
  put<uint64_t>(p + 24, h.vocab_size);
  put<uint32_t>(p + 32, h.tokenizer_crc);
  put<uint32_t>(p + 36, static_cast<uint32_t>(h.tokenizer));
  put<uint64_t>(p + 40, h.text_bytes);
  return bytes;
}

}  // namespace

TokenFileHeader header_for(const Tokenizer* tokenizer, int64_t vocab_size) {
  TORCH_CHECK(vocab_size >= 1 && static_cast<uint64_t>(vocab_size) <= (1ull << 32),
              "token file: vocabulary size ", vocab_size, " is out of range [1, 2^32]");
  TokenFileHeader h;
  h.vocab_size = static_cast<uint64_t>(vocab_size);
  h.token_bytes = vocab_size <= 65536 ? 2 : 4;
  if (tokenizer && tokenizer->kind() == "byte") h.tokenizer = TokenizerCode::byte;
  if (tokenizer && tokenizer->kind() == "sentencepiece") {
    h.tokenizer = TokenizerCode::sentencepiece;
    const auto model = tokenizer->model_bytes();
    h.tokenizer_crc = internal::crc32(model.data(), model.size());
  }
  return h;
}

// ---- writing ---------------------------------------------------------------------------

struct TokenFileWriter::File {
  internal::AtomicFile file;
  File(const std::string& path) : file(path, "token file") {}
};

TokenFileWriter::TokenFileWriter(const std::string& path, TokenFileHeader header)
    : file_(std::make_unique<File>(path)), header_(header) {
  TORCH_CHECK(header_.token_bytes == 2 || header_.token_bytes == 4, "token file: ",
              header_.token_bytes, " bytes per token: use 2 or 4");
  header_.tokens = 0;
  header_.text_bytes = 0;
  const auto bytes = encode_header(header_);
  file_->file.write(bytes.data(), bytes.size());
}

TokenFileWriter::~TokenFileWriter() = default;

void TokenFileWriter::append(const std::vector<int64_t>& ids, uint64_t text_bytes) {
  TORCH_CHECK(file_, "token file '", file_ ? file_->file.path() : "", "' is already finished");
  const size_t w = header_.token_bytes;
  const size_t at = buffer_.size();
  buffer_.resize(at + ids.size() * w);
  unsigned char* p = buffer_.data() + at;
  for (const auto id : ids) {
    TORCH_CHECK(id >= 0 && static_cast<uint64_t>(id) < header_.vocab_size, "token file '",
                internal::printable(file_->file.path()), "': token ", id, " is outside the vocabulary [0, ",
                header_.vocab_size, ")");
    if (w == 2) put<uint16_t>(p, static_cast<uint16_t>(id));
    else put<uint32_t>(p, static_cast<uint32_t>(id));
    p += w;
  }
  header_.tokens += ids.size();
  header_.text_bytes += text_bytes;
  if (buffer_.size() >= (1u << 20)) flush();
}

void TokenFileWriter::flush() {
  file_->file.write(buffer_.data(), buffer_.size());
  buffer_.clear();
}

void TokenFileWriter::finish() {
  TORCH_CHECK(file_, "token file is already finished");
  flush();
  const auto bytes = encode_header(header_);
  file_->file.write_at(0, bytes.data(), bytes.size());
  file_->file.commit();
  file_.reset();
}

// ---- reading ---------------------------------------------------------------------------

TokenFile::TokenFile(const std::string& path, bool in_memory) : path_(path) {
  const uint64_t size = internal::check_regular_file(path, "token file");
  const std::string shown = internal::printable(path);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  TORCH_CHECK(fd >= 0, "cannot open token file '", shown, "': ", std::strerror(errno));
  unsigned char head[kTokenFileHeaderBytes] = {};
  const ssize_t got = ::pread(fd, head, sizeof head, 0);
  const bool magic = got >= static_cast<ssize_t>(sizeof kMagic) && std::memcmp(head, kMagic, sizeof kMagic) == 0;
  auto fail = [&](const std::string& why) {
    ::close(fd);
    TORCH_CHECK(false, why);
  };
  if (!magic)
    fail("'" + shown + "' is not a tinylm token file (it does not start with TINYLMTK): make one with "
         "tinylm prepare");
  if (got < static_cast<ssize_t>(sizeof head))
    fail("token file '" + shown + "' is truncated: " + std::to_string(size) + " bytes, shorter than its " +
         std::to_string(kTokenFileHeaderBytes) + "-byte header");
  header_.version = get<uint32_t>(head + 8);
  header_.token_bytes = get<uint32_t>(head + 12);
  header_.tokens = get<uint64_t>(head + 16);
  header_.vocab_size = get<uint64_t>(head + 24);
  header_.tokenizer_crc = get<uint32_t>(head + 32);
  const uint32_t code = get<uint32_t>(head + 36);
  header_.text_bytes = get<uint64_t>(head + 40);
  if (header_.version != kTokenFileVersion)
    fail("token file '" + shown + "' has format version " + std::to_string(header_.version) +
         ", but this tinylm reads version " + std::to_string(kTokenFileVersion) +
         (header_.version > kTokenFileVersion ? ": upgrade tinylm" : ": prepare it again"));
  if (header_.token_bytes != 2 && header_.token_bytes != 4)
    fail("token file '" + shown + "' is damaged: " + std::to_string(header_.token_bytes) +
         " bytes per token (2 or 4 expected)");
  if (code > 2) fail("token file '" + shown + "' is damaged: unknown tokenizer code " + std::to_string(code));
  header_.tokenizer = static_cast<TokenizerCode>(code);
  if (header_.vocab_size == 0 || header_.vocab_size > (header_.token_bytes == 2 ? 65536ull : 1ull << 32))
    fail("token file '" + shown + "' is damaged: vocabulary size " + std::to_string(header_.vocab_size) +
         " does not fit " + std::to_string(header_.token_bytes) + "-byte tokens");
  const uint64_t have = size - kTokenFileHeaderBytes;
  const bool fits = header_.tokens <= have / header_.token_bytes;
  if (!fits || header_.tokens * header_.token_bytes != have)
    fail("token file '" + shown + "' " +
         (fits ? "has " + std::to_string(have - header_.tokens * header_.token_bytes) +
                     " bytes after its last token: it is damaged, prepare it again"
               : "is truncated: its header promises " + std::to_string(header_.tokens) + " tokens (" +
                     std::to_string(header_.tokens * header_.token_bytes) + " bytes), the file holds " +
                     std::to_string(have) + ": prepare it again"));
  if (in_memory) {
    copy_.resize(size);
    uint64_t done = 0;
    while (done < size) {
      const ssize_t n = ::pread(fd, copy_.data() + done, size - done, static_cast<off_t>(done));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) fail("cannot read token file '" + shown + "': " + (n < 0 ? std::strerror(errno) : "it shrank"));
      done += static_cast<uint64_t>(n);
    }
    tokens_ = copy_.data() + kTokenFileHeaderBytes;
  } else {
    map_bytes_ = size;
    map_ = ::mmap(nullptr, map_bytes_, PROT_READ, MAP_SHARED, fd, 0);
    if (map_ == MAP_FAILED) {
      map_ = nullptr;
      fail("cannot map token file '" + shown + "': " + std::strerror(errno));
    }
    ::madvise(map_, map_bytes_, MADV_RANDOM);  // windows are random: no read-ahead
    tokens_ = static_cast<const unsigned char*>(map_) + kTokenFileHeaderBytes;
  }
  ::close(fd);
}

TokenFile::~TokenFile() {
  if (map_) ::munmap(map_, map_bytes_);
}

void TokenFile::read(int64_t start, int64_t n, int64_t* out) const {
  TORCH_CHECK(start >= 0 && n >= 0 && start + n <= size(), "token file '", internal::printable(path_),
              "': tokens [", start, ", ", start + n, ") are outside [0, ", size(), ")");
  const size_t w = header_.token_bytes;
  const unsigned char* p = tokens_ + static_cast<size_t>(start) * w;
  for (int64_t i = 0; i < n; ++i, p += w) {
    const uint64_t id = w == 2 ? get<uint16_t>(p) : get<uint32_t>(p);
    TORCH_CHECK(id < header_.vocab_size, "token file '", internal::printable(path_), "' is damaged: token ",
                start + i, " is ", id, ", outside its vocabulary [0, ", header_.vocab_size, ")");
    out[i] = static_cast<int64_t>(id);
  }
}

void TokenFile::release_pages() const {
  // Unmaps the pages this process touched; the kernel keeps them in its page cache, so
  // reading them again costs a minor fault. (Counting pages is not enough: a fault may
  // map a whole large folio of the page cache, up to 2 MiB, around the page read.)
  if (map_) ::madvise(map_, map_bytes_, MADV_DONTNEED);
}

void TokenFile::verify() const {
  std::vector<int64_t> chunk(1 << 16);
  for (int64_t at = 0; at < size(); at += static_cast<int64_t>(chunk.size())) {
    read(at, std::min<int64_t>(static_cast<int64_t>(chunk.size()), size() - at), chunk.data());
    release_pages();
  }
}

// ---- the task --------------------------------------------------------------------------

TokenFileTask::TokenFileTask(const std::string& dir, int64_t seq_len, TokenFileTaskOptions options)
    : seq_len_(seq_len) {
  namespace fs = std::filesystem;
  TORCH_CHECK(seq_len >= 1, "tokens task: seq-len must be >= 1, got ", seq_len);
  const std::string shown = internal::printable(dir);
  std::error_code ec;
  const auto status = fs::status(dir, ec);
  TORCH_CHECK(fs::exists(status), "prepared corpus '", shown,
              "' does not exist: make it with tinylm prepare");
  TORCH_CHECK(fs::is_directory(status), "data '", shown,
              "' is a file, but task tokens reads a directory made by tinylm prepare (train.bin, "
              "val.bin): prepare the file into one, or train on its bytes with task = text");
  train_ = std::make_unique<TokenFile>((fs::path(dir) / "train.bin").string(), options.in_memory);
  val_ = std::make_unique<TokenFile>((fs::path(dir) / "val.bin").string(), options.in_memory);
  const auto& a = train_->header();
  const auto& b = val_->header();
  TORCH_CHECK(a.vocab_size == b.vocab_size && a.tokenizer == b.tokenizer && a.tokenizer_crc == b.tokenizer_crc,
              "prepared corpus '", shown, "': train.bin and val.bin were not prepared together (vocabulary ",
              a.vocab_size, " vs ", b.vocab_size, ", or another tokenizer): prepare it again");
  if (a.tokenizer == TokenizerCode::byte) {
    tokenizer_ = byte_tokenizer();
  } else if (a.tokenizer == TokenizerCode::sentencepiece) {
    const auto model_path = (fs::path(dir) / "tokenizer.model").string();
    const auto model = internal::read_regular_file(model_path, "tokenizer model", 1ull << 30);
    TORCH_CHECK(internal::crc32(model.data(), model.size()) == a.tokenizer_crc, "prepared corpus '",
                shown, "': tokenizer.model is not the tokenizer its tokens were made with (CRC differs):"
                " prepare it again");
    tokenizer_ = sentencepiece_tokenizer(model, model_path);
  } else {
    tokenizer_ = ids_tokenizer(static_cast<int64_t>(a.vocab_size));
  }
  TORCH_CHECK(tokenizer_->vocab_size() == static_cast<int64_t>(a.vocab_size), "prepared corpus '", shown,
              "': its tokenizer has ", tokenizer_->vocab_size(), " tokens but the token files say ",
              a.vocab_size, ": prepare it again");
  for (const auto* f : {train_.get(), val_.get()})
    TORCH_CHECK(f->size() >= seq_len + 1, "token file '", internal::printable(f->path()), "' holds ",
                f->size(), " tokens, but a window needs seq-len + 1 = ", seq_len + 1,
                " (use more text, a larger val-fraction, or a smaller seq-len)");
}

double TokenFileTask::bytes_per_token(Split split) const {
  const auto& h = file(split).header();
  return h.tokens && h.text_bytes ? static_cast<double>(h.text_bytes) / static_cast<double>(h.tokens) : 0;
}

Batch TokenFileTask::sample(int64_t batch_size, Split split, at::Generator& gen) {
  TORCH_CHECK(batch_size >= 1, "tokens task: batch_size must be >= 1, got ", batch_size);
  const auto& data = file(split);
  const int64_t n_windows = data.size() - seq_len_;  // start offsets with T + 1 tokens after them
  auto starts = torch::randint(n_windows, {batch_size, 1}, gen, torch::kLong);  // (B, 1)
  auto rows = torch::empty({batch_size, seq_len_ + 1}, torch::kLong);           // (B, T + 1)
  const auto* s = starts.data_ptr<int64_t>();
  auto* r = rows.data_ptr<int64_t>();
  for (int64_t b = 0; b < batch_size; ++b) data.read(s[b], seq_len_ + 1, r + b * (seq_len_ + 1));
  data.release_pages();  // resident memory stays flat however large the file
  Batch out;
  out.inputs = rows.narrow(1, 0, seq_len_).contiguous();   // (B, T)
  out.targets = rows.narrow(1, 1, seq_len_).contiguous();  // (B, T)
  out.scored = torch::ones({batch_size, seq_len_}, torch::kBool);
  return out;
}

}  // namespace tinylm::data
