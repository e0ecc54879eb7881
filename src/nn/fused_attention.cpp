// Fused self-attention: forward and backward as plain loops over (batch, head) pairs.
// B = batch, T = sequence length, D = d_model, H = heads, Dh = D / H
//
// Forward, per (b, h) and query i (j runs over the keys it may see):
//   s_ij = scale q_i·k_j;  p_ij = softmax_j(s_ij);  o_i = Σ_j p_ij v_j
// Backward, from do_i and the saved p:
//   dp_ij = do_i·v_j;  dv_j = Σ_i p_ij do_i;  ds_ij = p_ij (dp_ij - Σ_j' p_ij' dp_ij')
//   dq_i = scale Σ_j ds_ij k_j;  dk_j = scale Σ_i ds_ij q_i
// Every (b, h) pair reads and writes its own slices, so pairs run in parallel.
#include "nn/fused_attention.h"

#include "attention_kernels.h"
#include "nn/kernel_counts.h"
#include "nn/saved_policy.h"

#include <ATen/Parallel.h>
#include <ATen/record_function.h>
#include <torch/types.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <vector>

namespace tinylm::nn {

namespace {

using namespace kernels;

/// Whether the loops' T x T products take bfloat16 operands: with the policy's bfloat16
/// products (which it sets only where they run, natively or emulated for tests), at the
/// sizes those kernels take.
bool bf16_products(const KernelPolicy& policy, const Dims& s) {
  return policy.bf16_products && policy.bf16_attention && cpu::attention_bf16_fits(s);
}

class FusedSelfAttention : public torch::autograd::Function<FusedSelfAttention> {
 public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                const torch::Tensor& qkv_in, int64_t n_heads,
                                                bool causal, const KernelPolicy& policy, bool keep_weights) {
    RECORD_USER_SCOPE("tinylm::fused_attention");  // named for op profiles (tinylm bench)
    auto qkv = qkv_in.contiguous();
    const Dims s = dims_of(qkv, n_heads, causal);
    torch::Tensor out, p;
    const bool blas = policy.attention_products_use_blas(s.T), bf16 = !blas && bf16_products(policy, s);
    // The (B, H, T, T) weights neither returned nor kept: the backward recomputes them from
    // each row's log-sum-exp (B, H, T), a pair at a time.
    const bool recompute = bf16 && !keep_weights;
    count_attention_products(blas, bf16);
    torch::Tensor lse;
    if (blas) {
      auto [q, k, v] = split_qkv(qkv, s.B, s.T, s.H, s.Dh);              // (BH, T, Dh)
      auto scores = torch::bmm(q, k.transpose(1, 2));                     // (BH, T, T)
      masked_softmax_rows(scores.data_ptr<float>(), s.B * s.H * s.T, s.T, s.scale, s.causal);
      out = torch::bmm(scores, v)                                         // (BH, T, Dh)
                .view({s.B, s.H, s.T, s.Dh})
                .permute({0, 2, 1, 3})
                .reshape({s.B, s.T, s.D});                                // (B, T, D)
      p = scores.view({s.B, s.H, s.T, s.T});
    } else if (recompute) {
      out = torch::empty({s.B, s.T, s.D}, qkv.options());      // (B, T, D)
      lse = torch::empty({s.B, s.H, s.T}, qkv.options());       // (B, H, T)
      p = torch::empty({0}, qkv.options());
      forward_kernel(s, qkv.data_ptr<float>(), out.data_ptr<float>(), nullptr, true, lse.data_ptr<float>());
    } else {
      out = torch::empty({s.B, s.T, s.D}, qkv.options());      // (B, T, D)
      p = torch::empty({s.B, s.H, s.T, s.T}, qkv.options());    // (B, H, T, T)
      forward_kernel(s, qkv.data_ptr<float>(), out.data_ptr<float>(), p.data_ptr<float>(), bf16);
    }
    ctx->save_for_backward({qkv, recompute ? lse : p});
    ctx->saved_data["recompute"] = recompute;
    ctx->saved_data["n_heads"] = n_heads;
    ctx->saved_data["causal"] = causal;
    save_policy(ctx, policy);
    ctx->mark_non_differentiable({p});
    // The weights output has no gradient: do not let autograd build a zero (B, H, T, T)
    // tensor for it on every backward pass.
    ctx->set_materialize_grads(false);
    return {out, p};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const auto& qkv = saved[0];
    const auto& p = saved[1];  // the weights, or with "recompute" each row's log-sum-exp
    const Dims s = dims_of(qkv, ctx->saved_data["n_heads"].toInt(), ctx->saved_data["causal"].toBool());
    auto dout = grads[0].defined() ? grads[0].contiguous() : torch::zeros({s.B, s.T, s.D}, qkv.options());
    const KernelPolicy policy = saved_policy(ctx);
    const bool blas = policy.attention_products_use_blas(s.T), bf16 = !blas && bf16_products(policy, s);
    count_attention_products(blas, bf16);
    if (blas) {
      auto [q, k, v] = split_qkv(qkv, s.B, s.T, s.H, s.Dh);                          // (BH, T, Dh)
      auto pm = p.view({s.B * s.H, s.T, s.T});                                       // (BH, T, T)
      auto dO = dout.view({s.B, s.T, s.H, s.Dh}).permute({0, 2, 1, 3}).reshape({s.B * s.H, s.T, s.Dh});
      auto dV = torch::bmm(pm.transpose(1, 2), dO);                                  // (BH, T, Dh)
      auto dS = torch::bmm(dO, v.transpose(1, 2));                                   // dP (BH, T, T)
      dS.sub_((dS * pm).sum(-1, /*keepdim=*/true)).mul_(pm).mul_(s.scale);           // scale * dS
      auto dQ = torch::bmm(dS, k), dK = torch::bmm(dS.transpose(1, 2), q);           // (BH, T, Dh)
      auto dqkv = torch::stack({dQ, dK, dV})                                         // (3, BH, T, Dh)
                      .view({3, s.B, s.H, s.T, s.Dh})
                      .permute({1, 3, 0, 2, 4})                                      // (B, T, 3, H, Dh)
                      .reshape({s.B, s.T, 3 * s.D});
      return {dqkv, torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
    }
    auto dqkv = torch::empty_like(qkv);  // (B, T, 3D), every element written
    if (ctx->saved_data["recompute"].toBool())
      backward_kernel(s, qkv.data_ptr<float>(), nullptr, dout.data_ptr<float>(), dqkv.data_ptr<float>(), true,
                      p.data_ptr<float>());
    else
      backward_kernel(s, qkv.data_ptr<float>(), p.data_ptr<float>(), dout.data_ptr<float>(), dqkv.data_ptr<float>(),
                      bf16);
    return {dqkv, torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

bool fused_attention_supported(const torch::Tensor& qkv) {
  return qkv.defined() && qkv.device().is_cpu() && qkv.scalar_type() == torch::kFloat32 &&
         qkv.dim() == 3;
}

torch::Tensor fused_self_attention(const torch::Tensor& qkv, int64_t n_heads, bool causal,
                                   torch::Tensor* weights, const KernelPolicy& policy) {
  TORCH_CHECK(fused_attention_supported(qkv),
              "fused_self_attention: needs a float32 CPU tensor (B, T, 3D), got ",
              qkv.scalar_type(), " on ", qkv.device(), " with shape ", qkv.sizes());
  auto outputs = FusedSelfAttention::apply(qkv, n_heads, causal, policy, weights != nullptr);
  if (weights) *weights = outputs[1];
  return outputs[0];
}

torch::Tensor decode_rows_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                    torch::Tensor& keys, torch::Tensor& values, const std::vector<int64_t>& lengths) {
  const auto B = static_cast<int64_t>(lengths.size());
  TORCH_CHECK(q.dim() == 4 && q.size(0) == B && q.size(2) == 1 && keys.dim() == 4 && keys.size(0) == B &&
                  keys.size(3) == q.size(3) && values.sizes() == keys.sizes() && q.size(1) % keys.size(1) == 0 &&
                  k.dim() == 4 && k.size(0) == B && k.size(1) == keys.size(1) && k.size(2) == 1 &&
                  k.size(3) == q.size(3) && v.sizes() == k.sizes(),
              "decode_rows_attention: q ", q.sizes(), ", k ", k.sizes(), ", v ", v.sizes(), ", keys ", keys.sizes(),
              ", values ", values.sizes(), " for ", B, " rows");
  for (const torch::Tensor* t : std::array<const torch::Tensor*, 5>{&q, &k, &v, &keys, &values})
    TORCH_CHECK(t->scalar_type() == torch::kFloat && t->device().is_cpu(),
                "decode_rows_attention: float32 CPU tensors, got ", t->scalar_type(), " on ", t->device());
  TORCH_CHECK(keys.is_contiguous() && values.is_contiguous(), "decode_rows_attention: the cache must be contiguous");
  const int64_t H = q.size(1), Hkv = keys.size(1), capacity = keys.size(2), Dh = q.size(3);
  for (const int64_t n : lengths)
    TORCH_CHECK(n >= 0 && n < capacity, "decode_rows_attention: a row of ", n, " cached tokens in a cache of ",
                capacity);
  RECORD_USER_SCOPE("tinylm::decode_attention");
  count_attention_products(false);
  const auto qc = q.contiguous(), kc = k.contiguous(), vc = v.contiguous();
  auto out = torch::empty_like(qc);
  const auto& table = cpu::table();
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(Dh)));
  float* K = keys.data_ptr<float>();
  float* V = values.data_ptr<float>();
  at::parallel_for(0, B, 8, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b)
      for (int64_t h = 0; h < Hkv; ++h) {
        const int64_t at = ((b * Hkv + h) * capacity + lengths[b]) * Dh, from = (b * Hkv + h) * Dh;
        std::copy_n(kc.data_ptr<float>() + from, Dh, K + at);
        std::copy_n(vc.data_ptr<float>() + from, Dh, V + at);
      }
    std::vector<float> scores(static_cast<size_t>(capacity));
    table.decode_attention(qc.data_ptr<float>(), K, V, out.data_ptr<float>(), lengths.data(), begin, end, H, Hkv,
                           capacity, Dh, scale, scores.data());
  });
  return out;
}

}  // namespace tinylm::nn
