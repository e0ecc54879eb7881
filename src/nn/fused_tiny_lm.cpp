// The fused TinyAttentionLM loss: forward and backward written out.
// B = batch, T = sequence length, D = d_model, H = heads, V = vocab size, N = B * T
//
// Forward:  x = E[ids] + pe            (N, D)
//           qkv = x Wqkvᵀ + bqkv       (N, 3D)
//           c = attention(qkv)         (N, D)   causal, heads merged
//           o = c Woᵀ + bo             (N, D)
//           z = o Whᵀ + bh             (N, V)
//           loss = mean over counted n (logsumexp(z_n) - z_n[target_n])
//           (n is counted when target_n != the ignored target; M = their number)
// Backward: dz = (softmax(z) - onehot) / M (0 on ignored rows), then each product's two
//           gradients in turn; dE accumulates dx rows at their ids.
//
// Pointer layouts (row-major, contiguous): ids, targets (N) int64 with n = b * T + t;
// E (V, D), pe (T, D), x, c, o (N, D), qkv (N, 3D) as [q | k | v], P (B, H, T, T) and
// z (N, V), all float32; Wqkv (3D, D), Wo (D, D), Wh (V, D) as Linear stores them.
// The forward pass keeps x, qkv, c, o, z (then dz) and P in one buffer for the backward.
// The products go through nn::gemm (libxsmm for these sizes where built in), the
// attention and the softmax through the loops of src/nn/cpu/kernels.inc.
#include "nn/fused_tiny_lm.h"

#include <tinylm/nn/cpu_kernels.h>
#include <tinylm/nn/kernel_policy.h>

#include "attention_kernels.h"
#include "nn/float_data.h"
#include "nn/gradient_slots.h"
#include "nn/saved_policy.h"
#include "nn/token_ids.h"

#include <torch/types.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace tinylm::nn {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

/// Offsets of the forward pass's arrays in its one buffer.
struct Layout {
  int64_t B, T, D, H, V, N;
  int64_t x() const { return 0; }
  int64_t qkv() const { return N * D; }
  int64_t c() const { return qkv() + N * 3 * D; }
  int64_t o() const { return c() + N * D; }
  int64_t z() const { return o() + N * D; }
  int64_t P() const { return z() + N * V; }
  int64_t size() const { return P() + B * H * T * T; }
};

/// x (N, D) <- E[ids] + pe: each id checked against E's rows (V, D) first, position
/// n % T's row of pe (T, D) added.
void embed(const int64_t* id, int64_t N, int64_t T, int64_t D, const torch::Tensor& E, const float* pe, float* x) {
  int64_t lo = std::numeric_limits<int64_t>::max(), hi = std::numeric_limits<int64_t>::min();
  for (int64_t n = 0; n < N; ++n) {
    lo = std::min(lo, id[n]);
    hi = std::max(hi, id[n]);
  }
  check_token_range("TinyAttentionLM", lo, hi, E.size(0));
  const float* e = floats(E);
  for (int64_t n = 0; n < N; ++n) {
    const float* er = e + id[n] * D;
    const float* pr = pe + (n % T) * D;
    float* xr = x + n * D;
#pragma omp simd
    for (int64_t d = 0; d < D; ++d) xr[d] = er[d] + pr[d];
  }
}

/// rows (N x n) <- bias in every row.
void fill_rows(float* rows, const float* bias, int64_t N, int64_t n) {
  for (int64_t r = 0; r < N; ++r) std::copy(bias, bias + n, rows + r * n);
}

/// out (n) <- column sums of rows (N x n).
void column_sums(const float* rows, int64_t N, int64_t n, float* out) {
  std::fill(out, out + n, 0.f);
  for (int64_t r = 0; r < N; ++r) {
    const float* row = rows + r * n;
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) out[j] += row[j];
  }
}

/// C = op(A) op(B) (or +=), by the backend the model's policy picks for the shape.
void product(const KernelPolicy& policy, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
             const float* A, int64_t lda, const float* B, int64_t ldb, float* C, int64_t ldc,
             bool accumulate = false) {
  gemm(trans_a, trans_b, M, N, K, A, lda, B, ldb, C, ldc, accumulate, policy);
}

class FusedTinyLMLoss : public torch::autograd::Function<FusedTinyLMLoss> {
 public:
  static variable_list forward(AutogradContext* ctx, const torch::Tensor& ids_in,
                               const torch::Tensor& targets_in, const torch::Tensor& E_in,
                               const torch::Tensor& pe_in, const torch::Tensor& Wqkv_in,
                               const torch::Tensor& bqkv, const torch::Tensor& Wo_in,
                               const torch::Tensor& bo, const torch::Tensor& Wh_in,
                               const torch::Tensor& bh, int64_t n_heads, int64_t ignore, const KernelPolicy& policy) {
    auto ids = ids_in.contiguous(), targets = targets_in.contiguous();
    auto E = E_in.contiguous(), pe = pe_in.contiguous();
    auto Wqkv = Wqkv_in.contiguous(), Wo = Wo_in.contiguous(), Wh = Wh_in.contiguous();
    const int64_t B = ids.size(0), T = ids.size(1), D = E.size(1), V = Wh.size(0);
    const Layout L{B, T, D, n_heads, V, B * T};
    const int64_t N = L.N;
    const int64_t* id = ids.data_ptr<int64_t>();
    const int64_t* tg = targets.data_ptr<int64_t>();

    // The targets' range (the ids' is embed()'s), checked before anything is computed.
    int64_t count = 0;
    for (int64_t n = 0; n < N; ++n) {
      TORCH_CHECK(tg[n] == ignore || (tg[n] >= 0 && tg[n] < V), "fused_tiny_lm_loss: target ",
                  tg[n], " out of range [0, ", V, ")");
      count += tg[n] != ignore;
    }

    auto ws = torch::empty({L.size()}, E.options());
    float* w = ws.data_ptr<float>();
    float *x = w + L.x(), *qkv = w + L.qkv(), *c = w + L.c(), *o = w + L.o(), *z = w + L.z(),
          *P = w + L.P();
    embed(id, N, T, D, E, floats(pe), x);  // x = E[ids] + pe
    fill_rows(qkv, floats(bqkv), N, 3 * D);
    product(policy, false, true, N, 3 * D, D, x, D, floats(Wqkv), D, qkv, 3 * D, /*accumulate=*/true);
    const kernels::Dims s = kernels::make_dims(B, T, D, n_heads, /*causal=*/true);
    kernels::forward_kernel(s, qkv, c, P);
    fill_rows(o, floats(bo), N, D);
    product(policy, false, true, N, D, D, c, D, floats(Wo), D, o, D, true);
    fill_rows(z, floats(bh), N, V);
    product(policy, false, true, N, V, D, o, D, floats(Wh), D, z, V, true);

    // Softmax cross-entropy over the counted rows; z becomes dz = (softmax - onehot) / count
    // (0 on ignored rows). No counted row: the loss is NaN, as cross_entropy gives.
    const double loss = cpu::table().softmax_cross_entropy(z, tg, N, V, ignore,
                                                           1.f / static_cast<float>(count));
    ctx->save_for_backward({ids, ws, Wqkv, Wo, Wh});
    // The parameters themselves: where their gradients may go (gradient_destination).
    ctx->saved_data["params"] = std::vector<torch::Tensor>{E_in, Wqkv_in, bqkv, Wo_in, bo, Wh_in, bh};
    ctx->saved_data["n_heads"] = n_heads;
    save_policy(ctx, policy);
    return {torch::full({}, loss / static_cast<double>(count), E.options())};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const auto &ids = saved[0], &ws = saved[1], &Wqkv = saved[2], &Wo = saved[3], &Wh = saved[4];
    const int64_t B = ids.size(0), T = ids.size(1), D = Wo.size(0), V = Wh.size(0);
    const int64_t H = ctx->saved_data["n_heads"].toInt();
    const KernelPolicy policy = saved_policy(ctx);
    const Layout L{B, T, D, H, V, B * T};
    const int64_t N = L.N;
    const float* w = floats(ws);
    const float *x = w + L.x(), *qkv = w + L.qkv(), *c = w + L.c(), *o = w + L.o(), *P = w + L.P();

    // The intermediate gradients live in a per-thread buffer: dz (when scaled), dout, dc,
    // dqkv, dx.
    thread_local std::vector<float> scratch;
    scratch.resize(static_cast<size_t>(N * (V + 6 * D)));
    float *dout = scratch.data(), *dc = dout + N * D, *dqkv = dc + N * D, *dx = dqkv + N * 3 * D,
          *dz_scaled = dx + N * D;
    const float* dz = w + L.z();
    const auto& up = grads[0];
    const float g = !up.defined() ? 0.f
                    : up.is_cpu() && up.scalar_type() == torch::kFloat32 ? *up.data_ptr<float>()
                                                                        : up.item<float>();
    if (g != 1.f) {  // the saved dz is for an upstream gradient of 1
      for (int64_t i = 0; i < N * V; ++i) dz_scaled[i] = dz[i] * g;
      dz = dz_scaled;
    }
    // Each gradient where the optimizer keeps it, if it offered a place (gradient_slots.h).
    const auto params = ctx->saved_data["params"].toTensorVector();  // E, Wqkv, bqkv, Wo, bo, Wh, bh
    auto dE = gradient_destination(params[0]).zero_();
    auto dWqkv = gradient_destination(params[1]), dbqkv = gradient_destination(params[2]);
    auto dWo = gradient_destination(params[3]), dbo = gradient_destination(params[4]);
    auto dWh = gradient_destination(params[5]), dbh = gradient_destination(params[6]);

    product(policy, true, false, V, D, N, dz, V, o, D, dWh.data_ptr<float>(), D);  // dzᵀ o
    column_sums(dz, N, V, dbh.data_ptr<float>());
    product(policy, false, false, N, D, V, dz, V, floats(Wh), D, dout, D);         // dz Wh
    product(policy, true, false, D, D, N, dout, D, c, D, dWo.data_ptr<float>(), D);
    column_sums(dout, N, D, dbo.data_ptr<float>());
    product(policy, false, false, N, D, D, dout, D, floats(Wo), D, dc, D);
    const kernels::Dims s = kernels::make_dims(B, T, D, H, /*causal=*/true);
    kernels::backward_kernel(s, qkv, P, dc, dqkv);
    product(policy, true, false, 3 * D, D, N, dqkv, 3 * D, x, D, dWqkv.data_ptr<float>(), D);
    column_sums(dqkv, N, 3 * D, dbqkv.data_ptr<float>());
    product(policy, false, false, N, D, 3 * D, dqkv, 3 * D, floats(Wqkv), D, dx, D);
    {
      const int64_t* id = ids.data_ptr<int64_t>();
      float* de = dE.data_ptr<float>();
      for (int64_t n = 0; n < N; ++n) {
        float* row = de + id[n] * D;
        const float* src = dx + n * D;
#pragma omp simd
        for (int64_t d = 0; d < D; ++d) row[d] += src[d];
      }
    }
    return {torch::Tensor(), torch::Tensor(), dE, torch::Tensor(), dWqkv, dbqkv,
            dWo,             dbo,             dWh, dbh, torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

bool fused_tiny_lm_supported(const TinyLMTensors& m) {
  for (const auto* t : {&m.embedding, &m.positions, &m.qkv_weight, &m.qkv_bias, &m.out_weight, &m.out_bias,
                        &m.head_weight, &m.head_bias})
    if (!t->defined() || !t->device().is_cpu() || t->scalar_type() != torch::kFloat32) return false;
  return true;
}

torch::Tensor fused_tiny_lm_next_logits(const TinyLMTensors& m, const torch::Tensor& ids_in,
                                        const KernelPolicy& policy) {
  TORCH_CHECK(fused_tiny_lm_supported(m), "fused_tiny_lm_next_logits: needs float32 CPU parameters, every bias there");
  check_token_shape("TinyAttentionLM", ids_in, m.context_length);
  const auto ids = ids_in.contiguous();
  const auto E = m.embedding.contiguous(), pe = m.positions.contiguous();
  const auto Wqkv = m.qkv_weight.contiguous(), Wo = m.out_weight.contiguous(), Wh = m.head_weight.contiguous();
  const int64_t B = ids.size(0), T = ids.size(1), D = E.size(1), V = Wh.size(0), N = B * T, H = m.n_heads;
  TORCH_CHECK(pe.dim() == 2 && pe.size(0) == T && pe.size(1) == D, "fused_tiny_lm_next_logits: positions must be (",
              T, ", ", D, "), got ", pe.sizes());
  const int64_t* id = ids.data_ptr<int64_t>();

  // x (N, D), every position's keys and values kv (N, 2D) as [k | v], the last
  // positions' queries q (B, D), attention outputs c (B, D), projections o (B, D) and one
  // row of scores (T).
  thread_local std::vector<float> scratch;
  scratch.resize(static_cast<size_t>(N * 3 * D + 3 * B * D + T));
  float *x = scratch.data(), *kv = x + N * D, *q = kv + N * 2 * D, *c = q + B * D, *o = c + B * D, *score = o + B * D;
  embed(id, N, T, D, E, floats(pe), x);
  // Wqkv's rows are [q | k | v]: the keys' and values' for every position, the queries'
  // for the last (its row of x at b * T + T - 1, a stride of T rows).
  const float *W = floats(Wqkv), *bias = floats(m.qkv_bias);
  fill_rows(kv, bias + D, N, 2 * D);
  product(policy, false, true, N, 2 * D, D, x, D, W + D * D, D, kv, 2 * D, /*accumulate=*/true);
  fill_rows(q, bias, B, D);
  product(policy, false, true, B, D, D, x + (T - 1) * D, T * D, W, D, q, D, true);
  // The last query of each head over all T keys (the causal mask hides none of them).
  const int64_t Dh = D / H;
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(Dh)));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const float* qh = q + b * D + h * Dh;
      float top = -std::numeric_limits<float>::infinity();
      for (int64_t j = 0; j < T; ++j) {
        const float* k = kv + (b * T + j) * 2 * D + h * Dh;
        float s = 0.f;
        for (int64_t d = 0; d < Dh; ++d) s += qh[d] * k[d];
        score[j] = s * scale;
        top = std::max(top, score[j]);
      }
      float sum = 0.f;
      for (int64_t j = 0; j < T; ++j) sum += score[j] = std::exp(score[j] - top);
      float* out = c + b * D + h * Dh;
      std::fill(out, out + Dh, 0.f);
      for (int64_t j = 0; j < T; ++j) {
        const float* v = kv + (b * T + j) * 2 * D + D + h * Dh;
        const float w = score[j] / sum;
        for (int64_t d = 0; d < Dh; ++d) out[d] += w * v[d];
      }
    }
  fill_rows(o, floats(m.out_bias), B, D);
  product(policy, false, true, B, D, D, c, D, floats(Wo), D, o, D, true);
  auto logits = torch::empty({B, V}, E.options());
  float* z = logits.data_ptr<float>();
  fill_rows(z, floats(m.head_bias), B, V);
  product(policy, false, true, B, V, D, o, D, floats(Wh), D, z, V, true);
  return logits;
}

torch::Tensor fused_tiny_lm_loss(const TinyLMTensors& m, const torch::Tensor& ids, const torch::Tensor& targets,
                                 const KernelPolicy& policy) {
  TORCH_CHECK(fused_tiny_lm_supported(m), "fused_tiny_lm_loss: needs float32 CPU parameters, every bias there");
  check_token_shape("TinyAttentionLM", ids, m.context_length);  // the range: in forward
  TORCH_CHECK(targets.sizes() == ids.sizes() && targets.scalar_type() == torch::kLong,
              "fused_tiny_lm_loss: targets must be int64 of the ids' shape ", ids.sizes(),
              ", got ", targets.sizes());
  TORCH_CHECK(m.positions.dim() == 2 && m.positions.size(0) == ids.size(1),
              "fused_tiny_lm_loss: positions must be (T, D) for T ", ids.size(1), ", got ", m.positions.sizes());
  return FusedTinyLMLoss::apply(ids, targets, m.embedding, m.positions, m.qkv_weight, m.qkv_bias, m.out_weight,
                                m.out_bias, m.head_weight, m.head_bias, m.n_heads, m.ignore_target, policy)[0];
}

}  // namespace tinylm::nn
