// tinylm/nn/kernel_policy.h: every kernel choice of a model, in one value.
#include "../test_util.h"

#include <tinylm/nn/attention.h>
#include <tinylm/nn/block.h>
#include <tinylm/nn/kernel_policy.h>
#include <tinylm/nn/model.h>

#include <limits>
#include <vector>

using namespace tinylm::nn;

namespace {

AttentionCall cpu_call(int64_t T) {
  AttentionCall c;
  c.fused_supported = true;  // float32 on the CPU
  c.seq_len = T;
  return c;
}

}  // namespace

TEST_CASE("the attention kernel a policy picks, as a table", "[nn][kernel-policy]") {
  // With LibTorch 1.13 there is no SDPA: every row that would pick it falls back.
  const bool sdpa = sdpa_available();
  const AttentionKernel sdpa_or_plain = sdpa ? AttentionKernel::sdpa : AttentionKernel::plain;
  const AttentionKernel sdpa_or_fused = sdpa ? AttentionKernel::sdpa : AttentionKernel::fused;
  const KernelPolicy policy;
  // On the CPU, SDPA from T 64 where it beat the fused kernel; never where tinylm's loops
  // run AVX-512, which beat it at every length measured.
  CHECK(policy.sdpa_cpu_min_seq_len ==
        (cpu_isa() == CpuIsa::avx512 ? std::numeric_limits<int64_t>::max() : int64_t{64}));
  const AttentionKernel at_64 = policy.sdpa_cpu_min_seq_len <= 64 ? sdpa_or_fused : AttentionKernel::fused;
  AttentionCall cuda = cpu_call(12);
  cuda.cuda = true;
  cuda.fused_supported = false;
  AttentionCall padded = cpu_call(12), dropout = cpu_call(12), weights_grad = cpu_call(12),
                weights_no_grad = cpu_call(12), float64 = cpu_call(12);
  padded.padding_mask = true;
  dropout.dropout = true;
  weights_grad.return_weights = weights_grad.grad_enabled = true;
  weights_no_grad.return_weights = true;
  float64.fused_supported = false;
  struct Row {
    const char* what;
    AttentionKernel requested;
    AttentionCall call;
    AttentionKernel expected;
  };
  const std::vector<Row> table = {
      {"automatic, CPU, T 12", AttentionKernel::automatic, cpu_call(12), AttentionKernel::fused},
      {"automatic, CPU, T 63", AttentionKernel::automatic, cpu_call(63), AttentionKernel::fused},
      {"automatic, CPU, T 64", AttentionKernel::automatic, cpu_call(64), at_64},
      {"automatic, CUDA, T 12", AttentionKernel::automatic, cuda, sdpa_or_plain},
      {"automatic, padding mask", AttentionKernel::automatic, padded, AttentionKernel::plain},
      {"automatic, attention dropout", AttentionKernel::automatic, dropout, sdpa_or_plain},
      {"automatic, weights with autograd", AttentionKernel::automatic, weights_grad, AttentionKernel::plain},
      {"automatic, weights without autograd", AttentionKernel::automatic, weights_no_grad, AttentionKernel::fused},
      {"automatic, float64", AttentionKernel::automatic, float64, sdpa_or_plain},
      {"plain, CPU, T 64", AttentionKernel::plain, cpu_call(64), AttentionKernel::plain},
      {"fused, CPU, T 100", AttentionKernel::fused, cpu_call(100), AttentionKernel::fused},
      {"fused, CUDA", AttentionKernel::fused, cuda, AttentionKernel::plain},
      {"fused, padding mask", AttentionKernel::fused, padded, AttentionKernel::plain},
      {"sdpa, CPU, T 12", AttentionKernel::sdpa, cpu_call(12), sdpa_or_plain},
      {"sdpa, weights", AttentionKernel::sdpa, weights_no_grad, AttentionKernel::plain},
  };
  for (const auto& row : table) {
    INFO(row.what);
    CHECK(to_string(policy.attention_kernel(row.requested, row.call)) == std::string(to_string(row.expected)));
  }
  // The thresholds are the policy's.
  KernelPolicy early;
  early.sdpa_cpu_min_seq_len = 8;
  CHECK(early.attention_kernel(AttentionKernel::automatic, cpu_call(12)) == sdpa_or_fused);
  CHECK(policy.attention_products_use_blas(512));
  CHECK(!policy.attention_products_use_blas(256));
  KernelPolicy loops;
  loops.attention_blas_min_seq_len = 1000;
  CHECK(!loops.attention_products_use_blas(512));
  CHECK(loops.attention_products_use_blas(1000));
}

TEST_CASE("a model's policy reaches every attention it holds and decides its kernel", "[nn][kernel-policy]") {
  KernelPolicy policy;
  policy.sdpa_cpu_min_seq_len = 4;
  policy.attention_blas_min_seq_len = 7;
  TransformerLM model(TransformerLMOptions(20, 16, 16, 2, 2).kernel_policy(policy));
  for (const auto& block : *model->blocks) {
    const auto& attn = *block->as<TransformerBlockImpl>()->attn;
    CHECK(attn.options.kernel_policy()->sdpa_cpu_min_seq_len == 4);
    CHECK(attn.options.kernel_policy()->attention_blas_min_seq_len == 7);
    // T 8 >= 4: SDPA where LibTorch has it, under this model's policy.
    CHECK(attn.kernel_for(torch::zeros({1, 8, 16}), false, false) ==
          (sdpa_available() ? AttentionKernel::sdpa : AttentionKernel::fused));
  }
  // Changed later, on every layer; another model keeps its own.
  TransformerLM other(TransformerLMOptions(20, 16, 16, 2, 2));
  KernelPolicy never;
  never.sdpa_cpu_min_seq_len = 1 << 20;
  model->set_kernel_policy(never);
  for (const auto& block : *model->blocks)
    CHECK(block->as<TransformerBlockImpl>()->attn->kernel_for(torch::zeros({1, 8, 16}), false, false) ==
          AttentionKernel::fused);
  for (const auto& block : *other->blocks)
    CHECK(block->as<TransformerBlockImpl>()->attn->options.kernel_policy()->sdpa_cpu_min_seq_len ==
          KernelPolicy{}.sdpa_cpu_min_seq_len);
  // Outputs do not depend on the policy (the kernels compute the same function).
  torch::manual_seed(3);
  TinyAttentionLM tiny(TinyAttentionLMOptions(20, 12, 16, 2));
  auto ids = torch::randint(20, {2, 12}, torch::kLong), targets = torch::randint(20, {2, 12}, torch::kLong);
  const double fused = tiny->loss(ids, targets).item<double>();
  KernelPolicy unfused;
  unfused.fuse_whole_model = false;
  tiny->set_kernel_policy(unfused);
  CHECK(tiny->loss(ids, targets).item<double>() == Approx(fused).epsilon(1e-5));
}

namespace {

int64_t on(const KernelCounts& c, GemmBackend b) {
  return b == GemmBackend::libxsmm ? c.gemm_libxsmm : b == GemmBackend::blas ? c.gemm_blas : c.gemm_hand;
}
int64_t products(const KernelCounts& c) { return c.gemm_libxsmm + c.gemm_blas + c.gemm_hand; }

}  // namespace

TEST_CASE("every module of a model holds the model's one policy", "[nn][kernel-policy]") {
  TransformerLM model(TransformerLMOptions(20, 16, 16, 2, 2));
  const KernelPolicy* shared = model->ln_f->options.kernel_policy().get();
  for (const auto& block : *model->blocks) {
    const auto& b = *block->as<TransformerBlockImpl>();
    CHECK(b.options.kernel_policy().get() == shared);
    CHECK(b.attn->options.kernel_policy().get() == shared);
    CHECK(b.mlp->options.kernel_policy().get() == shared);
    CHECK(b.ln1->options.kernel_policy().get() == shared);
    CHECK(b.ln2->options.kernel_policy().get() == shared);
  }
  KernelPolicy changed;
  changed.layer_norm_loops = false;
  model->set_kernel_policy(changed);
  CHECK(model->ln_f->options.kernel_policy().get() == shared);
  CHECK(!shared->layer_norm_loops);
  CHECK(!model->options.kernel_policy().layer_norm_loops);
  TinyAttentionLM tiny(TinyAttentionLMOptions(20, 12, 16, 2));
  const KernelPolicy* own = tiny->attention->options.kernel_policy().get();
  tiny->set_kernel_policy(changed);
  CHECK(tiny->attention->options.kernel_policy().get() == own);
  CHECK(!own->layer_norm_loops);
}

TEST_CASE("a policy's product backend reaches the forward and the backward of every path", "[nn][kernel-policy]") {
  std::vector<GemmBackend> backends = {GemmBackend::hand, GemmBackend::blas};
  if (gemm_backend_available(GemmBackend::libxsmm)) backends.push_back(GemmBackend::libxsmm);
  auto ids = torch::randint(20, {2, 12}, torch::kLong), targets = torch::randint(20, {2, 12}, torch::kLong);
  for (const auto backend : backends) {
    for (const bool large : {false, true}) {  // as `gemm` (every product), or `large_gemm` (every one large)
      INFO(to_string(backend) << (large ? " as large_gemm" : " as gemm"));
      KernelPolicy policy;
      policy.small_gemm_flops = 0;
      (large ? policy.large_gemm : policy.gemm) = backend;

      // The tiny model as one op: three products forward, six backward, all on `backend`.
      torch::manual_seed(1);
      TinyAttentionLM tiny(TinyAttentionLMOptions(20, 12, 16, 2).kernel_policy(policy));
      auto start = kernel_counts();
      auto loss = tiny->loss(ids, targets);
      auto forward = kernel_counts() - start;
      CHECK(on(forward, backend) == 3);
      CHECK(products(forward) == 3);
      start = kernel_counts();
      loss.backward();
      auto backward = kernel_counts() - start;
      CHECK(on(backward, backend) == 6);
      CHECK(products(backward) == 6);

      // The transformer's Linear layers: 4 per block and the head forward, two products
      // each backward; BLAS there is LibTorch's own linear, which tinylm's gemm never sees.
      torch::manual_seed(1);
      TransformerLM model(TransformerLMOptions(20, 12, 16, 2, 2).kernel_policy(policy));
      const int64_t linears = 4 * 2 + 1, expected = backend == GemmBackend::blas ? 0 : linears;
      start = kernel_counts();
      loss = model->loss(ids, targets);
      forward = kernel_counts() - start;
      CHECK(on(forward, backend) == expected);
      CHECK(products(forward) == expected);
      start = kernel_counts();
      loss.backward();
      backward = kernel_counts() - start;
      CHECK(on(backward, backend) == 2 * expected);
      CHECK(products(backward) == 2 * expected);
    }
  }
}

TEST_CASE("a policy's attention products reach the forward and the backward of every path", "[nn][kernel-policy]") {
  auto ids = torch::randint(20, {2, 12}, torch::kLong), targets = torch::randint(20, {2, 12}, torch::kLong);
  for (const bool blas : {false, true}) {
    INFO((blas ? "BLAS" : "loops") << " from T 12");
    KernelPolicy policy;
    policy.attention_blas_min_seq_len = blas ? 12 : 13;
    torch::manual_seed(1);
    TransformerLM model(TransformerLMOptions(20, 12, 16, 2, 2).kernel_policy(policy));
    TinyAttentionLM tiny(TinyAttentionLMOptions(20, 12, 16, 2).kernel_policy(policy));
    for (LanguageModelImpl* m : {static_cast<LanguageModelImpl*>(model.get()), static_cast<LanguageModelImpl*>(tiny.get())}) {
      const int64_t layers = m == model.get() ? 2 : 1;
      auto start = kernel_counts();
      auto loss = m->loss(ids, targets);
      auto forward = kernel_counts() - start;
      start = kernel_counts();
      loss.backward();
      auto backward = kernel_counts() - start;
      // The tiny model as one op computes its attention on the loops, so BLAS products
      // make it run its modules instead.
      const int64_t passes = m == tiny.get() && !blas ? 0 : layers;
      CHECK((blas ? forward.attention_blas : forward.attention_loops) == passes);
      CHECK((blas ? backward.attention_blas : backward.attention_loops) == passes);
      CHECK((blas ? forward.attention_loops : forward.attention_blas) == 0);
      CHECK((blas ? backward.attention_loops : backward.attention_blas) == 0);
    }
  }
}
