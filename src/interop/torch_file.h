// Internal: a reader for the files Python's torch.save writes, for untrusted input.
//
// The format (PyTorch >= 1.6): a zip archive, every entry stored uncompressed, holding
// `<name>/data.pkl` (a pickle, protocol 2) and `<name>/data/<key>` (each tensor storage's
// raw bytes). LibTorch's own reader trusts both: a malformed pickle crashes its
// unpickler, a storage shorter than its tensor is read past its end, and views are made
// contiguous before anything is checked. This one checks every extent and runs only a
// fixed subset of pickle, what `torch.load(weights_only=True)` allows for state dicts:
// numbers, strings, bytes, None, booleans, tuples, lists, dicts, collections.OrderedDict,
// torch._utils._rebuild_tensor_v2 / _rebuild_parameter over torch.*Storage. Any other
// global (os.system, builtins.eval, ...) is refused by name: nothing in the file is ever
// called. Tensors are described, not built, until the caller asks for the ones it keeps.
#pragma once

#include <c10/core/ScalarType.h>
#include <torch/types.h>

#include <ATen/core/ivalue.h>

#include <cstdint>
#include <functional>
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
  enum class Kind { none, boolean, integer, real, string, bytes, tuple, list, dict, tensor, global };
  Kind kind = Kind::none;
  bool boolean = false;
  int64_t integer = 0;
  double real = 0;
  std::string text;                                            // string, bytes, global ("module.name")
  std::vector<std::shared_ptr<PyValue>> items;                 // tuple, list
  std::vector<std::pair<std::shared_ptr<PyValue>, std::shared_ptr<PyValue>>> entries;  // dict, in order
  std::shared_ptr<TensorRecord> tensor;

  /// "dict", "tensor", ...: for messages.
  const char* kind_name() const;
  /// A dict's value under a string key; nullptr when absent (or not a dict).
  const PyValue* find(std::string_view key) const;
};

class TorchFile {
 public:
  /// Parses `bytes`; throws (c10::Error) naming `path` and what is wrong.
  TorchFile(std::string bytes, std::string path);
  ~TorchFile();
  TorchFile(const TorchFile&) = delete;
  TorchFile& operator=(const TorchFile&) = delete;
  const PyValue& root() const { return *root_; }
  /// The tensor a record describes, contiguous, its own memory (checked at parse time:
  /// inside its storage, which is inside the file).
  torch::Tensor tensor(const TensorRecord& record) const;

 private:
  struct Entry {
    uint64_t offset = 0, size = 0;
  };
  void read_zip();
  void unpickle(std::string_view pickle);
  void break_cycles();

  std::string bytes_, path_, prefix_;
  std::vector<std::pair<std::string, Entry>> entries_;
  std::shared_ptr<PyValue> root_;
  /// Every value made: a pickle may build cycles (a dict holding itself), broken here.
  std::vector<std::shared_ptr<PyValue>> made_;
  const Entry* entry(const std::string& name) const;
};

/// The bytes torch.save writes for `value` (interop::torch_save_bytes), with the pickle
/// first handed to `change_pickle` when given (tests: a changed pickle whose archive's
/// checksums match it).
std::string torch_save_archive(const c10::IValue& value,
                               const std::function<void(std::vector<char>&)>& change_pickle);

}  // namespace tinylm::internal
