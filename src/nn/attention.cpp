// Multi-head self-attention.
// B = batch, T = sequence length, D = d_model, H = heads, Dh = D / H, C = max context
#include <tinylm/nn/attention.h>
#include <tinylm/log.h>
#include "nn/fused_attention.h"
#include "nn/linear.h"
#include "nn/rotary.h"

#include <torch/types.h>
#include <torch/nn/modules/linear.h>
#include <torch/version.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <vector>

namespace tinylm::nn {

namespace {

/// Rows [start, start + rows) and columns [0, cols) of the causal mask: true where
/// key j <= query start + i. Made per call, on `device`: (rows, cols) bool, nothing
/// kept that grows with the model's maximum context.
torch::Tensor causal_rows(int64_t start, int64_t rows, int64_t cols, const torch::Device& device) {
  return torch::ones({rows, cols}, torch::TensorOptions().dtype(torch::kBool).device(device)).tril(start);
}

/// softmax(q kᵀ / sqrt(Dh)) over keys, with keys masked out where `allowed` (broadcastable
/// to the scores) is false; undefined = no mask. q (B, H, Tq, Dh), k (B, H, Tk, Dh).
torch::Tensor attention_weights(const torch::Tensor& q, const torch::Tensor& k,
                                const torch::Tensor& allowed) {
  auto scores = torch::matmul(q, k.transpose(-2, -1)) *
                (1.0 / std::sqrt(static_cast<double>(q.size(-1))));  // (B, H, Tq, Tk)
  if (allowed.defined()) {
    scores = scores.masked_fill(allowed.logical_not(), -std::numeric_limits<float>::infinity());
  }
  return torch::softmax(scores, /*dim=*/-1);
}

/// The projection's output (B, T, H Dh + 2 Hkv Dh) as views: q (B, T, H, Dh), k and v
/// (B, T, Hkv, Dh); rotated for positions start .. start + T - 1 where rotary_base > 0.
std::array<torch::Tensor, 3> heads_of(const torch::Tensor& qkv, int64_t H, int64_t Hkv, int64_t Dh, int64_t start,
                                      double rotary_base, const KernelPolicy& policy) {
  const int64_t B = qkv.size(0), T = qkv.size(1), D = H * Dh;
  auto q = qkv.narrow(2, 0, D).reshape({B, T, H, Dh});
  auto k = qkv.narrow(2, D, Hkv * Dh).reshape({B, T, Hkv, Dh});
  auto v = qkv.narrow(2, D + Hkv * Dh, Hkv * Dh).reshape({B, T, Hkv, Dh});
  if (rotary_base > 0) {
    q = rotate_halves(q, start, rotary_base, policy);
    k = rotate_halves(k, start, rotary_base, policy);
  }
  return {q, k, v};
}

#if TORCH_VERSION_MAJOR >= 2
constexpr bool kHaveSdpa = true;
#else
constexpr bool kHaveSdpa = false;
#endif


}  // namespace

bool sdpa_available() { return kHaveSdpa; }

torch::Tensor sdpa_self_attention(const torch::Tensor& qkv, int64_t n_heads, bool causal,
                                  double dropout_p) {
  TORCH_CHECK(qkv.dim() == 3 && qkv.size(2) % 3 == 0,
              "sdpa_self_attention: expected qkv (B, T, 3D), got ", qkv.sizes());
#if TORCH_VERSION_MAJOR >= 2
  auto parts = qkv.chunk(3, /*dim=*/-1);                          // 3 x (B, T, D)
  auto out = at::scaled_dot_product_attention(
      split_heads(parts[0], n_heads), split_heads(parts[1], n_heads),
      split_heads(parts[2], n_heads), /*attn_mask=*/{}, dropout_p, causal);  // (B, H, T, Dh)
  return merge_heads(out);                                        // (B, T, D)
#else
  (void)n_heads, (void)causal, (void)dropout_p;
  TORCH_CHECK(false, "sdpa_self_attention: needs LibTorch 2.0 or later, this is ",
              TORCH_VERSION_MAJOR, ".", TORCH_VERSION_MINOR);
#endif
}

torch::Tensor split_heads(const torch::Tensor& x, int64_t n_heads) {
  TORCH_CHECK(x.dim() == 3, "split_heads: expected (B, T, D), got rank ", x.dim());
  TORCH_CHECK(n_heads >= 1 && x.size(2) % n_heads == 0, "split_heads: D=", x.size(2),
              " is not divisible by n_heads=", n_heads);
  const int64_t B = x.size(0), T = x.size(1), D = x.size(2);
  return x.view({B, T, n_heads, D / n_heads})  // (B, T, H, Dh)
      .transpose(1, 2);                        // (B, H, T, Dh)
}

torch::Tensor merge_heads(const torch::Tensor& x) {
  TORCH_CHECK(x.dim() == 4, "merge_heads: expected (B, H, T, Dh), got rank ", x.dim());
  const int64_t B = x.size(0), H = x.size(1), T = x.size(2), Dh = x.size(3);
  return x.transpose(1, 2)             // (B, T, H, Dh)
      .contiguous()
      .view({B, T, H * Dh});           // (B, T, D)
}

MultiHeadSelfAttentionImpl::MultiHeadSelfAttentionImpl(
    const MultiHeadSelfAttentionOptions& options_)
    : options(options_) {
  reset();
}

void MultiHeadSelfAttentionImpl::reset() {
  const int64_t D = options.d_model(), H = options.n_heads(), C = options.context_length();
  TORCH_CHECK(D >= 1, "MultiHeadSelfAttention: d_model must be >= 1, got ", D);
  TORCH_CHECK(H >= 1, "MultiHeadSelfAttention: n_heads must be >= 1, got ", H);
  TORCH_CHECK(D % H == 0, "MultiHeadSelfAttention: d_model ", D,
              " must be divisible by n_heads ", H);
  TORCH_CHECK(C >= 1, "MultiHeadSelfAttention: context_length must be >= 1, got ", C);
  TORCH_CHECK(options.attn_dropout() >= 0 && options.attn_dropout() < 1,
              "MultiHeadSelfAttention: attn_dropout must be in [0, 1), got ",
              options.attn_dropout());
  TORCH_CHECK(options.out_dropout() >= 0 && options.out_dropout() < 1,
              "MultiHeadSelfAttention: out_dropout must be in [0, 1), got ", options.out_dropout());
  TORCH_CHECK(options.n_kv_heads() >= 0 && H % n_kv_heads() == 0, "MultiHeadSelfAttention: n_kv_heads ",
              options.n_kv_heads(), " must divide n_heads ", H, " (0: as many as n_heads)");
  TORCH_CHECK(options.rotary_base() >= 0 && std::isfinite(options.rotary_base()),
              "MultiHeadSelfAttention: rotary_base must be >= 0 (0: none), got ", options.rotary_base());
  TORCH_CHECK(options.rotary_base() == 0 || (D / H) % 2 == 0, "MultiHeadSelfAttention: rotary positions need an "
              "even head width, got d_model / n_heads = ", D / H);
  const int64_t kv = n_kv_heads() * (D / H);
  qkv_proj = register_module(
      "qkv_proj", torch::nn::Linear(torch::nn::LinearOptions(D, D + 2 * kv).bias(options.bias())));
  out_proj = register_module(
      "out_proj", torch::nn::Linear(torch::nn::LinearOptions(D, D).bias(options.bias())));
}

void MultiHeadSelfAttentionImpl::reset_parameters() {
  qkv_proj->reset_parameters();
  out_proj->reset_parameters();
}

void MultiHeadSelfAttentionImpl::pretty_print(std::ostream& os) const {
  os << "tinylm::nn::MultiHeadSelfAttention(d_model=" << options.d_model()
     << ", n_heads=" << options.n_heads();
  if (n_kv_heads() != n_heads()) os << ", n_kv_heads=" << n_kv_heads();
  if (options.rotary_base() > 0) os << ", rotary_base=" << options.rotary_base();
  os << ", context_length="
     << options.context_length() << ", causal=" << (options.causal() ? "true" : "false")
     << ")";
}

const char* to_string(AttentionKernel kernel) {
  switch (kernel) {
    case AttentionKernel::automatic: return "automatic";
    case AttentionKernel::plain: return "plain";
    case AttentionKernel::fused: return "fused";
    case AttentionKernel::sdpa: return "sdpa";
  }
  return "?";
}

torch::Tensor MultiHeadSelfAttentionImpl::full_qkv(const torch::Tensor& qkv, int64_t start) const {
  const int64_t D = options.d_model(), H = n_heads(), Hkv = n_kv_heads(), Dh = d_head();
  const double base = options.rotary_base();
  if (Hkv == H && base == 0) return qkv;  // already [q | k | v] of H heads each
  const int64_t B = qkv.size(0), T = qkv.size(1);
  auto [q, k, v] = heads_of(qkv, H, Hkv, Dh, start, base, *options.kernel_policy());
  if (Hkv != H) {  // each key/value head serves H / Hkv query heads, in order
    k = k.repeat_interleave(H / Hkv, /*dim=*/2);
    v = v.repeat_interleave(H / Hkv, /*dim=*/2);
  }
  return torch::cat({q.reshape({B, T, D}), k.reshape({B, T, D}), v.reshape({B, T, D})}, /*dim=*/2);
}

AttentionKernel MultiHeadSelfAttentionImpl::kernel_for(const torch::Tensor& x, bool return_weights,
                                                       bool has_padding_mask) const {
  AttentionCall call;
  call.cuda = x.is_cuda();
  call.fused_supported = fused_attention_supported(x);  // x: the dtype and device of qkv
  call.seq_len = x.dim() >= 2 ? x.size(1) : 0;
  call.padding_mask = has_padding_mask;
  call.dropout = is_training() && options.attn_dropout() > 0;
  call.return_weights = return_weights;
  call.grad_enabled = torch::GradMode::is_enabled();
  return options.kernel_policy()->attention_kernel(options.kernel(), call);
}

AttentionKernel KernelPolicy::attention_kernel(AttentionKernel requested, const AttentionCall& c) const {
  // The fused kernel's weights carry no gradient: when weights are asked for with
  // autograd on, a loss may use them, so it does not apply.
  const bool fused_applies = c.fused_supported && !c.padding_mask && !c.dropout && !(c.return_weights && c.grad_enabled);
  const bool sdpa_applies = kHaveSdpa && !c.padding_mask && !c.return_weights;
  switch (requested) {
    case AttentionKernel::plain: break;
    case AttentionKernel::fused: if (fused_applies) return AttentionKernel::fused; break;
    case AttentionKernel::sdpa: if (sdpa_applies) return AttentionKernel::sdpa; break;
    case AttentionKernel::automatic:
      if (sdpa_applies && (c.cuda || c.seq_len >= sdpa_cpu_min_seq_len)) return AttentionKernel::sdpa;
      if (fused_applies) return AttentionKernel::fused;
      if (sdpa_applies) return AttentionKernel::sdpa;
      break;
  }
  return AttentionKernel::plain;
}

AttentionOutput MultiHeadSelfAttentionImpl::forward(const torch::Tensor& x, bool return_weights,
                                                    const torch::Tensor& padding_mask) {
  const int64_t D = options.d_model(), H = options.n_heads();
  TORCH_CHECK(x.dim() == 3, "MultiHeadSelfAttention: expected input of rank 3 (B, T, D), got rank ",
              x.dim(), " with shape ", x.sizes());
  const int64_t B = x.size(0), T = x.size(1);
  TORCH_CHECK(x.size(2) == D, "MultiHeadSelfAttention: input feature dim ", x.size(2),
              " does not match d_model ", D);
  TORCH_CHECK(T >= 1, "MultiHeadSelfAttention: sequence length must be >= 1, got ", T);
  TORCH_CHECK(T <= options.context_length(), "MultiHeadSelfAttention: sequence length ", T,
              " exceeds context_length ", options.context_length());

  const KernelPolicy& policy = *options.kernel_policy();
  auto qkv_all = full_qkv(linear(x, qkv_proj->weight, qkv_proj->bias, policy), 0);  // (B, T, 3D)

  const bool dropout_active = is_training() && options.attn_dropout() > 0;
  const AttentionKernel kernel = kernel_for(x, return_weights, padding_mask.defined());
  if (kernel == AttentionKernel::fused) {
    torch::Tensor weights;
    auto context = fused_self_attention(qkv_all, H, options.causal(), return_weights ? &weights : nullptr,
                                        policy);  // (B, T, D)
    auto out = torch::dropout(linear(context, out_proj->weight, out_proj->bias, policy), options.out_dropout(), is_training());
    return {out, weights};
  }
  if (kernel == AttentionKernel::sdpa) {
    auto context = sdpa_self_attention(qkv_all, H, options.causal(),
                                       dropout_active ? options.attn_dropout() : 0.0);  // (B, T, D)
    return {torch::dropout(linear(context, out_proj->weight, out_proj->bias, policy), options.out_dropout(), is_training()), {}};
  }

  auto qkv = qkv_all.chunk(3, /*dim=*/-1);      // 3 x (B, T, D)
  auto q = split_heads(qkv[0], H);              // (B, H, T, Dh)
  auto k = split_heads(qkv[1], H);              // (B, H, T, Dh)
  auto v = split_heads(qkv[2], H);              // (B, H, T, Dh)

  torch::Tensor allowed;  // true where query i may attend to key j; broadcastable to scores
  if (options.causal()) allowed = causal_rows(0, T, T, x.device());  // (T, T)
  if (padding_mask.defined()) {
    TORCH_CHECK(padding_mask.dim() == 2 && padding_mask.size(0) == B && padding_mask.size(1) == T,
                "MultiHeadSelfAttention: padding_mask must be (B, T) = (", B, ", ", T,
                "), got ", padding_mask.sizes());
    TORCH_CHECK(padding_mask.scalar_type() == torch::kBool,
                "MultiHeadSelfAttention: padding_mask must be bool (true = real token), got ",
                padding_mask.scalar_type());
    auto keys = padding_mask.to(x.device()).view({B, 1, 1, T});  // (B, 1, 1, T)
    allowed = allowed.defined() ? torch::logical_and(allowed, keys) : keys;
  }
  auto weights = attention_weights(q, k, allowed);  // (B, H, T, T)
  if (padding_mask.defined()) {
    // A query that sees no key at all has a row of NaN: it attends to nothing instead.
    auto sees_nothing = allowed.any(/*dim=*/-1, /*keepdim=*/true).logical_not();
    weights = weights.masked_fill(sees_nothing, 0.0);
  }
  auto attn = torch::dropout(weights, options.attn_dropout(), is_training());

  auto context = merge_heads(torch::matmul(attn, v));  // (B, H, T, Dh) -> (B, T, D)
  auto out = torch::dropout(linear(context, out_proj->weight, out_proj->bias, policy), options.out_dropout(), is_training());
  return {out, return_weights ? weights : torch::Tensor()};
}

torch::Tensor MultiHeadSelfAttentionImpl::forward_cached(const torch::Tensor& x, torch::Tensor& keys,
                                                        torch::Tensor& values, bool last_only) {
  const int64_t D = options.d_model(), H = options.n_heads();
  TORCH_CHECK(x.dim() == 3 && x.size(2) == D, "MultiHeadSelfAttention: expected new tokens (B, Tn, ",
              D, "), got ", x.sizes());
  const int64_t Tn = x.size(1), Tc = keys.defined() ? keys.size(2) : 0;
  TORCH_CHECK(Tc + Tn <= options.context_length(), "MultiHeadSelfAttention: cached length ",
              Tc, " + new tokens ", Tn, " exceeds context_length ", options.context_length());
  const KernelPolicy& policy = *options.kernel_policy();
  const int64_t Hkv = n_kv_heads(), Dh = d_head();
  // (B, Tn, D + 2 Hkv Dh) -> heads, rotated at their positions Tc .. Tc + Tn - 1
  auto [q, k, v] = heads_of(linear(x, qkv_proj->weight, qkv_proj->bias, policy), H, Hkv, Dh, Tc,
                            options.rotary_base(), policy);
  q = q.transpose(1, 2);                                       // (B, H, Tn, Dh)
  k = k.transpose(1, 2), v = v.transpose(1, 2);                // (B, Hkv, Tn, Dh)
  keys = Tc ? torch::cat({keys, k}, /*dim=*/2) : k;            // (B, Hkv, Tc + Tn, Dh)
  values = Tc ? torch::cat({values, v}, /*dim=*/2) : v;
  if (last_only && Tn > 1) q = q.narrow(2, Tn - 1, 1);        // (B, H, 1, Dh)
  const int64_t Tq = q.size(2);
  // One new token sees every cached key: its mask row would be all true.
  auto allowed = options.causal() && Tq > 1 ? causal_rows(Tc, Tn, Tc + Tn, x.device())
                                            : torch::Tensor();  // (Tn, Tc + Tn)
  // Each key/value head serves H / Hkv query heads, in order.
  const auto all_keys = Hkv == H ? keys : keys.repeat_interleave(H / Hkv, /*dim=*/1);        // (B, H, ., Dh)
  const auto all_values = Hkv == H ? values : values.repeat_interleave(H / Hkv, /*dim=*/1);
  auto weights = attention_weights(q, all_keys, allowed);         // (B, H, Tq, Tc + Tn)
  auto context = merge_heads(torch::matmul(weights, all_values));  // (B, Tq, D)
  return linear(context, out_proj->weight, out_proj->bias, policy);
}

DecodeRows decode_rows(std::vector<int64_t> lengths, const torch::Device& device) {
  TORCH_CHECK(!lengths.empty(), "decode_rows: no rows");
  DecodeRows rows;
  for (int64_t n : lengths) TORCH_CHECK(n >= 0, "decode_rows: a row of length ", n);
  rows.span = *std::max_element(lengths.begin(), lengths.end()) + 1;
  const auto B = static_cast<int64_t>(lengths.size());
  rows.positions = torch::tensor(lengths, torch::kLong);
  // Column j is row b's when j <= lengths[b] (its earlier tokens and the new one).
  if (std::any_of(lengths.begin(), lengths.end(), [&](int64_t n) { return n != lengths.front(); })) {
    rows.allowed = torch::arange(rows.span, torch::kLong).view({1, rows.span}).le(rows.positions.view({B, 1}));
    rows.allowed = rows.allowed.view({B, 1, 1, rows.span}).to(device);
  }
  rows.positions = rows.positions.to(device);
  rows.lengths = std::move(lengths);
  return rows;
}

torch::Tensor MultiHeadSelfAttentionImpl::forward_rows(const torch::Tensor& x, torch::Tensor& keys,
                                                      torch::Tensor& values, const DecodeRows& rows) {
  const int64_t D = options.d_model(), H = options.n_heads(), Hkv = n_kv_heads(), Dh = d_head();
  const auto B = static_cast<int64_t>(rows.lengths.size());
  TORCH_CHECK(x.dim() == 3 && x.size(0) == B && x.size(1) == 1 && x.size(2) == D,
              "MultiHeadSelfAttention: expected one new token per row (", B, ", 1, ", D, "), got ", x.sizes());
  TORCH_CHECK(keys.defined() && values.defined() && keys.dim() == 4 && keys.size(0) == B && keys.size(1) == Hkv &&
                  keys.size(2) >= rows.span && keys.size(3) == Dh && values.sizes() == keys.sizes(),
              "MultiHeadSelfAttention: the rows' keys and values must be (", B, ", ", Hkv, ", >= ", rows.span, ", ",
              Dh, "), got ", keys.defined() ? keys.sizes() : torch::IntArrayRef{});
  TORCH_CHECK(rows.span <= options.context_length(), "MultiHeadSelfAttention: a row of ", rows.span - 1,
              " cached tokens and a new one exceeds context_length ", options.context_length());
  const KernelPolicy& policy = *options.kernel_policy();
  const bool same_length = !rows.allowed.defined();
  auto [q, k, v] = heads_of(linear(x, qkv_proj->weight, qkv_proj->bias, policy), H, Hkv, Dh, rows.lengths.front(),
                            same_length ? options.rotary_base() : 0.0, policy);
  if (options.rotary_base() > 0 && !same_length) {  // each row at its own position, as alone
    std::vector<torch::Tensor> qs, ks;
    for (int64_t b = 0; b < B; ++b) {
      qs.push_back(rotate_halves(q.narrow(0, b, 1), rows.lengths[b], options.rotary_base(), policy));
      ks.push_back(rotate_halves(k.narrow(0, b, 1), rows.lengths[b], options.rotary_base(), policy));
    }
    q = torch::cat(qs), k = torch::cat(ks);
  }
  q = q.transpose(1, 2);                         // (B, H, 1, Dh)
  k = k.transpose(1, 2), v = v.transpose(1, 2);  // (B, Hkv, 1, Dh)
  // tinylm's loops where they apply: each row's new key and value written at its own
  // position, and each row and head attending over its own cached positions (no mask, no
  // copies of grouped-query heads).
  if (B > 1 && !torch::GradMode::is_enabled() && keys.is_contiguous() && values.is_contiguous() &&
      kernel_for(x, false, false) == AttentionKernel::fused)
    return linear(merge_heads(decode_rows_attention(q, k, v, keys, values, rows.lengths)), out_proj->weight,
                  out_proj->bias, policy);  // (B, 1, D)
  if (same_length) {  // one column for every row
    keys.narrow(2, rows.lengths.front(), 1).copy_(k);
    values.narrow(2, rows.lengths.front(), 1).copy_(v);
  } else {
    const auto column = rows.positions.view({B, 1, 1, 1}).expand({B, Hkv, 1, Dh});
    keys.scatter_(2, column, k);
    values.scatter_(2, column, v);
  }
  auto seen_keys = keys.narrow(2, 0, rows.span), seen_values = values.narrow(2, 0, rows.span);
  if (Hkv != H) {
    seen_keys = seen_keys.repeat_interleave(H / Hkv, /*dim=*/1);
    seen_values = seen_values.repeat_interleave(H / Hkv, /*dim=*/1);
  }
  torch::Tensor context;  // (B, H, 1, Dh)
  if (B == 1) {
    context = torch::matmul(attention_weights(q, seen_keys, rows.allowed), seen_values);
  } else {
    // One query per row and head: as broadcast multiply-and-sums, where a batched product
    // would be B x H calls on single vectors.
    auto scores = (q * seen_keys).sum(-1).unsqueeze(2) * (1.0 / std::sqrt(static_cast<double>(Dh)));  // (B, H, 1, span)
    if (rows.allowed.defined())
      scores = scores.masked_fill(rows.allowed.logical_not(), -std::numeric_limits<float>::infinity());
    auto weights = torch::softmax(scores, /*dim=*/-1);
    context = (weights.transpose(-2, -1) * seen_values).sum(2, /*keepdim=*/true);
  }
  return linear(merge_heads(context), out_proj->weight, out_proj->bias, policy);  // (B, 1, D)
}

}  // namespace tinylm::nn
