// src/data/token_file.cpp: token files keep their header and tokens; damage is refused.
#include "../test_util.h"

#include <tinylm/data/token_file.h>
#include <tinylm/data/tokenizer.h>

#include <filesystem>
#include <string>
#include <vector>

using namespace tinylm;
using tinylm::test::all_tokens;
using tinylm::test::error_message;
using tinylm::test::read_file;
using tinylm::test::scratch_dir;
using tinylm::test::write_file;
namespace fs = std::filesystem;

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

  const std::string good = read_file(path);
  auto damaged = [&](const std::string& name, const std::string& bytes) {
    write_file(dir / name, bytes);
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
  write_file(dir / "token.bin", bad_token);
  data::TokenFile bad((dir / "token.bin").string());
  CHECK_THAT(error_message([&] { bad.verify(); }), Catch::Contains("token 0 is 256, outside its vocabulary"));
  CHECK_THAT(error_message([&] { data::TokenFile((dir).string()); }), Catch::Contains("is a directory"));
  CHECK_THAT(error_message([&] { data::TokenFile("/dev/null"); }), Catch::Contains("not a regular file"));
}
