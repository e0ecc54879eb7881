// A checked reader for torch.save files: see torch_file.h.
// Over 400 lines on purpose: a zip reader and a pickle machine for one untrusted format,
// checked together.
#include "interop/torch_file.h"

#include "internal/crc32.h"
#include "internal/text.h"

#include <c10/util/Exception.h>
#include <torch/torch.h>

#include <cstring>
#include <limits>
#include <map>
#include <unordered_map>

namespace tinylm::internal {

int64_t TensorRecord::numel() const {
  int64_t n = 1;
  for (auto s : sizes) n *= s;  // each size was checked against the storage
  return n;
}

const char* PyValue::kind_name() const {
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
  }
  return "value";
}

const PyValue* PyValue::find(std::string_view key) const {
  if (kind != Kind::dict) return nullptr;
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

TorchFile::TorchFile(std::string bytes, std::string path) : bytes_(std::move(bytes)), path_(std::move(path)) {
  read_zip();
  const Entry* pickle = entry(prefix_ + "data.pkl");
  TORCH_CHECK(pickle, "'", printable(path_), "' is not a file Python's torch.save wrote: it has no data.pkl");
  if (const Entry* order = entry(prefix_ + "byteorder"))
    TORCH_CHECK(std::string_view(bytes_).substr(order->offset, order->size) == "little", "'", printable(path_),
                "' was written on a big-endian machine: tinylm reads little-endian files only");
  try {
    unpickle(std::string_view(bytes_).substr(pickle->offset, pickle->size));
  } catch (...) {
    break_cycles();  // no destructor runs for a constructor that throws
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
  for (const auto& [n, e] : entries_)
    if (n == name) return &e;
  return nullptr;
}

// ---- the zip archive ---------------------------------------------------------------
// End of central directory (EOCD), its zip64 twin where a field overflows, then one
// central-directory record per entry, each pointing at a local header before the data.
// Every offset and size is checked against the file; entries must be stored (method 0),
// unencrypted, and match their CRC-32.

void TorchFile::read_zip() {
  const std::string where = "'" + printable(path_) + "'";
  const uint64_t n = bytes_.size();
  TORCH_CHECK(n >= 22 && bytes_.compare(0, 4, "PK\x03\x04") == 0, where,
              " is not a file Python's torch.save wrote (not its zip format; PyTorch before 1.6 wrote "
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
    TORCH_CHECK(method == 0 && csize == usize, where, ": '", printable(name),
                "' is compressed; torch.save stores entries uncompressed");
    TORCH_CHECK(local <= n && n - local >= 30 && le(bytes_, local, 4) == 0x04034b50, where,
                " is damaged: the data of '", printable(name), "' is not where the zip directory says");
    const uint64_t data = local + 30 + le(bytes_, local + 26, 2) + le(bytes_, local + 28, 2);
    TORCH_CHECK(data <= n && usize <= n - data, where, " is damaged: '", printable(name), "' (", usize,
                " bytes at ", data, ") runs past the end of the file (", n, " bytes)");
    TORCH_CHECK(crc32(bytes_.data() + data, usize) == crc, where, " is corrupt: the checksum of '",
                printable(name), "' does not match its contents");
    entries_.push_back({std::move(name), {data, usize}});
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

void TorchFile::unpickle(std::string_view p) {
  const std::string where = "'" + printable(path_) + "'";
  using Ref = std::shared_ptr<PyValue>;
  using Kind = PyValue::Kind;
  std::vector<Ref> stack;
  std::vector<size_t> marks;
  std::unordered_map<uint64_t, Ref> memo;
  std::map<std::string, Ref> storages;  // by key: one storage, however often it is named
  std::map<std::string, Ref> views;     // by storage key: the one view it may have
  size_t at = 0;
  auto fail = [&](const std::string& what) {
    TORCH_CHECK(false, where, " is damaged or not a state dict: its pickle ", what, " (at byte ", at, ")");
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
  auto make = [this](Kind kind) {
    auto v = std::make_shared<PyValue>();
    v->kind = kind;
    made_.push_back(v);
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
    // Two tensors on one storage: only the same view twice (a tied weight).
    auto& seen = views[storage.storage_key];
    if (seen && (seen->tensor->offset != record->offset || seen->tensor->sizes != record->sizes ||
                 seen->tensor->strides != record->strides))
      fail("makes two different tensors share storage '" + printable(storage.storage_key) + "'");
    auto out = make(Kind::tensor);
    out->tensor = record;
    if (!seen) seen = out;
    return out;
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
                         full == "torch._utils._rebuild_parameter" || (module == "torch" && storage_type(full));
    TORCH_CHECK(allowed, where, ": its pickle names the Python global '", printable(full),
                "', which tinylm never runs: it reads numbers, strings, lists, tuples, dicts and tensors, as "
                "torch.load(weights_only=True) does (save a state dict of tensors)");
    auto v = make(Kind::global);
    v->text = full;
    stack.push_back(v);
  };
  auto string_value = [&](Kind kind, uint64_t length) {
    const char* d = need(length);
    auto v = make(kind);
    v->text.assign(d, length);
    stack.push_back(v);
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
      case '(': marks.push_back(stack.size()); break;              // MARK
      case '}': stack.push_back(make(Kind::dict)); break;          // EMPTY_DICT
      case ']': stack.push_back(make(Kind::list)); break;          // EMPTY_LIST
      case ')': stack.push_back(make(Kind::tuple)); break;         // EMPTY_TUPLE
      case 'N': stack.push_back(make(Kind::none)); break;          // NONE
      case 0x88: case 0x89: {                                      // NEWTRUE, NEWFALSE
        auto v = make(Kind::boolean);
        v->boolean = op == 0x88;
        stack.push_back(v);
        break;
      }
      case 'J': case 'K': case 'M': {                              // BININT, BININT1, BININT2
        auto v = make(Kind::integer);
        v->integer = op == 'J' ? static_cast<int32_t>(uint(4)) : static_cast<int64_t>(uint(op == 'K' ? 1 : 2));
        stack.push_back(v);
        break;
      }
      case 0x8a: {                                                 // LONG1
        const auto k = static_cast<int>(uint(1));
        if (k > 8) fail("holds an integer of " + std::to_string(k) + " bytes");
        uint64_t raw = k ? uint(k) : 0;
        if (k > 0 && k < 8 && (raw >> (8 * k - 1)) & 1) raw |= ~uint64_t{0} << (8 * k);  // sign-extend
        auto v = make(Kind::integer);
        v->integer = static_cast<int64_t>(raw);
        stack.push_back(v);
        break;
      }
      case 'G': {                                                  // BINFLOAT, big-endian
        const char* d = need(8);
        uint64_t raw = 0;
        for (int i = 0; i < 8; ++i) raw = raw << 8 | static_cast<unsigned char>(d[i]);
        auto v = make(Kind::real);
        std::memcpy(&v->real, &raw, 8);
        stack.push_back(v);
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
        const uint64_t index = op == 'q' ? uint(1) : op == 'r' ? uint(4) : memo.size();
        memo[index] = top();
        break;
      }
      case 'h': case 'j': {                                        // BINGET, LONG_BINGET
        auto it = memo.find(uint(op == 'h' ? 1 : 4));
        if (it == memo.end()) fail("recalls a value it never stored");
        stack.push_back(it->second);
        break;
      }
      case 't': {                                                  // TUPLE
        auto v = make(Kind::tuple);
        v->items = pop_mark();
        stack.push_back(v);
        break;
      }
      case 0x85: case 0x86: case 0x87: {                           // TUPLE1, TUPLE2, TUPLE3
        auto v = make(Kind::tuple);
        v->items.resize(op - 0x84);
        for (size_t i = v->items.size(); i-- > 0;) v->items[i] = pop();
        stack.push_back(v);
        break;
      }
      case 'a': {                                                  // APPEND
        auto value = pop();
        auto& list = top();
        if (list->kind != Kind::list) fail(std::string("appends to a ") + list->kind_name());
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
      case 'Q': stack.push_back(storage_of(pop())); break;         // BINPERSID
      case 'R': {                                                  // REDUCE
        auto args = pop(), callable = pop();
        stack.push_back(call(callable, args));
        break;
      }
      case 'b': {                                                  // BUILD: an OrderedDict's attributes
        auto state = pop();
        if (top()->kind != Kind::dict || (state->kind != Kind::dict && state->kind != Kind::none))
          fail(std::string("sets the state of a ") + top()->kind_name());
        break;                                                     // (state_dict()'s _metadata: not needed)
      }
      case '0': pop(); break;                                      // POP
      case '2': stack.push_back(top()); break;                     // DUP
      default: {
        const char* digits = "0123456789abcdef";
        const std::string hex = {'0', 'x', digits[op >> 4], digits[op & 15]};
        fail("uses opcode " + hex + ", which torch.save does not write for a state dict");
      }
    }
  }
}

torch::Tensor TorchFile::tensor(const TensorRecord& r) const {
  const Entry* e = entry(prefix_ + "data/" + r.storage_key);
  TORCH_CHECK(e, "'", printable(path_), "': storage '", printable(r.storage_key), "' is missing");
  auto storage = torch::empty({r.storage_numel}, torch::TensorOptions().dtype(r.dtype));
  std::memcpy(storage.data_ptr(), bytes_.data() + e->offset, e->size);  // sizes equal: checked when parsed
  auto view = storage.as_strided(r.sizes, r.strides, r.offset);
  // A view of part of the storage gets its own memory, so the storage can go.
  return view.is_contiguous() && view.numel() == r.storage_numel ? view : view.clone(at::MemoryFormat::Contiguous);
}

}  // namespace tinylm::internal
