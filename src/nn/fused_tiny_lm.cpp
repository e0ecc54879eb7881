// The fused TinyAttentionLM loss: forward and backward written out.
// B = batch, T = sequence length, D = d_model, H = heads, V = vocab size, N = B * T
//
// Forward:  x = E[ids] + pe            (N, D)
//           qkv = x Wqkvᵀ + bqkv       (N, 3D)
//           c = attention(qkv)         (N, D)   causal, heads merged
//           o = c Woᵀ + bo             (N, D)
//           z = o Whᵀ + bh             (N, V)
//           loss = mean over counted n (logsumexp(z_n) - z_n[target_n])
//           (n is counted when target_n != kIgnoreTarget; M = their number)
// Backward: dz = (softmax(z) - onehot) / M (0 on ignored rows), then each product's two
//           gradients in turn; dE accumulates dx rows at their ids.
//
// Pointer layouts (row-major, contiguous): ids, targets (N) int64 with n = b * T + t;
// E (V, D), pe (T, D), x, c, o (N, D), qkv (N, 3D) as [q | k | v], P (B, H, T, T) and
// z (N, V), all float32; Wqkv (3D, D), Wo (D, D), Wh (V, D) as Linear stores them.
#include "nn/fused_tiny_lm.h"

#include "attention_kernels.h"

#include <torch/torch.h>

namespace tinylm::nn {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

class FusedTinyLMLoss : public torch::autograd::Function<FusedTinyLMLoss> {
 public:
  static variable_list forward(AutogradContext* ctx, const torch::Tensor& ids_in,
                               const torch::Tensor& targets_in, const torch::Tensor& E,
                               const torch::Tensor& pe, const torch::Tensor& Wqkv,
                               const torch::Tensor& bqkv, const torch::Tensor& Wo,
                               const torch::Tensor& bo, const torch::Tensor& Wh,
                               const torch::Tensor& bh, int64_t n_heads) {
    auto ids = ids_in.contiguous(), targets = targets_in.contiguous();
    const int64_t B = ids.size(0), T = ids.size(1), D = E.size(1), V = Wh.size(0), N = B * T;
    const int64_t* id = ids.data_ptr<int64_t>();
    const int64_t* tg = targets.data_ptr<int64_t>();

    auto x = torch::empty({N, D}, E.options());  // x = E[ids] + pe
    {
      const float* e = E.data_ptr<float>();
      const float* p = pe.contiguous().data_ptr<float>();
      float* xp = x.data_ptr<float>();
      for (int64_t n = 0; n < N; ++n) {
        const float* er = e + id[n] * D;
        const float* pr = p + (n % T) * D;
        float* xr = xp + n * D;
        for (int64_t d = 0; d < D; ++d) xr[d] = er[d] + pr[d];
      }
    }
    auto qkv = torch::addmm(bqkv, x, Wqkv.t());  // (N, 3D)
    const kernels::Dims s = kernels::dims_of(qkv.view({B, T, 3 * D}), n_heads, /*causal=*/true);
    auto c = torch::empty({N, D}, E.options());
    auto P = torch::empty({B, n_heads, T, T}, E.options());
    kernels::forward_kernel(s, qkv.data_ptr<float>(), c.data_ptr<float>(), P.data_ptr<float>());
    auto o = torch::addmm(bo, c, Wo.t());  // (N, D)
    auto z = torch::addmm(bh, o, Wh.t());  // (N, V), becomes dz below

    // Softmax cross-entropy over the counted rows (target != kIgnoreTarget); z is
    // overwritten with dz = (softmax - onehot) / count, and with 0 on ignored rows.
    int64_t count = 0;
    for (int64_t n = 0; n < N; ++n) {
      TORCH_CHECK(tg[n] == kIgnoreTarget || (tg[n] >= 0 && tg[n] < V), "fused_tiny_lm_loss: target ",
                  tg[n], " out of range [0, ", V, ")");
      count += tg[n] != kIgnoreTarget;
    }
    double loss = 0;
    {
      float* zp = z.data_ptr<float>();
      const float inv_n = 1.f / static_cast<float>(count);
      for (int64_t n = 0; n < N; ++n) {
        float* zr = zp + n * V;
        if (tg[n] == kIgnoreTarget) {
          std::fill(zr, zr + V, 0.f);
          continue;
        }
        float m = zr[0];
        for (int64_t v = 1; v < V; ++v) m = std::max(m, zr[v]);
        const float target_logit = zr[tg[n]];
        float sum = 0.f;
        for (int64_t v = 0; v < V; ++v) sum += (zr[v] = std::exp(zr[v] - m));
        // -log softmax(z)[target] = logsumexp(z) - z[target]: exact however confident the
        // model is (a probability would underflow to 0 past ~87 nats).
        loss += static_cast<double>(m) + std::log(static_cast<double>(sum)) - target_logit;
        const float scale = inv_n / sum;
        for (int64_t v = 0; v < V; ++v) zr[v] *= scale;
        zr[tg[n]] -= inv_n;
      }
    }
    ctx->save_for_backward({ids, x, qkv, P, c, o, z, Wqkv, Wo, Wh});
    ctx->saved_data["n_heads"] = n_heads;
    ctx->saved_data["emb_rows"] = E.size(0);
    // No counted row: NaN, as cross_entropy gives.
    return {torch::full({}, loss / static_cast<double>(count), E.options())};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const auto &ids = saved[0], &x = saved[1], &qkv = saved[2], &P = saved[3], &c = saved[4],
               &o = saved[5], &Wqkv = saved[7], &Wo = saved[8], &Wh = saved[9];
    auto dz = saved[6] * grads[0];  // (N, V), scaled by the incoming gradient
    const int64_t N = x.size(0), D = x.size(1), B = P.size(0), T = P.size(2);
    const int64_t H = ctx->saved_data["n_heads"].toInt();

    auto dWh = torch::mm(dz.t(), o), dbh = dz.sum(0);
    auto dout = torch::mm(dz, Wh);                    // (N, D)
    auto dWo = torch::mm(dout.t(), c), dbo = dout.sum(0);
    auto dc = torch::mm(dout, Wo);                    // (N, D)
    auto dqkv = torch::zeros_like(qkv);               // (N, 3D)
    const kernels::Dims s = kernels::dims_of(qkv.view({B, T, 3 * D}), H, /*causal=*/true);
    kernels::backward_kernel(s, qkv.data_ptr<float>(), P.data_ptr<float>(), dc.data_ptr<float>(),
                             dqkv.data_ptr<float>());
    auto dWqkv = torch::mm(dqkv.t(), x), dbqkv = dqkv.sum(0);
    auto dx = torch::mm(dqkv, Wqkv);                  // (N, D)
    auto dE = torch::zeros({ctx->saved_data["emb_rows"].toInt(), D}, x.options());
    {
      const int64_t* id = ids.data_ptr<int64_t>();
      const float* dxp = dx.data_ptr<float>();
      float* de = dE.data_ptr<float>();
      for (int64_t n = 0; n < N; ++n) {
        float* row = de + id[n] * D;
        const float* src = dxp + n * D;
        for (int64_t d = 0; d < D; ++d) row[d] += src[d];
      }
    }
    return {torch::Tensor(), torch::Tensor(), dE, torch::Tensor(), dWqkv, dbqkv,
            dWo,             dbo,             dWh, dbh, torch::Tensor()};
  }
};

}  // namespace

bool fused_tiny_lm_supported(const TinyAttentionLMImpl& m) {
  const auto& w = m.token_embedding->weight;
  return w.device().is_cpu() && w.scalar_type() == torch::kFloat32 &&
         m.attention->options.causal() && m.attention->qkv_proj->bias.defined();
}

torch::Tensor fused_tiny_lm_loss(TinyAttentionLMImpl& m, const torch::Tensor& ids,
                                 const torch::Tensor& targets) {
  TORCH_CHECK(fused_tiny_lm_supported(m),
              "fused_tiny_lm_loss: needs float32 CPU parameters and causal attention");
  check_token_ids("TinyAttentionLM", ids, m.options.vocab_size(), m.options.context_length());
  TORCH_CHECK(targets.sizes() == ids.sizes() && targets.scalar_type() == torch::kLong,
              "fused_tiny_lm_loss: targets must be int64 of the ids' shape ", ids.sizes(),
              ", got ", targets.sizes());
  const int64_t T = ids.size(1);
  auto& a = *m.attention;
  return FusedTinyLMLoss::apply(ids, targets, m.token_embedding->weight, m.sinusoidal_positions->forward(T),
                                a.qkv_proj->weight, a.qkv_proj->bias, a.out_proj->weight,
                                a.out_proj->bias, m.lm_head->weight, m.lm_head->bias,
                                a.options.n_heads())[0];
}

}  // namespace tinylm::nn
