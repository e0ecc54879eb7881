// The matrix-product backends and tinylm's vectorised loops, against LibTorch and libm.
#include "../test_util.h"

#include <tinylm/nn/cpu_kernels.h>
#include <tinylm/nn/kernel_policy.h>

#include "nn/cpu/kernels.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <tuple>
#include <utility>
#include <vector>

using namespace tinylm::nn;
using tinylm::test::bf16_value;
using tinylm::test::error_message;

namespace {

struct Restore {
  ~Restore() { set_cpu_isa(CpuIsa::automatic); }
};

/// A product backend and the instruction set of the loops (the hand kernel's).
struct Product {
  GemmBackend backend;
  CpuIsa isa;
};

std::vector<Product> runnable_products() {
  std::vector<Product> v = {{GemmBackend::blas, CpuIsa::automatic}, {GemmBackend::hand, CpuIsa::generic}};
  for (auto isa : {CpuIsa::avx2, CpuIsa::avx512})
    if (cpu_isa_available(isa)) v.push_back({GemmBackend::hand, isa});
  if (gemm_backend_available(GemmBackend::libxsmm)) v.push_back({GemmBackend::libxsmm, CpuIsa::automatic});
  return v;
}

std::vector<const tinylm::nn::cpu::KernelTable*> runnable_tables() {
  std::vector<const tinylm::nn::cpu::KernelTable*> v = {&tinylm::nn::cpu::generic_table()};
  if (cpu_isa_available(CpuIsa::avx2)) v.push_back(tinylm::nn::cpu::avx2_table());
  if (cpu_isa_available(CpuIsa::avx512)) v.push_back(tinylm::nn::cpu::avx512_table());
  return v;
}

}  // namespace

TEST_CASE("every product backend computes op(A) op(B) as LibTorch does, with strides and accumulation",
          "[nn][gemm]") {
  Restore restore;
  // By index: Catch2 v3 would print a generated value, and a struct has no operator<<.
  const auto [backend, isa] = runnable_products()[GENERATE(range(size_t{0}, runnable_products().size()))];
  const auto [M, N, K] = GENERATE(std::make_tuple(192, 96, 32), std::make_tuple(64, 32, 192),
                                  std::make_tuple(7, 13, 5), std::make_tuple(1, 1, 1),
                                  std::make_tuple(17, 33, 9), std::make_tuple(3, 8, 0),
                                  // Above the small size: libxsmm's tiles, with a remainder
                                  // along every dimension (64 x 64 tiles, K steps of 256);
                                  // from 1024 rows B is copied into panels first.
                                  std::make_tuple(200, 150, 300), std::make_tuple(1030, 70, 60),
                                  // A few rows against a transposed B: dot products, with
                                  // remainders of every vector width along K and of 4 along N.
                                  std::make_tuple(2, 37, 45), std::make_tuple(4, 130, 300));
  const bool ta = GENERATE(false, true), tb = GENERATE(false, true), accumulate = GENERATE(false, true);
  INFO(to_string(backend) << " loops " << to_string(isa) << " M " << M << " N " << N << " K " << K
                          << " ta " << ta << " tb " << tb << " accumulate " << accumulate);
  set_cpu_isa(isa);
  torch::manual_seed(M * 7 + N * 3 + K);
  // Each operand sits in a wider buffer: row strides longer than the rows.
  auto a_buf = ta ? torch::randn({K, M + 3}) : torch::randn({M, K + 3});
  auto b_buf = tb ? torch::randn({N, K + 2}) : torch::randn({K, N + 2});
  auto c_buf = torch::randn({M, N + 5});
  auto a = ta ? a_buf.narrow(1, 0, M).t() : a_buf.narrow(1, 0, K);
  auto b = tb ? b_buf.narrow(1, 0, K).t() : b_buf.narrow(1, 0, N);
  auto c_before = c_buf.narrow(1, 0, N).clone();
  auto expected = torch::mm(a.to(torch::kFloat64), b.to(torch::kFloat64));
  if (accumulate) expected += c_before.to(torch::kFloat64);
  gemm(ta, tb, M, N, K, a_buf.data_ptr<float>(), a_buf.size(1), b_buf.data_ptr<float>(), b_buf.size(1),
       c_buf.data_ptr<float>(), c_buf.size(1), accumulate, backend);
  const double err = (c_buf.narrow(1, 0, N).to(torch::kFloat64) - expected).abs().max().item<double>();
  CHECK(err < 1e-4 * std::max(1.0, std::sqrt(static_cast<double>(K))));
}

TEST_CASE("the padding past C's rows is left alone", "[nn][gemm]") {
  Restore restore;
  const auto [backend, isa] = runnable_products()[GENERATE(range(size_t{0}, runnable_products().size()))];
  set_cpu_isa(isa);
  auto a = torch::randn({9, 4}), b = torch::randn({4, 11});
  auto c = torch::full({9, 16}, 7.0f);
  gemm(false, false, 9, 11, 4, a.data_ptr<float>(), 4, b.data_ptr<float>(), 11, c.data_ptr<float>(), 16,
       false, backend);
  CHECK(torch::all(c.narrow(1, 11, 5) == 7.0f).item<bool>());
  CHECK((c.narrow(1, 0, 11) - torch::mm(a, b)).abs().max().item<double>() < 1e-5);
}

TEST_CASE("the automatic choice sends small products to a small-matrix kernel and large ones to BLAS",
          "[nn][gemm]") {
  Restore restore;
  const KernelPolicy policy;
  const GemmBackend small = policy.gemm_backend(192, 96, 32);
  if (gemm_backend_available(GemmBackend::libxsmm)) {
    CHECK(small == GemmBackend::libxsmm);
  } else {
    CHECK(small == (cpu_isa() != CpuIsa::generic ? GemmBackend::hand : GemmBackend::blas));
  }
  // Large products: libxsmm's tiles where its code is as wide as the BLAS's, else BLAS.
  const GemmBackend large = tiles_for_large_products() ? GemmBackend::libxsmm : GemmBackend::blas;
  // libxsmm writes code for this CPU's widest vectors: wherever it works here with
  // AVX2 or AVX-512 code, the tiles take the large products.
  if (gemm_backend_available(GemmBackend::libxsmm) && cpu_isa_available(CpuIsa::avx2))
    CHECK(tiles_for_large_products());
  CHECK(policy.gemm_backend(1024, 1024, 1024) == large);
  KernelPolicy blas_large;
  blas_large.large_gemm = GemmBackend::blas;
  CHECK(blas_large.gemm_backend(1024, 1024, 1024) == GemmBackend::blas);
  CHECK(blas_large.gemm_backend(192, 96, 32) == small);
  // The threshold is the policy's: a product of 2 * 192 * 96 * 32 flops is large under a
  // lower one. One backend for all is a policy too; neither touches another policy.
  KernelPolicy low;
  low.small_gemm_flops = 2.0 * 192 * 96 * 32 - 1;
  CHECK(low.gemm_backend(192, 96, 32) == large);
  KernelPolicy hand;
  hand.gemm = GemmBackend::hand;
  CHECK(hand.gemm_backend(1024, 1024, 1024) == GemmBackend::hand);
  CHECK(KernelPolicy{}.gemm_backend(1024, 1024, 1024) == large);
  CHECK(cpu_kernels_description().find("loops: ") != std::string::npos);
  // A Linear layer takes tinylm's products above the small size, off BLAS only.
  CHECK(policy.linear_uses_gemm(2048, 768, 256) == (large != GemmBackend::blas));
  CHECK_FALSE(policy.linear_uses_gemm(1, 768, 256));  // one row: LibTorch's linear
  KernelPolicy no_linear;
  no_linear.linear_products = false;
  CHECK_FALSE(no_linear.linear_uses_gemm(2048, 768, 256));
  KernelPolicy hand_large;
  hand_large.large_gemm = GemmBackend::hand;
  CHECK(hand_large.linear_uses_gemm(2048, 768, 256));
}

TEST_CASE("libxsmm's tiles give the same bits on one thread and on two", "[nn][gemm]") {
  if (!gemm_backend_available(GemmBackend::libxsmm)) {  // then nothing may pick the tiles
    CHECK_FALSE(tiles_for_large_products());
    CHECK(KernelPolicy{}.gemm_backend(1024, 1024, 1024) == GemmBackend::blas);
    return;
  }
  const int before = at::get_num_threads();
  torch::manual_seed(3);
  auto a = torch::randn({300, 520}), b = torch::randn({520, 200});
  torch::Tensor c[2] = {torch::empty({300, 200}), torch::empty({300, 200})};
  for (int threads : {1, 2}) {
    at::set_num_threads(threads);
    gemm(false, false, 300, 200, 520, a.data_ptr<float>(), 520, b.data_ptr<float>(), 200,
         c[threads - 1].data_ptr<float>(), 200, false, GemmBackend::libxsmm);
  }
  at::set_num_threads(before);
  // Each tile is one thread's whole sum over K, in the same order whoever computes it.
  CHECK(torch::equal(c[0], c[1]));
  CHECK((c[0] - torch::mm(a, b)).abs().max().item<double>() < 1e-3);
}

TEST_CASE("kernel settings reject unknown names and what cannot run here", "[nn][gemm][errors]") {
  Restore restore;
  CHECK(error_message([] { gemm_backend_from_string("mkl"); }).find("use automatic, libxsmm, blas or hand") !=
        std::string::npos);
  CHECK(gemm_backend_from_string("libxsmm") == GemmBackend::libxsmm);
  for (auto isa : {CpuIsa::avx2, CpuIsa::avx512})
    if (!cpu_isa_available(isa))
      CHECK(error_message([isa] { set_cpu_isa(isa); }).find("cannot run here") != std::string::npos);
  // automatic is the widest set that runs here.
  set_cpu_isa(CpuIsa::automatic);
  CHECK(cpu_isa() == (cpu_isa_available(CpuIsa::avx512) ? CpuIsa::avx512
                      : cpu_isa_available(CpuIsa::avx2) ? CpuIsa::avx2
                                                        : CpuIsa::generic));
  CHECK(std::string(to_string(CpuIsa::avx512)) == "avx512");
  if (!gemm_backend_available(GemmBackend::libxsmm)) {
    std::vector<float> m(4);
    CHECK(error_message([&] {
            gemm(false, false, 2, 2, 2, m.data(), 2, m.data(), 2, m.data(), 2, false, GemmBackend::libxsmm);
          }).find("not available") != std::string::npos);
  }
  std::vector<float> x(4);
  CHECK(error_message([&] {
          gemm(false, false, 2, 2, 2, x.data(), 1, x.data(), 2, x.data(), 2);
        }).find("row stride") != std::string::npos);
}

TEST_CASE("the vectorised exp is within 2 ulp of libm and handles the edges", "[nn][gemm][exp]") {
  const auto* table = GENERATE(from_range(runnable_tables()));
  INFO(table->isa);
  std::vector<float> x;
  for (float v = -87.0f; v <= 88.0f; v += 0.01371f) x.push_back(v);
  const float inf = std::numeric_limits<float>::infinity();
  x.insert(x.end(), {0.0f, -0.0f, 1e-30f, -1e-30f, -inf, -1000.0f, std::nanf("")});
  std::vector<float> y(x.size());
  table->exp(x.data(), y.data(), static_cast<int64_t>(x.size()));
  double worst = 0;
  for (size_t i = 0; i + 7 < x.size(); ++i)
    worst = std::max(worst, std::abs(y[i] / std::exp(static_cast<double>(x[i])) - 1.0));
  INFO("largest relative error " << worst);
  CHECK(worst < 2.5e-7);
  const size_t e = x.size() - 7;
  CHECK(y[e] == 1.0f);
  CHECK(y[e + 1] == 1.0f);
  CHECK(y[e + 2] == 1.0f);
  CHECK(y[e + 3] == 1.0f);
  CHECK(y[e + 4] == 0.0f);  // exp(-inf)
  CHECK(y[e + 5] == 0.0f);
  CHECK(std::isnan(y[e + 6]));
}

TEST_CASE("the softmax cross-entropy kernel matches LibTorch's on rows of every length",
          "[nn][gemm][softmax]") {
  const auto* table = GENERATE(from_range(runnable_tables()));
  const int64_t V = GENERATE(1, 3, 8, 13, 64, 67);
  INFO(table->isa << " V " << V);
  torch::manual_seed(V);
  const int64_t N = 9;
  auto z = torch::randn({N, V}) * 4;
  auto targets = torch::randint(V, {N}, torch::kLong);
  targets[2] = -100;
  auto zr = z.clone().requires_grad_(true);
  auto expected = torch::nn::functional::cross_entropy(
      zr, targets, torch::nn::functional::CrossEntropyFuncOptions().ignore_index(-100).reduction(torch::kSum));
  expected.backward();
  auto work = z.clone();
  const double loss = table->softmax_cross_entropy(work.data_ptr<float>(), targets.data_ptr<int64_t>(), N, V,
                                                   -100, 1.0f);
  CHECK(std::abs(loss - expected.item<double>()) < 1e-4 * N);
  CHECK((work - zr.grad()).abs().max().item<double>() < 1e-6);
}

TEST_CASE("GELU's loops match the formulas in float64, both forms, value and slope", "[nn][gelu]") {
  const auto* table = GENERATE(from_range(runnable_tables()));
  const bool exact = GENERATE(true, false);
  INFO(table->isa << (exact ? " exact" : " tanh"));
  std::vector<float> x;
  for (float v = -12.0f; v <= 12.0f; v += 0.00731f) x.push_back(v);
  x.insert(x.end(), {0.0f, -0.0f, 1e-30f, -1e-30f, 30.0f, -30.0f, 3.0f});  // 7: a tail
  const int64_t n = static_cast<int64_t>(x.size());
  std::vector<float> y(n), dy(n, 1.0f), dx(n);
  table->gelu_forward(x.data(), y.data(), n, exact);
  table->gelu_backward(x.data(), dy.data(), dx.data(), n, exact);
  const double kBeta = std::sqrt(2.0 / M_PI), kKappa = 0.044715;
  double worst_value = 0, worst_slope = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double v = x[i];
    double value, slope;
    if (exact) {
      const double cdf = 0.5 * std::erfc(-v / std::sqrt(2.0)), pdf = std::exp(-0.5 * v * v) / std::sqrt(2 * M_PI);
      value = v * cdf;
      slope = cdf + v * pdf;
    } else {
      const double th = std::tanh(kBeta * (v + kKappa * v * v * v));
      value = 0.5 * v * (1 + th);
      slope = 0.5 * (1 + th) + 0.5 * v * (1 - th * th) * kBeta * (1 + 3 * kKappa * v * v);
    }
    // Absolute against the larger of the value and 1: float32 rounding of x itself.
    worst_value = std::max(worst_value, std::abs(y[i] - value) / std::max(1.0, std::abs(value)));
    worst_slope = std::max(worst_slope, std::abs(dx[i] - slope) / std::max(1.0, std::abs(slope)));
  }
  INFO("largest error: value " << worst_value << ", slope " << worst_slope);
  CHECK(worst_value < 1e-6);
  CHECK(worst_slope < 1e-6);
  // Central values (the rational fits) give the same bits beside a tail value (erfc) in
  // their vector as beside central ones.
  std::vector<float> central(64), mixed(64), y1(64), y2(64), d1(64), d2(64), ones(64, 1.0f);
  for (int i = 0; i < 64; ++i) central[i] = mixed[i] = -3.4f + 0.107f * static_cast<float>(i);
  for (int i = 0; i < 64; i += 3) mixed[i] = (i % 2 ? 1.f : -1.f) * (4.0f + 0.5f * static_cast<float>(i));
  table->gelu_forward(central.data(), y1.data(), 64, exact);
  table->gelu_forward(mixed.data(), y2.data(), 64, exact);
  table->gelu_backward(central.data(), ones.data(), d1.data(), 64, exact);
  table->gelu_backward(mixed.data(), ones.data(), d2.data(), 64, exact);
  int differing = 0;
  for (int i = 0; i < 64; ++i)
    if (i % 3 != 0) differing += (y1[i] != y2[i]) + (d1[i] != d2[i]);
  CHECK(differing == 0);
}

TEST_CASE("the decode loops attend each row over its own cached positions, as LibTorch does",
          "[nn][attention][rows]") {
  const auto* table = GENERATE(from_range(runnable_tables()));
  const int64_t Dh = GENERATE(8, 12, 32, 40);
  const int64_t Hkv = GENERATE(1, 2), H = 4;
  INFO(table->isa << " Dh " << Dh << " Hkv " << Hkv);
  torch::manual_seed(Dh + Hkv);
  const std::vector<int64_t> lengths = {0, 5, 2, 10};  // 10: the last position of a cache of 11
  const auto B = static_cast<int64_t>(lengths.size());
  const int64_t capacity = 11;
  auto q = torch::randn({B, H, Dh}), keys = torch::randn({B, Hkv, capacity, Dh}), values = torch::randn({B, Hkv, capacity, Dh});
  auto out = torch::full({B, H, Dh}, 99.0f);
  std::vector<float> scores(capacity);
  table->decode_attention(q.data_ptr<float>(), keys.data_ptr<float>(), values.data_ptr<float>(), out.data_ptr<float>(),
                          lengths.data(), 0, B, H, Hkv, capacity, Dh, 1.0f / std::sqrt(static_cast<float>(Dh)),
                          scores.data());
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      INFO("row " << b << " head " << h);
      const auto K = keys[b][h / (H / Hkv)].narrow(0, 0, lengths[b] + 1).to(torch::kDouble);
      const auto V = values[b][h / (H / Hkv)].narrow(0, 0, lengths[b] + 1).to(torch::kDouble);
      const auto w = torch::softmax(K.matmul(q[b][h].to(torch::kDouble)) / std::sqrt(static_cast<double>(Dh)), 0);
      CHECK((out[b][h].to(torch::kDouble) - w.matmul(V)).abs().max().item<double>() < 1e-5);
    }
}

namespace {

/// The tables whose bfloat16 loops (attention, rounding) run here: every runnable one
/// (emulating AVX512-BF16's dot products in float32, rounding in integer arithmetic) and the
/// one built with it where the CPU has it (VDPBF16PS, VCVTNEPS2BF16).
std::vector<const tinylm::nn::cpu::KernelTable*> bf16_attention_tables() {
  auto v = runnable_tables();
  if (tinylm::nn::cpu::avx512bf16_table() && tinylm::nn::cpu::cpu_has_avx512_bf16() &&
      cpu_isa_available(CpuIsa::avx512))
    v.push_back(tinylm::nn::cpu::avx512bf16_table());
  return v;
}

}  // namespace

TEST_CASE("the AVX-512 sets' exp (VSCALEFPS) gives the AVX2 set's bits over the float range", "[nn][exp]") {
  // The AVX-512 sets scale the polynomial by 2^n in one instruction, zeroing underflow by
  // its mask; the AVX2 set builds 2^n from its bits and selects 0: the same float for every
  // input, NaN and the infinities included. Every 509th bit pattern (8.4M, both signs).
  // (Where the CPU runs no AVX-512 code, the AVX2 set is compared with itself.)
  REQUIRE(cpu_isa_available(CpuIsa::avx2));
  const auto* reference = tinylm::nn::cpu::avx2_table();
  std::vector<const tinylm::nn::cpu::KernelTable*> tables;
  for (const auto* table : bf16_attention_tables())
    if (table != &tinylm::nn::cpu::generic_table()) tables.push_back(table);  // (no FMA: other roundings)
  std::vector<float> x;
  for (uint64_t u = 0; u < (uint64_t{1} << 32); u += 509) {
    const auto bits = static_cast<uint32_t>(u);
    float f;
    std::memcpy(&f, &bits, sizeof f);
    x.push_back(f);
  }
  const float inf = std::numeric_limits<float>::infinity();
  x.insert(x.end(), {-87.3365448f, std::nextafter(-87.3365448f, 0.f), std::nextafter(-87.3365448f, -inf), 88.0f,
                     88.5f, inf, -inf, std::nanf("")});
  std::vector<float> want(x.size()), got(x.size());
  reference->exp(x.data(), want.data(), static_cast<int64_t>(x.size()));
  for (const auto* table : tables) {
    INFO(table->isa);
    table->exp(x.data(), got.data(), static_cast<int64_t>(x.size()));
    size_t differing = 0, first = x.size();
    for (size_t i = 0; i < x.size(); ++i)
      if (std::memcmp(&got[i], &want[i], sizeof(float)) != 0 && differing++ == 0) first = i;
    INFO("first differing input " << (first < x.size() ? x[first] : 0.f));
    CHECK(differing == 0);
  }
}

TEST_CASE("rounding a gradient with its column sums: round_bf16's bits and row-order float sums",
          "[nn][bf16]") {
  const auto* table = GENERATE(from_range(bf16_attention_tables()));
  const int64_t cols = GENERATE(1, 16, 37);
  INFO(table->isa << ", " << cols << " columns");
  const int64_t rows = 5;
  torch::manual_seed(3);
  auto x = torch::randn({rows, cols});
  float* px = x.data_ptr<float>();
  px[cols / 2] = std::numeric_limits<float>::quiet_NaN();  // rounded as round_bf16 keeps it
  px[cols + cols / 3] = 3e-39f;  // subnormal: VCVTNEPS2BF16 would flush it to zero
  px[2 * cols] = -1e-40f;
  std::vector<uint16_t> want(rows * cols), got(rows * cols, 0);
  tinylm::nn::cpu::generic_table().round_bf16(px, want.data(), rows * cols);  // integer rounding's bits
  std::vector<float> sums(cols, 1.0f), expect(cols, 1.0f);  // added into, not overwritten
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < cols; ++j) expect[j] += px[r * cols + j];
  table->round_bf16_colsum(px, got.data(), rows, cols, sums.data());
  CHECK(got == want);
  for (int64_t j = 0; j < cols; ++j) {
    INFO("column " << j);
    if (j == cols / 2) CHECK(std::isnan(sums[j]));
    else CHECK(sums[j] == expect[j]);
  }
}

TEST_CASE("attention with bfloat16 products: float32 sums of the rounded operands, forward and backward",
          "[nn][attention][bf16]") {
  namespace cpu = tinylm::nn::cpu;
  const auto* table = GENERATE(from_range(bf16_attention_tables()));
  // Plain variables, not a structured binding: the lambda below uses them (C++17 lets no
  // lambda capture a binding; clang says so, GCC accepts it).
  // The last two convert fewer heads at once than they have (attention_bf16_heads_packed):
  // two, then two and one.
  const auto dims = GENERATE(std::make_tuple(2, 48, 64, 2), std::make_tuple(1, 32, 64, 4),
                             std::make_tuple(3, 16, 16, 1), std::make_tuple(1, 64, 512, 4),
                             std::make_tuple(2, 64, 384, 3));
  const int64_t B = std::get<0>(dims), T = std::get<1>(dims), D = std::get<2>(dims), H = std::get<3>(dims);
  const bool causal = GENERATE(true, false);
  INFO(table->isa << " (bf16 dot " << table->bf16_dot << "), B " << B << " T " << T << " D " << D << " H " << H
                  << (causal ? " causal" : ""));
  const int64_t Dh = D / H;
  const cpu::AttentionDims s{B, T, D, H, Dh, static_cast<float>(1.0 / std::sqrt(static_cast<double>(Dh))), causal};
  REQUIRE(cpu::attention_bf16_fits(s));
  if (D / H * T > 4096) REQUIRE(cpu::attention_bf16_heads_packed(s) < H);
  torch::manual_seed(7);
  auto qkv = torch::randn({B, T, 3 * D});
  auto dout = torch::randn({B, T, D});
  auto out = torch::full({B, T, D}, std::nanf("")), p = torch::full({B, H, T, T}, std::nanf(""));
  auto dqkv = torch::full({B, T, 3 * D}, std::nanf(""));
  // Scratch left as NaN: every part the kernels read must be written first.
  // Pairs [0, 1) and [1, B H) in two calls, as two threads would take them: the second
  // starts inside a batch element.
  std::vector<float> scratch(cpu::attention_bf16_scratch_floats(s), std::nanf(""));
  for (const auto& [begin, end] : {std::make_pair(int64_t{0}, int64_t{1}), std::make_pair(int64_t{1}, B * H)}) {
    table->attention_forward_bf16(s, qkv.data_ptr<float>(), out.data_ptr<float>(), p.data_ptr<float>(), nullptr,
                                  begin, end, scratch.data());
    table->attention_backward_bf16(s, qkv.data_ptr<float>(), p.data_ptr<float>(), nullptr, dout.data_ptr<float>(),
                                   dqkv.data_ptr<float>(), begin, end, scratch.data());
    if (begin == 0 && B * H > 1) {  // pair 0 only: every other pair's output still NaN
      const auto by_pair = [&](const torch::Tensor& x) {
        return x.narrow(2, 0, D).reshape({B, T, H, Dh}).permute({0, 2, 1, 3}).reshape({B * H, T * Dh});
      };
      CHECK(by_pair(out).narrow(0, 1, B * H - 1).isnan().all().item<bool>());
      CHECK(by_pair(dqkv).narrow(0, 1, B * H - 1).isnan().all().item<bool>());
      CHECK(!by_pair(dqkv).narrow(0, 0, 1).isnan().any().item<bool>());
    }
  }
  // The reference in float64, per (batch, head), from the rounded operands. Where a
  // product takes a float32 result of the kernel's (p, ds) rounded, the kernel's own p is
  // used: rounding decides between two bfloat16 neighbours, which float32 and float64
  // could see on different sides of.
  auto heads = [&](const torch::Tensor& x, int64_t part) {  // (B, T, 3D or D) -> (B, H, T, Dh)
    return x.narrow(2, part * D, D).reshape({B, T, H, Dh}).permute({0, 2, 1, 3}).to(torch::kFloat64);
  };
  const auto q = heads(qkv, 0), k = heads(qkv, 1), v = heads(qkv, 2), dO = heads(dout, 0);
  const auto qr = bf16_value(q), kr = bf16_value(k), vr = bf16_value(v), dor = bf16_value(dO);
  auto scores = torch::matmul(qr, kr.transpose(-1, -2)) * s.scale;
  if (causal) scores.masked_fill_(torch::ones({T, T}, torch::kBool).triu(1), -INFINITY);
  const auto p_ref = torch::softmax(scores, -1);
  const auto p_kernel = p.to(torch::kFloat64), pr = bf16_value(p);
  const auto o_ref = torch::matmul(pr, vr);
  const auto dp = torch::matmul(dor, vr.transpose(-1, -2));
  const auto ds = s.scale * p_kernel * (dp - (p_kernel * dp).sum(-1, true));
  const auto dsr = bf16_value(ds.to(torch::kFloat32));
  const auto dq_ref = torch::matmul(dsr, kr), dk_ref = torch::matmul(dsr.transpose(-1, -2), qr);
  const auto dv_ref = torch::matmul(pr.transpose(-1, -2), dor);
  auto merged = [&](const torch::Tensor& x) { return x.permute({0, 2, 1, 3}).reshape({B, T, D}); };
  auto relative = [](const torch::Tensor& got, const torch::Tensor& want) {
    return ((got.to(torch::kFloat64) - want).abs().max() / want.abs().max()).item<double>();
  };
  CHECK((p_kernel - p_ref).abs().max().item<double>() < 1e-5);
  if (causal) CHECK(p.masked_select(torch::ones({T, T}, torch::kBool).triu(1)).abs().max().item<float>() == 0.0f);
  CHECK(relative(out, merged(o_ref)) < 1e-5);
  CHECK(relative(dqkv.narrow(2, 2 * D, D), merged(dv_ref)) < 1e-5);
  // A p or ds of the kernel's may round to the other neighbour than its float64 twin (one
  // bfloat16 step, 2^-8 of one term among T): the tolerance is that, not float32's.
  CHECK(relative(dqkv.narrow(2, 0, D), merged(dq_ref)) < 1e-3);
  CHECK(relative(dqkv.narrow(2, D, D), merged(dk_ref)) < 1e-3);
  // And bfloat16's operands are what made the difference: float32's kernel is 1e-3 away.
  auto out32 = torch::empty_like(out), p32 = torch::empty_like(p);
  std::vector<float> scratch32(cpu::attention_scratch_floats(s));
  table->attention_forward(s, qkv.data_ptr<float>(), out32.data_ptr<float>(), p32.data_ptr<float>(), 0, B * H,
                           scratch32.data());
  CHECK(relative(out32, merged(o_ref)) > 1e-4);

  // Without p: the forward keeps each row's log-sum-exp, the same output; the backward
  // recomputes the weights from it (to float32 rounding: a rounded weight may land on the
  // other bfloat16 neighbour, hence the same tolerance as ds's above).
  auto out_r = torch::full_like(out, std::nanf("")), lse = torch::full({B, H, T}, std::nanf(""));
  auto dqkv_r = torch::full_like(dqkv, std::nanf(""));
  std::fill(scratch.begin(), scratch.end(), std::nanf(""));
  table->attention_forward_bf16(s, qkv.data_ptr<float>(), out_r.data_ptr<float>(), nullptr, lse.data_ptr<float>(), 0,
                                B * H, scratch.data());
  CHECK(torch::equal(out_r, out));
  CHECK((lse.to(torch::kFloat64) - torch::logsumexp(scores, -1)).abs().max().item<double>() < 1e-5);
  std::fill(scratch.begin(), scratch.end(), std::nanf(""));
  table->attention_backward_bf16(s, qkv.data_ptr<float>(), nullptr, lse.data_ptr<float>(), dout.data_ptr<float>(),
                                 dqkv_r.data_ptr<float>(), 0, B * H, scratch.data());
  CHECK(relative(dqkv_r, dqkv.to(torch::kFloat64)) < 1e-3);
  CHECK(relative(dqkv_r.narrow(2, 2 * D, D), merged(dv_ref)) < 1e-3);
}
