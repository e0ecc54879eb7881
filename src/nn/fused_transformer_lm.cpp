// The fused pre-LN TransformerLM loss (see fused_transformer_lm.h): forward and backward
// written out over the model's kernels.
// Over 400 lines on purpose: one derivation, its forward and its backward read side by side,
// with the passes they share (a norm or attention rounding its output as it makes it).
// B = batch, T = sequence length, D = d_model, H = heads, F = MLP width, V = vocab size,
// N = B * T rows; "16" marks a bfloat16 copy (what the products read).
//
// Forward:  h_0 = E[ids] + pos
//           block l:  y1 = ln1(h_l)16;  qkv = y1 Wqkvᵀ + b;  o = attention(qkv)16
//                     h2_l = h_l + (o Woᵀ + b);  y2 = ln2(h2_l)16
//                     f = y2 Wfcᵀ + b;  g = gelu(f)16;  m_l = g Wpᵀ + b
//                     h_{l+1} = h2_l + m_l    (made by the next norm as it reads both)
//           yf = ln_f(h_L)16;  z = yf Whᵀ;  loss = mean cross-entropy(z, targets)
// Backward: dz = (softmax(z) - onehot) / count, then each product's two gradients and each
//           norm's, in reverse; a residual's gradient goes into the norm backward that
//           reads it (its `dresidual`), so no pass adds gradients.
#include "nn/fused_transformer_lm.h"

#include <tinylm/nn/cpu_kernels.h>

#include "attention_kernels.h"
#include "nn/bf16_operands.h"
#include "nn/cpu/kernels.h"
#include "nn/float_data.h"
#include "nn/gradient_slots.h"
#include "nn/kernel_counts.h"
#include "nn/layer_norm.h"
#include "nn/token_ids.h"

#include <ATen/Parallel.h>
#include <ATen/record_function.h>
#include <torch/types.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

namespace tinylm::nn {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The parameters as one list (apply's inputs): the embedding, the positions, each block's
// kPerBlock in FusedBlockTensors' order, ln_f's gain and bias, the head (empty: tied).
enum : int64_t { kLn1Gain, kLn1Bias, kQkvW, kQkvB, kOutW, kOutB, kLn2Gain, kLn2Bias, kFcW, kFcB, kProjW, kProjB, kPerBlock };
constexpr int64_t kFirstBlock = 2;

std::vector<torch::Tensor> flatten(const FusedTransformerLMTensors& m) {
  std::vector<torch::Tensor> p{m.embedding, m.positions};
  for (const auto& b : m.blocks)
    for (const auto* t : {&b.ln1_gain, &b.ln1_bias, &b.qkv_weight, &b.qkv_bias, &b.out_weight, &b.out_bias,
                          &b.ln2_gain, &b.ln2_bias, &b.fc_weight, &b.fc_bias, &b.proj_weight, &b.proj_bias})
      p.push_back(*t);
  p.push_back(m.final_gain);
  p.push_back(m.final_bias);
  p.push_back(m.head_weight);
  return p;
}

bool none(const torch::Tensor& t) { return !t.defined() || t.numel() == 0; }

/// What the op needs besides tensors.
struct Settings {
  int64_t n_heads, layers, ignore;
  float eps;
  bool center, gelu_exact;
};

/// Rows of LayerNorm per task, and per chunk of a thread's float32 buffer.
int64_t norm_rows(int64_t D) { return std::max<int64_t>(1, 4096 / D); }

/// y16 = norm(x + r) rounded, h = x + r written where r is given (else h is x), each
/// row's mean and rstd kept; norm's float32 output only a chunk at a time.
void norm_rounded(const float* x, const float* r, float* h, const float* gain, const float* bias, uint16_t* y16,
                  float* mean, float* rstd, int64_t rows, int64_t D, float eps, bool center) {
  const auto& k = cpu::table();
  const auto& k16 = cpu::bf16_table();
  const int64_t chunk = norm_rows(D);
  at::parallel_for(0, rows, chunk, [&](int64_t begin, int64_t end) {
    std::vector<float> y(static_cast<size_t>(chunk * D));
    for (int64_t r0 = begin; r0 < end; r0 += chunk) {
      const int64_t n = std::min(chunk, end - r0);
      k.layer_norm_forward(x + r0 * D, r ? r + r0 * D : nullptr, r ? h + r0 * D : nullptr, gain, bias, y.data(),
                           mean + r0, rstd + r0, n, D, eps, center);
      k16.round_bf16(y.data(), y16 + r0 * D, n * D);
    }
  });
}

/// rows x cols floats rounded into x16, and where `sums` is given their column sums (in
/// row order) added into it.
void round_rows(const float* x, uint16_t* x16, int64_t rows, int64_t cols, float* sums) {
  const auto& k16 = cpu::bf16_table();
  if (sums)
    k16.round_bf16_colsum(x, x16, rows, cols, sums);
  else
    k16.round_bf16(x, x16, rows * cols);
}

/// Per-block partial sums (blocks x width), added in block order into a new (width) tensor.
torch::Tensor ordered_sum(const std::vector<float>& partial, int64_t blocks, int64_t width) {
  auto total = torch::zeros({width}, torch::kFloat32);
  float* t = floats(total);
  for (int64_t b = 0; b < blocks; ++b)
    for (int64_t i = 0; i < width; ++i) t[i] += partial[b * width + i];
  return total;
}

/// Causal attention over qkv (N x 3D) a batch element at a time, its output rounded into
/// o16 (N x D) as each element's rows are done: the float32 output only in a thread's
/// buffer. Each row's log-sum-exp into lse (B, H, T) for the backward.
void attention_rounded(const kernels::Dims& s, const float* qkv, float* lse, uint16_t* o16) {
  const auto& k16 = cpu::bf16_table();
  auto one = s;
  one.B = 1;
  at::parallel_for(0, s.B, 1, [&](int64_t begin, int64_t end) {
    const auto scratch = kernels::bf16_scratch(one);
    std::vector<float> out(static_cast<size_t>(s.T * s.D));
    for (int64_t b = begin; b < end; ++b) {
      k16.attention_forward_bf16(one, qkv + b * s.T * 3 * s.D, out.data(), nullptr, lse + b * s.H * s.T, 0, s.H,
                                 scratch.get());
      round_rows(out.data(), o16 + b * s.T * s.D, s.T, s.D, nullptr);
    }
  });
}

/// attention_rounded's backward from do (N x D): dqkv rounded into dqkv16 (N x 3D) a batch
/// element at a time, the float32 gradient only in a thread's buffer; where `sums` is
/// given, dqkv's column sums (the qkv bias's gradient), per element then in order.
void attention_backward_rounded(const kernels::Dims& s, const float* qkv, const float* lse, const float* dout,
                                uint16_t* dqkv16, torch::Tensor* sums) {
  const auto& k16 = cpu::bf16_table();
  auto one = s;
  one.B = 1;
  const int64_t row = 3 * s.D;
  std::vector<float> partial(sums ? static_cast<size_t>(s.B * row) : 0, 0.f);
  at::parallel_for(0, s.B, 1, [&](int64_t begin, int64_t end) {
    const auto scratch = kernels::bf16_scratch(one);
    std::vector<float> dqkv(static_cast<size_t>(s.T * row));
    for (int64_t b = begin; b < end; ++b) {
      k16.attention_backward_bf16(one, qkv + b * s.T * row, nullptr, lse + b * s.H * s.T, dout + b * s.T * s.D,
                                  dqkv.data(), 0, s.H, scratch.get());
      round_rows(dqkv.data(), dqkv16 + b * s.T * row, s.T, row, sums ? partial.data() + b * row : nullptr);
    }
  });
  if (sums) *sums = ordered_sum(partial, s.B, row);
}

/// C (rows x cols) = A Bᵀ (+ bias), A and B bfloat16 (A rows x inner, B cols x inner).
void product_bt(int64_t rows, int64_t cols, int64_t inner, const torch::Tensor& A, const torch::Tensor& B, float* C,
                const torch::Tensor& bias) {
  gemm_bf16(false, true, rows, cols, inner, bits(A), inner, bits(B), inner, C, cols, false,
            none(bias) ? nullptr : floats(bias));
}

/// The two gradients of y = x Wᵀ (x rows x K, W N x K) from dy16 (rows x N): dW into
/// `dw` (N x K) and, where dx is given, dx = dy W (rows x K).
void product_grads(int64_t rows, int64_t N, int64_t K, const torch::Tensor& dy16, const torch::Tensor& x16,
                   const torch::Tensor& w16, float* dw, float* dx) {
  gemm_bf16(true, false, N, K, rows, bits(dy16), N, bits(x16), K, dw, K, false);  // dW = dyᵀ x
  if (dx) gemm_bf16(false, false, rows, K, N, bits(dy16), N, bits(w16), K, dx, K, false);  // dx = dy W
}

torch::Tensor bf16_empty(int64_t rows, int64_t cols) {
  return torch::empty({rows, cols}, torch::TensorOptions().dtype(torch::kBFloat16));
}
torch::Tensor f32_empty(std::initializer_list<int64_t> sizes) {
  return torch::empty(sizes, torch::TensorOptions().dtype(torch::kFloat32));
}

// What the forward keeps of each block, in saved_data["block<l>"].
enum : int64_t { kH, kMean1, kRstd1, kY1, kQkv, kLse, kO, kH2, kMean2, kRstd2, kY2, kF, kG, kSaved };

class FusedTransformerLMLoss : public torch::autograd::Function<FusedTransformerLMLoss> {
 public:
  static variable_list forward(AutogradContext* ctx, const torch::Tensor& ids_in, const torch::Tensor& targets_in,
                               at::TensorList params, const Settings& set) {
    RECORD_USER_SCOPE("tinylm::fused_transformer_lm");
    count_fused_model();
    const auto ids = ids_in.contiguous(), targets = targets_in.contiguous();
    const auto& E = params[0];
    const int64_t B = ids.size(0), T = ids.size(1), D = E.size(1), V = E.size(0), N = B * T, L = set.layers;
    const auto& head = none(params[kFirstBlock + L * kPerBlock + 2]) ? E : params[kFirstBlock + L * kPerBlock + 2];
    const int64_t* id = ids.data_ptr<int64_t>();
    const int64_t* tg = targets.data_ptr<int64_t>();

    // Every id and target checked before anything is computed.
    int64_t lo = std::numeric_limits<int64_t>::max(), hi = std::numeric_limits<int64_t>::min(), count = 0;
    for (int64_t n = 0; n < N; ++n) {
      lo = std::min(lo, id[n]);
      hi = std::max(hi, id[n]);
      if (tg[n] == set.ignore) continue;
      TORCH_CHECK(tg[n] >= 0 && tg[n] < V, "next_token_loss: target ", tg[n], " is outside the vocabulary [0, ", V,
                  ") (and is not the ignored target ", set.ignore, ")");
      ++count;
    }
    check_token_range("TransformerLM", lo, hi, V);

    // h_0 = E[ids] + pos
    auto h = f32_empty({N, D});
    {
      const float* e = floats(E);
      const auto pos = none(params[1]) ? torch::Tensor() : params[1].contiguous();
      const float* p = pos.defined() ? floats(pos) : nullptr;
      float* x = floats(h);
      at::parallel_for(0, N, 64, [&](int64_t begin, int64_t end) {
        for (int64_t n = begin; n < end; ++n) {
          const float* er = e + id[n] * D;
          float* xr = x + n * D;
          if (p) {
            const float* pr = p + (n % T) * D;
            for (int64_t d = 0; d < D; ++d) xr[d] = er[d] + pr[d];
          } else {
            std::copy_n(er, D, xr);
          }
        }
      });
    }

    const auto s = kernels::make_dims(B, T, D, set.n_heads, true);
    torch::Tensor m;  // the last block's MLP output: the next norm adds it to its h
    for (int64_t l = 0; l < L; ++l) {
      const auto* p = params.data() + kFirstBlock + l * kPerBlock;
      const int64_t F = p[kFcW].size(0);
      std::vector<torch::Tensor> keep(kSaved);
      // h_l = h2_{l-1} + m_{l-1} (from block 1 on), y1 = ln1(h_l)
      auto hl = m.defined() ? f32_empty({N, D}) : h;
      keep[kMean1] = f32_empty({N});
      keep[kRstd1] = f32_empty({N});
      keep[kY1] = bf16_empty(N, D);
      norm_rounded(floats(h), m.defined() ? floats(m) : nullptr, floats(hl), floats(p[kLn1Gain]),
                   none(p[kLn1Bias]) ? nullptr : floats(p[kLn1Bias]), bits(keep[kY1]), floats(keep[kMean1]),
                   floats(keep[kRstd1]), N, D, set.eps, set.center);
      keep[kH] = hl;
      // qkv = y1 Wqkvᵀ + b; o = attention(qkv)
      keep[kQkv] = f32_empty({N, 3 * D});
      product_bt(N, 3 * D, D, keep[kY1], rounded_weight(p[kQkvW]), floats(keep[kQkv]), p[kQkvB]);
      keep[kLse] = f32_empty({B, set.n_heads, T});
      keep[kO] = bf16_empty(N, D);
      count_attention_products(false, true);
      attention_rounded(s, floats(keep[kQkv]), floats(keep[kLse]), bits(keep[kO]));
      // h2 = h_l + o Woᵀ + b, y2 = ln2(h2)
      auto a = f32_empty({N, D});
      product_bt(N, D, D, keep[kO], rounded_weight(p[kOutW]), floats(a), p[kOutB]);
      keep[kH2] = f32_empty({N, D});
      keep[kMean2] = f32_empty({N});
      keep[kRstd2] = f32_empty({N});
      keep[kY2] = bf16_empty(N, D);
      norm_rounded(floats(hl), floats(a), floats(keep[kH2]), floats(p[kLn2Gain]),
                   none(p[kLn2Bias]) ? nullptr : floats(p[kLn2Bias]), bits(keep[kY2]), floats(keep[kMean2]),
                   floats(keep[kRstd2]), N, D, set.eps, set.center);
      // m = gelu(y2 Wfcᵀ + b)16 Wpᵀ + b
      keep[kF] = f32_empty({N, F});
      product_bt(N, F, D, keep[kY2], rounded_weight(p[kFcW]), floats(keep[kF]), p[kFcB]);
      keep[kG] = gelu_rounded(keep[kF], set.gelu_exact);
      m = f32_empty({N, D});
      product_bt(N, D, F, keep[kG], rounded_weight(p[kProjW]), floats(m), p[kProjB]);
      h = keep[kH2];
      ctx->saved_data["block" + std::to_string(l)] = keep;
    }

    // yf = ln_f(h_L), z = yf Whᵀ, the loss and its gradient dz
    const auto& gain = params[kFirstBlock + L * kPerBlock];
    const auto& bias = params[kFirstBlock + L * kPerBlock + 1];
    auto hf = m.defined() ? f32_empty({N, D}) : h;
    auto mean = f32_empty({N}), rstd = f32_empty({N});
    auto yf = bf16_empty(N, D);
    norm_rounded(floats(h), m.defined() ? floats(m) : nullptr, floats(hf), floats(gain),
                 none(bias) ? nullptr : floats(bias), bits(yf), floats(mean), floats(rstd), N, D, set.eps,
                 set.center);
    auto z = f32_empty({N, V});
    product_bt(N, V, D, yf, rounded_weight(head), floats(z), {});
    constexpr int64_t kRows = 64;
    const int64_t blocks = (N + kRows - 1) / kRows;
    std::vector<double> sums(static_cast<size_t>(blocks));
    const float inv_count = 1.f / static_cast<float>(count);
    const auto& table = cpu::table();
    float* zp = floats(z);
    // dz, and rounded as the backward takes it where the loss's own gradient is 1
    auto dz16 = bf16_empty(N, V);
    at::parallel_for(0, blocks, 1, [&](int64_t begin, int64_t end) {
      for (int64_t b = begin; b < end; ++b) {
        const int64_t row = b * kRows, rows = std::min(kRows, N - row);
        sums[b] = table.softmax_cross_entropy(zp + row * V, tg + row, rows, V, set.ignore, inv_count);
        round_rows(zp + row * V, bits(dz16) + row * V, rows, V, nullptr);
      }
    });
    double total = 0;
    for (const double v : sums) total += v;

    ctx->saved_data["final"] = std::vector<torch::Tensor>{hf, mean, rstd, yf, z, dz16};
    ctx->saved_data["ids"] = ids;
    std::vector<torch::Tensor> weights(params.begin(), params.end());
    ctx->saved_data["params"] = weights;
    ctx->saved_data["n_heads"] = set.n_heads;
    ctx->saved_data["eps"] = static_cast<double>(set.eps);
    ctx->saved_data["center"] = set.center;
    ctx->saved_data["gelu_exact"] = set.gelu_exact;
    // No counted row: NaN, as cross_entropy's mean gives.
    return {torch::full({}, total / static_cast<double>(count), E.options().requires_grad(false))};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    RECORD_USER_SCOPE("tinylm::fused_transformer_lm_backward");
    const auto params = ctx->saved_data["params"].toTensorVector();
    const auto fin = ctx->saved_data["final"].toTensorVector();
    const auto ids = ctx->saved_data["ids"].toTensor();
    const int64_t H = ctx->saved_data["n_heads"].toInt();
    const bool center = ctx->saved_data["center"].toBool(), exact = ctx->saved_data["gelu_exact"].toBool();
    const auto L = static_cast<int64_t>((params.size() - kFirstBlock - 3) / kPerBlock);
    const auto& E = params[0];
    const bool tied = none(params[kFirstBlock + L * kPerBlock + 2]);
    const auto& head = tied ? E : params[kFirstBlock + L * kPerBlock + 2];
    const int64_t B = ids.size(0), T = ids.size(1), D = E.size(1), V = E.size(0), N = B * T;
    variable_list out(2 + params.size() + 1);  // ids, targets, each parameter, the settings
    auto grad_of = [&](int64_t i) -> torch::Tensor& { return out[2 + i]; };

    // dz = the saved gradient times the loss's
    auto dz16 = fin[5];
    if (grads[0].defined()) {
      const float g = grads[0].item<float>();
      if (g != 1.f) dz16 = rounded(fin[4] * g);
    }
    const auto& yf = fin[3];
    auto dhead = gradient_destination(head);
    auto dy = f32_empty({N, D});
    product_grads(N, V, D, dz16, yf, rounded_weight(head), floats(dhead), floats(dy));
    // The gradient of each block's output h_{l+1} (dr: through ln_f, then each block's ln1),
    // rounded as it is made for the block's last product (dm16), with that product's bias
    // gradient (dpb).
    auto dr = f32_empty({N, D}), dh2 = f32_empty({N, D}), dnext = f32_empty({N, D});
    auto dm16 = bf16_empty(N, D), do16 = bf16_empty(N, D), dq16 = bf16_empty(N, 3 * D);
    torch::Tensor dpb;
    auto proj_bias = [&](int64_t l) { return !none(params[kFirstBlock + l * kPerBlock + kProjB]); };
    {
      const int64_t at = kFirstBlock + L * kPerBlock;
      torch::Tensor dbias;
      layer_norm_backward_rows(floats(fin[0]), floats(dy), floats(params[at]), floats(fin[1]), floats(fin[2]), nullptr,
                    floats(dr), grad_of(at), none(params[at + 1]) ? nullptr : &dbias, N, D, center, bits(dm16),
                    proj_bias(L - 1) ? &dpb : nullptr);
      if (dbias.defined()) grad_of(at + 1) = dbias;
    }
    const auto s = kernels::make_dims(B, T, D, H, true);
    for (int64_t l = L - 1; l >= 0; --l) {
      const int64_t at = kFirstBlock + l * kPerBlock;
      const auto* p = params.data() + at;
      const auto keep = ctx->saved_data["block" + std::to_string(l)].toTensorVector();
      const int64_t F = p[kFcW].size(0);
      // the MLP: dm = dr
      auto dg = f32_empty({N, F});
      grad_of(at + kProjW) = gradient_destination(p[kProjW]);
      product_grads(N, D, F, dm16, keep[kG], rounded_weight(p[kProjW]), floats(grad_of(at + kProjW)), floats(dg));
      if (dpb.defined()) grad_of(at + kProjB) = dpb;
      auto [da16, dfb] = rounded_with_column_sums(dg, keep[kF], exact, !none(p[kFcB]));
      dg = torch::Tensor();
      grad_of(at + kFcW) = gradient_destination(p[kFcW]);
      product_grads(N, F, D, da16, keep[kY2], rounded_weight(p[kFcW]), floats(grad_of(at + kFcW)), floats(dy));
      da16 = torch::Tensor();
      if (dfb.defined()) grad_of(at + kFcB) = dfb;
      // ln2: dh2 = the gradient of h2 (through the norm, and dr past it), which is also the
      // output projection's: rounded as it is made
      torch::Tensor dob;
      {
        torch::Tensor dbias;
        layer_norm_backward_rows(floats(keep[kH2]), floats(dy), floats(p[kLn2Gain]), floats(keep[kMean2]),
                      floats(keep[kRstd2]), floats(dr), floats(dh2), grad_of(at + kLn2Gain),
                      none(p[kLn2Bias]) ? nullptr : &dbias, N, D, center, bits(do16),
                      none(p[kOutB]) ? nullptr : &dob);
        if (dbias.defined()) grad_of(at + kLn2Bias) = dbias;
      }
      // the output projection
      auto dout = f32_empty({N, D});
      grad_of(at + kOutW) = gradient_destination(p[kOutW]);
      product_grads(N, D, D, do16, keep[kO], rounded_weight(p[kOutW]), floats(grad_of(at + kOutW)), floats(dout));
      if (dob.defined()) grad_of(at + kOutB) = dob;
      // attention, its gradient rounded as it is made, then qkv's product
      torch::Tensor dqb;
      count_attention_products(false, true);
      attention_backward_rounded(s, floats(keep[kQkv]), floats(keep[kLse]), floats(dout), bits(dq16),
                                 none(p[kQkvB]) ? nullptr : &dqb);
      dout = torch::Tensor();
      grad_of(at + kQkvW) = gradient_destination(p[kQkvW]);
      product_grads(N, 3 * D, D, dq16, keep[kY1], rounded_weight(p[kQkvW]), floats(grad_of(at + kQkvW)), floats(dy));
      if (dqb.defined()) grad_of(at + kQkvB) = dqb;
      // ln1: the gradient of h_l (through the norm, and dh2 past it); rounded for the block
      // below's last product
      dpb = torch::Tensor();
      {
        torch::Tensor dbias;
        layer_norm_backward_rows(floats(keep[kH]), floats(dy), floats(p[kLn1Gain]), floats(keep[kMean1]), floats(keep[kRstd1]),
                      floats(dh2), floats(dnext), grad_of(at + kLn1Gain), none(p[kLn1Bias]) ? nullptr : &dbias, N, D,
                      center, l > 0 ? bits(dm16) : nullptr, l > 0 && proj_bias(l - 1) ? &dpb : nullptr);
        if (dbias.defined()) grad_of(at + kLn1Bias) = dbias;
      }
      std::swap(dr, dnext);
    }

    // the embedding's rows (and the tied head's gradient), the positions' sum over the batch
    torch::Tensor dE = tied ? dhead : gradient_destination(E);
    if (!tied) {
      grad_of(kFirstBlock + L * kPerBlock + 2) = dhead;
      dE.zero_();
    }
    {
      const int64_t* id = ids.data_ptr<int64_t>();
      const float* g = floats(dr);
      float* e = floats(dE);
      // columns split over the threads, rows in order: the same sums at every thread count
      at::parallel_for(0, D, 16, [&](int64_t c0, int64_t c1) {
        for (int64_t n = 0; n < N; ++n)
          for (int64_t d = c0; d < c1; ++d) e[id[n] * D + d] += g[n * D + d];
      });
    }
    grad_of(0) = dE;
    if (!none(params[1]) && params[1].requires_grad()) grad_of(1) = dr.view({B, T, D}).sum(0);
    return out;
  }
};

bool cpu_float(const torch::Tensor& t) {
  return t.defined() && t.device().is_cpu() && t.scalar_type() == torch::kFloat32 && t.is_contiguous();
}

bool fits(const torch::Tensor& t, std::initializer_list<int64_t> shape, bool optional = false) {
  if (optional && none(t)) return true;
  return cpu_float(t) && t.sizes() == c10::IntArrayRef(shape) && t.requires_grad();
}

}  // namespace

bool fused_transformer_lm_supported(const FusedTransformerLMTensors& m, int64_t T, const KernelPolicy& policy) {
  if (!policy.bf16_products || !policy.bf16_attention || !policy.fuse_whole_model || !bf16_products_missing().empty())
    return false;
  if (!cpu_float(m.embedding) || m.embedding.dim() != 2 || m.blocks.empty() || m.n_heads < 1) return false;
  const int64_t V = m.embedding.size(0), D = m.embedding.size(1);
  if (D % m.n_heads != 0 || !cpu::attention_bf16_fits(kernels::make_dims(1, T, D, m.n_heads, true)) ||
      policy.attention_products_use_blas(T) || !m.embedding.requires_grad())
    return false;
  if (!none(m.positions) && !(cpu_float(m.positions) && m.positions.sizes() == c10::IntArrayRef{T, D}))
    return false;
  for (const auto& b : m.blocks) {
    const int64_t F = b.fc_weight.defined() && b.fc_weight.dim() == 2 ? b.fc_weight.size(0) : 0;
    if (F < 1 || !fits(b.ln1_gain, {D}) || !fits(b.ln1_bias, {D}, true) || !fits(b.qkv_weight, {3 * D, D}) ||
        !fits(b.qkv_bias, {3 * D}, true) || !fits(b.out_weight, {D, D}) || !fits(b.out_bias, {D}, true) ||
        !fits(b.ln2_gain, {D}) || !fits(b.ln2_bias, {D}, true) || !fits(b.fc_weight, {F, D}) ||
        !fits(b.fc_bias, {F}, true) || !fits(b.proj_weight, {D, F}) || !fits(b.proj_bias, {D}, true))
      return false;
  }
  return fits(m.final_gain, {D}) && fits(m.final_bias, {D}, true) && fits(m.head_weight, {V, D}, true);
}

torch::Tensor fused_transformer_lm_loss(const FusedTransformerLMTensors& model, const torch::Tensor& ids,
                                        const torch::Tensor& targets, const KernelPolicy& policy) {
  check_token_shape("TransformerLM", ids, std::numeric_limits<int64_t>::max());
  TORCH_CHECK(targets.defined() && targets.scalar_type() == torch::kLong && targets.sizes() == ids.sizes(),
              "next_token_loss: targets must be int64 of the ids' shape ", ids.sizes(), ", got ",
              targets.defined() ? targets.sizes() : c10::IntArrayRef{});
  TORCH_CHECK(fused_transformer_lm_supported(model, ids.size(1), policy),
              "fused_transformer_lm_loss: these tensors or this policy are not what it takes (see "
              "fused_transformer_lm_supported)");
  const Settings set{model.n_heads, static_cast<int64_t>(model.blocks.size()), model.ignore_target,
                     static_cast<float>(model.eps), model.center, model.gelu_exact};
  auto params = flatten(model);
  const auto empty = torch::empty({0}, model.embedding.options().requires_grad(false));
  for (auto& t : params)
    if (!t.defined()) t = empty;  // LibTorch 1.13's apply: no undefined tensors
  return FusedTransformerLMLoss::apply(ids, targets, at::TensorList(params), set)[0];
}

}  // namespace tinylm::nn
