#include "../test_util.h"

#include <tinylm/train/checkpoint.h>
#include <tinylm/train/trainer.h>

#include <filesystem>
#include <fstream>

using namespace tinylm;
using namespace tinylm::train;
using tinylm::test::error_message;

namespace fs = std::filesystem;

namespace {

fs::path scratch(const std::string& name) {
  auto dir = fs::temp_directory_path() / ("tinylm_ckpt_test_" + name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

std::string read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_bytes(const fs::path& p, const std::string& bytes) {
  std::ofstream(p, std::ios::binary) << bytes;
}

RunConfig small_transformer() {
  RunConfig c;
  c.model = "transformer";
  c.d_model = 16;
  c.n_heads = 2;
  c.n_layers = 1;
  return c;
}

}  // namespace

TEST_CASE("CRC-32 matches the standard check value", "[checkpoint]") {
  CHECK(crc32("123456789", 9) == 0xCBF43926u);
  CHECK(crc32("", 0) == 0u);
}

TEST_CASE("a checkpoint round-trips config, weights, optimizer and state", "[checkpoint]") {
  const auto dir = scratch("roundtrip");
  RunConfig c = small_transformer();
  c.out_dir = dir.string();
  c.lr = 1.25e-3;
  Trainer trainer(c);
  const auto path = (dir / "a.ckpt").string();
  trainer.save(path);
  auto ck = read_checkpoint(path);
  CHECK(ck.format_version == kCheckpointFormatVersion);
  CHECK(to_toml(ck.config) == to_toml(c));
  CHECK(ck.state.step == 0);
  CHECK(ck.state.data_rng_state.defined());
  auto model = build_model(ck.config);
  load_model_state(ck, *model);
  auto a = trainer.model()->named_parameters(), b = model->named_parameters();
  for (const auto& p : a) CHECK(torch::equal(p.value(), b[p.key()]));
  // Nothing but the checkpoint is left in the directory: no temporary files.
  int files = 0;
  for (const auto& e : fs::directory_iterator(dir)) files += e.is_regular_file();
  CHECK(files == 1);
}

TEST_CASE("bad checkpoints are refused with the file and the problem", "[checkpoint][errors]") {
  const auto dir = scratch("bad");
  RunConfig c = small_transformer();
  c.out_dir = dir.string();
  Trainer trainer(c);
  const auto good = dir / "good.ckpt";
  trainer.save(good.string());
  const std::string bytes = read_bytes(good);

  SECTION("missing") {
    CHECK_THAT(error_message([&] { read_checkpoint((dir / "none.ckpt").string()); }),
               Catch::Contains("does not exist"));
  }
  SECTION("foreign") {
    write_bytes(dir / "f.ckpt", "PK\x03\x04 not ours");
    CHECK_THAT(error_message([&] { read_checkpoint((dir / "f.ckpt").string()); }),
               Catch::Contains("is not a tinylm checkpoint"));
  }
  SECTION("a bare LibTorch archive is foreign too") {
    torch::save(trainer.model()->parameters(), (dir / "t.pt").string());
    CHECK_THAT(error_message([&] { read_checkpoint((dir / "t.pt").string()); }),
               Catch::Contains("is not a tinylm checkpoint"));
  }
  SECTION("truncated") {
    write_bytes(dir / "t.ckpt", bytes.substr(0, bytes.size() / 2));
    CHECK_THAT(error_message([&] { read_checkpoint((dir / "t.ckpt").string()); }),
               Catch::Contains("is truncated: its header promises"));
    write_bytes(dir / "h.ckpt", bytes.substr(0, 20));
    CHECK_THAT(error_message([&] { read_checkpoint((dir / "h.ckpt").string()); }),
               Catch::Contains("shorter than its 32-byte header"));
  }
  SECTION("corrupt") {
    std::string flipped = bytes;
    flipped[flipped.size() / 2] ^= 0x40;
    write_bytes(dir / "c.ckpt", flipped);
    CHECK_THAT(error_message([&] { read_checkpoint((dir / "c.ckpt").string()); }),
               Catch::Contains("is corrupt: its checksum does not match"));
  }
  SECTION("newer format") {
    std::string newer = bytes;
    newer[8] = static_cast<char>(kCheckpointFormatVersion + 1);
    write_bytes(dir / "n.ckpt", newer);
    CHECK_THAT(error_message([&] { read_checkpoint((dir / "n.ckpt").string()); }),
               Catch::Contains("upgrade tinylm to read it"));
  }
  SECTION("a model it does not fit") {
    auto ck = read_checkpoint(good.string());
    RunConfig wider = c;
    wider.d_model = 32;
    auto model = build_model(wider);
    CHECK_THAT(error_message([&] { load_model_state(ck, *model); }),
               Catch::Contains("does not fit the model: 'token_embedding.weight' has shape [64, 16] "
                               "in the checkpoint but [64, 32] in the model"));
    RunConfig deeper = c;
    deeper.n_layers = 2;
    auto model2 = build_model(deeper);
    CHECK_THAT(error_message([&] { load_model_state(ck, *model2); }),
               Catch::Contains("does not fit the model: it holds parameter"));
    RunConfig tiny;  // the reference model: other parameter names entirely
    auto model3 = build_model(tiny);
    CHECK_THAT(error_message([&] { load_model_state(ck, *model3); }),
               Catch::Contains("does not fit the model"));
  }
}

TEST_CASE("resolve_checkpoint_path picks the newest step in a run directory", "[checkpoint]") {
  const auto dir = scratch("resolve");
  for (const char* name : {"step-00000010.ckpt", "step-00000200.ckpt", "step-00000030.ckpt", "best.ckpt"})
    write_bytes(dir / name, "x");
  CHECK(fs::path(resolve_checkpoint_path(dir.string())).filename() == "step-00000200.ckpt");
  CHECK(resolve_checkpoint_path("file.ckpt") == "file.ckpt");
  fs::remove_all(dir);
  fs::create_directories(dir);
  CHECK_THAT(error_message([&] { resolve_checkpoint_path(dir.string()); }),
             Catch::Contains("holds no step-*.ckpt checkpoint"));
}
