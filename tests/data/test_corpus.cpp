// Tokenizers, token files, prepare() and the task on prepared corpora.
// Tests tagged [sentencepiece] run in their own ctest entry (skipped where SentencePiece
// cannot load, in sanitizer builds).
#include "test_util.h"

#include <tinylm/data/prepare.h>
#include <tinylm/data/token_file.h>
#include <tinylm/data/tokenizer.h>
#include <tinylm/train/checkpoint.h>
#include <tinylm/nn/model.h>

#include "internal/system.h"

#include <ATen/CPUGeneratorImpl.h>

#include <fstream>
#include <sstream>

using namespace tinylm;
using tinylm::test::error_message;
using tinylm::test::scratch_dir;
namespace fs = std::filesystem;

namespace {

void write_text(const fs::path& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary);
  f << text;
}

std::string read_text(const fs::path& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

/// A small English-like corpus: lines of words, some blank lines, some non-ASCII.
std::string corpus(int lines) {
  const char* words[] = {"the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran", "to",
                         "café", "naïve", "über", "fish", "swam", "in", "sea", "sun", "rose", "—"};
  std::string out;
  uint64_t x = 12345;
  for (int i = 0; i < lines; ++i) {
    const int n = 3 + static_cast<int>(i % 9);
    for (int k = 0; k < n; ++k) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      out += (k ? " " : "") + std::string(words[(x >> 33) % 20]);
    }
    out += i % 7 == 6 ? "\n\n" : "\n";
  }
  return out;
}

std::vector<int64_t> all_tokens(const data::TokenFile& f) {
  std::vector<int64_t> ids(static_cast<size_t>(f.size()));
  f.read(0, f.size(), ids.data());
  return ids;
}

/// Every line of `part` is a line of `whole` (the held-out blocks are cut at lines).
bool lines_of(const std::string& part, const std::string& whole) {
  std::istringstream in(part);
  std::string line;
  while (std::getline(in, line))
    if (whole.find(line) == std::string::npos) return false;
  return true;
}

}  // namespace

TEST_CASE("byte and ids tokenizers map text to ids and back") {
  auto bytes = data::byte_tokenizer();
  const std::string text = "héllo\nworld ☃";
  auto ids = bytes->encode(text);
  REQUIRE(ids.size() == text.size());
  CHECK(ids[1] == 0xC3);
  CHECK(bytes->decode(ids) == text);
  // A sample cut in the middle of a character still prints as UTF-8.
  ids.pop_back();
  const auto cut = bytes->decode(ids);
  CHECK(internal::utf8_valid_prefix(cut) == cut.size());
  CHECK_THAT(cut, Catch::Contains("\xEF\xBF\xBD"));
  CHECK_THAT(error_message([&] { bytes->decode({256}); }), Catch::Contains("id 256 is outside"));

  auto ids_tok = data::ids_tokenizer(10);
  CHECK(ids_tok->encode("1, 2 9") == std::vector<int64_t>{1, 2, 9});
  CHECK(ids_tok->decode({3, 4}) == "3 4");
  CHECK_THAT(error_message([&] { ids_tok->encode("10"); }), Catch::Contains("out of range [0, 10)"));
  auto rebuilt = data::make_tokenizer(ids_tok->kind(), ids_tok->model_bytes(), "test");
  CHECK(rebuilt->vocab_size() == 10);
  CHECK_THAT(error_message([&] { data::make_tokenizer("gpt2", "", "x.ckpt"); }),
             Catch::Contains("tokenizer kind 'gpt2' is unknown"));
}

TEST_CASE("UTF-8 checks find the first bad byte") {
  CHECK(internal::utf8_valid_prefix("abc") == 3);
  CHECK(internal::utf8_valid_prefix("ab\xC3") == 2);          // cut
  CHECK(internal::utf8_valid_prefix("a\xC0\x80") == 1);       // overlong
  CHECK(internal::utf8_valid_prefix("a\xED\xA0\x80") == 1);   // surrogate
  CHECK(internal::utf8_valid_prefix("€\xFF") == 3);
  CHECK(internal::to_valid_utf8("a\xFF" "b") == "a\xEF\xBF\xBD" "b");
}

TEST_CASE("token files keep their header and tokens, and refuse damage") {
  const auto dir = scratch_dir("token_file");
  const auto path = (dir / "t.bin").string();
  auto header = data::header_for(data::byte_tokenizer().get(), 256);
  CHECK(header.token_bytes == 2);
  {
    data::TokenFileWriter w(path, header);
    w.append({1, 2, 255}, 3);
    w.append({7}, 1);
    CHECK_FALSE(fs::exists(path));  // only a temporary file until finish()
    w.finish();
  }
  data::TokenFile f(path);
  CHECK(f.size() == 4);
  CHECK(f.header().vocab_size == 256);
  CHECK(f.header().text_bytes == 4);
  CHECK(f.header().tokenizer == data::TokenizerCode::byte);
  CHECK(all_tokens(f) == std::vector<int64_t>{1, 2, 255, 7});
  data::TokenFile copy(path, /*in_memory=*/true);
  CHECK(all_tokens(copy) == all_tokens(f));

  // uint32 tokens above 65536 ids
  auto wide = data::header_for(nullptr, 100000);
  CHECK(wide.token_bytes == 4);
  {
    data::TokenFileWriter w((dir / "wide.bin").string(), wide);
    w.append({99999, 0}, 0);
    w.finish();
  }
  CHECK(all_tokens(data::TokenFile((dir / "wide.bin").string())) == std::vector<int64_t>{99999, 0});

  // a writer dropped before finish() (an error on the way) leaves nothing behind
  {
    data::TokenFileWriter w((dir / "half.bin").string(), header);
    w.append({1}, 1);
    CHECK_THAT(error_message([&] { w.append({256}, 1); }), Catch::Contains("token 256 is outside the vocabulary"));
  }
  int files = 0;
  for (const auto& entry : fs::directory_iterator(dir)) files += entry.path().filename() != "" ? 1 : 0;
  CHECK(files == 2);  // t.bin and wide.bin: no half.bin, no temporary file

  const std::string good = read_text(path);
  auto damaged = [&](const std::string& name, const std::string& bytes) {
    write_text(dir / name, bytes);
    return error_message([&] { data::TokenFile((dir / name).string()); });
  };
  CHECK_THAT(damaged("cut.bin", good.substr(0, good.size() - 1)),
             Catch::Contains("is truncated: its header promises 4 tokens"));
  CHECK_THAT(damaged("long.bin", good + "xy"), Catch::Contains("has 2 bytes after its last token"));
  CHECK_THAT(damaged("short.bin", good.substr(0, 20)), Catch::Contains("shorter than its 64-byte header"));
  CHECK_THAT(damaged("text.bin", "hello world, not tokens"), Catch::Contains("is not a tinylm token file"));
  std::string newer = good;
  newer[8] = 9;
  CHECK_THAT(damaged("newer.bin", newer), Catch::Contains("format version 9, but this tinylm reads version 1: upgrade"));
  std::string vocab = good;
  vocab[24] = 0;
  vocab[25] = 0;
  CHECK_THAT(damaged("vocab.bin", vocab), Catch::Contains("vocabulary size 0"));
  // a token past the vocabulary is found when it is read
  std::string bad_token = good;
  bad_token[64] = static_cast<char>(0x00);
  bad_token[65] = static_cast<char>(0x01);  // 256
  write_text(dir / "token.bin", bad_token);
  data::TokenFile bad((dir / "token.bin").string());
  CHECK_THAT(error_message([&] { bad.verify(); }), Catch::Contains("token 0 is 256, outside its vocabulary"));
  CHECK_THAT(error_message([&] { data::TokenFile((dir).string()); }), Catch::Contains("is a directory"));
  CHECK_THAT(error_message([&] { data::TokenFile("/dev/null"); }), Catch::Contains("not a regular file"));
}

TEST_CASE("prepare with the byte tokenizer splits text into train and val losslessly") {
  const auto dir = scratch_dir("prepare_bytes");
  fs::create_directories(dir / "in");
  const std::string a = corpus(400), b = corpus(150).substr(7);
  write_text(dir / "in" / "a.txt", a);
  write_text(dir / "in" / "b.txt", b);
  write_text(dir / "in" / "index.dat", std::string("\0\1\2binary", 9));
  data::PrepareOptions o;
  o.inputs = {(dir / "in").string()};
  o.tokenizer = "byte";
  o.out_dir = (dir / "out").string();
  int calls = 0;
  o.progress = [&](const data::PrepareProgress& p) {
    ++calls;
    CHECK(p.bytes_done <= p.bytes_total);
  };
  const auto s = data::prepare(o);
  CHECK(calls >= 1);
  CHECK(s.files.size() == 2);
  REQUIRE(s.skipped.size() == 1);
  CHECK_THAT(s.skipped[0], Catch::Contains("index.dat"));
  CHECK(s.train_bytes + s.val_bytes == a.size() + b.size());
  CHECK(s.train_tokens == s.train_bytes);  // bytes
  const double held_out = static_cast<double>(s.val_bytes) / (s.train_bytes + s.val_bytes);
  CHECK(held_out > 0.05);
  CHECK(held_out < 0.2);
  data::TokenFile train((dir / "out" / "train.bin").string()), val((dir / "out" / "val.bin").string());
  const auto tok = data::byte_tokenizer();
  const std::string train_text = tok->decode(all_tokens(train)), val_text = tok->decode(all_tokens(val));
  CHECK(train_text.size() + val_text.size() == a.size() + b.size());
  CHECK(lines_of(val_text, a + b));
  CHECK(fs::exists(dir / "out" / "prepare.json"));
  CHECK_FALSE(fs::exists(dir / "out" / "tokenizer.model"));

  // the task reads it: windows are contiguous runs of the files, the same for a seed,
  // from the map or from memory
  data::TokenFileTask task((dir / "out").string(), 16);
  data::TokenFileTask in_memory((dir / "out").string(), 16, data::TokenFileTaskOptions{true});
  CHECK(task.vocab_size() == 256);
  CHECK(task.tokenizer()->kind() == "byte");
  CHECK(task.bytes_per_token(data::Split::validation) == Approx(1.0));
  auto g1 = at::make_generator<at::CPUGeneratorImpl>(7), g2 = at::make_generator<at::CPUGeneratorImpl>(7);
  auto b1 = task.sample(8, data::Split::validation, g1), b2 = in_memory.sample(8, data::Split::validation, g2);
  CHECK(torch::equal(b1.inputs, b2.inputs));
  CHECK(torch::equal(b1.inputs.narrow(1, 1, 15), b1.targets.narrow(1, 0, 15)));
  const std::string row = task.decode(b1.inputs[3].unsqueeze(0));
  CHECK(val_text.find(row) != std::string::npos);
  CHECK_THAT(error_message([&] { data::TokenFileTask((dir / "out").string(), 1000000); }),
             Catch::Contains("but a window needs seq-len + 1 = 1000001"));
  CHECK_THAT(error_message([&] { data::TokenFileTask((dir / "in" / "a.txt").string(), 8); }),
             Catch::Contains("is a file, but task tokens reads a directory made by tinylm prepare"));
  CHECK_THAT(error_message([&] { data::TokenFileTask((dir / "missing").string(), 8); }),
             Catch::Contains("does not exist: make it with tinylm prepare"));
}

TEST_CASE("prepare refuses bad input and leaves nothing behind") {
  const auto dir = scratch_dir("prepare_errors");
  write_text(dir / "good.txt", corpus(300));
  write_text(dir / "latin1.txt", "caf\xE9\nok\n");
  write_text(dir / "empty.txt", "");
  write_text(dir / "nul.txt", std::string("a\0b\n", 4));
  write_text(dir / "tiny.txt", "one line\n");
  auto run = [&](std::vector<std::string> inputs, const std::string& out, const std::string& tokenizer = "byte") {
    data::PrepareOptions o;
    for (auto& i : inputs) o.inputs.push_back((dir / i).string());
    o.tokenizer = tokenizer;
    o.out_dir = (dir / out).string();
    return error_message([&] { data::prepare(o); });
  };
  CHECK_THAT(run({"good.txt", "latin1.txt"}, "o1"), Catch::Contains("latin1.txt' is not UTF-8 text: line 1, byte offset 3"));
  CHECK_FALSE(fs::exists(dir / "o1"));
  CHECK_THAT(run({"empty.txt"}, "o2"), Catch::Contains("the input is empty"));
  CHECK_FALSE(fs::exists(dir / "o2"));
  CHECK_THAT(run({"nul.txt"}, "o3"), Catch::Contains("is binary (it holds NUL bytes)"));
  CHECK_THAT(run({"tiny.txt"}, "o4"), Catch::Contains("are too few to hold out val-fraction 0.1"));
  CHECK_FALSE(fs::exists(dir / "o4"));
  CHECK_THAT(run({"missing.txt"}, "o5"), Catch::Contains("does not exist"));
  CHECK_THAT(run({"good.txt"}, "o6", "wordpiece"), Catch::Contains("tokenizer 'wordpiece' is unknown"));
  fs::create_directories(dir / "full");
  write_text(dir / "full" / "keep.txt", "mine");
  CHECK_THAT(run({"good.txt"}, "full"), Catch::Contains("already holds files: choose a new directory"));
  CHECK(read_text(dir / "full" / "keep.txt") == "mine");
  CHECK_THAT(run({"good.txt"}, "good.txt"), Catch::Contains("exists and is not a directory"));
  data::PrepareOptions o;
  o.inputs = {"-"};
  o.tokenizer = "bpe";
  o.out_dir = (dir / "o7").string();
  CHECK_THAT(error_message([&] { data::prepare(o); }), Catch::Contains("which standard input cannot give"));
}

TEST_CASE("a checkpoint carries its tokenizer") {
  const auto dir = scratch_dir("checkpoint_tokenizer");
  auto model = nn::build_model(nn::architecture_of(nn::TinyAttentionLMOptions(256, 8, 16, 2)));
  train::TrainingState state;
  const auto with = (dir / "with.ckpt").string(), without = (dir / "without.ckpt").string();
  train::save_checkpoint(with, *model, nullptr, state, "", data::byte_tokenizer().get());
  train::save_checkpoint(without, *model, nullptr, state, "");
  auto tok = train::checkpoint_tokenizer(train::read_checkpoint(with));
  REQUIRE(tok);
  CHECK(tok->kind() == "byte");
  CHECK(tok->decode(tok->encode("abc")) == "abc");
  CHECK_FALSE(train::checkpoint_tokenizer(train::read_checkpoint(without)));
}

TEST_CASE("SentencePiece BPE trains, round-trips text exactly and travels in checkpoints", "[sentencepiece]") {
  std::string why;
  const bool available = data::sentencepiece_available(&why);
  INFO(why);
  REQUIRE(available);  // this ctest entry is skipped where it is not
  const std::string text = corpus(600);
  std::istringstream lines(text);
  auto next = [&](std::string& line) { return static_cast<bool>(std::getline(lines, line)); };
  data::SentencePieceOptions o;
  o.vocab_size = 320;
  const auto sp = data::train_sentencepiece(next, o);
  CHECK(sp->kind() == "sentencepiece");
  CHECK(sp->vocab_size() == 320);
  const std::string sample = "the cat  sat\n\n  on the mat — naïve ☃ 42\ttab\n";
  const auto ids = sp->encode(sample);
  CHECK(ids.size() < sample.size());  // pieces, not bytes
  CHECK(sp->decode(ids) == sample);    // exactly: spaces, newlines, unseen characters
  auto again = data::sentencepiece_tokenizer(sp->model_bytes(), "copy");
  CHECK(again->encode(sample) == ids);

  // too large a vocabulary names the largest that fits
  std::istringstream few("a b c\nabc cab\n");
  auto next_few = [&](std::string& line) { return static_cast<bool>(std::getline(few, line)); };
  o.vocab_size = 5000;
  CHECK_THAT(error_message([&] { data::train_sentencepiece(next_few, o); }),
             Catch::Contains("vocab-size 5000 is too large for this corpus: SentencePiece can make at most"));
  CHECK_THAT(error_message([&] { data::sentencepiece_tokenizer("not a model", "x.model"); }),
             Catch::Contains("'x.model' is not a SentencePiece model"));

  // prepare with BPE: lossless over train + val, the tokenizer saved, checked by the task
  const auto dir = scratch_dir("prepare_bpe");
  write_text(dir / "c.txt", text);
  data::PrepareOptions p;
  p.inputs = {(dir / "c.txt").string()};
  p.vocab_size = 300;
  p.out_dir = (dir / "out").string();
  const auto s = data::prepare(p);
  CHECK(s.vocab_size == 300);
  CHECK(s.bytes_per_token() > 1.5);
  data::TokenFileTask task(p.out_dir, 8);
  const auto tok = task.tokenizer();
  CHECK(tok->kind() == "sentencepiece");
  const auto train_text = tok->decode(all_tokens(task.file(data::Split::train)));
  const auto val_text = tok->decode(all_tokens(task.file(data::Split::validation)));
  CHECK(train_text.size() + val_text.size() == text.size());
  CHECK(lines_of(val_text, text));
  CHECK(task.bytes_per_token(data::Split::validation) > 1.5);

  // a tokenizer.model swapped for another is caught
  write_text(dir / "out" / "tokenizer.model", sp->model_bytes());
  CHECK_THAT(error_message([&] { data::TokenFileTask(p.out_dir, 8); }),
             Catch::Contains("tokenizer.model is not the tokenizer its tokens were made with"));

  auto model = nn::build_model(nn::architecture_of(nn::TinyAttentionLMOptions(300, 8, 16, 2)));
  const auto path = (dir / "m.ckpt").string();
  train::save_checkpoint(path, *model, nullptr, train::TrainingState{}, "", tok.get());
  auto loaded = train::checkpoint_tokenizer(train::read_checkpoint(path));
  REQUIRE(loaded);
  CHECK(loaded->model_bytes() == tok->model_bytes());
  CHECK(loaded->encode(sample) == tok->encode(sample));
}

TEST_CASE("prepare reads a line longer than its 1 MiB pieces without splitting a character") {
  const auto dir = scratch_dir("prepare_long_line");
  std::string line;
  while (line.size() < (3u << 20)) line += "aé☃";  // 1-, 2- and 3-byte characters
  const std::string text = line + "\n" + corpus(2000);
  write_text(dir / "long.txt", text);
  data::PrepareOptions o;
  o.inputs = {(dir / "long.txt").string()};
  o.tokenizer = "byte";
  o.out_dir = (dir / "out").string();
  const auto s = data::prepare(o);
  CHECK(s.train_bytes + s.val_bytes == text.size());
  const auto tok = data::byte_tokenizer();
  data::TokenFile train((dir / "out" / "train.bin").string()), val((dir / "out" / "val.bin").string());
  std::string bytes;
  for (const auto* f : {&train, &val})
    for (const auto id : all_tokens(*f)) bytes += static_cast<char>(id);
  CHECK(bytes.size() == text.size());
  CHECK(internal::utf8_valid_prefix(bytes) == bytes.size());  // no character was cut apart
}
