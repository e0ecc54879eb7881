// Internal: a registry of kinds (model kinds, task kinds): tinylm's own first, then
// those a program adds, looked up by name. Kinds are never removed, so a reference to
// one stays valid; the list is safe to use from several threads.
#pragma once

#include "internal/text.h"

#include <c10/util/Exception.h>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace tinylm::internal {

template <typename Kind>
class KindRegistry {
 public:
  /// `what` names the kinds in messages ("model", "task").
  KindRegistry(std::string what, std::vector<Kind> builtins) : what_(std::move(what)) {
    for (auto& k : builtins) kinds_.push_back(std::make_unique<const Kind>(std::move(k)));
  }

  /// Adds a kind; one whose name is taken is refused.
  void add(Kind kind) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& k : kinds_)
      TORCH_CHECK(k->name != kind.name, "register_", what_, "_kind: a ", what_, " kind named '", printable(kind.name),
                  "' is already registered (", list_locked(), "): choose another name");
    kinds_.push_back(std::make_unique<const Kind>(std::move(kind)));
  }

  /// The kind of that name, or null.
  const Kind* find(const std::string& name) const {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& k : kinds_)
      if (k->name == name) return k.get();
    return nullptr;
  }

  std::vector<std::string> names() const {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<std::string> out;
    for (const auto& k : kinds_) out.push_back(k->name);
    return out;
  }

  /// "tiny, transformer": for messages.
  std::string list() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return list_locked();
  }

 private:
  std::string list_locked() const {
    std::vector<std::string> names;
    for (const auto& k : kinds_) names.push_back(k->name);
    return join(names);
  }

  std::string what_;
  mutable std::mutex mutex_;
  std::vector<std::unique_ptr<const Kind>> kinds_;
};

}  // namespace tinylm::internal
