// src/nn/linear.h and src/nn/gelu.h: Linear layers and GELU on tinylm's kernels, against
// LibTorch's linear and gelu.
#include "../test_util.h"

#include <tinylm/nn/cpu_kernels.h>
#include <tinylm/nn/kernel_policy.h>
#include <tinylm/nn/model.h>

#include "nn/gelu.h"
#include "nn/linear.h"

#include <chrono>
#include <vector>

using namespace tinylm::nn;
using tinylm::test::bf16_value;

namespace {

/// Policies that send every Linear product to one of tinylm's backends (the small size set
/// to 0: all products count as large), for each that runs here. (A product sent to BLAS is
/// LibTorch's linear: see linear_uses_gemm.)
std::vector<KernelPolicy> own_product_policies() {
  std::vector<KernelPolicy> v;
  for (auto backend : {GemmBackend::libxsmm, GemmBackend::hand}) {
    if (!gemm_backend_available(backend)) continue;
    KernelPolicy p;
    p.small_gemm_flops = 0;
    p.large_gemm = backend;
    v.push_back(p);
  }
  return v;
}

double max_diff(const torch::Tensor& a, const torch::Tensor& b) {
  return (a.to(torch::kFloat64) - b.to(torch::kFloat64)).abs().max().item<double>();
}

}  // namespace

TEST_CASE("linear through tinylm's products: LibTorch's output and gradients to float32 rounding",
          "[nn][linear]") {
  const auto policies = own_product_policies();
  const KernelPolicy policy = policies[GENERATE_COPY(range(size_t{0}, policies.size()))];
  // Rows, inputs, outputs: tiles with remainders in every dimension, one row, tiny sizes.
  const auto [rows, K, N] = GENERATE(std::make_tuple(130, 300, 70), std::make_tuple(1, 5, 3),
                                     std::make_tuple(64, 256, 64), std::make_tuple(7, 1, 1));
  const bool bias = GENERATE(true, false);
  // The instruction set of tinylm's loops (the hand kernel's); libxsmm writes its own code.
  const CpuIsa isa = GENERATE(CpuIsa::generic, CpuIsa::avx2, CpuIsa::avx512);
  if (!cpu_isa_available(isa)) return;
  struct Restore {
    ~Restore() { set_cpu_isa(CpuIsa::automatic); }
  } restore;
  set_cpu_isa(isa);
  INFO("backend " << to_string(policy.large_gemm) << " loops " << to_string(isa) << " rows " << rows
                  << " K " << K << " N " << N << " bias " << bias);
  REQUIRE(policy.linear_uses_gemm(rows, N, K));
  torch::manual_seed(rows + K + N);
  auto x = torch::randn({2, rows, K}, torch::requires_grad());  // extra leading dimension
  auto w = torch::randn({N, K}, torch::requires_grad());
  auto b = bias ? torch::randn({N}, torch::requires_grad()) : torch::Tensor();
  auto upstream = torch::randn({2, rows, N});
  auto x2 = x.detach().clone().requires_grad_();
  auto w2 = w.detach().clone().requires_grad_();
  auto b2 = bias ? b.detach().clone().requires_grad_() : torch::Tensor();

  auto ours = linear(x, w, b, policy);
  auto theirs = torch::nn::functional::linear(x2, w2, b2);
  REQUIRE(ours.sizes() == theirs.sizes());
  ours.backward(upstream);
  theirs.backward(upstream);
  // Sums of K (or 2 * rows) unit-normal products: rounding grows like their square root.
  const double tol = 2e-5 * std::sqrt(static_cast<double>(std::max<int64_t>(K, 2 * rows)));
  CHECK(max_diff(ours, theirs) < tol);
  CHECK(max_diff(x.grad(), x2.grad()) < tol);
  CHECK(max_diff(w.grad(), w2.grad()) < tol);
  if (bias) CHECK(max_diff(b.grad(), b2.grad()) < tol);
}

TEST_CASE("without autograd, linear keeps the weight's packed copy only while the weight is unchanged",
          "[nn][linear]") {
  const auto policies = own_product_policies();
  const KernelPolicy policy = policies[GENERATE_COPY(range(size_t{0}, policies.size()))];
  // Rows: a few (dot products, nothing packed), one tile, and tiles with remainders.
  const int64_t rows = GENERATE(3, 64, 130);
  INFO("backend " << to_string(policy.large_gemm) << " rows " << rows);
  torch::manual_seed(rows);
  torch::NoGradGuard no_grad;
  const auto x = torch::randn({rows, 300});
  auto w = torch::randn({70, 300});
  const auto b = torch::randn({70});
  auto expect = [&] { return torch::nn::functional::linear(x, w, b); };
  CHECK(max_diff(linear(x, w, b, policy), expect()) < 1e-3);
  CHECK(max_diff(linear(x, w, b, policy), expect()) < 1e-3);  // the kept copy
  w.mul_(-2.0);  // changed in place: its version counter moves
  CHECK(max_diff(linear(x, w, b, policy), expect()) < 1e-3);
  w.set_data(torch::randn({70, 300}));  // other storage
  CHECK(max_diff(linear(x, w, b, policy), expect()) < 1e-3);
  w = torch::randn({70, 300});  // the old tensor gone, a new one (perhaps at its address)
  CHECK(max_diff(linear(x, w, b, policy), expect()) < 1e-3);
}

TEST_CASE("linear leaves to LibTorch what its policy does not send to tinylm's products",
          "[nn][linear]") {
  KernelPolicy off;
  off.linear_products = false;
  torch::manual_seed(1);
  auto x = torch::randn({300, 200}), w = torch::randn({100, 200}), b = torch::randn({100});
  CHECK(torch::equal(linear(x, w, b, off), torch::nn::functional::linear(x, w, b)));
  // float64 and non-matching shapes are LibTorch's too (its error for the latter).
  auto x64 = x.to(torch::kFloat64), w64 = w.to(torch::kFloat64);
  CHECK(torch::equal(linear(x64, w64, {}, KernelPolicy{}), torch::nn::functional::linear(x64, w64)));
  CHECK_THROWS(linear(torch::randn({4, 3}), w, b, KernelPolicy{}));
}

TEST_CASE("a transformer trains the same with its Linear layers on tinylm's products", "[nn][linear]") {
  const auto policies = own_product_policies();
  const KernelPolicy ours = policies[GENERATE_COPY(range(size_t{0}, policies.size()))];
  INFO("backend " << to_string(ours.large_gemm));
  KernelPolicy libtorch;
  libtorch.linear_products = false;
  torch::Tensor loss[2];
  std::vector<torch::Tensor> grads[2];
  for (int i = 0; i < 2; ++i) {
    torch::manual_seed(5);
    TransformerLM model(TransformerLMOptions(50, 64, 64, 4, 2).kernel_policy(i ? ours : libtorch));
    torch::manual_seed(6);
    auto ids = torch::randint(50, {4, 64}, torch::kLong);
    auto targets = torch::randint(50, {4, 64}, torch::kLong);
    loss[i] = model->loss(ids, targets);
    loss[i].backward();
    for (const auto& p : model->parameters()) grads[i].push_back(p.grad().clone());
  }
  CHECK(std::abs(loss[0].item<double>() - loss[1].item<double>()) < 1e-5);
  REQUIRE(grads[0].size() == grads[1].size());
  for (size_t i = 0; i < grads[0].size(); ++i) {
    INFO("parameter " << i);
    CHECK(max_diff(grads[0][i], grads[1][i]) < 1e-5);
  }
}

TEST_CASE("GELU on tinylm's loops: LibTorch's gelu and its gradient to float32 rounding", "[nn][gelu]") {
  const bool exact = GENERATE(true, false);
  INFO((exact ? "exact" : "tanh"));
  torch::manual_seed(8);
  auto x = (3 * torch::randn({5, 33, 41})).requires_grad_();  // a tail past whole vectors
  auto x2 = x.detach().clone().requires_grad_();
  auto upstream = torch::randn({5, 33, 41});
  KernelPolicy loops, libtorch;
  libtorch.gelu_loops = false;
  auto ours = gelu(x, exact, loops), theirs = gelu(x2, exact, libtorch);
  ours.backward(upstream);
  theirs.backward(upstream);
  CHECK(max_diff(ours, theirs) < 2e-6);
  CHECK(max_diff(x.grad(), x2.grad()) < 2e-5);
  // The same bits on one thread and on two (each element is computed alone).
  const int before = at::get_num_threads();
  at::set_num_threads(1);
  auto one = gelu(x.detach(), exact, loops);
  at::set_num_threads(2);
  auto two = gelu(x.detach(), exact, loops);
  at::set_num_threads(before);
  CHECK(torch::equal(one, two));
}

namespace {

/// Where this machine has no bfloat16 products: checks that a layer asking for them is
/// refused, naming why, and returns true (the case has nothing more to run here).
bool bf16_refused_here() {
  if (bf16_products_missing().empty()) return false;
  KernelPolicy policy;
  policy.bf16_products = true;
  CHECK_THAT(tinylm::test::error_message([&] { linear(torch::randn({4, 8}), torch::randn({3, 8}), {}, policy); }),
             Catch::Contains(bf16_products_missing()));
  return true;
}

}  // namespace

TEST_CASE("linear with bfloat16 products: float32 sums of the rounded operands, gradients included",
          "[nn][linear][bf16]") {
  KernelPolicy policy;
  policy.bf16_products = true;
  REQUIRE(policy.linear_uses_gemm(1, 1, 1));  // every size: LibTorch's linear would be float32
  torch::manual_seed(11);
  if (bf16_refused_here()) return;
  const auto [rows, K, N] = GENERATE(std::make_tuple(130, 300, 70), std::make_tuple(1, 5, 3), std::make_tuple(64, 256, 64));
  const bool bias = GENERATE(true, false);
  INFO("rows " << rows << " K " << K << " N " << N << " bias " << bias);
  auto x = torch::randn({2, rows, K}, torch::requires_grad());
  auto w = torch::randn({N, K}, torch::requires_grad());
  auto b = bias ? torch::randn({N}, torch::requires_grad()) : torch::Tensor();
  auto upstream = torch::randn({2, rows, N});
  const auto before = kernel_counts();
  const auto start = std::chrono::steady_clock::now();
  auto y = linear(x, w, b, policy);
  y.backward(upstream);
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  CHECK((kernel_counts() - before).gemm_bf16 == 3);  // forward, dx, dW
  // And the time they took (the benchmarks' products_in_step_ms): some, within the wall time.
  const double spent = (kernel_counts() - before).gemm_bf16_seconds;
  CHECK(spent > 0);
  CHECK(spent <= wall);
  // What the products must be: float64 sums of the rounded operands (sums of K, or of
  // 2 rows, unit-normal products: float32's rounding grows like their square root).
  const auto x64 = bf16_value(x.detach()).reshape({-1, K}), w64 = bf16_value(w.detach()),
             dy64 = bf16_value(upstream).reshape({-1, N});
  auto want_y = x64.matmul(w64.t());
  if (bias) want_y += b.detach().to(torch::kFloat64);
  const double tol = 2e-5 * std::sqrt(static_cast<double>(std::max<int64_t>(K, 2 * rows)));
  CHECK(max_diff(y.reshape({-1, N}), want_y) < tol);
  CHECK(max_diff(x.grad().reshape({-1, K}), dy64.matmul(w64)) < tol);
  CHECK(max_diff(w.grad(), dy64.t().matmul(x64)) < tol);
  if (bias) CHECK(max_diff(b.grad(), upstream.sum(std::vector<int64_t>{0, 1})) < tol);
  // Against float32's products: bfloat16's 8-bit mantissa, each product off by up to 2^-8
  // relative, and not the same numbers (the rounding did happen).
  const auto exact = torch::nn::functional::linear(x.detach(), w.detach(), bias ? b.detach() : torch::Tensor());
  const double off = max_diff(y, exact);
  CHECK(off < 2e-2 * std::sqrt(static_cast<double>(K)) * 2);
  if (K > 1) CHECK(off > 0);
}

TEST_CASE("linear with bfloat16 products rounds a weight again once it changes", "[nn][linear][bf16]") {
  if (bf16_refused_here()) return;
  KernelPolicy policy;
  policy.bf16_products = true;
  torch::manual_seed(12);
  auto x = torch::randn({16, 32}), w = torch::randn({8, 32});
  const auto y1 = linear(x, w, {}, policy);
  CHECK(torch::equal(linear(x, w, {}, policy), y1));  // the same weight: the same result
  {
    torch::NoGradGuard no_grad;
    w.mul_(2);  // in place: its version counter moves
  }
  CHECK(torch::equal(linear(x, w, {}, policy), y1 * 2));  // exact: scaling by 2 commutes with the rounding
  w = torch::randn({8, 32});  // a new weight (maybe at the old one's address)
  CHECK(max_diff(linear(x, w, {}, policy), x.to(torch::kFloat64).matmul(w.to(torch::kFloat64).t())) < 0.5);
}

TEST_CASE("a transformer with bfloat16 products trains near its float32 self", "[nn][linear][bf16]") {
  if (bf16_refused_here()) return;
  KernelPolicy bf16;
  bf16.bf16_products = true;
  double loss[2];
  std::vector<torch::Tensor> grads[2];
  for (int i = 0; i < 2; ++i) {
    torch::manual_seed(5);
    TransformerLM model(TransformerLMOptions(50, 64, 64, 4, 2).kernel_policy(i ? bf16 : KernelPolicy{}));
    torch::manual_seed(6);
    auto ids = torch::randint(50, {4, 64}, torch::kLong);
    auto targets = torch::randint(50, {4, 64}, torch::kLong);
    const auto before = kernel_counts();
    auto l = model->loss(ids, targets);
    l.backward();
    loss[i] = l.item<double>();
    // Every Linear layer: 2 blocks x (QKV, out, fc, proj) + the head, 3 products each.
    if (i) CHECK((kernel_counts() - before).gemm_bf16 == 3 * (2 * 4 + 1));
    for (const auto& p : model->parameters()) grads[i].push_back(p.grad().clone());
  }
  CHECK(loss[0] != loss[1]);
  CHECK(std::abs(loss[0] - loss[1]) < 1e-2);
  for (size_t i = 0; i < grads[0].size(); ++i) {
    INFO("parameter " << i);
    const double scale = grads[0][i].abs().max().item<double>();
    CHECK(max_diff(grads[0][i], grads[1][i]) < 0.05 * scale + 1e-6);
  }
}

TEST_CASE("fc, GELU and proj as one bfloat16 op: the three ops' output and gradients, bit for bit",
          "[nn][linear][bf16][gelu]") {
  if (bf16_refused_here()) return;
  KernelPolicy policy;
  policy.bf16_products = true;
  const bool exact = GENERATE(true, false);
  const bool bias = GENERATE(true, false);
  const int64_t rows = GENERATE(1, 45, 64);  // 45: a last block of 13 rows (blocks of 32)
  INFO("exact " << exact << " bias " << bias << " rows " << rows);
  torch::manual_seed(5);
  const int64_t D = 24, F = 72, N = 24;
  auto x = torch::randn({2, rows, D});
  auto w1 = torch::randn({F, D}) * 0.3, w2 = torch::randn({N, F}) * 0.2;
  auto b1 = bias ? torch::randn({F}) : torch::Tensor(), b2 = bias ? torch::randn({N}) : torch::Tensor();
  auto upstream = torch::randn({2, rows, N});
  std::vector<torch::Tensor> outputs, grads;
  for (int fused = 0; fused < 2; ++fused) {
    std::vector<torch::Tensor> leaves = {x.clone().requires_grad_(), w1.clone().requires_grad_(),
                                         w2.clone().requires_grad_()};
    if (bias) {
      leaves.push_back(b1.clone().requires_grad_());
      leaves.push_back(b2.clone().requires_grad_());
    }
    const auto& lb1 = bias ? leaves[3] : b1;
    const auto& lb2 = bias ? leaves[4] : b2;
    REQUIRE(linear_gelu_linear_fused(leaves[0], leaves[1], lb1, leaves[2], lb2, policy));
    const auto before = kernel_counts();
    auto y = fused ? linear_gelu_linear(leaves[0], leaves[1], lb1, leaves[2], lb2, exact, policy)
                   : linear(gelu(linear(leaves[0], leaves[1], lb1, policy), exact, policy), leaves[2], lb2, policy);
    y.backward(upstream);
    CHECK((kernel_counts() - before).gemm_bf16 == 6);  // two forward, four backward
    outputs.push_back(y.detach());
    for (const auto& leaf : leaves) grads.push_back(leaf.grad());
  }
  CHECK(torch::equal(outputs[0], outputs[1]));
  const size_t n = grads.size() / 2;
  for (size_t i = 0; i < n; ++i) {
    INFO("gradient " << i);
    CHECK(torch::equal(grads[i], grads[n + i]));
  }
  // And it is bfloat16 arithmetic: not float32's output.
  auto exact32 = torch::nn::functional::linear(
      torch::gelu(torch::nn::functional::linear(x, w1, b1), exact ? "none" : "tanh"), w2, b2);
  CHECK(max_diff(outputs[1], exact32) > 0);
  CHECK(max_diff(outputs[1], exact32) < 0.1);
  // Not taken without autograd (generation keeps the layers' own copies) or in float32.
  {
    torch::NoGradGuard no_grad;
    CHECK_FALSE(linear_gelu_linear_fused(x, w1, b1, w2, b2, policy));
  }
  CHECK_FALSE(linear_gelu_linear_fused(x, w1, b1, w2, b2, KernelPolicy{}));
}
