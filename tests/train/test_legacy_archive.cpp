// src/train/legacy_archive.cpp: format-1 checkpoints (LibTorch archives) read by tinylm's
// own zip and pickle reader to the same tensors as LibTorch's loader, bit for bit, and
// upgraded to them; damaged archives refused with one line.
#include "../test_util.h"
#include "checkpoint_files.h"
#include "core_runs.h"

#include "internal/crc32.h"

#include <tinylm/nn/model.h>
#include <tinylm/train/checkpoint.h>
#include <tinylm/train/optimizer.h>
#include <tinylm/train/trainer.h>

#include <torch/serialize/input-archive.h>
#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

using namespace tinylm;
using namespace tinylm::train;
using tinylm::test::error_message;
using tinylm::test::fixture_file;
using tinylm::test::read_file;
using tinylm::test::with_header;
using tinylm::test::write_file;

namespace {

/// LibTorch's own reading of a format-1 file: the oracle, for tinylm's own fixtures only.
torch::serialize::InputArchive libtorch_read(const std::string& file) {
  torch::serialize::InputArchive archive;
  std::istringstream in(read_file(file).substr(32));
  archive.load_from(in);
  return archive;
}

bool same(const torch::Tensor& a, const torch::Tensor& b) {
  return a.defined() && b.defined() && a.scalar_type() == b.scalar_type() && a.sizes() == b.sizes() &&
         torch::equal(a, b);
}

torch::Tensor tensor_of(torch::serialize::InputArchive& a, const std::string& key) {
  torch::Tensor t;
  a.read(key, t);
  return t;
}

c10::IValue value_of(torch::serialize::InputArchive& a, const std::string& key) {
  c10::IValue v;
  a.read(key, v);
  return v;
}

uint64_t le(const std::string& s, size_t at, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; ++i) v |= static_cast<uint64_t>(static_cast<unsigned char>(s[at + i])) << (8 * i);
  return v;
}

/// The format-1 file `good` with the bytes of its zip entry `name` changed in place by
/// `edit`: the entry's CRC-32 recomputed unless `keep_crc`, the checkpoint header's always.
std::string with_entry(const std::string& good, const std::string& name, const std::function<void(std::string&)>& edit,
                       bool keep_crc = false) {
  std::string p = good.substr(32);
  const size_t eocd = p.size() - 22;  // LibTorch writes no archive comment
  REQUIRE(le(p, eocd, 4) == 0x06054b50);
  size_t at = le(p, eocd + 16, 4);
  for (uint64_t k = 0, count = le(p, eocd + 10, 2); k < count; ++k) {
    const size_t name_len = le(p, at + 28, 2);
    if (p.compare(at + 46, name_len, name) == 0 && name_len == name.size()) {
      const size_t local = le(p, at + 42, 4);
      const size_t data = local + 30 + le(p, local + 26, 2) + le(p, local + 28, 2);
      const size_t size = le(p, at + 24, 4);
      std::string bytes = p.substr(data, size);
      edit(bytes);
      REQUIRE(bytes.size() == size);
      p.replace(data, size, bytes);
      if (!keep_crc) {
        const uint32_t crc = internal::crc32(bytes.data(), bytes.size());
        for (int i = 0; i < 4; ++i) p[at + 16 + i] = p[local + 14 + i] = static_cast<char>((crc >> (8 * i)) & 0xFF);
      }
      return with_header(good, p);
    }
    at += 46 + name_len + le(p, at + 30, 2) + le(p, at + 32, 2);
  }
  FAIL("no entry " << name);
  return {};
}

}  // namespace

TEST_CASE("format-1 files read to LibTorch's own tensors, bit for bit, and upgrade to them",
          "[checkpoint][compat]") {
  const std::string file = GENERATE(as<std::string>{}, "v1-tiny-adam-step12.ckpt", "v1-transformer-adamw-step12.ckpt");
  INFO(file);
  const auto ck = read_checkpoint(fixture_file(file));
  auto archive = libtorch_read(fixture_file(file));

  CHECK(ck.recipe == value_of(archive, "config").toStringRef());
  CHECK(ck.state.step == value_of(archive, "step").toInt());
  CHECK(ck.state.best_val_loss == value_of(archive, "best_val_loss").toDouble());
  CHECK(same(ck.state.data_rng_state, tensor_of(archive, "data_rng_state")));
  CHECK(same(ck.state.dropout_rng_state, tensor_of(archive, "torch_rng_state")));
  // The weights, under the names the file gave them (format 3 renamed positions.*).
  std::vector<std::string> stored_names;
  std::istringstream names(value_of(archive, "model_parameter_names").toStringRef());
  for (std::string n; std::getline(names, n);) stored_names.push_back(n);
  REQUIRE(stored_names.size() == ck.parameter_names.size());
  for (size_t i = 0; i < stored_names.size(); ++i) {
    INFO(stored_names[i]);
    CHECK(same(ck.model.at(ck.parameter_names[i]), tensor_of(archive, "model." + stored_names[i])));
  }
  // The optimizer state: flat Adam's buffers, or LibTorch's per-parameter state by group.
  torch::serialize::InputArchive opt;
  archive.read("optimizer", opt);
  CHECK(ck.optimizer_kind == value_of(archive, "optimizer_kind").toStringRef());
  const bool flat = ck.optimizer_kind.rfind("flat-", 0) == 0;
  int64_t compared = 0;
  if (flat) {
    CHECK(ck.optimizer.at("step").item<int64_t>() == value_of(opt, "step").toInt());
    for (const char* key : {"exp_avg", "exp_avg_sq"}) compared += same(ck.optimizer.at(key), tensor_of(opt, key));
    CHECK(compared == 2);
  } else {
    torch::serialize::InputArchive states, groups;
    opt.read("state", states);
    opt.read("param_groups", groups);
    REQUIRE(static_cast<int64_t>(ck.optimizer_groups.size()) == tensor_of(groups, "param_groups/size").item<int64_t>());
    for (size_t g = 0; g < ck.optimizer_groups.size(); ++g) {
      torch::serialize::InputArchive group;
      groups.read("param_groups/" + std::to_string(g), group);
      REQUIRE(static_cast<int64_t>(ck.optimizer_groups[g].size()) == tensor_of(group, "params/size").item<int64_t>());
      for (size_t i = 0; i < ck.optimizer_groups[g].size(); ++i) {
        torch::serialize::InputArchive saved;
        states.read(value_of(group, "params/" + std::to_string(i)).toStringRef(), saved);
        const auto& s = ck.optimizer_groups[g][i];
        CHECK(s.size() == 3);
        CHECK(s.at("step").item<int64_t>() == value_of(saved, "step").toInt());
        for (const char* key : {"exp_avg", "exp_avg_sq"}) compared += same(s.at(key), tensor_of(saved, key));
      }
    }
    CHECK(compared == 2 * static_cast<int64_t>(ck.parameter_names.size()));
  }

  // What `tinylm upgrade` does (there through the run layer, whose reading of the stored
  // recipe tests/test_run.cpp checks): the run the recipe describes, resumed and saved.
  // The new file holds the same bits.
  const auto dir = tinylm::test::scratch_dir("legacy_upgrade_" + file);
  tinylm::test::CoreRun c;
  c.model = ck.architecture;
  c.trainer = tinylm::test::fixture_trainer_options(file);
  c.trainer.out_dir(dir.string());
  Trainer trainer = tinylm::test::make_core_trainer(c);
  trainer.resume(ck);
  trainer.save((dir / "up.ckpt").string());
  const auto up = read_checkpoint((dir / "up.ckpt").string());
  CHECK(up.format_version == kCheckpointFormatVersion);
  CHECK(up.state.step == ck.state.step);
  CHECK(up.state.best_val_loss == ck.state.best_val_loss);
  CHECK(same(up.state.data_rng_state, ck.state.data_rng_state));
  REQUIRE(up.parameter_names == ck.parameter_names);
  for (const auto& name : ck.parameter_names) CHECK(same(up.model.at(name), ck.model.at(name)));
  TensorMap expected = ck.optimizer;
  if (!flat) {
    // Named by the optimizer's own groups (AdamW: decayed weights, then the rest).
    auto model = nn::build_model(ck.architecture);
    AdamConfig adam;
    adam.decoupled = true;
    adam.weight_decay = 0.1;
    expected = make_torch_adam(*model, adam)->state_from_groups(ck.optimizer_groups);
  }
  REQUIRE(up.optimizer.size() == expected.size());
  for (const auto& [key, t] : expected) {
    INFO(key);
    CHECK(same(up.optimizer.at(key), t));
  }
}

TEST_CASE("damaged format-1 archives are refused with one line naming the damage", "[checkpoint][errors]") {
  const std::string good = read_file(fixture_file("v1-tiny-adam-step12.ckpt"));
  const auto dir = tinylm::test::scratch_dir("legacy_damaged");
  auto refused = [&](const std::string& name, const std::string& bytes) {
    write_file(dir / name, bytes);
    return error_message([&] { read_checkpoint((dir / name).string()); });
  };
  auto in_pickle = [&](const std::function<void(std::string&)>& edit) {
    return with_entry(good, "archive/data.pkl", edit);
  };
  struct Case {
    const char* name;
    std::string bytes;
    const char* expected;
  };
  const std::vector<Case> cases = {
      // lm_head.bias, the last 64 floats of the flat storage, made 65 long.
      {"short-storage.ckpt", in_pickle([](std::string& p) {
         const auto at = p.find("(K@t", p.find("model.lm_head.bias"));
         REQUIRE(at != std::string::npos);
         p[at + 2] = 'A';
       }),
       "describes a tensor reaching past its storage '2' (8384 elements)"},
      {"storage-crc.ckpt", with_entry(good, "archive/data/2", [](std::string& d) { d[100] ^= 1; }, /*keep_crc=*/true),
       "is corrupt: the checksum of 'archive/data/2' does not match its contents"},
      {"opcode.ckpt", in_pickle([](std::string& p) { p[p.find('\x89')] = 'I'; }),
       "is damaged or not a tinylm format-1 checkpoint: its pickle uses opcode 0x49"},
      {"global.ckpt", in_pickle([](std::string& p) { p[p.find("OrderedDict") + 10] = 'x'; }),
       "names the Python global 'collections.OrderedDicx', which tinylm never runs"},
      {"step-type.ckpt", in_pickle([](std::string& p) {
         const auto at = p.find(std::string("X\x04\0\0\0stepq", 10));
         REQUIRE(at != std::string::npos);
         p.replace(at + 11, 2, std::string("C\0", 2));  // BININT1 12 -> SHORT_BINBYTES b''
       }),
       "is damaged: its archive's 'step' is of type bytes, not int"},
  };
  for (const auto& c : cases) {
    INFO(c.name);
    const std::string message = refused(c.name, c.bytes);
    CHECK_THAT(message, Catch::Contains(c.expected));
    CHECK(message.find("v1") == std::string::npos);  // it names the damaged copy
    CHECK(message.find('\n') == std::string::npos);
  }
}

TEST_CASE("format-1 pickle mutants with valid checksums are refused cleanly or read whole",
          "[checkpoint][errors]") {
  const std::string good = read_file(fixture_file("v1-transformer-adamw-step12.ckpt"));
  const auto dir = tinylm::test::scratch_dir("legacy_mutants");
  std::mt19937_64 rng(20261203);
  int refused = 0, read = 0;
  for (int i = 0; i < 300; ++i) {
    const std::string bytes = with_entry(good, "archive/data.pkl", [&](std::string& p) {
      for (int k = 0, n = 1 + static_cast<int>(rng() % 3); k < n; ++k) p[rng() % p.size()] = static_cast<char>(rng());
    });
    write_file(dir / "mutant.ckpt", bytes);
    try {
      const auto ck = read_checkpoint((dir / "mutant.ckpt").string());
      auto model = nn::build_model(ck.architecture);
      load_model_state(ck, *model);
      ++read;
    } catch (const c10::Error& e) {
      ++refused;
      CHECK(std::string(e.what_without_backtrace()).find('\n') == std::string::npos);
    }
  }
  INFO(refused << " refused, " << read << " read");
  CHECK(refused > 150);
}
