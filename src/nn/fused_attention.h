// Fused scaled dot-product self-attention on the CPU: one autograd op from the QKV
// projection's output to the merged heads, with its own backward.
// B = batch, T = sequence length, D = d_model, H = heads, Dh = D / H
#pragma once

#include <tinylm/nn/kernel_policy.h>

#include <torch/types.h>

#include <cstdint>
#include <vector>

namespace tinylm::nn {

/// qkv: (B, T, 3D) float32 on the CPU, laid out [q | k | v] along the last dim with each
/// of q, k, v holding H heads of Dh features (what MultiHeadSelfAttention's qkv_proj
/// produces). Returns the attention output with heads merged, (B, T, D), and writes the
/// weights (B, H, T, T) to *weights when given. Equal to split -> q kᵀ / sqrt(Dh) ->
/// (causal mask) -> softmax -> · v -> merge, without the reshapes and with fewer,
/// larger operations; the backward pass is computed directly from the saved weights.
/// The T x T products go through BLAS from policy.attention_blas_min_seq_len.
torch::Tensor fused_self_attention(const torch::Tensor& qkv, int64_t n_heads, bool causal,
                                   torch::Tensor* weights = nullptr, const KernelPolicy& policy = {});

/// Whether fused_self_attention can take this input (CPU, float32, rank 3).
bool fused_attention_supported(const torch::Tensor& qkv);

/// Rows decoded together (continuous batching), one new token each, on tinylm's loops:
/// writes each row's new key and value (k, v: (B, Hkv, 1, Dh)) into keys and values
/// (B, Hkv, capacity, Dh; contiguous) at position lengths[b], then returns (B, H, 1, Dh):
/// softmax(q kᵀ / sqrt(Dh)) v per row and head over the row's first lengths[b] + 1
/// positions (grouped-query heads share theirs). q (B, H, 1, Dh). Float32 on the CPU,
/// no autograd.
torch::Tensor decode_rows_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                    torch::Tensor& keys, torch::Tensor& values, const std::vector<int64_t>& lengths);

}  // namespace tinylm::nn
