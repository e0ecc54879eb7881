// src/data/tokenizer.cpp: the byte, ids and SentencePiece tokenizers map text to ids and back.
// The [sentencepiece] case runs in its own ctest entry (skipped where SentencePiece cannot
// load, in sanitizer builds).
#include "../test_util.h"

#include <tinylm/data/prepare.h>
#include <tinylm/data/token_file.h>
#include <tinylm/data/tokenizer.h>
#include <tinylm/nn/model.h>
#include <tinylm/train/checkpoint.h>

#include "internal/system.h"

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
             Catch::Contains("'x.model' is not a SentencePiece model"));

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
