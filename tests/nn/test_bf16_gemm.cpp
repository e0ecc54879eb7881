// bfloat16 products (src/nn/bf16_gemm.cpp): the operands rounded to bfloat16 as
// round_to_bf16 rounds them, the sums in float32, in every orientation; refused, naming
// why, where they cannot run (no oneDNN in the build, a CPU without bfloat16 instructions).
// ctest runs this file twice on a CPU with AMX: as it is, and with oneDNN held to
// AVX512-BF16 (DNNL_MAX_CPU_ISA), so that both kernels are checked.
#include "../test_util.h"

#include <tinylm/nn/cpu_kernels.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
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

namespace {

/// The rounding written out bit by bit, as the tests' own reference.
uint16_t reference_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  const uint32_t lower = u & 0xFFFFu, upper = u >> 16;
  const bool up = lower > 0x8000u || (lower == 0x8000u && (upper & 1u));
  return static_cast<uint16_t>(upper + (up ? 1u : 0u));
}

}  // namespace

TEST_CASE("round_to_bf16 over arrays: the same bits on every instruction set of the loops", "[bf16]") {
  std::mt19937 rng(9);
  std::uniform_int_distribution<uint32_t> any_bits;
  std::vector<float> x;
  for (float f : {0.0f, -0.0f, 1.0f, -1.0f, std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                  std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::max(),
                  std::numeric_limits<float>::denorm_min(), 1.0f + std::ldexp(1.0f, -8), 1.0f + 3 * std::ldexp(1.0f, -8)})
    x.push_back(f);
  for (int i = 0; i < 5000; ++i) {  // every bit pattern is some float: NaNs with payloads, subnormals, ties
    uint32_t u = any_bits(rng);
    if (i % 3 == 0) u = (u & 0xFFFF0000u) | 0x8000u;  // an exact tie
    float f;
    std::memcpy(&f, &u, sizeof f);
    x.push_back(f);
  }
  struct Restore {
    ~Restore() { set_cpu_isa(CpuIsa::automatic); }
  } restore;
  for (const CpuIsa isa : {CpuIsa::generic, CpuIsa::avx2, CpuIsa::avx512}) {
    if (!cpu_isa_available(isa)) continue;
    set_cpu_isa(isa);
    for (const int64_t n : {int64_t{0}, int64_t{1}, int64_t{15}, int64_t{17}, static_cast<int64_t>(x.size())}) {
      std::vector<uint16_t> y(static_cast<size_t>(n) + 1, 0xABCDu);
      round_to_bf16(x.data(), y.data(), n);
      int64_t wrong = 0;
      for (int64_t i = 0; i < n; ++i) wrong += y[i] != reference_bits(x[i]);
      INFO("loops " << to_string(isa) << " n " << n);
      CHECK(wrong == 0);
      CHECK(y[n] == 0xABCDu);  // nothing written past the end
    }
  }
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
  const char* emulation = std::getenv("TINYLM_BF16_EMULATION");
  CHECK_THAT(bf16_products_description(),
             Catch::Contains(emulation && std::string(emulation) == "1" ? "emulated in float32" : "oneDNN"));
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
          const bool rounded_first = (s.M + ta + tb) % 2 == 0;  // half the cases: operands given in bfloat16
          // and half of those with a bias row added in the same pass
          const bool with_bias = rounded_first && (s.N + accumulate + ta) % 2 == 1;
          std::vector<float> bias(s.N);
          for (auto& x : bias) x = normal(rng);
          if (rounded_first) {
            std::vector<uint16_t> Ab(A.size()), Bb(B.size());
            round_to_bf16(A.data(), Ab.data(), static_cast<int64_t>(A.size()));
            round_to_bf16(B.data(), Bb.data(), static_cast<int64_t>(B.size()));
            gemm_bf16(ta, tb, s.M, s.N, s.K, Ab.data(), lda, Bb.data(), ldb, C.data(), ldc, accumulate,
                      with_bias ? bias.data() : nullptr);
          } else {
            gemm_bf16(ta, tb, s.M, s.N, s.K, A.data(), lda, B.data(), ldb, C.data(), ldc, accumulate);
          }
          double worst_rounded = 0, worst_exact = 0;
          for (int64_t i = 0; i < s.M; ++i)
            for (int64_t j = 0; j < s.N; ++j) {
              double rounded = (accumulate ? before[i * ldc + j] : 0) + (with_bias ? bias[j] : 0.0f), exact = rounded,
                     size = 0;
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
          INFO("M " << s.M << " N " << s.N << " K " << s.K << " trans " << ta << tb << " accumulate " << accumulate
                     << " given in bfloat16 " << rounded_first << " bias " << with_bias);
          CHECK(worst_rounded < 1e-5);  // float32 sums of the rounded operands' products
          CHECK(worst_exact < 1e-2);    // bfloat16's rounding: 8 bits of mantissa
          // The padding past each row is untouched.
          for (int64_t i = 0; i < s.M; ++i) CHECK(C[i * ldc + s.N] == before[i * ldc + s.N]);
        }
  }
}
