// Internal: the pieces of an ONNX ModelProto (src/onnx.cpp): onnx.proto's field numbers,
// attributes, tensors, graph inputs and outputs, and a graph of nodes and initializers,
// serialized by internal/protobuf.h (ONNX 1.12's schema; later versions only add fields).
#pragma once

#include "protobuf.h"

#include <torch/types.h>

#include <cstdint>
#include <set>
#include <string>
#include <string_view>
#include <vector>

namespace tinylm::internal::onnx {

namespace pb = internal::protobuf;

// onnx.proto's field numbers, message by message.
namespace model_f { constexpr uint64_t ir_version = 1, producer_name = 2, producer_version = 3, doc_string = 6,
                    graph = 7, opset_import = 8, metadata_props = 14; }
namespace graph_f { constexpr uint64_t node = 1, name = 2, initializer = 5, input = 11, output = 12; }
namespace node_f { constexpr uint64_t input = 1, output = 2, name = 3, op_type = 4, attribute = 5; }
namespace attr_f { constexpr uint64_t name = 1, f = 2, i = 3, ints = 8, type = 20; }
namespace attr_type { constexpr uint64_t FLOAT = 1, INT = 2, INTS = 7; }
namespace tensor_f { constexpr uint64_t dims = 1, data_type = 2, name = 8, raw_data = 9; }
namespace dtype { constexpr uint64_t FLOAT = 1, INT64 = 7; }
constexpr int64_t kIrVersion = 8;  // what opset 17 came with (ONNX 1.12)

inline std::string attr_int(const std::string& name, int64_t v) {
  return pb::field(node_f::attribute, pb::field(attr_f::name, name) + pb::number_field(attr_f::type, attr_type::INT) +
                                          pb::number_field(attr_f::i, static_cast<uint64_t>(v)));
}
inline std::string attr_float(const std::string& name, float v) {
  return pb::field(node_f::attribute, pb::field(attr_f::name, name) +
                                          pb::number_field(attr_f::type, attr_type::FLOAT) + pb::float_field(attr_f::f, v));
}
inline std::string attr_ints(const std::string& name, const std::vector<int64_t>& v) {
  std::string a = pb::field(attr_f::name, name) + pb::number_field(attr_f::type, attr_type::INTS);
  for (const int64_t x : v) a += pb::number_field(attr_f::ints, static_cast<uint64_t>(x));
  return pb::field(node_f::attribute, a);
}

/// A tensor's bytes, little-endian as ONNX's raw_data is (what x86-64 and arm64 hold).
inline std::string tensor_proto(const std::string& name, const torch::Tensor& t) {
  const auto c = t.detach().to(torch::kCPU).contiguous();
  TORCH_CHECK(c.scalar_type() == torch::kFloat || c.scalar_type() == torch::kLong,
              "ONNX export: tensor '", name, "' is ", c.scalar_type(), " (float32 and int64 are written)");
  std::string out;
  for (const int64_t d : c.sizes()) out += pb::number_field(tensor_f::dims, static_cast<uint64_t>(d));
  out += pb::number_field(tensor_f::data_type, c.scalar_type() == torch::kFloat ? dtype::FLOAT : dtype::INT64);
  out += pb::field(tensor_f::name, name);
  out += pb::field(tensor_f::raw_data,
                   std::string_view(static_cast<const char*>(c.data_ptr()), c.numel() * c.element_size()));
  return out;
}

/// A graph input or output: name, element type, dimensions (a name for a dynamic one).
inline std::string value_info(const std::string& name, uint64_t elem_type, const std::vector<std::string>& dims) {
  std::string shape;
  for (const auto& d : dims) {
    const bool number = !d.empty() && d.find_first_not_of("0123456789") == std::string::npos;
    shape += pb::field(1, number ? pb::number_field(1, std::stoull(d)) : pb::field(2, d));  // Dimension
  }
  const std::string tensor_type = pb::number_field(1, elem_type) + pb::field(2, shape);
  return pb::field(1, name) + pb::field(2, pb::field(1, tensor_type));  // ValueInfoProto{name, TypeProto{tensor}}
}

/// The nodes and initializers of one graph, each node's output named for its op.
class Graph {
 public:
  /// One node; returns its outputs' names.
  std::vector<std::string> node(const std::string& op, const std::vector<std::string>& inputs,
                                const std::string& attributes = "", int outputs = 1, const std::string& named = "") {
    std::string n;
    for (const auto& i : inputs) n += pb::field(node_f::input, i);
    std::vector<std::string> names;
    for (int o = 0; o < outputs; ++o) {
      names.push_back(!named.empty() ? named : op + "_" + std::to_string(count_) + (outputs > 1 ? "_" + std::to_string(o) : ""));
      n += pb::field(node_f::output, names.back());
    }
    n += pb::field(node_f::name, op + "_" + std::to_string(count_++));
    n += pb::field(node_f::op_type, op);
    n += attributes;
    nodes_ += pb::field(graph_f::node, n);
    return names;
  }
  std::string op(const std::string& op, const std::vector<std::string>& inputs, const std::string& attributes = "") {
    return node(op, inputs, attributes).front();
  }
  /// A weight (or table) under its own name.
  std::string weight(const std::string& name, const torch::Tensor& t) {
    if (named_.insert(name).second) initializers_ += pb::field(graph_f::initializer, tensor_proto(name, t));
    return name;  // a tensor used twice (the tied head) is stored once
  }
  /// A constant: int64 values or one float.
  std::string ints(const std::vector<int64_t>& v) {
    return weight("const_" + std::to_string(constants_++), torch::tensor(v, torch::kLong));
  }
  std::string scalar(float v) { return weight("const_" + std::to_string(constants_++), torch::tensor({v})); }

  std::string bytes(const std::string& name, const std::string& inputs, const std::string& outputs) const {
    return pb::field(graph_f::name, name) + nodes_ + initializers_ + inputs + outputs;
  }

 private:
  std::string nodes_, initializers_;
  std::set<std::string> named_;
  int64_t count_ = 0, constants_ = 0;
};

}  // namespace tinylm::internal::onnx
