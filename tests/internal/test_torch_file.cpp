// src/internal/torch_file.cpp: torch.save files read with every extent checked.
#include "../test_util.h"

#include <tinylm/interop.h>

#include "internal/torch_file.h"

#include <ATen/core/Dict.h>
#include <torch/types.h>

#include <malloc.h>
#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#include <sanitizer/allocator_interface.h>
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/allocator_interface.h>
#endif

#include <functional>
#include <random>
#include <string>
#include <vector>

using namespace tinylm;
using tinylm::internal::PyValue;
using tinylm::internal::TorchFile;
using tinylm::test::error_message;

namespace torch_file_test {

/// A dict of tensors (one tied) and values, as nanoGPT's files hold.
c10::IValue sample_value() {
  auto base = torch::arange(24, torch::kFloat).reshape({4, 6});
  c10::impl::GenericDict model(c10::StringType::get(), c10::AnyType::get());
  model.insert("weight", base);
  model.insert("tied", base);                                  // the same tensor twice
  model.insert("half", torch::ones({3}, torch::kHalf) * 2);
  model.insert("scalar", torch::tensor(1.25));
  c10::impl::GenericDict top(c10::StringType::get(), c10::AnyType::get());
  top.insert("model", model);
  top.insert("iter_num", int64_t{250});
  top.insert("loss", 0.5);
  top.insert("bias", true);
  top.insert("name", std::string("gpt ☃"));
  c10::impl::GenericList list(c10::AnyType::get());  // a typed list would pickle through a TorchScript global
  for (int64_t i : {1, 2, 3}) list.push_back(i);
  top.insert("list", list);
  return top;
}

/// The archive torch.save writes for `value`, its pickle changed by `change` first.
std::string archive(const c10::IValue& value, const std::function<void(std::vector<char>&)>& change) {
  return tinylm::internal::torch_save_archive(value, change);
}

std::string sample_file() { return interop::torch_save_bytes(sample_value()); }

/// Parses `bytes` and reads every tensor it describes; false when refused (c10::Error).
bool parse_all(const std::string& bytes) {
  try {
    const TorchFile file(bytes, "mutant.pt");
    std::vector<const PyValue*> todo = {&file.root()};
    for (size_t n = 0; n < todo.size() && n < 1000; ++n) {
      const PyValue* v = todo[n];
      if (v->kind == PyValue::Kind::tensor) file.tensor(*v->tensor).sum();
      for (const auto& item : v->items) todo.push_back(item.get());
      for (const auto& [k, value] : v->entries) todo.push_back(value.get());
    }
    return true;
  } catch (const c10::Error&) {
    return false;
  }
}

}  // namespace torch_file_test

TEST_CASE("TorchFile reads what torch.save writes", "[interop]") {
  const TorchFile file(torch_file_test::sample_file(), "sample.pt");
  // The archive this test builds for its mutants is the same file.
  CHECK(torch_file_test::archive(torch_file_test::sample_value(), [](auto&) {}) == torch_file_test::sample_file());
  const PyValue& top = file.root();
  REQUIRE(top.kind == PyValue::Kind::dict);
  CHECK(top.find("iter_num")->integer == 250);
  CHECK(top.find("loss")->real == 0.5);
  CHECK(top.find("bias")->boolean);
  CHECK(top.find("name")->text == "gpt ☃");
  REQUIRE(top.find("list")->kind == PyValue::Kind::list);
  CHECK(top.find("list")->items.size() == 3);
  CHECK(top.find("absent") == nullptr);
  const PyValue* model = top.find("model");
  REQUIRE(model);
  const auto weight = file.tensor(*model->find("weight")->tensor);
  CHECK(torch::equal(weight, torch::arange(24, torch::kFloat).reshape({4, 6})));
  CHECK(torch::equal(file.tensor(*model->find("tied")->tensor), weight));
  // The same tensor under two keys is made once (a file naming one big tensor under many
  // keys costs its size once).
  CHECK(file.tensor(*model->find("tied")->tensor).data_ptr() == weight.data_ptr());
  const auto half = file.tensor(*model->find("half")->tensor);
  CHECK(half.scalar_type() == torch::kHalf);
  CHECK(half.to(torch::kFloat).sum().item<float>() == 6.0f);
  CHECK(file.tensor(*model->find("scalar")->tensor).item<float>() == 1.25f);
}

TEST_CASE("TorchFile refuses damaged files with one line and survives mutants", "[interop][errors]") {
  const std::string good = torch_file_test::sample_file();
  CHECK_THAT(error_message([&] { TorchFile("not a zip", "x.pt"); }),
             Catch::Contains("'x.pt' is not a file Python's torch.save wrote"));
  CHECK_THAT(error_message([&] { TorchFile(good.substr(0, good.size() - 10), "x.pt"); }),
             Catch::Contains("has no end record"));
  // Bytes changed at random, in the whole file and in the pickle alone (with checksums
  // that match): each mutant is refused with a c10::Error, or parses and every tensor it
  // describes can be read (a crash or a sanitizer report fails the suite).
  std::mt19937_64 rng(20261201);
  int refused = 0, parsed = 0, pickle_refused = 0;
  for (int i = 0; i < 600; ++i) {
    const bool whole_file = i % 2 == 0;
    auto mutate = [&](auto& bytes) {
      const int changes = 1 + static_cast<int>(rng() % 4);
      for (int k = 0; k < changes; ++k) bytes[rng() % bytes.size()] = static_cast<char>(rng());
      if (i % 7 == 0) bytes.resize(rng() % bytes.size());
    };
    std::string m = good;
    if (whole_file) mutate(m);
    else m = torch_file_test::archive(torch_file_test::sample_value(), mutate);
    if (torch_file_test::parse_all(m)) {
      ++parsed;
    } else {
      ++refused;
      pickle_refused += !whole_file;
    }
  }
  INFO("refused " << refused << " (" << pickle_refused << " of 300 pickle mutants), parsed " << parsed);
  CHECK(refused + parsed == 600);
  CHECK(pickle_refused > 100);  // the pickle's own checks, not only the checksums
  CHECK(refused > 300);  // most bytes are covered by a CRC or an extent check
  // Globals other than the few a state dict needs are refused by name, before any call.
  const std::string evil = torch_file_test::archive(torch_file_test::sample_value(), [](std::vector<char>& p) {
    const std::string call = "cposix\nsystem\n(X\x02\x00\x00\x00idtR.";
    p.assign(call.begin(), call.end());
    p.insert(p.begin(), {'\x80', '\x02'});
  });
  CHECK_THAT(error_message([&] { TorchFile(evil, "evil.pt"); }),
             Catch::Contains("names the Python global 'posix.system', which tinylm never runs"));
}

namespace torch_file_test {

/// Heap bytes in use now: the sanitizer allocator's count, or glibc's.
size_t heap_in_use() {
#if defined(__SANITIZE_ADDRESS__)
  return __sanitizer_get_current_allocated_bytes();
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
  return __sanitizer_get_current_allocated_bytes();
#else
  const auto m = mallinfo2();
  return m.uordblks + m.hblkhd;
#endif
#else
  const auto m = mallinfo2();
  return m.uordblks + m.hblkhd;
#endif
}

/// A torch.save archive whose pickle is `pickle`.
std::string with_pickle(const std::string& pickle) {
  return archive(sample_value(), [&](std::vector<char>& p) { p.assign(pickle.begin(), pickle.end()); });
}

/// Pickles built to grow memory: `n` repeats of `unit` between a MARK and a TUPLE.
std::string growing(const std::string& unit, size_t n) {
  std::string p = "\x80\x02(";
  if (unit[0] == '2') p += "]";  // DUP needs something to duplicate
  for (size_t i = 0; i < n; ++i) p += unit;
  return p + "t.";
}

}  // namespace torch_file_test

TEST_CASE("a pickle's memory is bounded by a small multiple of its size", "[interop][errors]") {
  using tinylm::internal::kPickleMemoryFloor;
  using tinylm::internal::kPickleMemoryPerByte;
  struct Shape {
    const char* name;
    std::string unit;
    bool over_the_bound;  // takes more than kPickleMemoryPerByte bytes a byte
  };
  // New lists or dicts remembered in the memo, short strings, the stack grown by DUP,
  // dicts filled with recalled values: each kept on the stack until one tuple takes them.
  const Shape shape = GENERATE(Shape{"lists in the memo", "]\x94", true}, Shape{"dicts in the memo", "}\x94", true},
                               Shape{"strings", "\x8c\x01x", true}, Shape{"the stack, by DUP", "2", false},
                               Shape{"dict items", std::string("}\x94h\0h\0s", 7), false});
  INFO(shape.name);
  auto parse = [](const std::string& pickle, const char* name) {
    std::string file = torch_file_test::with_pickle(pickle);
    const size_t before = torch_file_test::heap_in_use();
    const TorchFile parsed(std::move(file), name);
    const size_t held = torch_file_test::heap_in_use() - before;
    INFO("pickle " << pickle.size() << " bytes, held " << held << ", charged " << parsed.pickle_memory());
    // The charge bounds what the parse really holds, and the charge is bounded.
    CHECK(held <= parsed.pickle_memory());
    CHECK(parsed.pickle_memory() <= kPickleMemoryFloor + kPickleMemoryPerByte * pickle.size());
    REQUIRE(parsed.root().kind == PyValue::Kind::tuple);
    return parsed.root().items.size();
  };
  CHECK(parse(torch_file_test::growing(shape.unit, 40000), "grow.pt") >= 40000);
  // 4 MiB of it: the bound is 16 MiB + 64 bytes a byte (272 MiB). Shapes that take more
  // are refused on reaching it, in one line naming the file, long before the gigabytes
  // they would take; the others parse within it.
  const size_t n = (4u << 20) / shape.unit.size();
  const std::string big = torch_file_test::growing(shape.unit, n);
  if (shape.over_the_bound) {
    const std::string message = error_message([&] { TorchFile(torch_file_test::with_pickle(big), "big.pt"); });
    CHECK_THAT(message, Catch::Contains("'big.pt' is damaged or hostile: its 4.00 MiB pickle needs more than 272"));
    CHECK(message.find('\n') == std::string::npos);
  } else {
    CHECK(parse(big, "big.pt") >= n);
  }
}

TEST_CASE("a large real state dict fits the pickle memory bound without its floor", "[interop]") {
  // 3,000 small tensors: a pickle of tensor records, the densest in values a real file has.
  c10::impl::GenericDict model(c10::StringType::get(), c10::AnyType::get());
  for (int i = 0; i < 3000; ++i) model.insert("layer." + std::to_string(i) + ".weight", torch::ones({2, 3}));
  size_t pickle_size = 0;
  const std::string bytes = torch_file_test::archive(model, [&](std::vector<char>& p) { pickle_size = p.size(); });
  const TorchFile file(bytes, "large.pt");
  CHECK(file.root().entries.size() == 3000);
  INFO("pickle " << pickle_size << " bytes, charged " << file.pickle_memory());
  CHECK(file.pickle_memory() < tinylm::internal::kPickleMemoryPerByte * pickle_size);
}
