// Errors a program may act on. tinylm throws c10::Error (TORCH_CHECK) for every problem;
// where a caller has something better to do than report it, the error is a tinylm::Error
// with a kind to switch on (its text is for people, never matched by programs).
#pragma once

#include <c10/util/Exception.h>

#include <string>

namespace tinylm {

enum class ErrorKind {
  run_directory_taken,  // a fresh run's directory already holds an earlier run
  heads_unknown,        // an imported state dict does not say its number of attention heads
  data_needed,          // a checkpoint needs the data it was trained on, and it was not found or differs
};

/// A c10::Error (caught wherever one is) that also says what kind of problem it is.
class Error : public c10::Error {
 public:
  Error(ErrorKind kind, const std::string& message, const char* file, uint32_t line)
      : c10::Error(c10::SourceLocation{"", file, line}, message), kind_(kind) {}
  ErrorKind kind() const { return kind_; }

 private:
  ErrorKind kind_;
};

}  // namespace tinylm

/// TORCH_CHECK, throwing a tinylm::Error of `kind`: TINYLM_CHECK(cond, kind, parts...).
#define TINYLM_CHECK(cond, kind, ...)                                                     \
  do {                                                                                    \
    if (!(cond)) throw ::tinylm::Error((kind), ::c10::str(__VA_ARGS__), __FILE__, __LINE__); \
  } while (false)
