// Tokenizers: ids, bytes, SentencePiece.
#include <tinylm/data/tokenizer.h>

#include "data/sentencepiece/model_check.h"
#include "data/sentencepiece/module.h"
#include "internal/files.h"
#include "internal/machine.h"
#include "internal/text.h"

#include <c10/util/Exception.h>

#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <mutex>
#include <regex>
#include <sstream>
#include <unordered_map>

// AddressSanitizer: GCC says __SANITIZE_ADDRESS__, clang __has_feature(address_sanitizer).
#if defined(__SANITIZE_ADDRESS__)
#define TINYLM_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TINYLM_ASAN 1
#endif
#endif

namespace tinylm::data {

std::string Tokenizer::describe() const {
  return kind() + ", " + std::to_string(vocab_size()) + " tokens";
}

namespace {

/// Where the module may be: $TINYLM_SENTENCEPIECE_MODULE, the build tree, the install
/// prefix, and lib/tinylm next to the program's bin/.
[[maybe_unused]] std::vector<std::string> module_candidates() {
  std::vector<std::string> out;
  if (const char* env = std::getenv("TINYLM_SENTENCEPIECE_MODULE"); env && *env) return {env};
#ifdef TINYLM_SENTENCEPIECE_BUILD_PATH
  out.push_back(TINYLM_SENTENCEPIECE_BUILD_PATH);
#endif
#ifdef TINYLM_SENTENCEPIECE_INSTALL_PATH
  out.push_back(TINYLM_SENTENCEPIECE_INSTALL_PATH);
#endif
  std::error_code ec;
  const auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) out.push_back((exe.parent_path().parent_path() / "lib" / "tinylm" / "tinylm_sentencepiece.so").string());
  return out;
}

struct LoadedModule {
  const internal::SentencePieceModule* module = nullptr;
  std::string error;
};

const LoadedModule& loaded_module() {
  static const LoadedModule loaded = [] {
    LoadedModule m;
#if defined(TINYLM_ASAN)
    m.error = "SentencePiece is not available in a sanitizer build: its module must be loaded with "
              "RTLD_DEEPBIND, which AddressSanitizer does not allow (use a release build)";
    return m;
#elif !defined(TINYLM_HAVE_SENTENCEPIECE)
    m.error = "SentencePiece is not available in this build: libsentencepiece-dev was not found when "
              "tinylm was built (install it and rebuild, or use the byte-level tokenizer)";
    return m;
#else
    std::string tried;
    for (const auto& path : module_candidates()) {
      std::error_code ec;
      if (!std::filesystem::exists(path, ec)) {
        tried += (tried.empty() ? "" : ", ") + path;
        continue;
      }
      void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
      if (!handle) {
        const char* why = ::dlerror();
        m.error = "cannot load tinylm's SentencePiece module '" + path + "': " + (why ? why : "unknown error") +
                  " (is libsentencepiece0 installed?)";
        return m;
      }
      using Entry = const internal::SentencePieceModule* (*)();
      auto entry = reinterpret_cast<Entry>(::dlsym(handle, "tinylm_sentencepiece_module"));
      if (!entry || entry()->abi() != internal::kSentencePieceModuleAbi) {
        m.error = "'" + path + "' is not this tinylm's SentencePiece module (another version): rebuild or "
                  "reinstall tinylm";
        return m;
      }
      m.module = entry();
      return m;
    }
    m.error = "tinylm's SentencePiece module was not found (looked for " + tried +
              "): install tinylm, or set TINYLM_SENTENCEPIECE_MODULE to the path of tinylm_sentencepiece.so";
    return m;
#endif
  }();
  return loaded;
}

const internal::SentencePieceModule& sentencepiece_module() {
  const auto& m = loaded_module();
  TORCH_CHECK(m.module, m.error);
  return *m.module;
}

void check_ids(const Tokenizer& t, const std::vector<int64_t>& ids) {
  for (const auto id : ids)
    TORCH_CHECK(id >= 0 && id < t.vocab_size(), t.kind(), " tokenizer: id ", id,
                " is outside its vocabulary [0, ", t.vocab_size(), ")");
}

class IdsTokenizer final : public Tokenizer {
 public:
  explicit IdsTokenizer(int64_t vocab_size) : V_(vocab_size) {
    TORCH_CHECK(vocab_size >= 1, "ids tokenizer: vocab size must be >= 1, got ", vocab_size);
  }
  std::string kind() const override { return "ids"; }
  int64_t vocab_size() const override { return V_; }
  std::vector<int64_t> encode(std::string_view text) const override {
    std::string s(text);
    std::replace(s.begin(), s.end(), ',', ' ');
    std::istringstream in(s);
    std::vector<int64_t> ids;
    std::string word;
    while (in >> word) {
      size_t used = 0;
      int64_t id = -1;
      try {
        id = std::stoll(word, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      TORCH_CHECK(used == word.size(), "prompt: '", internal::printable(word),
                  "' is not a token id; this model takes integers in [0, ", V_,
                  ") separated by spaces or commas");
      TORCH_CHECK(id >= 0 && id < V_, "prompt: token id ", id, " is out of range [0, ", V_, ")");
      ids.push_back(id);
    }
    return ids;
  }
  std::string decode(const std::vector<int64_t>& ids) const override {
    check_ids(*this, ids);
    std::string out;
    for (size_t i = 0; i < ids.size(); ++i) out += (i ? " " : "") + std::to_string(ids[i]);
    return out;
  }
  std::string model_bytes() const override { return std::to_string(V_); }

 private:
  int64_t V_;
};

class ByteTokenizer final : public Tokenizer {
 public:
  std::string kind() const override { return "byte"; }
  int64_t vocab_size() const override { return 256; }
  std::vector<int64_t> encode(std::string_view text) const override {
    std::vector<int64_t> ids(text.size());
    for (size_t i = 0; i < text.size(); ++i) ids[i] = static_cast<unsigned char>(text[i]);
    return ids;
  }
  std::string decode(const std::vector<int64_t>& ids) const override {
    check_ids(*this, ids);
    std::string bytes(ids.size(), '\0');
    for (size_t i = 0; i < ids.size(); ++i) bytes[i] = static_cast<char>(ids[i]);
    return internal::to_valid_utf8(bytes);
  }
  std::string model_bytes() const override { return {}; }
  std::string describe() const override { return "byte-level, 256 tokens"; }
};

class SentencePieceTokenizer final : public Tokenizer {
 public:
  SentencePieceTokenizer(const std::string& proto, const std::string& origin) : proto_(proto) {
    // SentencePiece does not check what it loads: tinylm does, first (model_check.h).
    const std::string problem = internal::sentencepiece_model_problem(proto);
    TORCH_CHECK(problem.empty(), "'", internal::printable(origin), "' is not a usable SentencePiece model: ",
                problem, ". The file is damaged or not a tokenizer: use the tokenizer the model was trained with");
    const auto& module = sentencepiece_module();
    try {
      sp_ = module.load(proto);
    } catch (const std::runtime_error& e) {
      const std::string why = e.what();
      TORCH_CHECK(why.find("Self-test") == std::string::npos, "'", internal::printable(origin),
                  "' is not a usable SentencePiece model: it fails its own self-test (the pieces it "
                  "encodes its sample texts into are not the ones it records), so it is damaged");
      TORCH_CHECK(false, "'", internal::printable(origin), "' is not a SentencePiece model: ",
                  internal::printable(why));
    }
    TORCH_CHECK(sp_->piece_size() >= 1, "SentencePiece model '", internal::printable(origin), "' has no pieces");
    newline_ = sp_->piece_to_id("<0x0A>");
    if (newline_ == sp_->unk_id() || !sp_->is_byte(newline_)) newline_ = -1;
  }
  std::string kind() const override { return "sentencepiece"; }
  int64_t vocab_size() const override { return sp_->piece_size(); }
  std::vector<int64_t> encode(std::string_view text) const override {
    std::vector<int64_t> out;
    std::vector<int> ids;
    auto encode_part = [&](std::string_view part) {
      if (part.empty()) return;
      try {
        sp_->encode(part, ids);
      } catch (const std::runtime_error& e) {
        TORCH_CHECK(false, "SentencePiece could not encode the text: ", internal::printable(e.what()));
      }
      out.insert(out.end(), ids.begin(), ids.end());
    };
    if (newline_ < 0) {
      encode_part(text);
      return out;
    }
    // Lines are encoded one by one and joined by the newline byte piece: SentencePiece
    // treats its input as one line.
    size_t start = 0;
    for (;;) {
      const size_t end = text.find('\n', start);
      encode_part(text.substr(start, end == std::string_view::npos ? end : end - start));
      if (end == std::string_view::npos) break;
      out.push_back(newline_);
      start = end + 1;
    }
    return out;
  }
  std::string decode(const std::vector<int64_t>& ids) const override {
    check_ids(*this, ids);
    try {
      return internal::to_valid_utf8(sp_->decode(std::vector<int>(ids.begin(), ids.end())));
    } catch (const std::runtime_error& e) {
      TORCH_CHECK(false, "SentencePiece could not decode: ", internal::printable(e.what()));
    }
  }
  std::string model_bytes() const override { return proto_; }
  std::string describe() const override {
    return "SentencePiece, " + std::to_string(vocab_size()) + " pieces" +
           (newline_ < 0 ? " (no newline piece: newlines are normalized away)" : "");
  }

 private:
  std::unique_ptr<internal::SentencePieceModel> sp_;
  std::string proto_;
  int newline_ = -1;
};

/// Lines for the trainer, long ones cut (on a character boundary) into pieces.
class LineCutter {
 public:
  LineCutter(const std::function<bool(std::string&)>& next, size_t max_bytes) : next_(next), max_bytes_(max_bytes) {}
  bool operator()(std::string& value) {
    while (rest_.empty()) {
      if (!next_(rest_)) return false;
    }
    size_t cut = std::min(rest_.size(), max_bytes_);
    while (cut < rest_.size() && cut > 0 && (static_cast<unsigned char>(rest_[cut]) & 0xC0) == 0x80) --cut;
    if (cut == 0) cut = std::min(rest_.size(), max_bytes_);
    value = rest_.substr(0, cut);
    rest_.erase(0, cut);
    return true;
  }

 private:
  const std::function<bool(std::string&)>& next_;
  size_t max_bytes_;
  std::string rest_;
};

}  // namespace

bool sentencepiece_available(std::string* why) {
  const auto& m = loaded_module();
  if (why) *why = m.error;
  return m.module != nullptr;
}

std::shared_ptr<const Tokenizer> ids_tokenizer(int64_t vocab_size) {
  return std::make_shared<IdsTokenizer>(vocab_size);
}

std::shared_ptr<const Tokenizer> byte_tokenizer() {
  static const auto instance = std::make_shared<ByteTokenizer>();
  return instance;
}

std::shared_ptr<const Tokenizer> sentencepiece_tokenizer(const std::string& model_proto,
                                                         const std::string& origin) {
  return std::make_shared<SentencePieceTokenizer>(model_proto, origin);
}

std::shared_ptr<const Tokenizer> load_sentencepiece(const std::string& path) {
  return sentencepiece_tokenizer(internal::read_regular_file(path, "tokenizer model", 1ull << 30), path);
}

std::shared_ptr<const Tokenizer> make_tokenizer(const std::string& kind, const std::string& model_bytes,
                                                const std::string& origin) {
  if (kind == "byte") return byte_tokenizer();
  if (kind == "sentencepiece") return sentencepiece_tokenizer(model_bytes, origin);
  if (kind == "ids") {
    int64_t v = 0;
    try {
      v = std::stoll(model_bytes);
    } catch (const std::exception&) {
      v = 0;
    }
    TORCH_CHECK(v >= 1, internal::printable(origin), ": the ids tokenizer's vocabulary size '",
                internal::printable(model_bytes), "' is not a positive integer");
    return ids_tokenizer(v);
  }
  TORCH_CHECK(false, internal::printable(origin), ": tokenizer kind '", internal::printable(kind),
              "' is unknown to this tinylm (it knows ids, byte and sentencepiece): upgrade tinylm");
}

std::shared_ptr<const Tokenizer> train_sentencepiece(const std::function<bool(std::string&)>& next_line,
                                                     const SentencePieceOptions& o) {
  TORCH_CHECK(o.model_type == "bpe" || o.model_type == "unigram", "tokenizer type '",
              internal::printable(o.model_type), "' is unknown: use bpe or unigram");
  // 256 byte pieces + <unk> + at least one learned piece.
  TORCH_CHECK(o.vocab_size >= 258 && o.vocab_size <= (1 << 22), "vocab-size ", o.vocab_size,
              " is out of range for a SentencePiece tokenizer: use 258 (256 byte pieces, <unk> and"
              " one more) to 4194304");
  TORCH_CHECK(o.normalization == "identity" || o.normalization == "nmt_nfkc", "normalization '",
              internal::printable(o.normalization), "' is unknown: use identity or nmt_nfkc");
  TORCH_CHECK(o.max_sentences >= 1, "max_sentences must be >= 1, got ", o.max_sentences);
  TORCH_CHECK(o.max_sentence_bytes >= 16, "max_sentence_bytes must be >= 16, got ", o.max_sentence_bytes);
  TORCH_CHECK(o.threads >= 0, "threads must be >= 0, got ", o.threads);
  const int64_t threads = o.threads > 0 ? o.threads : internal::usable_cpu_count();
  const std::unordered_map<std::string, std::string> spec = {
      {"model_type", o.model_type},
      {"vocab_size", std::to_string(o.vocab_size)},
      {"byte_fallback", "true"},                  // every text encodes losslessly
      {"character_coverage", "0.9995"},
      {"normalization_rule_name", o.normalization},  // identity: the text as it is
      {"remove_extra_whitespaces", "false"},
      {"add_dummy_prefix", "false"},              // no space added before each line
      {"split_digits", "true"},
      {"bos_id", "-1"},                           // tinylm uses neither
      {"eos_id", "-1"},
      {"input_sentence_size", std::to_string(o.max_sentences)},
      {"shuffle_input_sentence", "true"},
      {"max_sentence_length", std::to_string(o.max_sentence_bytes)},
      {"num_threads", std::to_string(threads)},
      {"minloglevel", "3"},                       // the library prints nothing (module.cpp)
  };
  const auto& module = sentencepiece_module();
  LineCutter cutter(next_line, static_cast<size_t>(o.max_sentence_bytes));
  std::string proto;
  try {
    proto = module.train(spec, [&cutter](std::string& line) { return cutter(line); });
  } catch (const std::runtime_error& e) {
    const std::string message = e.what();
    std::smatch m;
    if (std::regex_search(message, m, std::regex("value <= ([0-9]+)")))
      TORCH_CHECK(false, "vocab-size ", o.vocab_size, " is too large for this corpus: SentencePiece can",
                  " make at most ", m[1].str(), " pieces from it; use a vocabulary of ", m[1].str(),
                  " or less, or more text");
    TORCH_CHECK(false, "training the SentencePiece tokenizer failed: ", internal::printable(message));
  }
  return sentencepiece_tokenizer(proto, "the tokenizer just trained");
}

}  // namespace tinylm::data
