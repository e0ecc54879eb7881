// Catch2 v2 (Debian 12) and v3 (Debian 13) behind one set of names: the tests write
// Catch::Contains, Catch::StartsWith and Approx, as in v2; v3 moved them.
#pragma once

// TINYLM_CATCH2_V2: the build chose v2's single header (TINYLM_DEPS_DIR) where v3's are
// installed too.
#if !defined(TINYLM_CATCH2_V2) && __has_include(<catch2/catch_all.hpp>)
#include <catch2/catch_all.hpp>

#include <string>

namespace Catch {
inline Matchers::StringContainsMatcher Contains(const std::string& text) {
  return Matchers::ContainsSubstring(text);
}
inline Matchers::StartsWithMatcher StartsWith(const std::string& text) {
  return Matchers::StartsWith(text);
}
}  // namespace Catch
using Catch::Approx;
#else
#include <catch2/catch.hpp>
#endif
