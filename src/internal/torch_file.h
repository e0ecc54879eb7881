// Internal: a reader for the files Python's torch.save writes, and for the LibTorch
// archives of format-1 checkpoints, for untrusted input.
//
// The format (PyTorch >= 1.6): a zip archive holding `<name>/data.pkl` (a pickle,
// protocol 2) and `<name>/data/<key>` (each tensor storage's raw bytes), both stored
// uncompressed. LibTorch's own reader trusts both: a malformed pickle crashes its
// unpickler, a storage shorter than its tensor is read past its end, and views are made
// contiguous before anything is checked. This one checks every extent and CRC and runs
// only a fixed subset of pickle, what `torch.load(weights_only=True)` allows for state
// dicts: numbers, strings, bytes, None, booleans, tuples, lists, dicts,
// collections.OrderedDict, torch._utils._rebuild_tensor_v2 / _rebuild_parameter over
// torch.*Storage. Any other global (os.system, builtins.eval, ...) is refused by name:
// nothing in the file is ever called. Tensors are described, not built, until the caller
// asks for the ones it keeps; distinct views of one storage may not hold more elements
// than it, and each tensor is made once, so reading every tensor takes at most twice the
// file's size.
// A LibTorch archive (torch::serialize::OutputArchive, a TorchScript module) also holds
// module objects (`__torch__.Module`, made by NEWOBJ, their attributes set by BUILD) and
// compressed TorchScript code: the objects are read as values, the code never.
// Memory: parsing the pickle takes at most kPickleMemoryFloor + kPickleMemoryPerByte
// bytes per pickle byte (and no more than the machine has); past that the file is refused.
#pragma once

#include <c10/core/ScalarType.h>
#include <torch/types.h>

#include <ATen/core/ivalue.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tinylm::internal {

/// A tensor as the file describes it: checked against its storage, not yet read.
struct TensorRecord {
  std::string storage_key;       // the entry <name>/data/<key>
  c10::ScalarType dtype = c10::ScalarType::Float;
  int64_t storage_numel = 0;     // elements in the storage
  int64_t offset = 0;            // in elements
  std::vector<int64_t> sizes, strides;
  int64_t numel() const;
};

/// A value of the pickle.
struct PyValue {
  enum class Kind { none, boolean, integer, real, string, bytes, tuple, list, dict, tensor, global, object };
  Kind kind = Kind::none;
  bool boolean = false;
  int64_t integer = 0;
  double real = 0;
  std::string text;                     // string, bytes, global ("module.name"), object (its class)
  std::vector<std::shared_ptr<PyValue>> items;                 // tuple, list
  std::vector<std::pair<std::shared_ptr<PyValue>, std::shared_ptr<PyValue>>> entries;  // dict, object's attributes
  std::shared_ptr<TensorRecord> tensor;

  /// "dict", "tensor", ...: for messages.
  const char* kind_name() const { return name_of(kind); }
  static const char* name_of(Kind kind);
  /// A dict's value (an object's attribute) under a string key; nullptr when absent (or
  /// not a dict or object).
  const PyValue* find(std::string_view key) const;
};

/// The bound on the memory a pickle takes to parse: this much, plus
/// kPickleMemoryPerByte bytes for each byte of the pickle.
constexpr uint64_t kPickleMemoryFloor = uint64_t{16} << 20;
constexpr uint64_t kPickleMemoryPerByte = 64;  // a dense real state dict takes about 38

class TorchFile {
 public:
  enum class Format {
    torch_save,        // Python's torch.save
    libtorch_archive,  // LibTorch's OutputArchive: module objects too (format-1 checkpoints)
  };
  /// Parses `bytes`; throws (c10::Error) naming `path` and what is wrong.
  TorchFile(std::string bytes, std::string path, Format format = Format::torch_save);
  ~TorchFile();
  TorchFile(const TorchFile&) = delete;
  TorchFile& operator=(const TorchFile&) = delete;
  const PyValue& root() const { return *root_; }
  /// The tensor a record describes, contiguous, its own memory (checked at parse time:
  /// inside its storage, which is inside the file); the same tensor for the same record.
  /// Reading every tensor takes at most twice the storages' size (storages and views).
  torch::Tensor tensor(const TensorRecord& record) const;
  /// The memory parsing the pickle was charged (an upper bound of what it took).
  uint64_t pickle_memory() const { return pickle_memory_; }

 private:
  struct Entry {
    uint64_t offset = 0, size = 0;
    bool stored = true;  // false: compressed (TorchScript code), never read
  };
  void read_zip();
  void unpickle(std::string_view pickle);
  void break_cycles();

  std::string bytes_, path_, prefix_;
  mutable std::map<const TensorRecord*, torch::Tensor> tensors_;  // made by tensor()
  mutable std::map<std::string, torch::Tensor> storages_;
  Format format_;
  uint64_t pickle_memory_ = 0;
  std::vector<std::pair<std::string, Entry>> entries_;
  std::shared_ptr<PyValue> root_;
  /// Every value made: a pickle may build cycles (a dict holding itself), broken here.
  std::vector<std::shared_ptr<PyValue>> made_;
  /// The stored entry `name`; nullptr when absent; refused when compressed.
  const Entry* entry(const std::string& name) const;
};

/// The bytes torch.save writes for `value` (interop::torch_save_bytes), with the pickle
/// first handed to `change_pickle` when given (tests: a changed pickle whose archive's
/// checksums match it).
std::string torch_save_archive(const c10::IValue& value,
                               const std::function<void(std::vector<char>&)>& change_pickle);

}  // namespace tinylm::internal
