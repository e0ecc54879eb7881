// A checked reader for torch.save files: see torch_file.h.
// Over 400 lines on purpose: a zip reader and a pickle machine for one untrusted format,
// checked together.
#include "internal/torch_file.h"

#include "internal/crc32.h"
#include "internal/machine.h"
#include "internal/text.h"

#include <c10/util/Exception.h>
#include <torch/types.h>

#include <cstring>
#include <limits>
#include <map>
#include <new>
#include <tuple>

namespace tinylm::internal {

int64_t TensorRecord::numel() const {
  int64_t n = 1;
  for (auto s : sizes) n *= s;  // each size was checked against the storage
  return n;
}

const char* PyValue::name_of(Kind kind) {
  switch (kind) {
    case Kind::none: return "None";
    case Kind::boolean: return "bool";
    case Kind::integer: return "int";
    case Kind::real: return "float";
    case Kind::string: return "str";
    case Kind::bytes: return "bytes";
    case Kind::tuple: return "tuple";
    case Kind::list: return "list";
    case Kind::dict: return "dict";
    case Kind::tensor: return "tensor";
    case Kind::global: return "global";
    case Kind::object: return "object";
  }
  return "value";
}

const PyValue* PyValue::find(std::string_view key) const {
  if (kind != Kind::dict && kind != Kind::object) return nullptr;
  const PyValue* found = nullptr;
  for (const auto& [k, v] : entries)
    if (k->kind == Kind::string && k->text == key) found = v.get();  // the last one, as in Python
  return found;
}

namespace {

uint64_t le(const std::string& bytes, uint64_t at, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; ++i) v |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[at + i])) << (8 * i);
  return v;
}

struct StorageType {
  const char* name;
  c10::ScalarType dtype;
  int64_t element_size;
};
const StorageType kStorageTypes[] = {
    {"FloatStorage", c10::ScalarType::Float, 4},    {"DoubleStorage", c10::ScalarType::Double, 8},
    {"HalfStorage", c10::ScalarType::Half, 2},      {"BFloat16Storage", c10::ScalarType::BFloat16, 2},
    {"LongStorage", c10::ScalarType::Long, 8},      {"IntStorage", c10::ScalarType::Int, 4},
    {"ShortStorage", c10::ScalarType::Short, 2},    {"CharStorage", c10::ScalarType::Char, 1},
    {"ByteStorage", c10::ScalarType::Byte, 1},      {"BoolStorage", c10::ScalarType::Bool, 1}};

const StorageType* storage_type(const std::string& global) {
  for (const auto& t : kStorageTypes)
    if (global == std::string("torch.") + t.name) return &t;
  return nullptr;
}

constexpr int kMaxDims = 16;

}  // namespace

TorchFile::TorchFile(std::string bytes, std::string path, Format format)
    : bytes_(std::move(bytes)), path_(std::move(path)), format_(format) {
  read_zip();
  const Entry* pickle = entry(prefix_ + "data.pkl");
  TORCH_CHECK(pickle, "'", printable(path_), "' is not a file Python's torch.save wrote: it has no data.pkl");
  if (const Entry* order = entry(prefix_ + "byteorder"))
    TORCH_CHECK(std::string_view(bytes_).substr(order->offset, order->size) == "little", "'", printable(path_),
                "' was written on a big-endian machine: tinylm reads little-endian files only");
  try {
    unpickle(std::string_view(bytes_).substr(pickle->offset, pickle->size));
  } catch (const std::bad_alloc&) {
    break_cycles();  // no destructor runs for a constructor that throws
    TORCH_CHECK(false, "'", printable(path_), "' could not be read: the machine ran out of memory for its ",
                human_bytes(pickle->size), " pickle (", human_bytes(pickle_memory_),
                " taken so far); free memory and try again");
  } catch (...) {
    break_cycles();
    throw;
  }
}

TorchFile::~TorchFile() { break_cycles(); }

void TorchFile::break_cycles() {
  for (auto& v : made_) {
    v->items.clear();
    v->entries.clear();
  }
  made_.clear();
}

const TorchFile::Entry* TorchFile::entry(const std::string& name) const {
  for (const auto& [n, e] : entries_) {
    if (n != name) continue;
    TORCH_CHECK(e.stored, "'", printable(path_), "': '", printable(name),
                "' is compressed; torch.save and LibTorch store it uncompressed");
    return &e;
  }
  return nullptr;
}

// ---- the zip archive ---------------------------------------------------------------
// End of central directory (EOCD), its zip64 twin where a field overflows, then one
// central-directory record per entry, each pointing at a local header before the data.
// Every offset and size is checked against the file; entries must be unencrypted. Those
// read (the pickle, the storages) must be stored (method 0) and match their CRC-32; a
// LibTorch archive's TorchScript code is compressed, and never read.

void TorchFile::read_zip() {
  const std::string where = "'" + printable(path_) + "'";
  const uint64_t n = bytes_.size();
  TORCH_CHECK(n >= 22 && bytes_.compare(0, 4, "PK\x03\x04") == 0, where,
              format_ == Format::libtorch_archive
                  ? " is damaged: its format-1 payload is not a zip archive"
                  : " is not a file Python's torch.save wrote (not its zip format; PyTorch before 1.6 wrote "
                    "another: load it and save it again with a newer PyTorch)");
  uint64_t eocd = n;
  for (uint64_t at = n - 22 + 1; at-- > 0 && n - at <= 22 + 65535;) {
    if (le(bytes_, at, 4) == 0x06054b50 && at + 22 + le(bytes_, at + 20, 2) == n) {
      eocd = at;
      break;
    }
  }
  TORCH_CHECK(eocd < n, where, " is damaged: its zip archive has no end record (the file is truncated?)");
  uint64_t count = le(bytes_, eocd + 10, 2), cd_size = le(bytes_, eocd + 12, 4), cd_offset = le(bytes_, eocd + 16, 4);
  if (count == 0xFFFF || cd_size == 0xFFFFFFFF || cd_offset == 0xFFFFFFFF) {
    TORCH_CHECK(eocd >= 20 && le(bytes_, eocd - 20, 4) == 0x07064b50, where,
                " is damaged: its zip64 end record is missing");
    const uint64_t z = le(bytes_, eocd - 20 + 8, 8);
    TORCH_CHECK(z <= eocd - 20 && eocd - 20 - z >= 56 && le(bytes_, z, 4) == 0x06064b50, where,
                " is damaged: its zip64 end record is outside the file");
    count = le(bytes_, z + 32, 8);
    cd_size = le(bytes_, z + 40, 8);
    cd_offset = le(bytes_, z + 48, 8);
  }
  TORCH_CHECK(cd_offset <= n && cd_size <= n - cd_offset, where, " is damaged: its zip directory (",
              cd_size, " bytes at ", cd_offset, ") is outside the file (", n, " bytes)");
  TORCH_CHECK(count <= cd_size / 46, where, " is damaged: its zip directory claims ", count,
              " entries in ", cd_size, " bytes");
  uint64_t at = cd_offset;
  const uint64_t end = cd_offset + cd_size;
  for (uint64_t i = 0; i < count; ++i) {
    TORCH_CHECK(end - at >= 46 && le(bytes_, at, 4) == 0x02014b50, where, " is damaged: zip directory entry ", i,
                " is malformed");
    const uint64_t flags = le(bytes_, at + 8, 2), method = le(bytes_, at + 10, 2), crc = le(bytes_, at + 16, 4);
    uint64_t csize = le(bytes_, at + 20, 4), usize = le(bytes_, at + 24, 4);
    const uint64_t name_len = le(bytes_, at + 28, 2), extra_len = le(bytes_, at + 30, 2),
                   comment_len = le(bytes_, at + 32, 2);
    uint64_t local = le(bytes_, at + 42, 4);
    TORCH_CHECK(end - at - 46 >= name_len + extra_len + comment_len, where, " is damaged: zip directory entry ", i,
                " runs past the directory");
    std::string name = bytes_.substr(at + 46, name_len);
    // zip64 sizes and offset, in that order, for the fields that overflowed.
    for (uint64_t x = at + 46 + name_len, x_end = x + extra_len; x + 4 <= x_end;) {
      const uint64_t id = le(bytes_, x, 2), len = le(bytes_, x + 2, 2);
      TORCH_CHECK(x + 4 + len <= x_end, where, " is damaged: a zip extra field of '", printable(name), "' overruns");
      if (id == 0x0001) {
        uint64_t y = x + 4;
        auto take = [&](uint64_t& field) {
          if (field != 0xFFFFFFFF) return;
          TORCH_CHECK(y + 8 <= x + 4 + len, where, " is damaged: the zip64 field of '", printable(name), "' is short");
          field = le(bytes_, y, 8);
          y += 8;
        };
        take(usize);
        take(csize);
        take(local);
      }
      x += 4 + len;
    }
    TORCH_CHECK(!(flags & 1), where, ": '", printable(name), "' is encrypted");
    const bool stored = method == 0;
    TORCH_CHECK(!stored || csize == usize, where, " is damaged: '", printable(name), "' is stored with ", csize,
                " bytes for ", usize);
    TORCH_CHECK(local <= n && n - local >= 30 && le(bytes_, local, 4) == 0x04034b50, where,
                " is damaged: the data of '", printable(name), "' is not where the zip directory says");
    const uint64_t data = local + 30 + le(bytes_, local + 26, 2) + le(bytes_, local + 28, 2);
    TORCH_CHECK(data <= n && csize <= n - data, where, " is damaged: '", printable(name), "' (", csize,
                " bytes at ", data, ") runs past the end of the file (", n, " bytes)");
    TORCH_CHECK(!stored || crc32(bytes_.data() + data, usize) == crc, where, " is corrupt: the checksum of '",
                printable(name), "' does not match its contents");
    entries_.push_back({std::move(name), {data, csize, stored}});
    at += 46 + name_len + extra_len + comment_len;
  }
  // The archive's folder: the one holding data.pkl at its top.
  for (const auto& [name, e] : entries_) {
    const auto slash = name.find('/');
    if (slash != std::string::npos && name.compare(slash, std::string::npos, "/data.pkl") == 0) {
      prefix_ = name.substr(0, slash + 1);
      break;
    }
  }
}

// ---- the pickle --------------------------------------------------------------------
// Memory: every value made, string held, container slot, stack, mark and memo slot is
// charged (sizes with their allocator's and shared_ptr's overhead, growing vectors at
// twice their length), and the pickle is refused once the charge passes its bound.

namespace {

/// A module class of a LibTorch archive: `__torch__.Module` or
/// `__torch__.___torch_mangle_<n>.Module`.
bool is_module_class(const std::string& module, const std::string& name) {
  if (name != "Module") return false;
  if (module == "__torch__") return true;
  const std::string mangle = "__torch__.___torch_mangle_";
  if (module.compare(0, mangle.size(), mangle) != 0 || module.size() == mangle.size() || module.size() > mangle.size() + 9)
    return false;
  for (size_t i = mangle.size(); i < module.size(); ++i)
    if (module[i] < '0' || module[i] > '9') return false;
  return true;
}

constexpr uint64_t kValueCost = sizeof(PyValue) + 64;    // + control block, made_ slot, malloc
constexpr uint64_t kSlotCost = 2 * sizeof(std::shared_ptr<PyValue>);  // a vector slot, doubled

}  // namespace

void TorchFile::unpickle(std::string_view p) {
  const std::string where = "'" + printable(path_) + "'";
  using Ref = std::shared_ptr<PyValue>;
  using Kind = PyValue::Kind;
  const bool archive = format_ == Format::libtorch_archive;
  std::vector<Ref> stack;
  std::vector<size_t> marks;
  std::vector<Ref> memo;                // indexes are given in order: 0, 1, 2, ...
  std::map<std::string, Ref> storages;  // by key: one storage, however often it is named
  // By storage key: its distinct views, and the elements they hold together.
  using View = std::tuple<int64_t, std::vector<int64_t>, std::vector<int64_t>>;
  std::map<std::string, std::pair<std::map<View, Ref>, int64_t>> views;
  size_t at = 0;
  auto fail = [&](const std::string& what) {
    TORCH_CHECK(false, where, " is damaged or not ", archive ? "a tinylm format-1 checkpoint" : "a state dict",
                ": its pickle ", what, " (at byte ", at, ")");
  };
  // The bound: kPickleMemoryFloor + kPickleMemoryPerByte per byte, or what the machine has.
  const uint64_t bound = kPickleMemoryFloor + kPickleMemoryPerByte * p.size();
  const uint64_t available = available_memory_bytes();
  const uint64_t limit = available != 0 && available < bound ? available : bound;
  auto charge = [&](uint64_t bytes) {
    pickle_memory_ += bytes;
    if (pickle_memory_ <= limit) return;
    TORCH_CHECK(false, where, " is damaged or hostile: its ", human_bytes(static_cast<double>(p.size())),
                " pickle needs more than ", human_bytes(static_cast<double>(limit)), " of memory to read (",
                limit == bound ? "tinylm's bound: 16 MiB + 64 bytes per pickle byte" : "what this machine has left",
                "), at byte ", at);
  };
  size_t stack_high = 0, marks_high = 0;
  auto push = [&](Ref v) {
    stack.push_back(std::move(v));
    if (stack.size() > stack_high) {
      charge(kSlotCost * (stack.size() - stack_high));
      stack_high = stack.size();
    }
  };
  auto need = [&](size_t k) {
    if (p.size() - at < k) fail("is cut short");
    const char* data = p.data() + at;
    at += k;
    return data;
  };
  auto uint = [&](int k) {
    const char* d = need(k);
    uint64_t v = 0;
    for (int i = 0; i < k; ++i) v |= static_cast<uint64_t>(static_cast<unsigned char>(d[i])) << (8 * i);
    return v;
  };
  auto make = [&](Kind kind) {
    charge(kValueCost);
    auto v = std::make_shared<PyValue>();
    v->kind = kind;
    made_.push_back(v);
    return v;
  };
  // Immutable values a pickle writes often (None, booleans, the empty tuple, ints 0..255)
  // are made once and shared.
  std::map<std::pair<Kind, int64_t>, Ref> shared;
  auto constant = [&](Kind kind, int64_t value) {
    auto& v = shared[{kind, value}];
    if (!v) {
      v = make(kind);
      v->boolean = value != 0;
      v->integer = value;
    }
    return v;
  };
  auto pop = [&]() {
    if (stack.empty() || (!marks.empty() && stack.size() <= marks.back())) fail("takes a value from an empty stack");
    Ref v = stack.back();
    stack.pop_back();
    return v;
  };
  auto pop_mark = [&]() {
    if (marks.empty()) fail("has no MARK where one is needed");
    std::vector<Ref> items(stack.begin() + static_cast<std::ptrdiff_t>(marks.back()), stack.end());
    charge(kSlotCost * items.size());
    stack.resize(marks.back());
    marks.pop_back();
    return items;
  };
  auto top = [&]() -> Ref& {
    if (stack.empty() || (!marks.empty() && stack.size() <= marks.back())) fail("refers to an empty stack");
    return stack.back();
  };
  auto integers = [&](const Ref& v, const char* what) {
    if (v->kind != Kind::tuple || v->items.size() > kMaxDims)
      fail(std::string("gives a tensor's ") + what + " as a " + v->kind_name() + " of " +
           std::to_string(v->items.size()) + " items");
    std::vector<int64_t> out;
    for (const auto& x : v->items) {
      if (x->kind != Kind::integer || x->integer < 0 || x->integer > (int64_t{1} << 48))
        fail(std::string("gives a tensor's ") + what + " as " + (x->kind == Kind::integer ? std::to_string(x->integer) : x->kind_name()));
      out.push_back(x->integer);
    }
    return out;
  };
  auto set_item = [&](const Ref& dict, Ref key, Ref value) {
    if (dict->kind != Kind::dict) fail(std::string("sets an item of a ") + dict->kind_name());
    charge(2 * kSlotCost);
    dict->entries.emplace_back(std::move(key), std::move(value));
  };
  // Everything the pickle calls: a fixed list, matched by name.
  auto call = [&](const Ref& callable, const Ref& args) -> Ref {
    if (callable->kind != Kind::global) fail(std::string("calls a ") + callable->kind_name());
    if (args->kind != Kind::tuple) fail("calls with arguments that are not a tuple");
    const auto& a = args->items;
    if (callable->text == "collections.OrderedDict") {
      if (!a.empty()) fail("makes an OrderedDict from arguments");
      return make(Kind::dict);
    }
    if (callable->text == "torch._utils._rebuild_parameter") {
      if (a.size() != 3 || a[0]->kind != Kind::tensor) fail("rebuilds a parameter from something else than a tensor");
      return a[0];
    }
    if (callable->text != "torch._utils._rebuild_tensor_v2") fail("calls " + printable(callable->text));
    // _rebuild_tensor_v2(storage, offset, size, stride, requires_grad, hooks[, metadata])
    if (a.size() < 6 || a.size() > 7 || a[0]->kind != Kind::global || !a[0]->tensor || a[1]->kind != Kind::integer)
      fail("rebuilds a tensor from arguments it does not take");
    const TensorRecord& storage = *a[0]->tensor;
    auto record = std::make_shared<TensorRecord>(storage);
    charge(sizeof(TensorRecord) + 64 + 2 * kMaxDims * sizeof(int64_t));
    record->offset = a[1]->integer;
    record->sizes = integers(a[2], "sizes");
    record->strides = integers(a[3], "strides");
    if (record->sizes.size() != record->strides.size())
      fail("gives a tensor " + std::to_string(record->sizes.size()) + " sizes and " +
           std::to_string(record->strides.size()) + " strides");
    // The last element the view reaches must lie inside the storage; the view may not
    // hold more elements than the storage (stride-0 views would, and would multiply
    // memory when made contiguous).
    __int128 numel = 1, last = record->offset;
    for (size_t d = 0; d < record->sizes.size(); ++d) {
      numel *= record->sizes[d];
      if (record->sizes[d] > 0) last += static_cast<__int128>(record->sizes[d] - 1) * record->strides[d];
      if (numel > storage.storage_numel) break;
    }
    if (numel > 0 && (record->offset < 0 || last >= storage.storage_numel || numel > storage.storage_numel))
      fail("describes a tensor reaching past its storage '" + printable(storage.storage_key) + "' (" +
           std::to_string(storage.storage_numel) + " elements)");
    // Views of one storage: the same view again is the same tensor (a tied weight);
    // distinct views together may hold no more elements than the storage (a LibTorch
    // archive's flat buffer cut into parameters), so reading them all costs at most the
    // storage again.
    auto& [distinct, total] = views[storage.storage_key];
    auto& seen = distinct[View{record->offset, record->sizes, record->strides}];
    if (seen) return seen;
    total += static_cast<int64_t>(numel);
    if (total > storage.storage_numel)
      fail("makes tensors holding " + std::to_string(total) + " elements in all from storage '" +
           printable(storage.storage_key) + "' of " + std::to_string(storage.storage_numel));
    seen = make(Kind::tensor);
    seen->tensor = record;
    return seen;
  };
  auto storage_of = [&](const Ref& pid) -> Ref {
    // ('storage', torch.<Type>Storage, key, location, numel)
    const auto& t = pid->items;
    if (pid->kind != Kind::tuple || t.size() != 5 || t[0]->kind != Kind::string || t[0]->text != "storage" ||
        t[1]->kind != Kind::global || t[2]->kind != Kind::string || t[4]->kind != Kind::integer)
      fail("names a storage in a way torch.save does not");
    const StorageType* type = storage_type(t[1]->text);
    if (!type) fail("names a storage of type '" + printable(t[1]->text) + "'");
    const std::string& key = t[2]->text;
    auto& known = storages[key];
    if (known) {
      if (known->tensor->dtype != type->dtype || known->tensor->storage_numel != t[4]->integer)
        fail("names storage '" + printable(key) + "' twice with different types or sizes");
      return known;
    }
    charge(kValueCost + key.size());
    const Entry* e = entry(prefix_ + "data/" + key);
    if (!e) fail("names storage '" + printable(key) + "', which the archive does not hold");
    const int64_t numel = t[4]->integer;
    if (numel < 0 || static_cast<uint64_t>(numel) > e->size / static_cast<uint64_t>(type->element_size) ||
        static_cast<uint64_t>(numel) * static_cast<uint64_t>(type->element_size) != e->size)
      fail("says storage '" + printable(key) + "' holds " + std::to_string(numel) + " elements of " +
           std::to_string(type->element_size) + " bytes, but its entry has " + std::to_string(e->size) + " bytes");
    known = make(Kind::global);
    known->text = t[1]->text;
    known->tensor = std::make_shared<TensorRecord>();
    known->tensor->storage_key = key;
    known->tensor->dtype = type->dtype;
    known->tensor->storage_numel = numel;
    return known;
  };
  auto text_line = [&]() {
    const size_t nl = p.find('\n', at);
    if (nl == std::string_view::npos || nl - at > 256) fail("has a GLOBAL without its line end");
    std::string s(p.substr(at, nl - at));
    at = nl + 1;
    return s;
  };
  auto global = [&](const std::string& module, const std::string& name) {
    const std::string full = module + "." + name;
    const bool allowed = full == "collections.OrderedDict" || full == "torch._utils._rebuild_tensor_v2" ||
                         full == "torch._utils._rebuild_parameter" || (module == "torch" && storage_type(full)) ||
                         (archive && is_module_class(module, name));
    TORCH_CHECK(allowed, where, ": its pickle names the Python global '", printable(full),
                "', which tinylm never runs: it reads numbers, strings, lists, tuples, dicts and tensors, as "
                "torch.load(weights_only=True) does (save a state dict of tensors)");
    auto v = make(Kind::global);
    charge(full.size());
    v->text = full;
    push(v);
  };
  auto string_value = [&](Kind kind, uint64_t length) {
    const char* d = need(length);
    auto v = make(kind);
    charge(length);
    v->text.assign(d, length);
    push(v);
  };

  for (;;) {
    const auto op = static_cast<unsigned char>(*need(1));
    switch (op) {
      case 0x80: need(1); break;                                   // PROTO
      case 0x95: need(8); break;                                   // FRAME (protocol 4)
      case '.':                                                    // STOP
        if (stack.size() != 1 || !marks.empty()) fail("stops with " + std::to_string(stack.size()) + " values on its stack");
        root_ = stack.back();
        return;
      case '(':                                                    // MARK
        marks.push_back(stack.size());
        if (marks.size() > marks_high) {
          charge(2 * sizeof(size_t));
          marks_high = marks.size();
        }
        break;
      case '}': push(make(Kind::dict)); break;                     // EMPTY_DICT
      case ']': push(make(Kind::list)); break;                     // EMPTY_LIST
      case ')': push(constant(Kind::tuple, 0)); break;             // EMPTY_TUPLE
      case 'N': push(constant(Kind::none, 0)); break;              // NONE
      case 0x88: case 0x89: push(constant(Kind::boolean, op == 0x88)); break;  // NEWTRUE, NEWFALSE
      case 'K': push(constant(Kind::integer, static_cast<int64_t>(uint(1)))); break;  // BININT1
      case 'J': case 'M': {                                        // BININT, BININT2
        auto v = make(Kind::integer);
        v->integer = op == 'J' ? static_cast<int32_t>(uint(4)) : static_cast<int64_t>(uint(2));
        push(v);
        break;
      }
      case 0x8a: {                                                 // LONG1
        const auto k = static_cast<int>(uint(1));
        if (k > 8) fail("holds an integer of " + std::to_string(k) + " bytes");
        uint64_t raw = k ? uint(k) : 0;
        if (k > 0 && k < 8 && (raw >> (8 * k - 1)) & 1) raw |= ~uint64_t{0} << (8 * k);  // sign-extend
        auto v = make(Kind::integer);
        v->integer = static_cast<int64_t>(raw);
        push(v);
        break;
      }
      case 'G': {                                                  // BINFLOAT, big-endian
        const char* d = need(8);
        uint64_t raw = 0;
        for (int i = 0; i < 8; ++i) raw = raw << 8 | static_cast<unsigned char>(d[i]);
        auto v = make(Kind::real);
        std::memcpy(&v->real, &raw, 8);
        push(v);
        break;
      }
      case 'X': string_value(Kind::string, uint(4)); break;        // BINUNICODE
      case 0x8c: string_value(Kind::string, uint(1)); break;       // SHORT_BINUNICODE
      case 'B': string_value(Kind::bytes, uint(4)); break;         // BINBYTES
      case 'C': string_value(Kind::bytes, uint(1)); break;         // SHORT_BINBYTES
      case 'c': {                                                  // GLOBAL
        const std::string module = text_line();
        global(module, text_line());
        break;
      }
      case 0x93: {                                                 // STACK_GLOBAL
        auto name = pop(), module = pop();
        if (name->kind != Kind::string || module->kind != Kind::string) fail("names a global with non-strings");
        global(module->text, name->text);
        break;
      }
      case 'q': case 'r': case 0x94: {                             // BINPUT, LONG_BINPUT, MEMOIZE
        // Python's pickler and LibTorch's number memo entries 0, 1, 2, ...: an index past
        // the next one would leave a gap to allocate.
        const uint64_t index = op == 'q' ? uint(1) : op == 'r' ? uint(4) : memo.size();
        if (index > memo.size()) fail("stores memo entry " + std::to_string(index) + " before entry " + std::to_string(memo.size()));
        if (index == memo.size()) {
          charge(kSlotCost);
          memo.push_back(top());
        } else {
          memo[index] = top();
        }
        break;
      }
      case 'h': case 'j': {                                        // BINGET, LONG_BINGET
        const uint64_t index = uint(op == 'h' ? 1 : 4);
        if (index >= memo.size()) fail("recalls a value it never stored");
        push(memo[index]);
        break;
      }
      case 't': {                                                  // TUPLE
        auto items = pop_mark();
        auto v = make(Kind::tuple);
        v->items = std::move(items);
        push(v);
        break;
      }
      case 0x85: case 0x86: case 0x87: {                           // TUPLE1, TUPLE2, TUPLE3
        auto v = make(Kind::tuple);
        charge(kSlotCost * (op - 0x84));
        v->items.resize(op - 0x84);
        for (size_t i = v->items.size(); i-- > 0;) v->items[i] = pop();
        push(v);
        break;
      }
      case 'a': {                                                  // APPEND
        auto value = pop();
        auto& list = top();
        if (list->kind != Kind::list) fail(std::string("appends to a ") + list->kind_name());
        charge(kSlotCost);
        list->items.push_back(value);
        break;
      }
      case 'e': {                                                  // APPENDS
        auto items = pop_mark();
        auto& list = top();
        if (list->kind != Kind::list) fail(std::string("appends to a ") + list->kind_name());
        list->items.insert(list->items.end(), items.begin(), items.end());
        break;
      }
      case 's': {                                                  // SETITEM
        auto value = pop(), key = pop();
        set_item(top(), key, value);
        break;
      }
      case 'u': {                                                  // SETITEMS
        auto items = pop_mark();
        if (items.size() % 2) fail("sets items from an odd number of values");
        auto& dict = top();
        for (size_t i = 0; i < items.size(); i += 2) set_item(dict, items[i], items[i + 1]);
        break;
      }
      case 'Q': push(storage_of(pop())); break;                    // BINPERSID
      case 'R': {                                                  // REDUCE
        auto args = pop(), callable = pop();
        push(call(callable, args));
        break;
      }
      case 0x81: {                                                 // NEWOBJ: a LibTorch module
        auto args = pop(), cls = pop();
        if (!archive || cls->kind != Kind::global || cls->text.rfind("__torch__", 0) != 0)
          fail(std::string("makes an object of a ") + cls->kind_name());
        if (args->kind != Kind::tuple || !args->items.empty()) fail("makes a module object from arguments");
        auto v = make(Kind::object);
        v->text = cls->text;
        push(v);
        break;
      }
      case 'b': {                                                  // BUILD
        auto state = pop();
        auto& target = top();
        if (target->kind == Kind::object && state->kind == Kind::dict) {  // a module's attributes
          charge(2 * kSlotCost * state->entries.size());
          target->entries.insert(target->entries.end(), state->entries.begin(), state->entries.end());
          break;
        }
        if (target->kind != Kind::dict || (state->kind != Kind::dict && state->kind != Kind::none))
          fail(std::string("sets the state of a ") + target->kind_name());
        break;                                                     // (state_dict()'s _metadata: not needed)
      }
      case '0': pop(); break;                                      // POP
      case '2': push(top()); break;                                // DUP
      default: {
        const char* digits = "0123456789abcdef";
        const std::string hex = {'0', 'x', digits[op >> 4], digits[op & 15]};
        fail("uses opcode " + hex + (archive ? ", which tinylm's LibTorch archives never held"
                                             : ", which torch.save does not write for a state dict"));
      }
    }
  }
}

torch::Tensor TorchFile::tensor(const TensorRecord& r) const {
  // Each tensor and each storage is made once: a record named under many keys is one
  // tensor, and many views of one storage copy it from the file once.
  auto& made = tensors_[&r];
  if (made.defined()) return made;
  auto& storage = storages_[r.storage_key];
  if (!storage.defined()) {
    const Entry* e = entry(prefix_ + "data/" + r.storage_key);
    TORCH_CHECK(e, "'", printable(path_), "': storage '", printable(r.storage_key), "' is missing");
    storage = torch::empty({r.storage_numel}, torch::TensorOptions().dtype(r.dtype));
    std::memcpy(storage.data_ptr(), bytes_.data() + e->offset, e->size);  // sizes equal: checked when parsed
  }
  auto view = storage.as_strided(r.sizes, r.strides, r.offset);
  // A view of part of the storage gets its own memory: the distinct views of a storage
  // hold no more than it (checked when parsed), so all of them take its size once more.
  made = view.is_contiguous() && view.numel() == r.storage_numel ? view : view.clone(at::MemoryFormat::Contiguous);
  return made;
}

}  // namespace tinylm::internal
