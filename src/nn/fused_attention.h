// Fused scaled dot-product self-attention on the CPU: one autograd op from the QKV
// projection's output to the merged heads, with its own backward.
// B = batch, T = sequence length, D = d_model, H = heads, Dh = D / H
#pragma once

#include <tinylm/nn/kernel_policy.h>

#include <torch/types.h>

#include <cstdint>

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

}  // namespace tinylm::nn
