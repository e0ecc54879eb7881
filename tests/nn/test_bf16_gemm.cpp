// bfloat16 products (src/nn/bf16_gemm.cpp): the operands rounded to bfloat16 as
// round_to_bf16 rounds them, the sums in float32, in every orientation; refused, naming
// why, where they cannot run (no oneDNN in the build, a CPU without bfloat16 instructions).
#include "../test_util.h"

#include <tinylm/nn/cpu_kernels.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

using namespace tinylm::nn;
using tinylm::test::error_message;

TEST_CASE("round_to_bf16 rounds to nearest, ties to even, and keeps NaN and infinities", "[bf16]") {
  CHECK(round_to_bf16(1.0f) == 1.0f);
  CHECK(round_to_bf16(-2.5f) == -2.5f);
  CHECK(round_to_bf16(1.0f + std::ldexp(1.0f, -8)) == 1.0f);  // a tie: to the even neighbour, 1
  CHECK(round_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)) == 1.0f + std::ldexp(1.0f, -6));  // a tie: up to even
  CHECK(round_to_bf16(1.0f + std::ldexp(1.0f, -7) + std::ldexp(1.0f, -9)) == 1.0f + std::ldexp(1.0f, -7));
  CHECK(round_to_bf16(3.14159265f) == 3.140625f);
  CHECK(std::isnan(round_to_bf16(std::numeric_limits<float>::quiet_NaN())));
  CHECK(round_to_bf16(std::numeric_limits<float>::infinity()) == std::numeric_limits<float>::infinity());
  CHECK(round_to_bf16(std::numeric_limits<float>::max()) == std::numeric_limits<float>::infinity());  // past the largest
}

TEST_CASE("gemm_bf16: bfloat16 operands, float32 sums, in every orientation", "[bf16]") {
  const std::string missing = bf16_products_missing();
  if (!missing.empty()) {  // where they cannot run: refused, naming why
    float a = 1, b = 1, c = 0;
    CHECK_THAT(error_message([&] { gemm_bf16(false, false, 1, 1, 1, &a, 1, &b, 1, &c, 1, false); }),
               Catch::Contains(missing));
    CHECK_THAT(bf16_products_description(), Catch::Contains(missing));
    return;
  }
  CHECK_THAT(bf16_products_description(), Catch::Contains("oneDNN"));
  std::mt19937 rng(5);
  std::normal_distribution<float> normal;
  struct Shape {
    int64_t M, N, K;
  };
  for (const Shape s : {Shape{1, 1, 1}, Shape{7, 5, 3}, Shape{33, 17, 130}, Shape{64, 96, 256}}) {
    for (const bool ta : {false, true})
      for (const bool tb : {false, true})
        for (const bool accumulate : {false, true}) {
          const int64_t lda = (ta ? s.M : s.K) + 3, ldb = (tb ? s.K : s.N) + 2, ldc = s.N + 1;
          std::vector<float> A((ta ? s.K : s.M) * lda), B((tb ? s.N : s.K) * ldb), C(s.M * ldc);
          for (auto& x : A) x = normal(rng);
          for (auto& x : B) x = normal(rng);
          for (auto& x : C) x = normal(rng);
          const auto before = C;
          gemm_bf16(ta, tb, s.M, s.N, s.K, A.data(), lda, B.data(), ldb, C.data(), ldc, accumulate);
          double worst_rounded = 0, worst_exact = 0;
          for (int64_t i = 0; i < s.M; ++i)
            for (int64_t j = 0; j < s.N; ++j) {
              double rounded = accumulate ? before[i * ldc + j] : 0, exact = rounded, size = 0;
              for (int64_t k = 0; k < s.K; ++k) {
                const float a = ta ? A[k * lda + i] : A[i * lda + k], b = tb ? B[j * ldb + k] : B[k * ldb + j];
                rounded += static_cast<double>(round_to_bf16(a)) * round_to_bf16(b);
                exact += static_cast<double>(a) * b;
                size += std::fabs(static_cast<double>(a) * b);
              }
              const double got = C[i * ldc + j];
              worst_rounded = std::max(worst_rounded, std::fabs(got - rounded) / (size + 1));
              worst_exact = std::max(worst_exact, std::fabs(got - exact) / (size + 1));
            }
          INFO("M " << s.M << " N " << s.N << " K " << s.K << " trans " << ta << tb << " accumulate " << accumulate);
          CHECK(worst_rounded < 1e-5);  // float32 sums of the rounded operands' products
          CHECK(worst_exact < 1e-2);    // bfloat16's rounding: 8 bits of mantissa
          // The padding past each row is untouched.
          for (int64_t i = 0; i < s.M; ++i) CHECK(C[i * ldc + s.N] == before[i * ldc + s.N]);
        }
  }
}
