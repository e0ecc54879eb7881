// src/data/tokenizer.cpp: the byte, ids and SentencePiece tokenizers map text to ids and back.
// The [sentencepiece] case runs in its own ctest entry (skipped where SentencePiece cannot
// load, in sanitizer builds).
#include "../test_util.h"

#include <tinylm/data/prepare.h>
#include <tinylm/data/token_file.h>
#include <tinylm/data/tokenizer.h>
#include <tinylm/nn/model.h>
#include <tinylm/train/checkpoint.h>

#include "internal/protobuf.h"
#include "data/sentencepiece/model_check.h"
#include "internal/text.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <random>
#include <sstream>
#include <string>
#include <vector>

using namespace tinylm;
using tinylm::test::all_tokens;
using tinylm::test::corpus;
using tinylm::test::error_message;
using tinylm::test::lines_of;
using tinylm::test::scratch_dir;
using tinylm::test::write_file;

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
             Catch::Contains("'x.model' is not a usable SentencePiece model"));

  // prepare with BPE: lossless over train + val, the tokenizer saved, checked by the task
  const auto dir = scratch_dir("prepare_bpe");
  write_file(dir / "c.txt", text);
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
  write_file(dir / "out" / "tokenizer.model", sp->model_bytes());
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

namespace wire {

// A few protobuf wire-format helpers, to damage SentencePiece models the way a bad file
// would.
using tinylm::internal::protobuf::field;
using tinylm::internal::protobuf::number_field;
uint64_t read_varint(const std::string& s, size_t& i) {
  uint64_t v = 0;
  for (int shift = 0;; shift += 7) {
    const auto b = static_cast<unsigned char>(s.at(i++));
    v |= static_cast<uint64_t>(b & 0x7F) << shift;
    if (!(b & 0x80)) return v;
  }
}
/// Where the bytes of length-delimited field `number` start in `message`, and how many.
std::pair<size_t, size_t> find_field(const std::string& message, int number, size_t from = 0,
                                     size_t to = std::string::npos) {
  size_t i = from;
  to = std::min(to, message.size());
  while (i < to) {
    const uint64_t tag = read_varint(message, i);
    const int wire = static_cast<int>(tag & 7);
    if (wire == 0) read_varint(message, i);
    else if (wire == 1) i += 8;
    else if (wire == 5) i += 4;
    else {
      const size_t n = read_varint(message, i);
      if (static_cast<int>(tag >> 3) == number) return {i, n};
      i += n;
    }
  }
  return {std::string::npos, 0};
}

/// A normalizer character map whose trie is one chain of `links` 'a' bytes from the root,
/// every node on it a rule (mapping to "b"); `loop`: the last node's 'a' leads back to the
/// first (a cycle no darts-clone trie has).
std::string chain_charsmap(int links, bool loop = false) {
  const uint32_t none = 1u << 31;  // a unit whose label matches no byte
  std::vector<uint32_t> units(256 * static_cast<size_t>(links + 2), none);
  uint32_t node = 0;
  for (int i = 0; i <= links; ++i) {
    // Its children's block (the root's again for a loop), holding its value at byte 0.
    const uint32_t block = 256u * static_cast<uint32_t>(loop && i == links ? 1 : i + 1);
    units[node] = ((node ^ block) << 10) | (i > 0 ? (1u << 8) | 'a' : 0u);  // offset, leaf, label
    if (i > 0) units[block] = none | 0;                                      // its value: "b", at 0
    node = block ^ 'a';
  }
  std::string map(4, '\0');
  const uint32_t trie_bytes = static_cast<uint32_t>(units.size() * 4);
  std::memcpy(map.data(), &trie_bytes, 4);
  map.append(reinterpret_cast<const char*>(units.data()), trie_bytes);
  return map + std::string("b\0", 2);
}

}  // namespace wire

TEST_CASE("SentencePiece models are checked before SentencePiece reads them", "[sentencepiece]") {
  std::string why;
  const bool available = data::sentencepiece_available(&why);
  INFO(why);
  REQUIRE(available);
  const std::string text = corpus(300) + "ｆｕｌｌｗｉｄｔｈ ｔｅｘｔ ① ㍿\n";
  std::istringstream lines(text);
  auto next = [&](std::string& line) { return static_cast<bool>(std::getline(lines, line)); };
  data::SentencePieceOptions o;
  o.vocab_size = 300;
  o.normalization = "nmt_nfkc";
  const auto sp = data::train_sentencepiece(next, o);
  // NFKC through the model's character map: full-width letters become ASCII.
  CHECK(sp->encode("ｔｈｅ ｃａｔ") == sp->encode("the cat"));
  const std::string proto = sp->model_bytes();
  using wire::field;
  const auto [spec_at, spec_size] = wire::find_field(proto, 3);
  REQUIRE(spec_at != std::string::npos);
  const auto [map_at, map_size] = wire::find_field(proto, 2, spec_at, spec_at + spec_size);
  REQUIRE(map_at != std::string::npos);
  REQUIRE(map_size > 1000);  // a real trie
  auto load = [](const std::string& bytes) { return data::sentencepiece_tokenizer(bytes, "t.model"); };

  // The trie's size beyond the map; a node whose children lie outside the trie.
  std::string damaged = proto;
  damaged.replace(map_at, 4, std::string("\xF0\xFF\xFF\x0F", 4));
  CHECK_THAT(error_message([&] { load(damaged); }),
             Catch::Contains("'t.model' is not a usable SentencePiece model: its normalizer's character map is "
                             "damaged (its trie claims"));
  damaged = proto;
  damaged.replace(map_at + 4, 4, std::string("\x00\xFC\xFF\x7F", 4));  // the root's offset: huge
  CHECK_THAT(error_message([&] { load(damaged); }), Catch::Contains("trie node 0 leads to units up to"));
  // A wire-format field longer than the model.
  CHECK_THAT(error_message([&] { load(proto + std::string("\x1A\xFF\xFF\x03", 4)); }),
             Catch::Contains("field 3 claims 65535 bytes where 0 remain"));

  // Bytes of the map changed at random: refused or harmless, never a crash (SentencePiece
  // 0.1.97 reads outside the model for most of these).
  std::mt19937 rng(7);
  int refused = 0, loaded = 0;
  for (int i = 0; i < 300; ++i) {
    std::string m = proto;
    for (int k = 0; k < 4; ++k)
      m[map_at + (k == 0 ? rng() % 64 : rng() % map_size)] = static_cast<char>(rng() & 0xFF);
    std::shared_ptr<const data::Tokenizer> t;
    try {
      t = load(m);
    } catch (const c10::Error&) {
      ++refused;
      continue;
    }
    ++loaded;
    t->decode(t->encode(text.substr(0, 2000) + "ｆｕｌｌｗｉｄｔｈ ① ㍿"));
  }
  CHECK(refused > 0);
  CHECK(loaded > 0);

  // A self-test that fails: SentencePiece reports it through its log, which must not be
  // written (it crashed the process); the error says what it means.
  const std::string sample = field(1, field(1, "the cat") + field(2, "▁nonsense ▁pieces"));
  CHECK_THAT(error_message([&] { load(proto + field(4, sample)); }),
             Catch::Contains("'t.model' is not a usable SentencePiece model: it fails its own self-test"));
  CHECK(internal::sentencepiece_model_problem(proto).empty());
  CHECK(internal::sentencepiece_model_problem("") == "it is empty");

  // A second normalizer spec is merged into the first: its map is the one used. 32 rules
  // along one path encode a long run of their byte; 33 crashed SentencePiece (it gathers
  // the matches into 32 slots and reads as many as there were) and are refused.
  const std::string run(40, 'a');
  const auto chained = load(proto + field(3, field(2, wire::chain_charsmap(32))));
  CHECK(!chained->encode(run).empty());
  CHECK_THAT(error_message([&] { load(proto + field(3, field(2, wire::chain_charsmap(33)))); }),
             Catch::Contains("one input can match 33 of its rules, more than the 32 SentencePiece holds"));

  // Models made by SentencePiece's own spm_train (fuzz/corpus/sentencepiece: nmt_nfkc,
  // nfkc_cf with a self-test, identity BPE with byte pieces) pass the check and load.
  int models = 0;
  for (const auto& entry : std::filesystem::directory_iterator(std::string(TINYLM_SOURCE_DIR) + "/fuzz/corpus/sentencepiece")) {
    INFO(entry.path().string());
    const auto t = data::load_sentencepiece(entry.path().string());
    CHECK(t->vocab_size() == 50 + (entry.path().filename().string().rfind("bpe", 0) == 0 ? 250 : 0));
    CHECK(!t->decode(t->encode("the cat sat on the mat")).empty());
    ++models;
  }
  CHECK(models == 3);
}

TEST_CASE("the SentencePiece model check stays inside the model it checks") {
  // No SentencePiece needed (so this runs in the sanitizer build too): the check alone,
  // on SentencePiece's own models and on mutants of them.
  std::mt19937 rng(11);
  int refused = 0, accepted = 0;
  for (const auto& entry : std::filesystem::directory_iterator(std::string(TINYLM_SOURCE_DIR) + "/fuzz/corpus/sentencepiece")) {
    INFO(entry.path().string());
    const std::string model = test::read_file(entry.path());
    CHECK(internal::sentencepiece_model_problem(model).empty());
    for (int i = 0; i < 200; ++i) {
      std::string m = model;
      for (int k = 0; k < 3; ++k) m[rng() % m.size()] = static_cast<char>(rng());
      if (i % 5 == 0) m.resize(rng() % m.size());
      (internal::sentencepiece_model_problem(m).empty() ? accepted : refused)++;
    }
  }
  CHECK(refused > 0);
  CHECK(accepted > 0);
}

TEST_CASE("the SentencePiece model check bounds the matches SentencePiece keeps in fixed arrays") {
  using wire::field;
  using wire::number_field;
  const std::string piece = field(1, field(1, "a"));
  auto with_map = [&](const std::string& map) { return piece + field(3, field(2, map)); };
  // The normalizer gathers the rules matching one input into 32 slots: 32 rules along one
  // path pass, 33 (an input of 33 'a's would match them all) are refused, in the
  // normalizer and the denormalizer alike; so is a cycle, and a path of 1025 bytes.
  CHECK(internal::sentencepiece_model_problem(with_map(wire::chain_charsmap(32))).empty());
  CHECK(internal::sentencepiece_model_problem(with_map(wire::chain_charsmap(33))) ==
        "its normalizer's character map is damaged (one input can match 33 of its rules, more than the 32 "
        "SentencePiece holds)");
  CHECK_THAT(internal::sentencepiece_model_problem(piece + field(5, field(2, wire::chain_charsmap(300)))),
             Catch::Contains("its denormalizer's character map is damaged (one input can match 255 or more"));
  CHECK_THAT(internal::sentencepiece_model_problem(with_map(wire::chain_charsmap(3, true))),
             Catch::Contains("its trie has a cycle through node"));
  CHECK_THAT(internal::sentencepiece_model_problem(with_map(wire::chain_charsmap(1025))),
             Catch::Contains("a path through its trie is longer than 1024 bytes"));

  // User-defined pieces that start one another: 64 pass, 65 are refused (SentencePiece's
  // prefix matcher keeps 64).
  auto with_user_defined = [&](int chain, const std::string& extra = "") {
    std::string proto = piece;
    for (int i = 1; i <= chain; ++i) proto += field(1, field(1, std::string(i, 'x')) + number_field(3, 4));
    if (!extra.empty()) proto += field(1, field(1, extra) + number_field(3, 4));
    return proto;
  };
  CHECK(internal::sentencepiece_model_problem(with_user_defined(64)).empty());
  CHECK(internal::sentencepiece_model_problem(with_user_defined(64, "y")).empty());
  CHECK(internal::sentencepiece_model_problem(with_user_defined(65)) ==
        "65 of its user-defined pieces start one another, more than the 64 SentencePiece holds");
  // A piece of any kind that is empty or holds a NUL byte: SentencePiece hands pieces to
  // darts-clone as C strings, which throws on the empty key that makes (the fuzz target's
  // first finding with the structure-aware mutator: a normal piece "\0&aaa...").
  CHECK(internal::sentencepiece_model_problem(with_user_defined(3, std::string("a\0b", 3))) ==
        "piece 4 is empty or holds a NUL byte");
  CHECK(internal::sentencepiece_model_problem(piece + field(1, field(1, std::string("\0&a", 3)))) ==
        "piece 1 is empty or holds a NUL byte");
  CHECK(internal::sentencepiece_model_problem(piece + field(1, number_field(3, 4))) ==
        "piece 1 is empty or holds a NUL byte");
}
