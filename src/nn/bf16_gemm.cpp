// bfloat16 products (cpu_kernels.h: gemm_bf16) through oneDNN's matmul, whose kernel for
// this CPU is AMX tiles or AVX512-BF16 dot products, with float32 sums (issue 40). Float
// operands are rounded to bfloat16 by tinylm's loops (cpu::KernelTable::round_bf16) into
// buffers of this thread's; operands already in bfloat16 go to oneDNN as they are stored,
// a transposed one by its strides. Each shape's primitive is made once per thread and kept.
// Built with oneDNN 2.x (Debian 12) or 3.x (Debian 13), whose primitive descriptors are made
// differently. With TINYLM_BF16_EMULATION=1 the products are emulated in float32 instead,
// on any CPU and build (for tests: see emulated()).
#include <tinylm/nn/cpu_kernels.h>

#include "nn/cpu/kernels.h"
#include "nn/kernel_counts.h"
#include "tinylm_onednn_config.h"

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#if defined(TINYLM_HAVE_ONEDNN)
#if defined(__x86_64__)
#include <cpuid.h>
#endif
#include <oneapi/dnnl/dnnl.hpp>
#endif

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <array>
#include <map>
#include <unordered_map>
#include <string>
#include <vector>

namespace tinylm::nn {

namespace {

/// bfloat16 bits as the float they stand for (exact: the upper half of a float32).
float bf16_to_float(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

/// The stored matrix of op(X) (rows x cols of op(X), or its transpose) as packed bfloat16.
const uint16_t* packed_bf16(bool trans, int64_t rows, int64_t cols, const float* X, int64_t ld,
                            std::vector<uint16_t>& out) {
  const int64_t stored_rows = trans ? cols : rows, stored_cols = trans ? rows : cols;
  out.resize(static_cast<size_t>(stored_rows * stored_cols));
  if (ld == stored_cols) {  // packed already: one pass
    round_to_bf16(X, out.data(), stored_rows * stored_cols);
    return out.data();
  }
  for (int64_t i = 0; i < stored_rows; ++i) round_to_bf16(X + i * ld, out.data() + i * stored_cols, stored_cols);
  return out.data();
}

}  // namespace

void round_to_bf16(const float* x, uint16_t* y, int64_t n) {
  TORCH_CHECK(n >= 0, "round_to_bf16: negative count ", n);
  const auto round = cpu::bf16_table().round_bf16;  // VCVTNEPS2BF16 where the CPU has it
  // Over the intra-op threads: a layer's activations are millions of floats.
  at::parallel_for(0, n, 1 << 16, [&](int64_t begin, int64_t end) { round(x + begin, y + begin, end - begin); });
}

float round_to_bf16(float x) {
  uint16_t h;
  round_to_bf16(&x, &h, 1);
  return bf16_to_float(h);
}

void gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda,
               const float* B, int64_t ldb, float* C, int64_t ldc, bool accumulate) {
  TORCH_CHECK(M >= 0 && N >= 0 && K >= 0, "gemm_bf16: negative size M=", M, " N=", N, " K=", K);
  TORCH_CHECK(lda >= (trans_a ? M : K) && ldb >= (trans_b ? K : N),
              "gemm_bf16: a row stride is shorter than its row (lda ", lda, ", ldb ", ldb, " for M=", M, " N=", N,
              " K=", K, ")");
  TORCH_CHECK(bf16_products_missing().empty(), "gemm_bf16: ", bf16_products_missing());
  thread_local std::vector<uint16_t> a, b;
  const uint16_t* pa = packed_bf16(trans_a, M, K, A, lda, a);
  const uint16_t* pb = packed_bf16(trans_b, K, N, B, ldb, b);
  gemm_bf16(trans_a, trans_b, M, N, K, pa, trans_a ? M : K, pb, trans_b ? K : N, C, ldc, accumulate);
}

#if defined(TINYLM_HAVE_ONEDNN)

namespace {

/// AVX512-BF16 (CPUID leaf 7 subleaf 1, EAX bit 5) or AMX-BF16 (leaf 7, EDX bit 22): what
/// makes oneDNN's bfloat16 products faster than float32's (elsewhere it converts).
bool cpu_has_bf16() {
#if !defined(__x86_64__)
  return false;
#else
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  const bool amx = (d >> 22) & 1u;
  const unsigned subleaves = a;
  bool avx512 = false;
  if (subleaves >= 1 && __get_cpuid_count(7, 1, &a, &b, &c, &d)) avx512 = (a >> 5) & 1u;
  return amx || avx512;
#endif
}

/// A product's primitive, its implementation's name, and its operands' memory objects
/// (made with it; each call sets their pointers: making them took a few microseconds of
/// the one thread between parallel regions, per product).
struct Bf16Product {
  dnnl::matmul matmul;
  std::string impl;
  dnnl::memory a, b, c, bias;
  std::unordered_map<int, dnnl::memory> args;  // the same objects, by oneDNN's argument
};

struct Bf16Thread {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
  std::map<std::array<int64_t, 11>, Bf16Product> products;
};

Bf16Thread& bf16_thread() {
  thread_local Bf16Thread t;
  return t;
}

/// op(X) (rows x cols) of a matrix stored row-major with row stride ld (transposed: stored
/// cols x rows), as oneDNN's strides.
dnnl::memory::desc operand(bool trans, int64_t rows, int64_t cols, int64_t ld, dnnl::memory::data_type type) {
  return dnnl::memory::desc({rows, cols}, type, trans ? dnnl::memory::dims{1, ld} : dnnl::memory::dims{ld, 1});
}

/// The primitive for C (M x N, row stride ldc) (+)= op(A) op(B) (+ a bias row), made once
/// per shape, thread and intra-op thread count: oneDNN fixes a primitive's split over the
/// threads when it makes it, so one made under 1 thread would run on 1 thread ever after.
Bf16Product& bf16_product(Bf16Thread& t, bool ta, bool tb, int64_t M, int64_t N, int64_t K, int64_t lda, int64_t ldb,
                          int64_t ldc, bool accumulate, bool bias = false) {
  const std::array<int64_t, 11> key{ta, tb, M, N, K, lda, ldb, ldc, accumulate, bias, at::get_num_threads()};
  auto it = t.products.find(key);
  if (it != t.products.end()) return it->second;
  // A server sees many shapes (prompt lengths, batch widths): the cache is bounded.
  if (t.products.size() >= 256) t.products.clear();
  using dt = dnnl::memory::data_type;
  const auto a = operand(ta, M, K, lda, dt::bf16), b = operand(tb, K, N, ldb, dt::bf16),
             c = operand(false, M, N, ldc, dt::f32);
  dnnl::primitive_attr attr;
  if (accumulate) {
    dnnl::post_ops ops;
    ops.append_sum(1.0f);
    attr.set_post_ops(ops);
  }
  const auto bias_row = operand(false, 1, N, N, dt::f32);
#if DNNL_VERSION_MAJOR >= 3
  const auto pd = bias ? dnnl::matmul::primitive_desc(t.engine, a, b, bias_row, c, attr)
                       : dnnl::matmul::primitive_desc(t.engine, a, b, c, attr);
#else
  const auto pd = bias ? dnnl::matmul::primitive_desc(dnnl::matmul::desc(a, b, bias_row, c), attr, t.engine)
                       : dnnl::matmul::primitive_desc(dnnl::matmul::desc(a, b, c), attr, t.engine);
#endif
  // (memory objects made on no data: each call sets theirs)
  Bf16Product p{dnnl::matmul(pd), pd.impl_info_str(), dnnl::memory(a, t.engine, DNNL_MEMORY_NONE),
                dnnl::memory(b, t.engine, DNNL_MEMORY_NONE), dnnl::memory(c, t.engine, DNNL_MEMORY_NONE),
                dnnl::memory(bias_row, t.engine, DNNL_MEMORY_NONE), {}};
  p.args = {{DNNL_ARG_SRC, p.a}, {DNNL_ARG_WEIGHTS, p.b}, {DNNL_ARG_DST, p.c}};
  if (bias) p.args.emplace(DNNL_ARG_BIAS, p.bias);
  return t.products.emplace(key, std::move(p)).first->second;
}

/// Why oneDNN's bfloat16 products do not run here ("" where they do).
std::string native_missing() {
  static const std::string why =
      cpu_has_bf16() ? "" : "this CPU has no bfloat16 instructions (AVX512-BF16 or AMX): its bfloat16 products "
                            "would be slower than float32's";
  return why;
}

void native_gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const uint16_t* A, int64_t lda,
                      const uint16_t* B, int64_t ldb, float* C, int64_t ldc, bool accumulate, const float* bias) {
  auto& t = bf16_thread();
  auto& p = bf16_product(t, trans_a, trans_b, M, N, K, lda, ldb, ldc, accumulate, bias != nullptr);
  // oneDNN reads the operands only; its memory objects take non-const pointers.
  p.a.set_data_handle(const_cast<uint16_t*>(A));
  p.b.set_data_handle(const_cast<uint16_t*>(B));
  p.c.set_data_handle(C);
  if (bias) p.bias.set_data_handle(const_cast<float*>(bias));
  p.matmul.execute(t.stream, p.args);
  t.stream.wait();
}

std::string native_description() {
  const auto* v = dnnl_version();
  constexpr int64_t n = 256;  // a layer's product: oneDNN picks its kernel by shape
  std::vector<uint16_t> a(n * n, 0), b(n * n, 0);
  std::vector<float> c(n * n);
  native_gemm_bf16(false, false, n, n, n, a.data(), n, b.data(), n, c.data(), n, false, nullptr);
  auto& t = bf16_thread();
  return "bfloat16 products: oneDNN " + std::to_string(v->major) + "." + std::to_string(v->minor) + " (" +
         bf16_product(t, false, false, n, n, n, n, n, n, false).impl + " at 256 x 256 x 256)";
}

}  // namespace

#else

namespace {

std::string native_missing() { return "this build has no oneDNN (apt-get install libdnnl-dev, then configure again)"; }

void native_gemm_bf16(bool, bool, int64_t, int64_t, int64_t, const uint16_t*, int64_t, const uint16_t*, int64_t,
                      float*, int64_t, bool, const float*) {
  TORCH_CHECK(false, "gemm_bf16: ", native_missing());
}

std::string native_description() { return ""; }

}  // namespace

#endif

namespace {

/// TINYLM_BF16_EMULATION=1: bfloat16 products emulated in float32, on any CPU and build, so
/// that the bfloat16 path (rounding, caches, gradients, the CLI's runs) is tested where
/// oneDNN's bfloat16 kernels cannot run. The operands are rounded as ever, widened back to
/// float32 (exactly) and multiplied by the float32 kernels: products exact, sums in float32,
/// as AMX and AVX512-BF16 make them, the order of the sums aside. Slower than float32: for
/// tests, not for runs.
bool emulated() {
  static const bool on = [] {
    const char* v = std::getenv("TINYLM_BF16_EMULATION");
    const std::string value = v ? v : "";
    TORCH_CHECK(value.empty() || value == "0" || value == "1", "TINYLM_BF16_EMULATION is '", value,
                "': set it to 1 (bfloat16 products emulated in float32, for tests) or unset it");
    return value == "1";
  }();
  return on;
}

/// The stored matrix (rows x cols, row stride ld) of bfloat16 bits, widened to packed float32.
const float* widened(const uint16_t* X, int64_t rows, int64_t cols, int64_t ld, std::vector<float>& out) {
  out.resize(static_cast<size_t>(rows * cols));
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) out[i * cols + j] = bf16_to_float(X[i * ld + j]);
  return out.data();
}

void emulated_gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const uint16_t* A, int64_t lda,
                        const uint16_t* B, int64_t ldb, float* C, int64_t ldc, bool accumulate, const float* bias) {
  thread_local std::vector<float> a, b;
  const int64_t a_rows = trans_a ? K : M, a_cols = trans_a ? M : K, b_rows = trans_b ? N : K, b_cols = trans_b ? K : N;
  const float* fa = widened(A, a_rows, a_cols, lda, a);
  const float* fb = widened(B, b_rows, b_cols, ldb, b);
  gemm(trans_a, trans_b, M, N, K, fa, a_cols, fb, b_cols, C, ldc, accumulate, GemmBackend::automatic);
  if (bias)
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) C[i * ldc + j] += bias[j];
}

}  // namespace

std::string bf16_products_missing() { return emulated() ? "" : native_missing(); }

bool bf16_products_emulated() { return emulated(); }

void gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const uint16_t* A, int64_t lda,
               const uint16_t* B, int64_t ldb, float* C, int64_t ldc, bool accumulate, const float* bias) {
  TORCH_CHECK(M >= 0 && N >= 0 && K >= 0, "gemm_bf16: negative size M=", M, " N=", N, " K=", K);
  TORCH_CHECK(ldc >= N && lda >= (trans_a ? M : K) && ldb >= (trans_b ? K : N),
              "gemm_bf16: a row stride is shorter than its row (lda ", lda, ", ldb ", ldb, ", ldc ", ldc,
              " for M=", M, " N=", N, " K=", K, ")");
  TORCH_CHECK(bf16_products_missing().empty(), "gemm_bf16: ", bf16_products_missing());
  if (M == 0 || N == 0) return;
  if (K == 0) {
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) C[i * ldc + j] = (accumulate ? C[i * ldc + j] : 0.0f) + (bias ? bias[j] : 0.0f);
    return;
  }
  const auto start = std::chrono::steady_clock::now();
  if (emulated())
    emulated_gemm_bf16(trans_a, trans_b, M, N, K, A, lda, B, ldb, C, ldc, accumulate, bias);
  else
    native_gemm_bf16(trans_a, trans_b, M, N, K, A, lda, B, ldb, C, ldc, accumulate, bias);
  count_bf16_gemm(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
}

std::string bf16_products_description() {
  if (emulated())
    return "bfloat16 products: emulated in float32 (TINYLM_BF16_EMULATION=1: operands rounded to bfloat16, "
           "multiplied by the float32 kernels; for tests, slower than float32)";
  if (!native_missing().empty()) return "no bfloat16 products: " + native_missing();
  return native_description();
}

}  // namespace tinylm::nn
