// Where a step's time goes, by op family: LibTorch's RecordFunction callbacks time every
// op (and every autograd node, and tinylm's own scopes: "tinylm::..." in the library) on
// every thread, and each op's self time (its time less that of the ops it called) goes to
// its family. Inside a tinylm scope, everything goes to that scope's family: the fused
// optimizer's ops count as "optimizer", not as element-wise arithmetic.
#pragma once

#include <map>
#include <string>

namespace tinylm::cli {

/// The family of an op or scope, from its name: matmul, attention, layer_norm, gelu,
/// loss, embedding, optimizer, data, elementwise (add, mul, copy, views and the rest).
std::string op_family(const std::string& name);

/// Times ops while alive (one at a time in a process).
class OpProfile {
 public:
  OpProfile();
  ~OpProfile();
  OpProfile(const OpProfile&) = delete;
  OpProfile& operator=(const OpProfile&) = delete;
  /// Seconds of self time per family so far (all threads).
  std::map<std::string, double> seconds() const;
  /// Seconds of self time per op name so far, with its family: {family, {name, seconds}}.
  std::map<std::string, std::map<std::string, double>> seconds_by_op() const;
};

}  // namespace tinylm::cli
