// Fused self-attention: forward and backward as plain loops over (batch, head) pairs.
// B = batch, T = sequence length, D = d_model, H = heads, Dh = D / H
//
// Forward, per (b, h) and query i (j runs over the keys it may see):
//   s_ij = scale q_i·k_j;  p_ij = softmax_j(s_ij);  o_i = Σ_j p_ij v_j
// Backward, from do_i and the saved p:
//   dp_ij = do_i·v_j;  dv_j = Σ_i p_ij do_i;  ds_ij = p_ij (dp_ij - Σ_j' p_ij' dp_ij')
//   dq_i = scale Σ_j ds_ij k_j;  dk_j = scale Σ_i ds_ij q_i
// Every (b, h) pair reads and writes its own slices, so pairs run in parallel.
#include <tinylm/nn/fused_attention.h>

#include <ATen/Parallel.h>
#include <torch/torch.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <vector>

namespace tinylm::nn {

namespace {

inline float dot(const float* a, const float* b, int64_t n) {
  float s = 0.f;
#pragma omp simd reduction(+ : s)
  for (int64_t d = 0; d < n; ++d) s += a[d] * b[d];
  return s;
}

inline void axpy(float alpha, const float* x, float* y, int64_t n) {
#pragma omp simd
  for (int64_t d = 0; d < n; ++d) y[d] += alpha * x[d];
}

// Sequences at least this long use BLAS batched matmuls for the two T x T products;
// shorter ones are faster as plain loops (no copies, no per-call BLAS overhead).
constexpr int64_t kBlasMinSeqLen = 32;

/// In place over rows of s (BH, T, T): p = softmax(scale * s) with keys j > i masked.
void masked_softmax_rows(float* s, int64_t rows_total, int64_t T, float scale, bool causal) {
  at::parallel_for(0, rows_total, 64, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int64_t i = r % T, n = causal ? i + 1 : T;
      float* row = s + r * T;
      float m = -INFINITY;
      for (int64_t j = 0; j < n; ++j) m = std::max(m, row[j] *= scale);
      float sum = 0.f;
      for (int64_t j = 0; j < n; ++j) sum += (row[j] = std::exp(row[j] - m));
      const float inv = 1.f / sum;
#pragma omp simd
      for (int64_t j = 0; j < n; ++j) row[j] *= inv;
      std::fill(row + n, row + T, 0.f);
    }
  });
}

/// (B, T, 3D) -> q, k, v each (B*H, T, Dh), contiguous.
std::array<torch::Tensor, 3> split_qkv(const torch::Tensor& qkv, int64_t B, int64_t T, int64_t H, int64_t Dh) {
  auto x = qkv.view({B, T, 3, H, Dh}).permute({2, 0, 3, 1, 4});  // (3, B, H, T, Dh)
  return {x[0].reshape({B * H, T, Dh}), x[1].reshape({B * H, T, Dh}), x[2].reshape({B * H, T, Dh})};
}

struct Dims {
  int64_t B, T, D, H, Dh;
  float scale;
  bool causal;
};

Dims dims_of(const torch::Tensor& qkv, int64_t H, bool causal) {
  TORCH_CHECK(qkv.dim() == 3 && qkv.size(2) % 3 == 0,
              "fused_self_attention: expected qkv (B, T, 3D), got ", qkv.sizes());
  const int64_t D = qkv.size(2) / 3;
  TORCH_CHECK(H >= 1 && D % H == 0, "fused_self_attention: D=", D,
              " is not divisible by n_heads=", H);
  return {qkv.size(0), qkv.size(1), D, H, D / H,
          static_cast<float>(1.0 / std::sqrt(static_cast<double>(D / H))), causal};
}

void forward_kernel(const Dims& s, const float* qkv, float* out, float* p) {
  const int64_t row = 3 * s.D;  // stride between tokens in qkv
  at::parallel_for(0, s.B * s.H, 1, [&](int64_t begin, int64_t end) {
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t b = bh / s.H, h = bh % s.H;
      const float* q = qkv + b * s.T * row + h * s.Dh;
      const float* k = q + s.D;
      const float* v = q + 2 * s.D;
      float* o = out + b * s.T * s.D + h * s.Dh;
      float* pw = p + bh * s.T * s.T;
      for (int64_t i = 0; i < s.T; ++i) {
        const int64_t n = s.causal ? i + 1 : s.T;  // keys this query sees
        float* pi = pw + i * s.T;
        float m = -INFINITY;
        for (int64_t j = 0; j < n; ++j) {
          pi[j] = s.scale * dot(q + i * row, k + j * row, s.Dh);
          m = std::max(m, pi[j]);
        }
        float sum = 0.f;
        for (int64_t j = 0; j < n; ++j) sum += (pi[j] = std::exp(pi[j] - m));
        const float inv = 1.f / sum;
        float* oi = o + i * s.D;
        std::fill(oi, oi + s.Dh, 0.f);
        for (int64_t j = 0; j < n; ++j) {
          pi[j] *= inv;
          axpy(pi[j], v + j * row, oi, s.Dh);
        }
        std::fill(pi + n, pi + s.T, 0.f);
      }
    }
  });
}

void backward_kernel(const Dims& s, const float* qkv, const float* p, const float* dout,
                     float* dqkv) {
  const int64_t row = 3 * s.D;
  at::parallel_for(0, s.B * s.H, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> ds(s.T);
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t b = bh / s.H, h = bh % s.H;
      const int64_t base = b * s.T * row + h * s.Dh;
      const float *q = qkv + base, *k = q + s.D, *v = q + 2 * s.D;
      float *dq = dqkv + base, *dk = dq + s.D, *dv = dq + 2 * s.D;
      const float* dob = dout + b * s.T * s.D + h * s.Dh;
      const float* pw = p + bh * s.T * s.T;
      for (int64_t i = 0; i < s.T; ++i) {
        const int64_t n = s.causal ? i + 1 : s.T;
        const float* pi = pw + i * s.T;
        const float* doi = dob + i * s.D;
        float rowdot = 0.f;
        for (int64_t j = 0; j < n; ++j) {
          ds[j] = dot(doi, v + j * row, s.Dh);  // dp_ij
          rowdot += pi[j] * ds[j];
          axpy(pi[j], doi, dv + j * row, s.Dh);
        }
        float* dqi = dq + i * row;
        for (int64_t j = 0; j < n; ++j) {
          const float g = s.scale * pi[j] * (ds[j] - rowdot);  // scale * ds_ij
          axpy(g, k + j * row, dqi, s.Dh);
          axpy(g, q + i * row, dk + j * row, s.Dh);
        }
      }
    }
  });
}

class FusedSelfAttention : public torch::autograd::Function<FusedSelfAttention> {
 public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                const torch::Tensor& qkv_in, int64_t n_heads,
                                                bool causal) {
    auto qkv = qkv_in.contiguous();
    const Dims s = dims_of(qkv, n_heads, causal);
    torch::Tensor out, p;
    if (s.T >= kBlasMinSeqLen) {
      auto [q, k, v] = split_qkv(qkv, s.B, s.T, s.H, s.Dh);              // (BH, T, Dh)
      auto scores = torch::bmm(q, k.transpose(1, 2));                     // (BH, T, T)
      masked_softmax_rows(scores.data_ptr<float>(), s.B * s.H * s.T, s.T, s.scale, s.causal);
      out = torch::bmm(scores, v)                                         // (BH, T, Dh)
                .view({s.B, s.H, s.T, s.Dh})
                .permute({0, 2, 1, 3})
                .reshape({s.B, s.T, s.D});                                // (B, T, D)
      p = scores.view({s.B, s.H, s.T, s.T});
    } else {
      out = torch::empty({s.B, s.T, s.D}, qkv.options());      // (B, T, D)
      p = torch::empty({s.B, s.H, s.T, s.T}, qkv.options());    // (B, H, T, T)
      forward_kernel(s, qkv.data_ptr<float>(), out.data_ptr<float>(), p.data_ptr<float>());
    }
    ctx->save_for_backward({qkv, p});
    ctx->saved_data["n_heads"] = n_heads;
    ctx->saved_data["causal"] = causal;
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
    const auto& p = saved[1];
    const Dims s = dims_of(qkv, ctx->saved_data["n_heads"].toInt(), ctx->saved_data["causal"].toBool());
    auto dout = grads[0].defined() ? grads[0].contiguous() : torch::zeros({s.B, s.T, s.D}, qkv.options());
    if (s.T >= kBlasMinSeqLen) {
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
      return {dqkv, torch::Tensor(), torch::Tensor()};
    }
    auto dqkv = torch::zeros_like(qkv);  // (B, T, 3D)
    backward_kernel(s, qkv.data_ptr<float>(), p.data_ptr<float>(), dout.data_ptr<float>(),
                    dqkv.data_ptr<float>());
    return {dqkv, torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

bool fused_attention_supported(const torch::Tensor& qkv) {
  return qkv.defined() && qkv.device().is_cpu() && qkv.scalar_type() == torch::kFloat32 &&
         qkv.dim() == 3;
}

torch::Tensor fused_self_attention(const torch::Tensor& qkv, int64_t n_heads, bool causal,
                                   torch::Tensor* weights) {
  TORCH_CHECK(fused_attention_supported(qkv),
              "fused_self_attention: needs a float32 CPU tensor (B, T, 3D), got ",
              qkv.scalar_type(), " on ", qkv.device(), " with shape ", qkv.sizes());
  auto outputs = FusedSelfAttention::apply(qkv, n_heads, causal);
  if (weights) *weights = outputs[1];
  return outputs[0];
}

}  // namespace tinylm::nn
