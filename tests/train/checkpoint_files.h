// Shared by the checkpoint tests (the core's, and the run layer's in tests/test_run.cpp):
// checkpoint files with a changed payload, and the checkpoints of earlier formats in
// tests/fixtures with what each was recorded to give.
#pragma once

#include "../test_util.h"
#include "internal/crc32.h"

#include <tinylm/train/trainer.h>

#include <array>
#include <cstdint>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

namespace tinylm::test {

/// The file `good` with `payload` behind its header, whose length and CRC are recomputed,
/// so the reader's own checks, not the checksum, must catch what is wrong.
inline std::string with_header(const std::string& good, const std::string& payload) {
  std::string out = good.substr(0, 32) + payload;
  for (int i = 0; i < 8; ++i) out[16 + i] = static_cast<char>((payload.size() >> (8 * i)) & 0xFF);
  const uint32_t crc = internal::crc32(payload.data(), payload.size());
  for (int i = 0; i < 4; ++i) out[24 + i] = static_cast<char>((crc >> (8 * i)) & 0xFF);
  return out;
}

/// The length of a payload's JSON index (its first 8 bytes, little-endian).
inline uint64_t index_length(const std::string& payload) {
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(static_cast<unsigned char>(payload[i])) << (8 * i);
  return n;
}

/// Mutant number `i` of a payload whose JSON index is `index_len` bytes long, drawn from
/// `rng`: by turns a bit flip, a byte overwritten, a truncation, bytes inserted and JSON
/// punctuation scattered; every second one aimed at the index.
inline std::string payload_mutant(const std::string& payload, uint64_t index_len, int i, std::mt19937_64& rng) {
  auto pick = [&](uint64_t n) { return static_cast<size_t>(rng() % n); };
  std::string p = payload;
  const bool aim_at_index = i % 2 == 0;
  const size_t span = aim_at_index ? 8 + index_len : p.size();
  switch (i % 5) {
    case 0: p[pick(span)] ^= static_cast<char>(1 << pick(8)); break;
    case 1: p[pick(span)] = static_cast<char>(rng()); break;
    case 2: p.resize(pick(p.size())); break;
    case 3: p.insert(pick(span), std::string(1 + pick(8), static_cast<char>(rng()))); break;
    default:
      for (int k = 0; k < 4; ++k) p[pick(span)] = "{}[]\",:0-9e"[pick(11)];
  }
  return p;
}

// ---- earlier formats: the fixtures ----------------------------------------------------
//
// tests/fixtures holds checkpoints written by earlier tinylm code: format 1 (a LibTorch
// archive), format 2 (safetensors, the run config as the only model description) and
// format 3 (the model's architecture stored apart from the run config).
// Each format has the reference model with the flat Adam, and a one-layer transformer
// with LibTorch's AdamW and dropout, each after 12 steps of the repeat task. Their
// evaluation loss (5 batches, seed 1234) and the losses of steps 13-16 after resuming
// were recorded by the code that wrote them; reading the files today must reproduce
// them. Every later format adds its own fixtures to this list; none is ever removed.

struct CheckpointFixture {
  const char* file;  // in tests/fixtures
  uint32_t format;
  double eval_loss;                   // 5 validation batches of the repeat task, seed 1234
  std::array<double, 4> next_losses;  // steps 13-16, resumed
};

/// Writes 400 payload mutants of `good` (a checkpoint file's bytes) to dir/mutant.ckpt in
/// turn and hands each path to `load`: each must load or be refused with a c10::Error, and
/// most must be refused (they break the index or the sizes).
template <typename Load>
void check_payload_mutants(const std::filesystem::path& dir, const std::string& good, Load&& load) {
  const std::string payload = good.substr(32);
  const uint64_t index_len = index_length(payload);
  REQUIRE(index_len < payload.size());
  std::mt19937_64 rng(20261129);
  int refused = 0, loaded = 0;
  for (int i = 0; i < 400; ++i) {
    const auto file = dir / "mutant.ckpt";
    write_file(file, with_header(good, payload_mutant(payload, index_len, i, rng)));
    try {
      load(file.string());
      ++loaded;
    } catch (const c10::Error&) {
      ++refused;
    }
  }
  INFO("refused " << refused << ", loaded " << loaded);
  CHECK(refused + loaded == 400);
  CHECK(refused >= 200);
}

inline std::string fixture_file(const std::string& name) {
  return std::string(TINYLM_SOURCE_DIR) + "/tests/fixtures/" + name;
}

inline std::vector<CheckpointFixture> checkpoint_fixtures() {
  const std::array<double, 4> tiny_next = {4.1598472595214844, 4.0449504852294922,
                                           4.3370833396911621, 4.0504159927368164};
  const std::array<double, 4> transformer_next = {3.5225563049316406, 3.5407850742340088,
                                                  3.5292942523956299, 3.3616440296173096};
  return {
      {"v1-tiny-adam-step12.ckpt", 1, 4.20962868, tiny_next},
      {"v1-transformer-adamw-step12.ckpt", 1, 3.54752172, transformer_next},
      {"v2-tiny-adam-step12.ckpt", 2, 4.20962861, tiny_next},
      {"v2-transformer-adamw-step12.ckpt", 2, 3.54752172, transformer_next},
      // Format 3: dropout draws from the Trainer's own generator since, so the
      // transformer's losses differ from the earlier formats' (it starts from the same weights).
      {"v3-tiny-adam-step12.ckpt", 3, 4.20962858, tiny_next},
      {"v3-transformer-adamw-step12.ckpt", 3, 3.54108720,
       {3.5186946392059326, 3.5339415073394775, 3.528031349182129, 3.3532612323760986}},
  };
}

/// The trainer options a fixture was trained with, as its stored recipe gives them: 3
/// epochs of 4 steps of 16 rows, seed 42, and the flat Adam at 5e-3 (the reference
/// model's files) or LibTorch's AdamW with weight decay 0.1 (the transformer's).
inline train::TrainerOptions fixture_trainer_options(const std::string& name) {
  train::TrainerOptions o;
  o.epochs(3).steps_per_epoch(4).batch_size(16).seed(42).log_every(100);
  o.optimizer().lr(5e-3);
  if (name.find("transformer") != std::string::npos)
    o.optimizer().kind(train::OptimizerKind::adamw).weight_decay(0.1).flat(false);
  return o;
}

}  // namespace tinylm::test
