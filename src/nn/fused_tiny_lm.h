// The whole TinyAttentionLM training loss as one autograd op (CPU, float32).
// B = batch, T = sequence length, D = d_model, V = vocab size, N = B * T
#pragma once

#include <tinylm/nn/model.h>

#include <torch/types.h>

namespace tinylm::nn {

/// Mean next-token cross-entropy of `model` on ids (B, T) -> targets (B, T), equal to
/// cross_entropy(model->forward(ids).logits, targets) but computed as one operation
/// (embedding + positions, QKV projection, causal attention, output projection, LM head,
/// softmax cross-entropy) with a hand-written backward that yields the gradients of all
/// seven parameters at once. For tiny models, whose step time is per-operator overhead,
/// this replaces ~60 dispatched operations with ~14 matrix products and a few loops.
torch::Tensor fused_tiny_lm_loss(TinyAttentionLMImpl& model, const torch::Tensor& ids,
                                 const torch::Tensor& targets);

/// check_token_ids (model.h) in two halves, for the fused loss, which finds the smallest
/// and largest id in the pass that gathers the embeddings: rank, dtype, non-empty and
/// length; then the range.
void check_token_shape(const char* who, const torch::Tensor& ids, int64_t context_length);
void check_token_range(const char* who, int64_t min_id, int64_t max_id, int64_t vocab_size);

/// Whether fused_tiny_lm_loss applies: float32 CPU parameters, causal attention.
bool fused_tiny_lm_supported(const TinyAttentionLMImpl& model);

}  // namespace tinylm::nn
