// src/nn/linear.h and src/nn/gelu.h: Linear layers and GELU on tinylm's kernels, against
// LibTorch's linear and gelu.
#include "../test_util.h"

#include <tinylm/nn/cpu_kernels.h>
#include <tinylm/nn/kernel_policy.h>
#include <tinylm/nn/model.h>

#include "nn/gelu.h"
#include "nn/linear.h"

#include <vector>

using namespace tinylm::nn;

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
