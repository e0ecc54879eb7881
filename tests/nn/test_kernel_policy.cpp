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
    CHECK(attn.options.policy().sdpa_cpu_min_seq_len == 4);
    CHECK(attn.options.policy().attention_blas_min_seq_len == 7);
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
    CHECK(block->as<TransformerBlockImpl>()->attn->options.policy().sdpa_cpu_min_seq_len ==
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
